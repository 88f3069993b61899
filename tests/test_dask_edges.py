"""knnkit.dask edge cases found by fuzzing (CPU workers): inputs where the distributed answer
used to differ from the single process without an error, or fail unclearly."""

import warnings

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")
da = pytest.importorskip("dask.array")

import knnkit  # noqa: E402
import knnkit.dask  # noqa: E402


@pytest.fixture(scope="module")
def client():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as c:
        yield c


@pytest.mark.parametrize("scale", [1e30, 1e-30])
@pytest.mark.parametrize("metric", ["sqeuclidean", "euclidean", "inner_product"])
def test_knn_merge_ranks_data_at_a_scale(client, metric, scale):
    """Data beyond 2^50 (or below 2^-50) is searched at a power-of-two scale; its float32 user
    distances overflow (inf) or underflow (0), and the merge across partitions ranked such ties
    by id: wrong neighbours (euclidean: unsorted finite distances). Equal to one process now."""
    rng = np.random.default_rng(1)
    X = rng.random((600, 5)) * scale
    Q = rng.random((20, 5)) * scale
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # inf distances (ids exact)
        d0, i0 = knnkit.knn(X, Q, k=5, metric=metric, device="cpu")
        d, i = knnkit.dask.knn(X, Q, k=5, metric=metric, client=client, device="cpu", n_parts=3)
        assert (i == i0).all() and np.array_equal(d, d0) and d.dtype == np.float32
        d0, i0 = knnkit.knn(X, k=4, metric=metric, device="cpu")
        d, i = knnkit.dask.knn(da.from_array(X, chunks=(170, 5)), k=4, metric=metric, client=client, device="cpu")
        d, i = d.compute(), i.compute()
    assert d.dtype == np.float32 and (i == i0).all() and np.array_equal(d, d0)


def _recall(g, X, k, metric="sqeuclidean"):
    from knnkit.evaluate import recall

    _, T = knnkit.knn(X, k=k, metric=metric, device="cpu")
    return recall(g.indices, T)


@pytest.mark.parametrize("partition, second_stage", [("rows", "graph"), ("rows", "search"), ("tree", "search")])
def test_knn_graph_data_at_a_scale(client, partition, second_stage):
    """1e30-scale data: each partition ran at its own scale and the merges compared float32
    distances that overflow (recall 0.75, unsorted lists). One scale for the whole data now."""
    from knnkit.datasets import make_clustered

    X = np.asarray(make_clustered(2500, 8, random_state=3), dtype=np.float64) * 1e30
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        g = knnkit.dask.knn_graph(X, k=8, metric="euclidean", client=client, device="cpu", partition=partition,
                                  second_stage=second_stage, n_parts=2, recall_estimate=False)
        assert _recall(g, X, 8, "euclidean") >= 0.99
        assert (np.diff(g.distances, axis=1) >= 0).all() and np.isfinite(g.distances).all()
        d0, _ = knnkit.knn(X, k=8, metric="euclidean", device="cpu")
        np.testing.assert_allclose(g.distances[:, 0], d0[:, 0], rtol=1e-5)
        gl = knnkit.dask.knn_graph(da.from_array(X, chunks=1250), k=8, metric="euclidean", client=client,
                                   device="cpu", partition=partition, second_stage=second_stage, n_parts=2,
                                   recall_estimate=False).compute()
    assert (gl.indices == g.indices).all() and (gl.distances == g.distances).all()


@pytest.mark.parametrize("second_stage", ["graph", "search"])
def test_knn_graph_rows_k_above_a_partition(client, second_stage):
    """Row partitions of k points or fewer: the lists came back with n_part - 1 columns instead of
    k (shape (60, 29) for k=59), or a dask result whose blocks disagreed with its chunks."""
    from knnkit.datasets import make_clustered

    X = np.asarray(make_clustered(2005, 6, random_state=1), dtype=np.float32)
    g = knnkit.dask.knn_graph(X[:60], k=59, client=client, device="cpu", partition="rows", second_stage=second_stage)
    assert g.indices.shape == (60, 59) and (g.indices >= 0).all() and _recall(g, X[:60], 59) == 1.0
    g = knnkit.dask.knn_graph(X[:100], k=40, client=client, device="cpu", partition="rows", n_parts=4,
                              second_stage=second_stage)
    assert g.indices.shape == (100, 40) and (g.indices >= 0).all() and _recall(g, X[:100], 40) >= 0.99
    g = knnkit.dask.knn_graph(da.from_array(X, chunks=1000), k=10, client=client, device="cpu", partition="rows",
                              second_stage=second_stage)  # a last chunk of 5 rows
    gc = g.compute()
    assert gc.indices.shape == (2005, 10) and (gc.indices >= 0).all() and _recall(gc, X, 10) >= 0.99


def test_knn_graph_tree_default_leaves_fit_k(client):
    """The tree's default leaf count (one per worker) refused a small data set with a large k,
    naming an n_parts the caller had not given; it is capped at n // (k + 1) now."""
    X = np.random.default_rng(0).random((60, 4), dtype=np.float32)
    g = knnkit.dask.knn_graph(X, k=40, client=client, device="cpu", partition="tree")
    assert g.indices.shape == (60, 40) and _recall(g, X, 40) == 1.0
    with pytest.raises(ValueError, match="n_parts=2"):
        knnkit.dask.knn_graph(X, k=40, client=client, device="cpu", partition="tree", n_parts=2)


def test_knn_graph_random_state_validated(client):
    """random_state is validated as knnkit.knn_graph does (int() took "7" and truncated 1.5)."""
    X = np.random.default_rng(0).random((300, 4), dtype=np.float32)
    with pytest.raises(TypeError, match="random_state"):
        knnkit.dask.knn_graph(X, k=5, client=client, device="cpu", random_state=1.5)
    with pytest.raises(TypeError, match="random_state"):
        knnkit.dask.knn_graph(X, k=5, client=client, device="cpu", random_state="7")
    with pytest.raises(ValueError, match="random_state"):
        knnkit.dask.knn_graph(X, k=5, client=client, device="cpu", random_state=-1)
    a = knnkit.dask.knn_graph(X, k=5, client=client, device="cpu", random_state=np.int64(3), n_parts=2)
    b = knnkit.dask.knn_graph(X, k=5, client=client, device="cpu", random_state=3, n_parts=2)
    assert (a.indices == b.indices).all()
    assert knnkit.dask.knn_graph(X, k=5, client=client, device="cpu", random_state=None).shape == (300, 5)
