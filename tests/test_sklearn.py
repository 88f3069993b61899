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
