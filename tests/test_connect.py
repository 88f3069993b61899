"""Connectivity repair (index/_connect.py) on the CPU, checked against scipy's connected components
and a plain breadth-first search."""

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse.csgraph import breadth_first_order, connected_components

import knnkit
from knnkit.datasets.suite import make_tight_clusters
from knnkit.index._connect import (combine_entry_points, components, entry_points_per_component,
                                   reachable_from, repair_connectivity)
from knnkit.index._entry import build_entry_points


def _csr(g):
    n = g.shape[0]
    r, c = np.nonzero(g >= 0)
    return sp.csr_matrix((np.ones(r.size), (r, g[r, c])), shape=(n, n))


def _scipy_labels(g):
    return connected_components(_csr(g), directed=True, connection="weak")


def _scipy_reach(g, sources):
    seen = np.zeros(g.shape[0], bool)
    csr = _csr(g)
    for s in sources:
        seen[breadth_first_order(csr, int(s), directed=True, return_predecessors=False)] = True
    return seen


def _same_partition(a, b):
    # same partition <=> the pairs (a_i, b_i) are in one-to-one correspondence
    pairs = np.unique(np.stack([a, b], 1), axis=0)
    return len(pairs) == len(np.unique(a)) == len(np.unique(b))


@pytest.fixture(scope="module")
def clustered_graph():
    """40 tight clusters of 50 points; the exact 10-NN graph falls into one piece per cluster."""
    X = make_tight_clusters(2000, 16, 40, 0.01, random_state=3)
    _, idx = knnkit.knn(X, k=10, device="cpu")
    return X, idx.astype(np.int32)


def test_components_match_scipy(clustered_graph, rng):
    X, g = clustered_graph
    labels, c = components(g)
    c_ref, lab_ref = _scipy_labels(g)
    assert c == c_ref == 40
    assert _same_partition(labels, lab_ref)
    assert labels[0] == 0 and labels.dtype == np.int32
    # the array-operation algorithm (the GPU one) gives the very same labels
    lab2, c2 = components(g, method="propagate")
    assert c2 == c and np.array_equal(lab2, labels)
    # random sparse graphs with holes: many small components
    for _ in range(3):
        n = int(rng.integers(50, 400))
        h = rng.integers(0, n, (n, 3)).astype(np.int32)
        h[rng.random(h.shape) < 0.6] = -1
        lab_a, ca = components(h)
        lab_b, cb = components(h, method="propagate")
        c_ref, lab_ref = _scipy_labels(h)
        assert ca == cb == c_ref
        assert np.array_equal(lab_a, lab_b) and _same_partition(lab_a, lab_ref)


def test_reachable_matches_bfs(rng):
    n = 300
    g = rng.integers(0, n, (n, 2)).astype(np.int32)
    g[rng.random(g.shape) < 0.5] = -1
    src = rng.choice(n, 3, replace=False)
    ref = _scipy_reach(g, src)
    assert np.array_equal(reachable_from(g, src), ref)
    assert np.array_equal(reachable_from(g, src, method="frontier"), ref)
    assert not ref.all()  # the test graph really has unreachable nodes
    with pytest.raises(ValueError):
        reachable_from(g, [n])


def test_repair_connects_clusters(clustered_graph):
    X, g = clustered_graph
    before = g.copy()
    entry = np.array([0])
    assert reachable_from(g, entry).sum() < 100  # one cluster of 50 (+ nothing else)
    g2, st = repair_connectivity(X, g, metric="l2", entry_ids=entry)
    assert np.array_equal(g, before)  # copy=True leaves the input alone
    assert st["components_before"] == 40 and st["components_after"] == 1
    assert st["unreachable_before"] >= 1900 and st["unreachable_after"] == 0
    assert _scipy_labels(g2)[0] == 1
    assert _scipy_reach(g2, entry).all()
    assert st["links_added"] >= 2 * 39
    # links replace few slots: most of every row is still the exact k-NN list
    kept = np.mean([np.isin(g2[i], before[i]).mean() for i in range(len(g2))])
    assert kept > 0.9
    # at least a spanning tree of cross-cluster links, both ways (the other added links are
    # reverse links to nodes of a cluster that no other node points to)
    lab, _ = components(before)
    r, c = np.nonzero(g2 != before)
    cross = lab[r] != lab[g2[r, c]]
    assert cross.sum() >= 2 * 39
    pairs = {(a, b) for a, b in zip(lab[r][cross], lab[g2[r, c]][cross])}
    assert all((b, a) in pairs for a, b in pairs)


def test_repair_orphans_and_ip(rng):
    """One weak component whose nodes have no in-links: reachability needs reverse links."""
    n = 200
    X = rng.standard_normal((n, 8)).astype(np.float32)
    g = np.full((n, 4), -1, np.int32)
    g[1:, 0] = 0          # a star pointing to 0: nobody but 0 is reachable from 0
    g[0, :] = [1, 2, 3, 4]
    labels, c = components(g)
    assert c == 1
    g2, st = repair_connectivity(X, g, metric="ip", entry_ids=[0])
    assert st["unreachable_before"] == n - 5 and st["unreachable_after"] == 0
    assert _scipy_reach(g2, [0]).all()
    # no row took more than R // 2 repair links (the hub 0 was not overwritten)
    assert (g2 != g).sum(axis=1).max() <= 2


def _hub_graph(rng, n, R=8, hubs=8):
    """Every row points at the same few hub rows (an inner-product graph of skewed norms in
    miniature): hubs take R // 2 repair links each, so almost every node needs a link from its
    nearest reachable node instead of from a neighbour."""
    X = rng.standard_normal((n, 8)).astype(np.float32)
    g = np.full((n, R), -1, np.int32)
    g[:, :hubs] = np.arange(hubs, dtype=np.int32)
    g[np.arange(hubs), :hubs] = (np.arange(hubs)[:, None] + np.arange(1, hubs + 1)[None, :]) % hubs
    return X, g


def test_repair_many_unreachable_in_two_rounds(rng):
    """40k nodes behind 8 full hubs: the rounds link everything left from the nearest reachable
    nodes batch after batch (the old rounds took one batch of 16,384 each, with a BFS between:
    skewed norms 1M x 96 on the GPU ran out of its 64 rounds with 74k nodes unreachable)."""
    n = 40_000
    X, g = _hub_graph(rng, n)
    g2, st = repair_connectivity(X, g, metric="ip", entry_ids=[0], max_rounds=2)
    assert st["unreachable_before"] == n - 8 and st["unreachable_after"] == 0, st
    assert _scipy_reach(g2, [0]).all()
    assert st["links_added"] == n - 8      # one link per node: nothing links a node twice


def test_repair_left_unfinished_warns(rng):
    """Rounds that run out leave nodes unreachable: never silently."""
    X, g = _hub_graph(rng, 3000)
    with pytest.warns(RuntimeWarning, match="unreachable"):
        _g2, st = repair_connectivity(X, g, metric="ip", entry_ids=[0], max_rounds=1)
    assert st["unreachable_after"] > 0


def test_repair_marks_what_a_link_reaches(rng):
    """A node made reachable by one repair link makes what it reaches reachable too: fewer links
    than unreachable nodes on a k-NN graph, and every node reached (checked by SciPy's BFS)."""
    X = rng.standard_normal((1500, 8)).astype(np.float32)
    _d, idx = knnkit.knn(X, k=6, device="cpu")
    g = np.full((1500, 12), -1, np.int32)
    g[:, :6] = idx
    g2, st = repair_connectivity(X, g, metric="l2", entry_ids=[0])
    assert st["unreachable_before"] > 0 and st["unreachable_after"] == 0
    assert st["links_added"] < st["unreachable_before"], st
    assert _scipy_reach(g2, [0]).all()
    # only slots that were empty or not on the BFS tree changed; the k-NN part keeps most edges
    assert (g2[:, :6] == g[:, :6]).mean() > 0.95


def _knn_graph_with_orphans(rng, n=3000, d=24, R=8):
    """A full-rowed exact k-NN graph on uniform data (some nodes have no in-link at all) and a few
    entry points: one weak component with some nodes no entry reaches."""
    X = rng.random((n, d), dtype=np.float32)
    _d, i = knnkit.knn(X, k=R, device="cpu")
    return X, np.asarray(i, np.int32)


def test_few_unreachable_repair_without_bfs_tree(rng):
    """The device path's repair of a few unreachable nodes (run here on numpy with the host BFS):
    everything reachable afterwards, rows full, at most R // 2 repair links per row, only the
    links it reports, and every link r -> u joins u to one of its own reachable out-neighbours."""
    from knnkit.index._connect import _repair_few_on_device

    X, g = _knn_graph_with_orphans(rng)
    entry = np.array([0, 1, 2], np.int64)
    before = ~reachable_from(g, entry)
    assert 0 < before.sum() <= 4096 and components(g)[1] == 1
    g2 = g.copy()
    added, rounds, m0 = _repair_few_on_device(g2, entry, mask_fn=reachable_from)
    assert m0 == before.sum() and rounds >= 1 and added >= m0
    assert _scipy_reach(g2, entry).all() and (g2 >= 0).all()
    changed = g2 != g
    assert changed.sum() == added
    assert changed.sum(axis=1).max() <= g.shape[1] // 2
    r, c = np.nonzero(changed)
    u = g2[r, c]
    assert all(r_ in g[u_] for r_, u_ in zip(r, u))  # r was an out-neighbour of u
    # the caller's own first mask (the GPU path's, from the BFS that counted the unreachable) gives
    # the same links and one BFS fewer
    calls = []

    def counting_bfs(graph, sources):
        calls.append(1)
        return reachable_from(graph, sources)

    g4 = g.copy()
    assert _repair_few_on_device(g4, entry, mask_fn=counting_bfs, first_mask=~before) == (added, rounds, m0)
    assert np.array_equal(g4, g2) and len(calls) == rounds
    # the host path (the CPU's, and the GPU's fallback) reaches the same end its own way
    g3, st = repair_connectivity(X, g, metric="l2", entry_ids=entry)
    assert st["unreachable_after"] == 0 and _scipy_reach(g3, entry).all()


def test_few_unreachable_repair_gives_way(rng):
    """A node whose out-neighbours are all unreachable too (a closed pair) cannot be linked from
    its own list: the device repair returns None (the host path then links it by distance)."""
    from knnkit.index._connect import _repair_few_on_device

    n = 50
    g = np.full((n, 4), -1, np.int32)
    g[:48, 0] = (np.arange(48) + 1) % 48      # a ring over 0..47
    g[48, 0], g[49, 0] = 49, 48              # a closed pair, linked into the ring by nothing
    g[48, 1] = 0                              # (weakly connected through 48 -> 0)
    g2 = g.copy()
    out = _repair_few_on_device(g2, np.array([0]), mask_fn=reachable_from)
    # 48 has a reachable out-neighbour (0): linked; then 49 is reached through 48 -> 49
    assert out is not None and _scipy_reach(g2, [0]).all()
    g4 = np.full((n, 4), -1, np.int32)
    g4[:48, 0] = (np.arange(48) + 1) % 48
    g4[48, 0], g4[49, 0] = 49, 48
    g4[0, 1] = 47  # the pair is its own weak component here; only its out-lists matter below
    assert _repair_few_on_device(g4.copy(), np.array([0]), mask_fn=reachable_from) is None


def test_repair_in_place_and_full_rows(clustered_graph):
    X, g = clustered_graph
    g = g.copy()
    g2, st = repair_connectivity(X, g, metric="l2", entry_ids=[5], copy=False, links_per_component=1)
    assert g2 is g and st["components_after"] == 1 and st["unreachable_after"] == 0
    assert (g2 >= 0).all()  # full rows: links replaced slots, no -1 appeared


def test_entry_points_per_component(clustered_graph):
    X, g = clustered_graph
    labels, c = components(g)
    med, cen = entry_points_per_component(labels, X)
    assert med.shape == (c,) and cen.shape == (c, X.shape[1])
    assert np.array_equal(labels[med], np.arange(c))       # one entry inside every component
    # each is its component's member nearest the centroid
    for k in range(0, c, 7):
        mem = np.flatnonzero(labels == k)
        d = ((X[mem] - X[mem].mean(0)) ** 2).sum(1)
        assert d[mem == med[k]][0] <= d.min() + 1e-6
    # the default sqrt(n) = 45 k-means entries on 40 clusters; combined, every cluster has an entry
    ep = build_entry_points(X, 8, "l2", random_state=0)
    assert len(np.unique(labels[ep.medoids])) < c
    both = combine_entry_points(ep, med, cen)
    assert len(np.unique(labels[both.medoids])) == c
    assert len(both) == len(np.unique(both.medoids))
    m2, _ = entry_points_per_component(labels, X, max_entries=5)
    assert m2.shape == (5,)


def test_bad_arguments(clustered_graph):
    X, g = clustered_graph
    with pytest.raises(ValueError, match="metric"):
        repair_connectivity(X, g, metric="cosine", entry_ids=[0])
    with pytest.raises(ValueError, match="entry_ids"):
        repair_connectivity(X, g, metric="l2", entry_ids=[-1])
    with pytest.raises(ValueError, match="links_per_component"):
        repair_connectivity(X, g, metric="l2", entry_ids=[0], links_per_component=0)
    with pytest.raises(ValueError, match="X must be"):
        repair_connectivity(X[:10], g, metric="l2", entry_ids=[0])
    with pytest.raises(ValueError, match="2-D"):
        components(g.ravel())


@pytest.mark.parametrize("kind", ["duplicates", "skewed_ip"])
def test_repair_reaches_everything_on_hard_sets(kind):
    """Inner product with skewed norms (hubs take the in-links): most points start unreachable;
    after the repair none is, in a few rounds. Many exact duplicates used to be the other such
    case (pruning kept one link into a group of copies); the build now makes candidate lists on
    the distinct rows and links each group as a cycle, so nothing starts unreachable there. Both:
    the default index search finds the neighbours."""
    import knnkit
    from knnkit.datasets.suite import make_duplicates, make_skewed_norms
    from knnkit.evaluate import recall

    if kind == "duplicates":
        X, Q = make_duplicates(12_000, 3, 2_500, n_queries=200, random_state=5)
        metric = "sqeuclidean"
    else:
        X, Q = make_skewed_norms(12_000, 32, n_queries=200, random_state=5)
        metric = "inner_product"
    index = knnkit.GraphIndex.build(X, metric=metric, device="cpu", random_state=0)
    conn = index.build_params["connectivity"]
    if kind == "duplicates":
        assert conn["unreachable_before"] == 0 and conn["components_before"] == 1, conn
    else:
        assert conn["unreachable_before"] > 1000, conn  # the case is real
    assert conn["unreachable_after"] == 0 and conn["reach_rounds"] <= 16, conn
    from knnkit.index._connect import reachable_from

    assert bool(reachable_from(index.graph, index.entry_points).all())
    D, T = knnkit.knn(X, Q, k=10, metric=metric, device="cpu")
    d, i = index.search(Q, k=10)
    assert recall(i, T, found_distances=d, true_distances=D, similarity=metric == "inner_product") >= 0.95


def test_argmin_per_label_host(rng):
    from knnkit.index._connect import _argmin_per_label

    labels = rng.integers(0, 50, 5000)
    d = rng.integers(0, 7, 5000).astype(np.float32)
    got = _argmin_per_label(np, labels, d)
    want = [min(np.flatnonzero(labels == c), key=lambda i: (d[i], i)) for c in np.unique(labels)]
    assert got.tolist() == want


def test_stray_links_do_not_hide_clusters(rng):
    """Tight clusters joined by a few random links (as a GPU NN-Descent graph keeps some of its
    random start) are one component; the short-edge components still give each cluster a door."""
    from knnkit.index._connect import short_edge_components
    from knnkit.index._engine import _connect

    X = make_tight_clusters(20_000, 16, 1000, 0.01, random_state=int(rng.integers(1 << 30)))
    _, idx = knnkit.knn(X, k=12, device="cpu")
    g = idx.astype(np.int32)
    clusters, n_clusters = components(g)
    assert n_clusters >= 900
    rows = rng.choice(len(g), 4000, replace=False)
    g[rows, -1] = rng.integers(0, len(g), 4000)  # stray links, one in 60 edges
    assert components(g)[1] < 50
    assert short_edge_components(X, g)[1] >= 0.9 * n_clusters
    entry = build_entry_points(X, 141, "l2", random_state=0)
    _g2, entry2, conn = _connect(X, g, entry, "l2")
    doors = np.unique(clusters[np.asarray(entry2.medoids)])
    assert len(doors) >= 0.95 * n_clusters, (len(doors), n_clusters)
    assert conn["components_after"] == 1 and conn["unreachable_after"] == 0


def test_short_edge_components_numba_and_numpy_paths_agree(rng, monkeypatch):
    import knnkit.index._connect as conn

    X = make_tight_clusters(3000, 8, 100, 0.01, random_state=int(rng.integers(1 << 30)))
    _, idx = knnkit.knn(X, k=8, device="cpu")
    g = idx.astype(np.int32)
    g[rng.choice(3000, 300, replace=False), -1] = -1
    g[rng.choice(3000, 300, replace=False), 0] = rng.integers(0, 3000, 300)
    lab_np, c_np = conn.short_edge_components(X, g)
    monkeypatch.setattr(conn, "NUMBA_EDGE_WORK", 0)
    lab_nb, c_nb = conn.short_edge_components(X, g)
    assert c_np == c_nb and np.array_equal(lab_np, lab_nb)


def test_doors_when_kmeans_entries_match_the_clusters(rng):
    """As many k-means entries as clusters still leave some clusters without one (k-means is not a
    partition by cluster); every short-edge component gets its own door whenever they outnumber the
    graph's components (a gate at twice the k-means entries left 1M x 128 tight_c1000 at 0.947)."""
    from knnkit.index._engine import _connect

    X = make_tight_clusters(20_000, 16, 400, 0.01, random_state=int(rng.integers(1 << 30)))
    _, idx = knnkit.knn(X, k=12, device="cpu")
    g = idx.astype(np.int32)
    clusters, n_clusters = components(g)
    rows = rng.choice(len(g), 1500, replace=False)
    g[rows, -1] = rng.integers(0, len(g), 1500)  # stray links join the clusters into a few components
    assert components(g)[1] < n_clusters // 2
    entry = build_entry_points(X, n_clusters, "l2", random_state=0)  # as many entries as clusters
    kmeans_doors = len(np.unique(clusters[np.asarray(entry.medoids)]))
    _g2, entry2, conn = _connect(X, g, entry, "l2")
    doors = len(np.unique(clusters[np.asarray(entry2.medoids)]))
    assert doors >= 0.98 * n_clusters, (doors, kmeans_doors, n_clusters)


def test_long_edges_measured_against_the_shortest_edge(rng):
    """Rows filled mostly with links to other clusters (as a reverse-edge pass can leave them) have a
    long median edge; their stray links are still long against the row's shortest edge."""
    from knnkit.index._connect import short_edge_components

    X = make_tight_clusters(4000, 16, 200, 0.01, random_state=int(rng.integers(1 << 30)))
    _, idx = knnkit.knn(X, k=9, device="cpu")
    g = idx.astype(np.int32)
    labels, n_clusters = components(g)[0], components(g)[1]
    # one row in every component (so none is left without stray links), then random rows up to 300
    firsts = np.unique(labels, return_index=True)[1]
    others = np.setdiff1d(np.arange(len(g)), firsts)
    rows = np.concatenate([firsts, rng.choice(others, 300 - len(firsts), replace=False)])
    g[rows, 3:] = rng.integers(0, len(g), (300, g.shape[1] - 3))  # 6 of 9 edges leave the cluster
    g[firsts, 3] = np.roll(firsts, -1)  # a chain through the components: connected by construction
    assert components(g)[1] == 1
    assert short_edge_components(X, g)[1] >= 0.95 * n_clusters


def _pass_reference(graph, parent, repair_links, cap):
    """The reach pass's documented rule in plain Python (parent / repair_links only, no state
    array, no early skip): each unreachable u, in order, is linked from its first reachable
    out-neighbour r with a free slot and fewer than ``cap`` repair links; a row without a free
    slot is closed; what u reaches is marked at once."""
    n, R = graph.shape

    def free_slot(r):
        for s in range(R):
            if graph[r, s] < 0:
                return s
        for s in range(R - 1, -1, -1):
            if parent[graph[r, s]] != r:
                return s
        return -1

    for u in range(n):
        if parent[u] != -2:
            continue
        for r in graph[u]:
            if r < 0 or r >= n or parent[r] == -2 or repair_links[r] >= cap:
                continue
            s = free_slot(r)
            if s < 0:
                repair_links[r] = cap
                continue
            graph[r, s] = u
            parent[u] = r
            repair_links[r] += 1
            stack = [u]
            while stack:
                w = stack.pop(0)
                for v in graph[w]:
                    if 0 <= v < n and parent[v] == -2:
                        parent[v] = w
                        stack.append(v)
            break


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reach_pass_equals_its_reference(seed):
    # rows pointing mostly at a few hubs (inner-product graphs), some at a local block, hubs'
    # rows among themselves; a few hubs already out of room: the state array and the skip of rows
    # with no open neighbour must give the same links and parents as the plain rule
    from knnkit.index import _connect as C

    rng = np.random.default_rng(seed)
    n, R, H = 3000, 8, 40
    hubs = rng.choice(n, H, replace=False)
    g = np.empty((n, R), np.int32)
    g[:, :4] = hubs[rng.integers(0, H, size=(n, 4))]
    g[:, 4:] = ((np.arange(n)[:, None] // 5) * 5 + rng.integers(0, 5, size=(n, R - 4))) % n
    g[hubs] = hubs[rng.integers(0, H, size=(H, R))]
    g[rng.random((n, R)) < 0.05] = -1
    entry = hubs[:5].astype(np.int64)
    parent = np.empty(n, np.int64)
    queue = np.empty(n, np.int64)
    C._bfs_tree(g, entry, parent, queue)
    cap = R // 2
    rl = np.zeros(n, np.int32)
    rl[hubs[:10]] = cap  # already full
    g_ref, p_ref, rl_ref = g.copy(), parent.copy(), rl.copy()
    _pass_reference(g_ref, p_ref, rl_ref, cap)
    state = C._open_state(parent, rl, cap)
    added, newly = C._link_unreachable(g, parent, rl, cap, queue, state)
    assert added > 0 and newly > added  # links made, and marks beyond the linked rows
    np.testing.assert_array_equal(g, g_ref)
    np.testing.assert_array_equal(parent, p_ref)
    np.testing.assert_array_equal(rl, rl_ref)
    # the state array is in step with parent and repair_links
    np.testing.assert_array_equal((state & 1) != 0, parent != -2)
    np.testing.assert_array_equal((state & 2) != 0, (parent != -2) & (rl < cap))
