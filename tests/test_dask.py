"""knnkit.dask on CPU workers (a LocalCluster): exact results equal knnkit.knn, graphs and the
sharded index reach the single-process recall, lost workers give clear errors or are survived."""

import time

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")
da = pytest.importorskip("dask.array")

import knnkit  # noqa: E402
import knnkit.dask  # noqa: E402
from knnkit.evaluate import recall  # noqa: E402


def _cluster():
    return distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None)


@pytest.fixture(scope="module")
def client():
    with _cluster() as cluster, distributed.Client(cluster) as c:
        yield c


def _tie_forgiving_equal(d, i, d0, i0):
    """Equal distances everywhere; ids equal wherever the distance is not tied in the row."""
    np.testing.assert_allclose(d, d0, rtol=1e-6, atol=1e-6)
    for r in range(i.shape[0]):
        if len(np.unique(d0[r])) == d0.shape[1]:
            assert (i[r] == i0[r]).all()


@pytest.mark.parametrize("metric", ["sqeuclidean", "inner_product", "cosine"])
def test_knn_equals_single_process(client, rng, metric):
    X = rng.standard_normal((4003, 12)).astype(np.float32)
    Q = rng.standard_normal((77, 12)).astype(np.float32)
    d, i = knnkit.dask.knn(X, Q, k=9, metric=metric, client=client, device="cpu", n_parts=3)
    d0, i0 = knnkit.knn(X, Q, k=9, metric=metric, device="cpu")
    assert d.shape == i.shape == (77, 9)
    _tie_forgiving_equal(d, i, d0, i0)


def test_knn_k_larger_than_a_partition_and_duplicates(client, rng):
    base = rng.random((40, 5), dtype=np.float32)
    X = np.concatenate([base, base, base[:7]])  # exact duplicates across partitions
    Q = base[:6] + 0.001
    d, i = knnkit.dask.knn(X, Q, k=50, client=client, device="cpu", n_parts=5)  # partitions of 17 points
    d0, i0 = knnkit.knn(X, Q, k=50, device="cpu")
    _tie_forgiving_equal(d, i, d0, i0)
    assert (i >= 0).all() and all(len(set(r)) == 50 for r in i.tolist())


def test_knn_all_points_and_dask_array(client, rng):
    """Dask arrays in, dask arrays out (blocks left on the workers), equal to the single process;
    compute=True gathers them."""
    X = rng.random((3001, 6), dtype=np.float32)
    dX = da.from_array(X, chunks=(700, 3))
    d, i = knnkit.dask.knn(dX, k=4, client=client, device="cpu")
    assert isinstance(d, da.Array) and isinstance(i, da.Array)
    assert i.chunks == ((700, 700, 700, 700, 201), (4,)) and (d.dtype, i.dtype) == (np.float32, np.int64)
    d0, i0 = knnkit.knn(X, k=4, device="cpu")
    d, i = client.persist([d, i])
    d, i = d.compute(), i.compute()
    _tie_forgiving_equal(d, i, d0, i0)
    assert not (i == np.arange(3001)[:, None]).any()
    d1, i1 = knnkit.dask.knn(dX, k=4, client=client, device="cpu", compute=True)
    assert isinstance(i1, np.ndarray) and (i1 == i).all() and (d1 == d).all()
    dQ = da.from_array(X[:500], chunks=(128, 6))
    d, i = knnkit.dask.knn(dX, dQ, k=3, client=client, device="cpu", query_block=200)
    assert isinstance(i, da.Array) and i.chunks[0] == (200, 200, 100)  # blocks of query_block rows
    assert (i.compute()[:, 0] == np.arange(500)).all()
    d, i = knnkit.dask.knn(X, X[:500], k=3, client=client, device="cpu", compute=False, query_block=200)
    assert isinstance(i, da.Array) and i.chunks[0] == (200, 200, 100)
    assert (i.compute()[:, 0] == np.arange(500)).all()
    with pytest.raises(TypeError, match="compute"):
        knnkit.dask.knn(X, X[:5], k=3, client=client, device="cpu", compute="yes")


def test_knn_prepares_each_partition_once(client, rng):
    """Every partition is validated and placed once, whatever the number of query blocks; the
    lists equal the single process's."""
    from dask.utils import key_split

    X = rng.standard_normal((2000, 8)).astype(np.float32)
    Q = rng.standard_normal((500, 8)).astype(np.float32)
    with distributed.get_task_stream(client=client) as ts:
        d, i = knnkit.dask.knn(X, Q, k=6, client=client, device="cpu", n_parts=2, query_block=100)
    d0, i0 = knnkit.knn(X, Q, k=6, device="cpu")
    _tie_forgiving_equal(d, i, d0, i0)
    counts = {}
    for r in ts.data:
        counts[key_split(r["key"])] = counts.get(key_split(r["key"]), 0) + 1
    assert counts["prepare_part"] == 2 and counts["exact_prepared"] == 2 * 5, counts


def test_validation(client, rng):
    X = rng.random((100, 4), dtype=np.float32)
    with pytest.raises(ValueError, match="k"):
        knnkit.dask.knn(X, X[:2], k=101, client=client, device="cpu")
    with pytest.raises(TypeError, match="k"):
        knnkit.dask.knn(X, X[:2], k=2.5, client=client, device="cpu")
    with pytest.raises(ValueError, match="metric"):
        knnkit.dask.knn(X, X[:2], k=2, metric="hamming", client=client, device="cpu")
    with pytest.raises(ValueError, match="device"):
        knnkit.dask.knn(X, X[:2], k=2, client=client, device="tpu")
    with pytest.raises(ValueError, match="dimension"):
        knnkit.dask.knn(X, X[:2, :3], k=2, client=client, device="cpu")
    with pytest.raises(TypeError, match="client"):
        knnkit.dask.knn(X, X[:2], k=2, client="localhost:8786")
    with pytest.raises(ValueError, match="n_parts"):
        knnkit.dask.knn(X, X[:2], k=2, client=client, device="cpu", n_parts=0)
    with pytest.raises(ValueError, match="replicas"):
        knnkit.dask.ShardedIndex.build(X, replicas=3, client=client, device="cpu")
    with pytest.raises(ValueError, match="shards"):
        knnkit.dask.ShardedIndex.build(X, shards=60, client=client, device="cpu")


@pytest.mark.parametrize("second_stage", ["search", "graph"])
def test_knn_graph_recall_matches_single_process(client, second_stage):
    from knnkit.datasets import make_clustered

    X = np.asarray(make_clustered(8000, 24, random_state=3), dtype=np.float32)
    _, T = knnkit.knn(X, k=10, device="cpu")
    g = knnkit.dask.knn_graph(X, k=10, client=client, device="cpu", n_parts=3, random_state=1, partition="rows",
                              second_stage=second_stage)
    g0 = knnkit.knn_graph(X, k=10, device="cpu", random_state=1)
    r, r0 = recall(g.indices, T), recall(g0.indices, T)
    assert g.indices.shape == (8000, 10) and (g.indices >= 0).all()
    assert not (g.indices == np.arange(8000)[:, None]).any()
    assert r >= r0 - 0.01, (r, r0)
    st = g.stats.extra
    assert st["second_stage"] == second_stage
    if second_stage == "search":  # every ordered pair of partitions: 3 * 2 cross searches, no GGM merge
        assert g.stats.method == "dask-rows" and st["cross_searches"] == 6 and st["merges"] == 0
    else:
        assert g.stats.method == "dask-ggm" and st["merges"] == 3
    assert abs(g.stats.extra["recall_estimate"] - r) <= 0.01, (g.stats.extra, r)
    d = ((X[:, None, :] - X[g.indices[:, :3]]) ** 2).sum(-1)  # distances are the points' own
    np.testing.assert_allclose(np.asarray(g.distances)[:, :3], d, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind, P, metric", [("clustered", 2, "sqeuclidean"), ("clustered", 3, "euclidean"),
                                             ("uniform", 4, "sqeuclidean"), ("clustered", 2, "cosine")])
def test_knn_graph_tree_recall_matches_single_process(client, kind, P, metric):
    from knnkit.datasets import make_clustered, make_uniform

    n = 10000
    X = make_clustered(n, 16, random_state=5, device="cpu") if kind == "clustered" else \
        make_uniform(n, 8, random_state=5, device="cpu")
    X = np.asarray(X, dtype=np.float32)
    _, T = knnkit.knn(X, k=10, metric=metric, device="cpu")
    g = knnkit.dask.knn_graph(X, k=10, metric=metric, client=client, device="cpu", n_parts=P, random_state=1)
    g0 = knnkit.knn_graph(X, k=10, metric=metric, device="cpu", random_state=1)
    r, r0 = recall(g.indices, T), recall(g0.indices, T)
    st = g.stats.extra
    assert g.stats.method == "dask-tree" and st["partitions"] == P
    assert sum(st["leaf_sizes"]) == n and max(st["leaf_sizes"]) - min(st["leaf_sizes"]) < 0.1 * n / P
    assert len(st["slab_sizes"]) == P - 1 and 0 < st["slab_fraction"] < P
    assert r >= r0 - 0.005, (r, r0, st)
    assert not (g.indices == np.arange(n)[:, None]).any() and (g.indices >= 0).all()
    assert all(len(set(row)) == 10 for row in g.indices[:500].tolist())


def _second_stage_workers(records, name):
    from dask.utils import key_split

    return {r["worker"] for r in records if key_split(r["key"]) == name}


@pytest.mark.parametrize("partition, n, d", [("tree", 20000, 24), ("rows", 12000, 16)])
def test_knn_graph_second_stage_runs_on_both_workers(client, partition, n, d):
    """Two workers, two partitions: the stage after the partition graphs (cross searches) runs on
    BOTH workers, as do the final per-partition merges; recall against exact neighbours matches
    the single process; lists hold the points' own distances, sorted."""
    from knnkit.datasets import make_clustered

    X = np.asarray(make_clustered(n, d, n_clusters=200, random_state=8), dtype=np.float32)
    D0, T = knnkit.knn(X, k=10, device="cpu")
    with distributed.get_task_stream(client=client) as ts:
        g = knnkit.dask.knn_graph(X, k=10, client=client, device="cpu", n_parts=2, random_state=3,
                                  partition=partition, second_stage="search")
    g0 = knnkit.knn_graph(X, k=10, device="cpu", random_state=3)
    st = g.stats.extra
    assert st["second_stage"] == "search" and st["cross_searches"] == 2
    workers = sorted(client.nthreads())
    assert _second_stage_workers(ts.data, "cross_search") == set(workers)
    assert _second_stage_workers(ts.data, "merge_leaf") == set(workers)
    assert not _second_stage_workers(ts.data, "pair_merge")  # no GGM merge
    # the recall estimate's exact lists came from the partition graphs' tasks: no separate search
    assert not _second_stage_workers(ts.data, "exact_part")
    r, r0 = recall(g.indices, T), recall(g0.indices, T)
    assert r >= r0 - 0.003 and r >= 0.99, (r, r0, st)
    assert abs(st["recall_estimate"] - r) <= 0.01, (st["recall_estimate"], r)
    I, D = np.asarray(g.indices), np.asarray(g.distances)
    assert (np.diff(D, axis=1) >= 0).all()
    assert not (I == np.arange(n)[:, None]).any() and all(len(set(row)) == 10 for row in I.tolist())
    own = ((X[:, None, :] - X[I]) ** 2).sum(-1)
    np.testing.assert_allclose(D, own, rtol=1e-4, atol=1e-4)
    # the k-th distance is never below the exact one (no list holds a point nearer than truly exists)
    assert (D[:, -1] >= np.asarray(D0)[:, -1] - 1e-4).all()


def test_knn_graph_tree_cross_searches_on_four_leaves(client):
    """Four leaves on two workers: every ordered pair of leaves on opposite sides of a hyperplane
    is searched once (at their lowest common node: 8 at the root, 2 + 2 below), both workers
    search, and recall matches the single process."""
    from knnkit.datasets import make_clustered

    X = np.asarray(make_clustered(16000, 16, random_state=9), dtype=np.float32)
    _, T = knnkit.knn(X, k=10, device="cpu")
    with distributed.get_task_stream(client=client) as ts:
        g = knnkit.dask.knn_graph(X, k=10, client=client, device="cpu", n_parts=4, random_state=2)
    st = g.stats.extra
    assert st["cross_searches"] == 12 and len(st["slab_sizes"]) == 3
    assert len(_second_stage_workers(ts.data, "cross_search")) == 2
    g0 = knnkit.knn_graph(X, k=10, device="cpu", random_state=2)
    assert recall(g.indices, T) >= recall(g0.indices, T) - 0.003


def test_second_stage_option(client, rng):
    X = rng.random((3000, 6), dtype=np.float32)
    g = knnkit.dask.knn_graph(X, k=5, client=client, device="cpu", n_parts=2, second_stage="graph")
    assert g.stats.extra["second_stage"] == "graph" and g.stats.extra["cross_searches"] == 0  # one slab graph
    g = knnkit.dask.knn_graph(X, k=5, client=client, device="cpu", n_parts=2, metric="manhattan")
    assert g.stats.extra["second_stage"] == "graph"  # no graph search for L1
    g = knnkit.dask.knn_graph(X, k=5, client=client, device="cpu", n_parts=2, partition="rows",
                              n_neighbors_internal=12)
    assert g.stats.method == "dask-ggm" and g.stats.extra["n_neighbors_internal"] == 12  # a GGM parameter: GGM
    with pytest.raises(ValueError, match="second_stage"):
        knnkit.dask.knn_graph(X, k=5, client=client, device="cpu", second_stage="slab")
    with pytest.raises(ValueError, match="second_stage='search'"):
        knnkit.dask.knn_graph(X, k=5, client=client, device="cpu", metric="inner_product", second_stage="search")
    with pytest.raises(ValueError, match="second_stage='search'"):
        knnkit.dask.knn_graph(X, k=5, client=client, device="cpu", metric="manhattan", second_stage="search")


class _NotNumpy:
    """numpy behind another module object: runs the device (sort-based) branches of the dask tasks."""

    def __getattr__(self, name):
        return getattr(np, name)


@pytest.mark.parametrize("xp", [np, _NotNumpy()], ids=["cpu", "sort-branch"])
def test_group_topk_and_search_graph(rng, xp):
    from knnkit.dask import _tasks as t

    owner = rng.integers(-1, 50, 4000)
    other = rng.permutation(4000).astype(np.int64)
    d = rng.random(4000).astype(np.float32)
    rows, ids, dist = t._group_topk(xp, owner, other, d, 3, 50)
    for r, row_ids, row_d in zip(rows.tolist(), ids, dist):
        sel = owner == r
        best = np.lexsort((other[sel], d[sel]))[:3]
        got = row_ids >= 0
        assert row_ids[got].tolist() == other[sel][best].tolist()
        np.testing.assert_array_equal(row_d[got], d[sel][best])
    assert set(np.flatnonzero(np.bincount(owner[owner >= 0], minlength=50)).tolist()) <= set(rows.tolist())
    I = np.stack([rng.permutation(30)[:4] for _ in range(30)]).astype(np.int32)  # distinct ids per list
    I[3] = -1
    D = rng.random((30, 4)).astype(np.float32)
    G = t.search_graph(xp, I, D, 7)
    assert G.shape == (30, 7) and (G[:, :4] == I).all()
    for a in range(30):  # the reverse edges: up to 3 of the points that list a, the nearest first
        listing = [(D[b, j], b) for b in range(30) for j in range(4) if I[b, j] == a]
        want = [b for _d, b in sorted(listing)[:3]]
        assert [b for b in G[a, 4:].tolist() if b >= 0] == want


def test_tree_leaves_cover_every_point_once(rng):
    """The tree's routing: every global id in exactly one leaf, margins on the path's side."""
    from knnkit.dask import _tasks as t

    X = rng.standard_normal((3001, 6)).astype(np.float32)
    parts = [(0, X[:1000]), (1000, X[1000:])]
    for P, rule in [(3, "pca"), (5, "random"), (4, "pca")]:
        tree = t.fit_tree(P, rule, 0, *[t.sample_rows(x, 500, 1, False) for _o, x in parts])
        routed = [t.route(x, tree, P, False) for _o, x in parts]
        leaves = [t.assemble(*[t.select_leaf(x, rt, o, L) for (o, x), rt in zip(parts, routed)]) for L in range(P)]
        ids = np.concatenate([lf[0] for lf in leaves])
        assert np.array_equal(np.sort(ids), np.arange(3001))
        assert all(lf[0].size > 3001 / P * 0.6 for lf in leaves)
        nodes = t.tree_nodes(P)
        for L, lf in enumerate(leaves):  # left of a node: negative margin, right: >= 0
            for lvl, h in enumerate(t.leaf_path(nodes, L)):
                lo, mid, hi, _ = nodes[h]
                m = lf[2][:, lvl]
                assert ((m < 0) if L < mid else (m >= 0)).all()


def test_knn_graph_partition_validation(client, rng):
    X = rng.random((300, 4), dtype=np.float32)
    with pytest.raises(ValueError, match="partition"):
        knnkit.dask.knn_graph(X, k=5, client=client, device="cpu", partition="kd")
    with pytest.raises(TypeError, match="partition"):
        knnkit.dask.knn_graph(X, k=5, client=client, device="cpu", partition=2)
    with pytest.raises(ValueError, match="partition='tree'"):
        knnkit.dask.knn_graph(X, k=5, client=client, device="cpu", partition="tree", metric="inner_product")
    with pytest.raises(ValueError, match="split"):
        knnkit.dask.knn_graph(X, k=5, client=client, device="cpu", split="median")
    with pytest.raises(ValueError, match="slab_width"):
        knnkit.dask.knn_graph(X, k=5, client=client, device="cpu", slab_width="wide")
    with pytest.raises(ValueError, match="slab_quantile"):
        knnkit.dask.knn_graph(X, k=5, client=client, device="cpu", slab_quantile=0.0)
    with pytest.raises(TypeError, match="slab_quantile"):
        knnkit.dask.knn_graph(X, k=5, client=client, device="cpu", slab_quantile="high")
    with pytest.raises(ValueError, match="tree_sample"):
        knnkit.dask.knn_graph(X, k=5, client=client, device="cpu", tree_sample=0)
    with pytest.raises(ValueError, match="n_parts"):
        knnkit.dask.knn_graph(X, k=5, client=client, device="cpu", n_parts=60)
    g = knnkit.dask.knn_graph(X, k=5, client=client, device="cpu", metric="inner_product")
    assert g.stats.method == "dask-ggm"  # auto: no slab bound for inner products
    g = knnkit.dask.knn_graph(X, k=5, client=client, device="cpu", slab_width="bound", split="random", n_parts=3)
    _, T = knnkit.knn(X, k=5, device="cpu")
    assert g.stats.extra["slab_width"] == "bound" and recall(g.indices, T) >= 0.99


def test_sharded_search_resident_queries(client, rng):
    """Queries as a dask array on the workers: searched where they live, results lazy."""
    from knnkit.datasets.suite import make_tight_clusters

    X, Q = make_tight_clusters(4000, 12, 40, n_queries=300, random_state=4)
    ix = knnkit.dask.ShardedIndex.build(X, shards=1, replicas=2, client=client, device="cpu", random_state=0)
    d0, i0 = ix.search(Q, k=8)
    workers = sorted(client.nthreads())
    blocks = [client.scatter(Q[lo:lo + 100], workers=[workers[b % 2]]) for b, lo in enumerate(range(0, 300, 100))]
    dQ = da.concatenate([da.from_delayed(f, (100, 12), dtype=Q.dtype) for f in blocks])
    d, i = ix.search(dQ, k=8, compute=False)
    assert isinstance(i, da.Array) and i.shape == (300, 8) and i.chunks[0] == (100, 100, 100)
    d, i = client.persist([d, i])
    assert (i.compute() == i0).all()
    np.testing.assert_allclose(d.compute(), d0, rtol=1e-6)
    d2, i2 = ix.search(dQ, k=8)  # dask arrays in, dask arrays out by default
    assert isinstance(i2, da.Array) and (i2.compute() == i0).all()
    d3, i3 = ix.search(dQ, k=8, compute=True)  # gathered
    assert isinstance(i3, np.ndarray) and (i3 == i0).all()
    _, ia = ix.search(Q, k=8, compute=False, query_block=128)  # in-memory queries, lazy results
    assert (ia.compute() == i0).all()
    with pytest.raises(TypeError, match="compute"):
        ix.search(Q, k=8, compute="no")
    with pytest.raises(ValueError, match="dimension"):
        ix.search(dQ[:, :5], k=8)


def test_sharded_search_balances_unevenly_placed_blocks(client):
    """Query blocks persisted all on one worker are not all searched there when another worker
    holds a replica: blocks move to the least loaded replica once the own worker is
    RESIDENT_SLACK blocks ahead (2 x H100: 20 blocks on one worker, the other idle)."""
    from distributed import get_task_stream

    from knnkit.dask._index import RESIDENT_SLACK
    from knnkit.datasets.suite import make_tight_clusters

    X, Q = make_tight_clusters(3000, 8, 30, n_queries=800, random_state=5)
    ix = knnkit.dask.ShardedIndex.build(X, shards=1, replicas=2, client=client, device="cpu", random_state=0)
    d0, i0 = ix.search(Q, k=5)
    one = sorted(client.nthreads())[0]
    blocks = [client.scatter(Q[lo:lo + 100], workers=[one]) for lo in range(0, 800, 100)]
    dQ = da.concatenate([da.from_delayed(f, (100, 8), dtype=Q.dtype) for f in blocks])
    with get_task_stream(client=client) as ts:
        d, i = ix.search(dQ, k=5, compute=True)
    where = [t["worker"] for t in ts.data if str(t["key"]).startswith("search_shard")
             or "search_shard" in str(t["key"])]
    assert len(where) == 8
    counts = sorted(where.count(w) for w in set(where))
    assert len(counts) == 2 and counts[1] - counts[0] <= 2 * RESIDENT_SLACK
    assert (i == i0).all()
    np.testing.assert_allclose(d, d0, rtol=1e-6)


def test_sharded_index_recall_save_load(client, tmp_path, rng):
    from knnkit.datasets.suite import make_tight_clusters

    X, Q = make_tight_clusters(6000, 16, 60, n_queries=200, random_state=2)
    _, T = knnkit.knn(X, Q, k=10, device="cpu")
    ix = knnkit.dask.ShardedIndex.build(X, shards=3, client=client, device="cpu", random_state=0)
    assert "shards=3" in repr(ix) and ix.n == 6000
    d, i = ix.search(Q, k=10)
    single = knnkit.GraphIndex.build(X, device="cpu", random_state=0)
    r, r0 = recall(i, T), recall(single.search(Q, k=10)[1], T)
    assert r >= r0 - 0.02 and r >= 0.95, (r, r0)
    assert (np.diff(d, axis=1) >= -1e-6).all()
    ix.save(tmp_path / "sharded")
    back = knnkit.dask.ShardedIndex.load(tmp_path / "sharded", client=client, device="cpu")
    d2, i2 = back.search(Q, k=10)
    assert (i2 == i).all()
    shard = tmp_path / "sharded" / "shard_00001.knnkit"
    shard.write_bytes(shard.read_bytes()[:-1] + b"\0")
    with pytest.raises(ValueError, match="checksum"):
        knnkit.dask.ShardedIndex.load(tmp_path / "sharded", client=client, device="cpu")


def _lose_a_worker(cluster, client):
    name = sorted(cluster.workers)[0]
    cluster.sync(cluster.workers[name].close)
    t0 = time.time()
    while len(client.nthreads()) > 1 and time.time() - t0 < 10:
        time.sleep(0.05)


def test_lost_worker_is_survived_with_replicas_and_named_without(rng):
    X = rng.random((3000, 8), dtype=np.float32)
    Q = X[:40]
    with _cluster() as cluster, distributed.Client(cluster) as c:
        ix = knnkit.dask.ShardedIndex.build(X, shards=2, replicas=2, client=c, device="cpu")
        d, i = ix.search(Q, k=5)
        _lose_a_worker(cluster, c)
        d2, i2 = ix.search(Q, k=5)
        assert (i2 == i).all()
    with _cluster() as cluster, distributed.Client(cluster) as c:
        ix = knnkit.dask.ShardedIndex.build(X, shards=2, replicas=1, client=c, device="cpu")
        ix.search(Q, k=5)
        _lose_a_worker(cluster, c)
        time.sleep(0.5)
        with pytest.raises(RuntimeError, match=r"shard \d .*lost"):
            ix.search(Q, k=5)


@pytest.mark.gpu
def test_gpu_workers_equal_cpu(client, rng):
    """GPU compute in the workers (the module cluster's workers share this process's GPU)."""
    X = rng.random((5000, 16), dtype=np.float32)
    Q = X[:100]
    d, i = knnkit.dask.knn(X, Q, k=10, client=client, device="gpu")
    d0, i0 = knnkit.knn(X, Q, k=10, device="cpu")
    _tie_forgiving_equal(d, i, d0, i0)
    g = knnkit.dask.knn_graph(X, k=10, client=client, device="gpu", n_parts=2)
    _, T = knnkit.knn(X, k=10, device="cpu")
    assert recall(g.indices, T) >= 0.98


def test_knn_graph_phases_and_recall_estimate_option(client):
    from knnkit.datasets import make_clustered

    X = np.asarray(make_clustered(5000, 16, random_state=2), dtype=np.float32)
    g = knnkit.dask.knn_graph(X, k=8, client=client, device="cpu", n_parts=2, random_state=1)
    h = knnkit.dask.knn_graph(X, k=8, client=client, device="cpu", n_parts=2, random_state=1, recall_estimate=False)
    assert (g.indices == h.indices).all() and g.indices.dtype == np.int32 and g.distances.dtype == np.float32
    assert "recall_estimate" in g.stats.extra and "recall_estimate" not in h.stats.extra
    ph = g.stats.extra["phases"]
    assert {"schedule_s", "wait_s", "gather_s", "assemble_s", "estimate_s", "total_s"} <= set(ph)
    assert "estimate_s" not in h.stats.extra["phases"]
    with pytest.raises(TypeError, match="recall_estimate"):
        knnkit.dask.knn_graph(X, k=8, client=client, device="cpu", recall_estimate=1)


@pytest.mark.parametrize("partition", ["rows", "tree"])
def test_knn_graph_one_partition_is_the_single_device_build(client, partition):
    from knnkit.datasets import make_clustered

    X = np.asarray(make_clustered(3000, 12, random_state=6), dtype=np.float32)
    g = knnkit.dask.knn_graph(X, k=6, client=client, device="cpu", n_parts=1, random_state=2, partition=partition)
    g0 = knnkit.knn_graph(X, k=6, device="cpu", random_state=2)
    assert (np.asarray(g.indices) == np.asarray(g0.indices)).all()
    np.testing.assert_allclose(np.asarray(g.distances), np.asarray(g0.distances), rtol=1e-6)


@pytest.mark.parametrize("partition, chunks", [("tree", 8000), ("rows", 8000), ("tree", 3000)])
def test_knn_graph_one_partition_nndescent_equals_single_process_in_one_task(client, partition, chunks):
    """One partition: one task (the data's blocks joined on a worker) runs knnkit.knn_graph's
    NN-Descent build with the same seed: the same lists, and the engine's recall estimate is
    reported instead of a second, distributed exact search."""
    from dask.utils import key_split
    from knnkit.datasets import make_clustered

    X = np.asarray(make_clustered(8000, 16, random_state=4), dtype=np.float32)
    dX = client.persist(da.from_array(X, chunks=(chunks, 16)))
    distributed.wait(dX)
    with distributed.get_task_stream(client=client) as ts:
        g = knnkit.dask.knn_graph(dX, k=10, client=client, device="cpu", n_parts=1, random_state=7,
                                  partition=partition, compute=True)
    g0 = knnkit.knn_graph(X, k=10, device="cpu", random_state=7)
    assert g0.stats.method == "nndescent"
    assert (np.asarray(g.indices) == np.asarray(g0.indices)).all()
    np.testing.assert_allclose(np.asarray(g.distances), np.asarray(g0.distances), rtol=1e-6)
    assert g.indices.dtype == np.int32 and g.distances.dtype == np.float32
    st = g.stats.extra
    assert st["single_device"] and st["partitions"] == 1 and g.stats.method == f"dask-{'tree' if partition == 'tree' else 'ggm'}"
    assert st["recall_estimate"] == round(g0.stats.extra["recall_estimate"], 5)
    assert {key_split(r["key"]) for r in ts.data} == {"single_graph"}, {key_split(r["key"]) for r in ts.data}
    assert "estimate_s" not in st["phases"]


@pytest.mark.parametrize("chunks", [8000, 3000])
def test_knn_graph_one_partition_dask_out(client, chunks):
    """One partition, dask in: the one build's lists stay on its worker, cut into the input's row
    chunks (views, a small task each), equal to the gathered result; only the build and small
    tasks run (the stats, the short-list count)."""
    from dask.utils import key_split
    from knnkit.datasets import make_clustered

    X = np.asarray(make_clustered(8000, 16, random_state=4), dtype=np.float32)
    dX = client.persist(da.from_array(X, chunks=(chunks, 16)))
    distributed.wait(dX)
    with distributed.get_task_stream(client=client) as ts:
        g = knnkit.dask.knn_graph(dX, k=10, client=client, device="cpu", n_parts=1, random_state=7)
    names = [key_split(r["key"]) for r in ts.data]
    assert names.count("single_graph") == 1 and set(names) <= {"single_graph", "take", "row_slice", "short_rows"}
    assert g.is_dask and isinstance(g.indices, da.Array) and isinstance(g.distances, da.Array)
    assert g.indices.chunks == (dX.chunks[0], (10,)) and (g.indices.dtype, g.distances.dtype) == (np.int32, np.float32)
    h = knnkit.dask.knn_graph(dX, k=10, client=client, device="cpu", n_parts=1, random_state=7, compute=True)
    assert not h.is_dask and isinstance(h.indices, np.ndarray)
    gc = g.compute()
    assert (gc.indices == h.indices).all() and (gc.distances == h.distances).all()
    assert g.stats.extra["recall_estimate"] == h.stats.extra["recall_estimate"]


def _graph_X(n=6000, d=12, seed=11):
    from knnkit.datasets import make_clustered

    return np.asarray(make_clustered(n, d, n_clusters=60, random_state=seed), dtype=np.float32)


class _GatheredRows:
    """Counts the rows of the ``cols``-column 2-D arrays that ``client.gather`` brings to the client."""

    def __init__(self, client, cols):
        self.client, self.cols, self.rows = client, cols, 0
        self._gather = client.gather

        def gather(futures, *a, **kw):
            out = self._gather(futures, *a, **kw)
            self._count(out)
            return out

        client.gather = gather

    def _count(self, x):
        if isinstance(x, np.ndarray):
            self.rows += x.shape[0] if x.ndim == 2 and x.shape[1] == self.cols else 0
        elif isinstance(x, (list, tuple)):
            for v in x:
                self._count(v)

    def close(self):
        self.client.gather = self._gather


@pytest.mark.parametrize("partition, second_stage, n_parts", [("tree", "search", 2), ("tree", "graph", 3),
                                                              ("rows", "search", None), ("rows", "graph", None)])
def test_knn_graph_dask_in_dask_out(client, partition, second_stage, n_parts):
    """Dask in, dask out: the final lists stay on the workers in row order, chunked like the
    input's rows (the tree's leaves, a permutation of the rows, are exchanged into row blocks by
    tasks on the workers); computed, they equal compute=True's lists for the same seed, and the
    recall estimate (sampled rows fetched from the workers) is the same."""
    from dask.utils import key_split

    X = _graph_X()
    dX = client.persist(da.from_array(X, chunks=(2600, 12)))  # 2600, 2600, 800: blocks unlike the leaves
    distributed.wait(dX)
    kw = dict(k=8, client=client, device="cpu", n_parts=n_parts, random_state=4, partition=partition,
              second_stage=second_stage)
    gathered = _GatheredRows(client, 8)
    with distributed.get_task_stream(client=client) as ts:
        g = knnkit.dask.knn_graph(dX, **kw)
    gathered.close()
    # the only k-column arrays the client received: the recall estimate's sampled rows
    assert 0 < gathered.rows <= knnkit.dask._api.ESTIMATE_ROWS, gathered.rows
    assert g.is_dask and isinstance(g.indices, da.Array) and isinstance(g.distances, da.Array)
    assert g.indices.chunks == g.distances.chunks == ((2600, 2600, 800), (8,))
    assert (g.indices.dtype, g.distances.dtype) == (np.int32, np.float32) and g.shape == (6000, 8)
    names = [key_split(r["key"]) for r in ts.data]
    if partition == "tree":  # every leaf cuts one piece per row block, every block is placed on a worker
        leaves = g.stats.extra["partitions"]
        assert names.count("leaf_rows_in") == 3 * leaves and names.count("place_rows") == 3
    assert names.count("short_rows") == 3  # the short-list check ran on the workers, one count per block
    ph = g.stats.extra["phases"]
    assert {"wait_s", "gather_s", "assemble_s", "check_s", "estimate_s", "total_s"} <= set(ph)
    h = knnkit.dask.knn_graph(dX, compute=True, **kw)
    assert not h.is_dask and h.stats.method == g.stats.method
    gc = g.compute()
    assert (gc.indices == h.indices).all() and (gc.distances == h.distances).all()
    assert g.stats.extra["recall_estimate"] == h.stats.extra["recall_estimate"] > 0.9
    assert (g.indices[100:110].compute() == h.indices[100:110]).all()  # blocks usable as dask arrays


@pytest.mark.parametrize("partition, n_parts, chunks", [("tree", 3, (3000, 3000)), ("rows", 3, (2000, 2000, 2000))])
def test_knn_graph_in_memory_compute_false(client, partition, n_parts, chunks):
    """An in-memory input with compute=False: the lists stay on the workers in the row blocks of
    its partitions (tree: one per worker, whatever the leaves), equal to the gathered lists."""
    X = _graph_X()
    kw = dict(k=6, client=client, device="cpu", n_parts=n_parts, random_state=2, partition=partition)
    g = knnkit.dask.knn_graph(X, compute=False, **kw)
    h = knnkit.dask.knn_graph(X, **kw)
    assert g.is_dask and g.indices.chunks == (chunks, (6,)) and not h.is_dask
    gc = g.compute()
    assert (gc.indices == h.indices).all() and (gc.distances == h.distances).all()
    assert g.stats.extra["recall_estimate"] == h.stats.extra["recall_estimate"]
    with pytest.raises(TypeError, match="compute must be None or a bool"):
        knnkit.dask.knn_graph(X, compute="yes", **kw)
    with pytest.raises(TypeError, match="compute"):
        knnkit.dask.knn_graph(X, compute=1, **kw)


def test_dask_backed_graph_methods(client, tmp_path):
    """A dask-backed KnnGraph: shape, stats and the arrays work; compute() / host_arrays() gather;
    every method needing the whole lists raises a TypeError that says to call .compute()."""
    X = _graph_X(3000, 8)
    g = knnkit.dask.knn_graph(X, k=5, client=client, device="cpu", random_state=1, compute=False)
    assert g.is_dask and g.n == len(g) == 3000 and g.k == 5 and g.shape == (3000, 5) and "dask" in repr(g)
    knnkit.set_output("numpy")
    try:
        assert isinstance(g.indices, da.Array)  # never gathered behind the caller's back
    finally:
        knnkit.set_output("input")
    I, D = g.host_arrays()
    gc = g.compute()
    assert isinstance(I, np.ndarray) and (gc.indices == I).all() and (gc.distances == D).all()
    assert not gc.is_dask and gc.compute() is gc and gc.stats.method == g.stats.method
    _, T = knnkit.knn(X, k=5, device="cpu")
    calls = {"recall": lambda: g.recall(T), "to_csr": g.to_csr, "to_umap": g.to_umap,
             "save": lambda: g.save(tmp_path / "g.knng"), "extend": lambda: g.extend(X[:10], data=X),
             "merge_graphs": lambda: knnkit.merge_graphs(X, g, X[:100], gc, k=5, device="cpu"),
             "init_graph": lambda: knnkit.knn_graph(X, k=5, device="cpu", method="nndescent", init_graph=g)}
    for name, call in calls.items():
        with pytest.raises(TypeError, match=r"call \.compute\(\) first"):
            call()
    assert not (tmp_path / "g.knng").exists()
    assert gc.recall(T) > 0.9 and gc.to_csr().shape == (3000, 3000)
    with pytest.raises(TypeError, match="both be dask arrays or neither"):
        knnkit.KnnGraph(g.indices, D)


def test_knn_graph_short_lists_are_caught_on_the_workers(client, monkeypatch):
    """The check that every list holds k neighbours runs on the workers for lists left there: a
    block with an empty slot makes knn_graph raise, as a gathered one does."""
    import knnkit.dask._api as api
    from knnkit.dask import _tasks

    def broken_place_rows(rows, k, *pieces):  # a row no leaf delivered
        I, D = _tasks.place_rows(rows, k, *pieces)
        I[0, -1] = -1
        return I, D

    monkeypatch.setattr(api, "place_rows", broken_place_rows)  # the cluster runs in this process
    X = _graph_X(4000, 8)
    with pytest.raises(RuntimeError, match="short of k"):
        knnkit.dask.knn_graph(X, k=5, client=client, device="cpu", random_state=1, compute=False)
    d = np.zeros((50, 3), np.float32)
    i = np.ones((50, 3), np.int32)
    i[[3, 7], 1] = -1
    f = client.scatter((i, d), hash=False)
    lists = api.OnWorkers([(100, 50, f)], (0, 1))
    assert api._short_rows(client, lists) == 2
    d[:, 0] = np.arange(50)
    f2 = client.scatter((i, d), hash=False)
    got = api._distances_at(client, api.OnWorkers([(100, 50, f2)], (0, 1)), np.array([101, 120, 149]))
    assert got[:, 0].tolist() == [1.0, 20.0, 49.0]


def test_sharded_search_persisted_queries_run_no_block_tasks(client, rng):
    """A persisted query array is searched from its own blocks: no task recomputes them."""
    X = rng.random((3000, 8), dtype=np.float32)
    ix = knnkit.dask.ShardedIndex.build(X, shards=1, replicas=2, client=client, device="cpu", random_state=0)
    d0, i0 = ix.search(X[:400], k=5)
    dQ = client.persist(da.from_array(X[:400], chunks=(100, 8)))
    distributed.wait(dQ)
    with distributed.get_task_stream(client=client) as ts:
        d, i = ix.search(dQ, k=5, compute=True)
    assert (i == i0).all()
    from dask.utils import key_split

    assert {key_split(r["key"]) for r in ts.data} <= {"search_shard"}, {key_split(r["key"]) for r in ts.data}


def test_knn_graph_refuses_rows_below_float32_resolution(client):
    """Partition graphs whose rows have neighbours closer than float32 resolves are refused (the
    single-process knn_graph answers them in float64; merged lists across partitions cannot)."""
    X = (np.random.default_rng(0).random((3000, 6)) * 1e-25).astype(np.float32)
    X[0] = 1.0
    with pytest.raises(ValueError, match="closer than float32 resolves"):
        knnkit.dask.knn_graph(X, k=5, client=client, device="cpu", partition="rows", n_parts=2)


def test_cosine_beyond_float32_resolution_warns_on_the_client(client):
    """knnkit.dask's gathered results say what knnkit.knn / knn_graph say: neighbours at cosine
    distances float32 cannot order (rows sharing a direction, similarities ~0.99999) raise the
    RuntimeWarning; similarities ~0.9999, copies and multiples do not. Dask queries too, when the
    result is computed (a lazy result is not checked)."""
    from helpers import check_cosine_resolution_warning

    check_cosine_resolution_warning((
        lambda X: knnkit.dask.knn(X, X[:5], k=5, metric="cosine", client=client, device="cpu", n_parts=2),
        lambda X: knnkit.dask.knn(X, da.from_array(X[:5], chunks=3), k=5, metric="cosine", client=client,
                                  device="cpu", n_parts=2, compute=True),
        lambda X: knnkit.dask.knn(X, k=5, metric="cosine", client=client, device="cpu", n_parts=2),
        lambda X: knnkit.dask.knn_graph(X, k=5, metric="cosine", client=client, device="cpu", n_parts=2,
                                        random_state=0)))
