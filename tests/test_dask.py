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
    X = rng.random((3001, 6), dtype=np.float32)
    dX = da.from_array(X, chunks=(700, 3))
    d, i = knnkit.dask.knn(dX, k=4, client=client, device="cpu")
    d0, i0 = knnkit.knn(X, k=4, device="cpu")
    _tie_forgiving_equal(d, i, d0, i0)
    assert not (i == np.arange(3001)[:, None]).any()
    dQ = da.from_array(X[:500], chunks=(128, 6))
    d, i = knnkit.dask.knn(dX, dQ, k=3, client=client, device="cpu", query_block=200)
    assert (i[:, 0] == np.arange(500)).all()


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


def test_knn_graph_recall_matches_single_process(client):
    from knnkit.datasets import make_clustered

    X = np.asarray(make_clustered(8000, 24, random_state=3), dtype=np.float32)
    _, T = knnkit.knn(X, k=10, device="cpu")
    g = knnkit.dask.knn_graph(X, k=10, client=client, device="cpu", n_parts=3, random_state=1)
    g0 = knnkit.knn_graph(X, k=10, device="cpu", random_state=1)
    r, r0 = recall(g.indices, T), recall(g0.indices, T)
    assert g.indices.shape == (8000, 10) and (g.indices >= 0).all()
    assert not (g.indices == np.arange(8000)[:, None]).any()
    assert r >= r0 - 0.01, (r, r0)
    assert g.stats.extra["merges"] == 3
    assert abs(g.stats.extra["recall_estimate"] - r) <= 0.01, (g.stats.extra, r)
    d = ((X[:, None, :] - X[g.indices[:, :3]]) ** 2).sum(-1)  # distances are the points' own
    np.testing.assert_allclose(np.asarray(g.distances)[:, :3], d, rtol=1e-4, atol=1e-4)


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
    while len(client.scheduler_info()["workers"]) > 1 and time.time() - t0 < 10:
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
