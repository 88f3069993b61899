"""The GPU connectivity path (``index/_connect_gpu.py`` + the ``GPU_KERNELS`` branches of
``_connect.py``) run on the CPU against an emulation of CuPy and of the ``connect.cu`` kernels
(``_connect_fake_gpu.py``), checked against the host algorithms: union-find labels, BFS counts,
the repair's stats and graphs. The real kernels: ``test_connect_gpu.py`` (GPU) and
``test_connect_kernels_host.py`` (their per-thread code compiled for the host)."""

import numpy as np
import pytest

import knnkit
from _connect_fake_gpu import FakeArray, dev, install
from knnkit.datasets.suite import make_tight_clusters
from knnkit.index import _connect as conn
from knnkit.index import _connect_gpu as cg
from knnkit.index._connect import _bfs_tree, _union_find_roots, components, reachable_from, repair_connectivity


def _graphs(rng):
    """(name, graph): random with holes, many components, a chain, self loops, odd sizes."""
    out = []
    n = 1000
    g = rng.integers(0, n, (n, 6)).astype(np.int32)
    g[rng.random(g.shape) < 0.3] = -1
    out.append(("random_holes", g))
    n = 777  # not a multiple of any block size
    g = rng.integers(0, n, (n, 2)).astype(np.int32)
    g[rng.random(g.shape) < 0.7] = -1
    out.append(("many_components", g))
    n = 600
    g = np.full((n, 3), -1, np.int32)
    perm = rng.permutation(n)            # a chain in random id order: 599 BFS levels
    g[perm[:-1], 0] = perm[1:]
    out.append(("chain", g))
    n = 301
    g = np.tile(np.arange(n, dtype=np.int32)[:, None], (1, 4))  # self loops only ...
    g[::3, 1] = (np.arange(0, n, 3) + 1) % n                     # ... and a few real edges
    g[5, 2] = n + 7                                             # an id >= n: an empty slot
    out.append(("self_loops", g))
    out.append(("no_edges", np.full((37, 5), -1, np.int32)))
    out.append(("zero_width", np.zeros((9, 0), np.int32)))
    return out


def _host_reach(g, src):
    parent = np.empty(g.shape[0], np.int64)
    return _bfs_tree(np.ascontiguousarray(g), np.unique(np.asarray(src, np.int64)), parent,
                     np.empty(g.shape[0], np.int64)), parent != -2


def test_component_roots_equal_union_find(rng, monkeypatch):
    install(monkeypatch, seed=int(rng.integers(1 << 30)))
    for name, g in _graphs(rng):
        roots = cg.component_roots(dev(g))
        assert isinstance(roots, FakeArray) and roots.dtype == np.int32
        assert np.array_equal(roots.get(), _union_find_roots(g)), name
        lab_d, c_d = components(dev(g))         # method "kernel" (the cupy default)
        lab_h, c_h = components(g)
        assert c_d == c_h and np.array_equal(lab_d.get(), lab_h), name
    g64 = _graphs(rng)[0][1].astype(np.int64)    # other dtypes are converted
    assert np.array_equal(cg.component_roots(dev(g64)).get(), _union_find_roots(g64))


def test_reach_equals_host_bfs(rng, monkeypatch):
    install(monkeypatch, seed=int(rng.integers(1 << 30)))
    for name, g in _graphs(rng):
        n = g.shape[0]
        src = rng.choice(n, min(n, 3), replace=False)
        want_count, want = _host_reach(g, src)
        bits, count = cg.reach_bits(dev(g), src)
        assert count == want_count, name
        mask = cg.reachable_mask(dev(g), np.concatenate([src, src, [-1]]))  # duplicates, -1 ignored
        assert np.array_equal(mask.get(), want), name
        assert np.array_equal(reachable_from(dev(g), src).get(), want), name
        assert cg.reach_count(dev(g), src) == want_count
    chain = dict(_graphs(rng))["chain"]
    head = np.flatnonzero(~np.isin(np.arange(600), chain[:, 0]))   # the chain's first node
    assert cg.reach_count(dev(chain), head) == 600
    assert cg.reach_count(dev(chain), head, max_levels=600) == 600    # 600 levels: exactly enough
    assert cg.reach_count(dev(chain), head, max_levels=599) is None   # the cap: left to the host
    assert cg.reach_bits(dev(chain), np.array([], np.int64))[1] == 0


def test_edge_lengths_and_long_edges(rng, monkeypatch):
    install(monkeypatch, seed=int(rng.integers(1 << 30)))
    n, d, R = 500, 37, 7
    X = rng.standard_normal((n, d)).astype(np.float32)
    X[1] = X[0]                                          # a duplicate: zero-length edges
    g = rng.integers(0, n, (n, R)).astype(np.int32)
    g[rng.random(g.shape) < 0.2] = -1
    g[0, 0], g[1, 0] = 1, 0
    dist = cg.edge_sqdist(dev(X), dev(g)).get()
    valid = g >= 0
    ref = np.zeros((n, R), np.float32)
    for k in range(d):                                   # the kernel's order: sequential float32
        t = X[np.where(valid, g, 0), k] - X[:, None, k]
        ref = ref + t * t
    assert np.isnan(dist[~valid]).all()
    assert np.array_equal(dist[valid], ref[valid])
    d64 = ((X[np.where(valid, g, 0)].astype(np.float64) - X[:, None].astype(np.float64)) ** 2).sum(-1)
    np.testing.assert_allclose(dist[valid], d64[valid], rtol=1e-5)
    assert dist[0, 0] == 0 and dist[1, 0] == 0
    # the long-edge rule of short_edge_components, written out on the host
    near = np.where(dist > 0, dist, np.inf).min(axis=1)
    near = np.where(np.isfinite(near), near, 0).astype(np.float32)
    longs = []
    for factor in (64.0, 1.5, 1.05):
        short, n_long = cg.drop_long_edges(dev(g), dev(dist), dev(near), factor)
        longs.append(n_long)
        gi = np.where(valid, g, 0)
        scale = np.maximum(near[:, None], near[gi])
        long_ = (dist > np.float32(factor) * scale) & (near[:, None] > 0) & (near[gi] > 0)
        assert n_long == int(long_.sum()) and np.array_equal(short.get(), np.where(long_, -1, g))
    assert longs[-1] > 0                     # the rule was exercised


def test_short_edge_components_on_the_kernel_path(rng, monkeypatch):
    X = make_tight_clusters(3000, 8, 100, 0.01, random_state=int(rng.integers(1 << 30)))
    _, idx = knnkit.knn(X, k=8, device="cpu")
    g = idx.astype(np.int32)
    g[rng.choice(3000, 300, replace=False), -1] = -1
    g[rng.choice(3000, 300, replace=False), 0] = rng.integers(0, 3000, 300)   # stray links
    lab_h, c_h = conn.short_edge_components(X, g)
    own = components(g)
    install(monkeypatch, seed=int(rng.integers(1 << 30)))
    lab_d, c_d = conn.short_edge_components(dev(X), dev(g), components_of=own)
    assert isinstance(lab_d, FakeArray) and c_d == c_h > own[1]
    assert np.array_equal(lab_d.get(), lab_h)
    # no long edge: the graph's own components come back as they are
    X2 = np.random.default_rng(1).standard_normal((400, 8)).astype(np.float32)
    _, i2 = knnkit.knn(X2, k=6, device="cpu")
    own2 = components(i2.astype(np.int32))
    assert conn.short_edge_components(dev(X2), dev(i2.astype(np.int32)), components_of=own2) is own2


@pytest.fixture
def connected(rng):
    """A k-NN graph plus its reverse links: one component, everything reachable from node 0."""
    X = rng.standard_normal((1500, 8)).astype(np.float32)
    _, idx = knnkit.knn(X, k=6, device="cpu")
    g = np.full((1500, 12), -1, np.int32)
    g[:, :6] = idx
    fill = np.full(1500, 6)
    for u in range(1500):
        for v in idx[u]:
            if fill[v] < 12 and u not in g[v]:
                g[v, fill[v]] = u
                fill[v] += 1
    assert components(g)[1] == 1 and reachable_from(g, [0]).all()
    return X, g


@pytest.mark.parametrize("copy", [True, False])
def test_repair_fast_path_skips_the_host(connected, copy, monkeypatch):
    X, g = connected
    _, st_h = repair_connectivity(X, g, metric="l2", entry_ids=[0, 3])
    install(monkeypatch)
    host_copies = []
    to_host = conn._to_host
    monkeypatch.setattr(conn, "_to_host", lambda a: host_copies.append(a.shape) or to_host(a))
    gd = dev(g)
    g2, st_d = repair_connectivity(dev(X), gd, metric="l2", entry_ids=[0, 3], copy=copy)
    assert isinstance(g2, FakeArray) and (g2 is gd) != copy and np.array_equal(g2.get(), g)
    assert g.shape not in host_copies                       # the graph never went to the host
    assert list(st_d) == list(st_h)                         # the same stats, in the same order
    for k in st_h:
        if not k.endswith("seconds") and k != "link_placement":
            assert st_d[k] == st_h[k], k


@pytest.mark.parametrize("case", ["unreachable", "components", "deep"])
def test_repair_falls_back_to_the_host(connected, case, rng, monkeypatch):
    """Not "one component, all reachable" (or too deep to tell): the host repair runs as before and
    gives the CPU's graph and stats (the labels come from the kernels)."""
    X, g = connected
    g = g.copy()
    if case == "unreachable":
        g[:, 6:] = -1          # the plain k-NN graph: some nodes have no in-link
        assert components(g)[1] == 1 and not reachable_from(g, [0]).all()
    elif case == "components":
        X = make_tight_clusters(2000, 16, 40, 0.01, random_state=3)
        _, idx = knnkit.knn(X, k=10, device="cpu")
        g = idx.astype(np.int32)
        assert components(g)[1] == 40
    else:
        monkeypatch.setattr(cg, "MAX_BFS_LEVELS", 2)
    g_h, st_h = repair_connectivity(X, g, metric="l2", entry_ids=[0])
    _, kernels = install(monkeypatch)
    # a few unreachable nodes are repaired on the device (test_few_unreachable_repaired_on_the_device_with_one_first_bfs);
    # this test is about the host path, which links fewer of them (what one link reaches is marked)
    monkeypatch.setattr(conn, "FEW_ON_DEVICE", False)
    gd = dev(g)
    g_d, st_d = repair_connectivity(dev(X), gd, metric="l2", entry_ids=[0], copy=False)
    assert g_d is gd and np.array_equal(g_d.get(), g_h)
    assert "cc_hook" in kernels.calls   # the labels came from the kernels
    if case == "deep":
        assert kernels.calls.count("bfs_expand") == 2
    for k in st_h:
        if not k.endswith("seconds") and k != "link_placement":
            assert st_d[k] == st_h[k], k


def test_engine_connect_on_the_kernel_path(connected, monkeypatch):
    """``_engine._connect`` on a connected graph: the kernel path's answer equals the CPU's."""
    from knnkit.index._engine import _connect
    from knnkit.index._entry import EntryPoints, build_entry_points

    X, g = connected
    entry = build_entry_points(X, 9, "l2", random_state=0)
    _, e_h, c_h = _connect(X, g.copy(), entry, "l2")
    _, kernels = install(monkeypatch)
    ed = EntryPoints(dev(entry.centroids), dev(entry.medoids), "l2")
    g_d, e_d, c_d = _connect(dev(X), dev(g), ed, "l2")
    assert np.array_equal(g_d.get(), g) and np.array_equal(np.asarray(e_d.medoids), entry.medoids)
    assert {k: v for k, v in c_d.items() if "seconds" not in k} == {k: v for k, v in c_h.items() if "seconds" not in k}
    assert {"cc_hook", "bfs_expand", "edge_sqdist", "short_graph"} <= set(kernels.calls)


def test_old_path_still_selectable(connected, monkeypatch):
    """``GPU_KERNELS = False``: no kernel of connect.cu runs, the host path answers (A/B timings)."""
    X, g = connected
    _, st_h = repair_connectivity(X, g, metric="l2", entry_ids=[0])
    _, kernels = install(monkeypatch)
    monkeypatch.setattr(conn, "GPU_KERNELS", False)
    _, st_d = repair_connectivity(dev(X), dev(g), metric="l2", entry_ids=[0])
    assert np.array_equal(reachable_from(dev(g), [0]).get(), reachable_from(g, [0]))  # "frontier"
    assert kernels.calls == []
    for k in st_h:
        if not k.endswith("seconds") and k != "link_placement":
            assert st_d[k] == st_h[k], k


@pytest.mark.parametrize("placement", ["hybrid", "host", "device", "auto"])
def test_link_placements_agree(placement, monkeypatch):
    """The component rounds of a GPU graph give the CPU's graph and statistics wherever they run
    (``LINK_PLACEMENT``): the in-degree counted on the device, the reach counted by the kernels
    (the host BFS skipped when every node is reached), the passes over all points on the device
    and the member searches on a host copy (hybrid)."""
    from knnkit.index import _connect

    X = make_tight_clusters(1800, 12, 30, 0.01, random_state=8)
    _, idx = knnkit.knn(X, k=8, device="cpu")
    g = idx.astype(np.int32)
    labels, c = components(g)
    assert c == 30
    doors = [int(np.flatnonzero(labels == lab)[0]) for lab in range(c)]  # a door into every cluster
    entry = doors + np.flatnonzero(~reachable_from(g, doors)).tolist()  # and every node reached
    g_h, st_h = repair_connectivity(X, g.copy(), metric="l2", entry_ids=entry)
    _, kernels = install(monkeypatch)
    monkeypatch.setattr(_connect, "LINK_PLACEMENT", placement)
    bfs = []
    real_bfs = _connect._bfs_tree
    monkeypatch.setattr(_connect, "_bfs_tree", lambda *a: bfs.append(1) or real_bfs(*a))
    g_d, st_d = repair_connectivity(dev(X), dev(g), metric="l2", entry_ids=entry, copy=False)
    assert np.array_equal(g_d.get(), g_h)
    assert st_d["components_after"] == 1 and st_d["unreachable_after"] == 0
    for k in st_h:
        if not k.endswith("seconds") and k != "link_placement":
            assert st_d[k] == st_h[k], k
    # every node reached before and after the links: counted by the kernels, no host BFS tree
    assert st_d["unreachable_before"] == 0 and st_d["reach_rounds"] == 0
    # auto: 1800 x 12 float32 in 30 components is far below LINK_DEVICE_BYTES each: hybrid
    assert st_d["link_placement"] == ("hybrid" if placement == "auto" else placement)
    assert st_h["link_placement"] is None
    assert kernels.calls.count("bfs_expand") >= 2 and not bfs
    with pytest.raises(ValueError, match="LINK_PLACEMENT"):
        monkeypatch.setattr(_connect, "LINK_PLACEMENT", "gpu")
        repair_connectivity(dev(X), dev(g), metric="l2", entry_ids=entry)


def test_few_unreachable_repaired_on_the_device_with_one_first_bfs(connected, monkeypatch):
    """A few nodes without in-links: repaired on the device (no host copy), everything reachable
    afterwards, and the BFS that counted them is the repair's first mask (one BFS per round after)."""
    X, g = connected
    g = g.copy()
    cut = np.array([5, 300, 1200])
    g[np.isin(g, cut)] = -1    # no links into them: unreachable, still one weak component
    assert components(g)[1] == 1 and reachable_from(g, [0]).sum() == 1500 - 3
    _, kernels = install(monkeypatch)
    monkeypatch.setattr(conn, "FEW_ON_DEVICE", True)
    g_d, st = repair_connectivity(dev(X), dev(g), metric="l2", entry_ids=[0], copy=True)
    assert st["reach_placement"] == "device" and st["unreachable_before"] == 3 and st["links_added"] >= 3
    assert reachable_from(g_d.get(), [0]).all()
    # the BFS that counted, then one per round after the first (whose mask is the count's bits);
    # the last round's BFS finds nothing left (two BFS before, for the same rounds)
    assert kernels.calls.count("bfs_seed") == 1 + st["reach_rounds"]
