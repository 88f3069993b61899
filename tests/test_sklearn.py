"""knnkit.sklearn: scikit-learn's estimator checks, equality with sklearn.neighbors on exact search,
and the pipelines the transformer is for (Isomap, TSNE, DBSCAN, SpectralClustering)."""

import numpy as np
import pytest

sklearn = pytest.importorskip("sklearn")

from sklearn import neighbors as skn  # noqa: E402
from sklearn.utils.estimator_checks import parametrize_with_checks  # noqa: E402

from knnkit.sklearn import KNeighborsTransformer, NearestNeighbors  # noqa: E402


@parametrize_with_checks([NearestNeighbors(device="cpu"), KNeighborsTransformer(device="cpu")])
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


def _data(rng, n=400, d=8, nq=50):
    return rng.standard_normal((n, d)), rng.standard_normal((nq, d))


@pytest.mark.parametrize("metric", ["minkowski", "euclidean", "sqeuclidean", "cosine"])
@pytest.mark.parametrize("mode", ["distance", "connectivity"])
def test_transformer_equals_sklearn(rng, metric, mode):
    X, Q = _data(rng)
    ours = KNeighborsTransformer(n_neighbors=7, mode=mode, metric=metric, device="cpu").fit(X)
    ref = skn.KNeighborsTransformer(n_neighbors=7, mode=mode, metric=metric).fit(X)
    for a, b in ((ours.transform(Q), ref.transform(Q)), (ours.fit_transform(X), ref.fit_transform(X))):
        assert a.shape == b.shape and a.nnz == b.nnz
        a, b = a.tocsr(), b.tocsr()
        a.sort_indices()
        b.sort_indices()
        np.testing.assert_array_equal(a.indices, b.indices)  # continuous data: no distance ties
        np.testing.assert_allclose(a.data, b.data, rtol=1e-4, atol=1e-5)


def test_nearest_neighbors_equals_sklearn(rng):
    X, Q = _data(rng)
    ours = NearestNeighbors(n_neighbors=5, device="cpu").fit(X)
    ref = skn.NearestNeighbors(n_neighbors=5).fit(X)
    for args in ((Q,), ()):
        d1, i1 = ours.kneighbors(*args)
        d2, i2 = ref.kneighbors(*args)
        np.testing.assert_array_equal(i1, i2)
        np.testing.assert_allclose(d1, d2, rtol=1e-4, atol=1e-5)
    g1 = ours.kneighbors_graph(mode="distance")
    g2 = ref.kneighbors_graph(mode="distance")
    assert abs(g1 - g2).max() < 1e-4
    with pytest.raises(ValueError, match="n_neighbors"):
        ours.kneighbors(n_neighbors=len(X))       # the training sample itself is left out
    with pytest.raises(ValueError, match="p=3"):
        NearestNeighbors(p=3).fit(X)
    with pytest.raises(ValueError, match="method"):
        NearestNeighbors(method="kd_tree").fit(X)


def _ball_sets(dist, ind, ref_dist, ref_ind, radius):
    """Rows equal as sets of ids; boundary points (|d - radius| within rounding) may differ."""
    for d1, i1, d2, i2 in zip(dist, ind, ref_dist, ref_ind):
        a, b = dict(zip(i1.tolist(), d1.tolist())), dict(zip(i2.tolist(), d2.tolist()))
        for j in set(a) ^ set(b):
            assert abs(a.get(j, b.get(j)) - radius) < 1e-4 * max(1.0, radius), (j, a.get(j), b.get(j))
        for j in set(a) & set(b):
            assert abs(a[j] - b[j]) < 1e-4 * max(1.0, abs(b[j]))
        assert np.all(np.diff(d1) >= 0)  # sorted


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("metric", ["minkowski", "sqeuclidean", "cosine"])
@pytest.mark.parametrize("method", ["exact", "index"])
def test_radius_neighbors_equals_sklearn(rng, metric, method, device):
    """Exact whatever the method: balls from a few points to more than the first k (the k-doubling
    rounds), with and without queries (each training sample leaves itself out), radius 0, and the
    sparse graph."""
    X, Q = _data(rng, n=600)
    X = np.concatenate([X, X[:30]])  # exact duplicates: distance 0 from each other
    scale = {"minkowski": 1.0, "sqeuclidean": 1.0, "cosine": 0.25}[metric]
    ours = NearestNeighbors(n_neighbors=3, metric=metric, method=method, device=device, random_state=0).fit(X)
    ref = skn.NearestNeighbors(metric=metric, algorithm="brute").fit(X)
    for radius in (0.0, 2.0 * scale, 3.5 * scale, 5.0 * scale):
        for args in ((Q,), (), (X[:40],)):
            d1, i1 = ours.radius_neighbors(*args, radius=radius)
            d2, i2 = ref.radius_neighbors(*args, radius=radius, sort_results=True)
            assert len(d1) == len(d2) and d1.dtype == object and i1[0].dtype == np.int64
            _ball_sets(d1, i1, d2, i2, radius)
    # a ball past several doublings of k (16 -> 32 -> 64 -> 128): the 100th neighbour's distance
    big = float(ref.kneighbors(Q[:1], n_neighbors=100)[0][0, -1]) * (1 + 1e-6)
    d1, i1 = ours.radius_neighbors(Q, radius=big)
    d2, i2 = ref.radius_neighbors(Q, radius=big, sort_results=True)
    _ball_sets(d1, i1, d2, i2, big)
    assert len(i1[0]) >= 100
    g1 = ours.radius_neighbors_graph(Q, radius=3.5 * scale, mode="distance")
    g2 = ref.radius_neighbors_graph(Q, radius=3.5 * scale, mode="distance")
    assert g1.shape == g2.shape and abs(g1.nnz - g2.nnz) <= 2
    # the 30 duplicate pairs, both ways (cosine's 1 - cos of equal vectors rounds to ~1e-7)
    assert ours.radius_neighbors_graph(radius=1e-5 if metric == "cosine" else 0.0).nnz == 60


def test_radius_neighbors_refusals(rng):
    X, Q = _data(rng, n=50)
    nn = NearestNeighbors(device="cpu").fit(X)
    for bad in (-1.0, np.inf, np.nan, "1", True):
        with pytest.raises(ValueError, match="radius"):
            nn.radius_neighbors(Q, radius=bad)
    with pytest.raises(ValueError, match="inner_product"):
        NearestNeighbors(metric="inner_product", device="cpu").fit(X).radius_neighbors(Q)
    with pytest.raises(ValueError, match="mode"):
        nn.radius_neighbors_graph(Q, mode="weights")
    one = NearestNeighbors(device="cpu").fit(X[:1])
    assert one.radius_neighbors(radius=10.0)[1][0].size == 0  # alone: nothing but itself
    assert NearestNeighbors(radius=100.0, device="cpu").fit(X).radius_neighbors(Q[:2])[1][0].size == 50


@pytest.mark.parametrize("method", ["graph", "index"])
def test_approximate_methods_recall(rng, method):
    from knnkit.datasets import make_clustered

    X, Q = make_clustered(6000, 16, n_queries=200, random_state=1, device="cpu")
    exact = NearestNeighbors(n_neighbors=10, device="cpu").fit(X)
    approx = NearestNeighbors(n_neighbors=10, method=method, device="cpu", random_state=0).fit(X)
    for args in ((), (Q,)):
        t = exact.kneighbors(*args, return_distance=False)
        a = approx.kneighbors(*args, return_distance=False)
        hits = sum(len(set(x) & set(y)) for x, y in zip(a, t))
        assert hits / t.size >= 0.95


def _pipelines():
    from sklearn.cluster import DBSCAN, SpectralClustering
    from sklearn.manifold import TSNE, Isomap

    return {
        "isomap": lambda: Isomap(n_neighbors=10, n_components=2, metric="precomputed"),
        "tsne": lambda: TSNE(n_components=2, metric="precomputed", init="random", perplexity=5, max_iter=250,
                             random_state=0),
        "dbscan": lambda: DBSCAN(eps=1.5, min_samples=5, metric="precomputed"),
        "spectral": lambda: SpectralClustering(n_clusters=3, affinity="precomputed_nearest_neighbors",
                                               n_neighbors=10, random_state=0),
    }


@pytest.mark.parametrize("name", ["isomap", "tsne", "dbscan", "spectral"])
def test_pipelines_match_sklearn(name):
    from sklearn.datasets import make_blobs, make_s_curve
    from sklearn.metrics import adjusted_rand_score
    from sklearn.pipeline import make_pipeline

    if name == "isomap":  # one connected manifold (Isomap refuses a disconnected neighbour graph)
        X, _t = make_s_curve(n_samples=300, random_state=0)
    else:
        X, _y = make_blobs(n_samples=300, centers=3, n_features=5, random_state=0)
    make = _pipelines()[name]
    k = 16 if name == "tsne" else 10  # TSNE(perplexity=5) reads 3 * 5 + 1 neighbours besides the sample
    ours = make_pipeline(KNeighborsTransformer(n_neighbors=k, device="cpu"), make())
    ref = make_pipeline(skn.KNeighborsTransformer(n_neighbors=k), make())
    if name in ("dbscan", "spectral"):
        a, b = ours.fit_predict(X), ref.fit_predict(X)
        assert adjusted_rand_score(a, b) > 0.99
    elif name == "isomap":
        a, b = ours.fit_transform(X), ref.fit_transform(X)
        # the same graph gives the same embedding up to the sign of each axis
        np.testing.assert_allclose(np.abs(a), np.abs(b), rtol=1e-3, atol=1e-3)
    else:
        from sklearn.manifold import trustworthiness

        a, b = ours.fit_transform(X), ref.fit_transform(X)
        assert trustworthiness(X, a, n_neighbors=5) > trustworthiness(X, b, n_neighbors=5) - 0.02


def test_import_knnkit_does_not_import_sklearn():
    import subprocess
    import sys

    code = "import sys, knnkit; print('sklearn' in sys.modules)"
    import os

    import knnkit

    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(knnkit.__file__)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "False"


def test_umap_knn_format_and_embedding_quality():
    """``umap_knn`` gives UMAP's own layout of neighbours (self first, Euclidean distances) and an
    embedding as trustworthy as UMAP with its own neighbour search."""
    import knnkit

    X = np.random.default_rng(3).standard_normal((800, 12)).astype(np.float32)
    ind, dist = knnkit.umap_knn(X, 10, device="cpu", random_state=0)
    assert ind.shape == dist.shape == (800, 10) and ind.dtype == np.int64
    assert (ind[:, 0] == np.arange(800)).all() and (dist[:, 0] == 0).all()
    d_true, i_true = knnkit.knn(X, k=9, metric="euclidean", device="cpu")
    np.testing.assert_allclose(dist[:, 1:], d_true, rtol=1e-4, atol=1e-5)  # small n: exact graph
    with pytest.raises(ValueError, match="metric"):
        knnkit.umap_knn(X, 10, metric="inner_product")
    umap = pytest.importorskip("umap")
    from sklearn.manifold import trustworthiness

    from sklearn.datasets import load_digits

    D = load_digits().data[:1000].astype(np.float32)
    ind, dist = knnkit.umap_knn(D, 15, device="cpu", random_state=0)
    ours = umap.UMAP(n_neighbors=15, precomputed_knn=(ind, dist, None), random_state=0, n_epochs=100).fit_transform(D)
    ref = umap.UMAP(n_neighbors=15, random_state=0, n_epochs=100).fit_transform(D)
    assert trustworthiness(D, ours, n_neighbors=10) > trustworthiness(D, ref, n_neighbors=10) - 0.02
