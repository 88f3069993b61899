"""The robustness-suite generators (datasets/suite.py): shapes, seeding, the property each set is
made for, and argument validation."""

import numpy as np
import pytest

from knnkit.datasets import suite
from knnkit.datasets.suite import (make_2d, make_broad_clusters, make_duplicates, make_manifold,
                                   make_sift_like_uint8, make_skewed_norms, make_tight_clusters,
                                   make_uniform_cube, robustness_sets)

GENERATORS = [
    (make_tight_clusters, dict(n=600, d=8, n_clusters=30, spread=0.01)),
    (make_broad_clusters, dict(n=600, d=8)),
    (make_manifold, dict(n=600, d=32, intrinsic=3)),
    (make_duplicates, dict(n=600, d=3, n_distinct=50)),
    (make_skewed_norms, dict(n=600, d=8)),
    (make_sift_like_uint8, dict(n=600, d=128)),
    (make_2d, dict(n=600)),
    (make_uniform_cube, dict(n=600, d=5)),
]


@pytest.mark.parametrize("gen,kw", GENERATORS, ids=[g.__name__ for g, _ in GENERATORS])
def test_shapes_seeding_and_streams(gen, kw):
    a = gen(**kw, random_state=7)
    b, q = gen(**kw, n_queries=25, random_state=7)
    c = gen(**kw, random_state=8)
    assert isinstance(a, np.ndarray) and a.shape[0] == kw["n"] and q.shape == (25, a.shape[1])
    assert a.dtype == q.dtype and a.dtype in (np.float32, np.uint8)
    assert np.array_equal(a, b)          # data does not depend on n_queries
    assert not np.array_equal(a, c)      # the seed matters
    assert np.isfinite(a.astype(np.float32)).all()


def test_tight_clusters_are_tight_and_separated():
    X = make_tight_clusters(2000, 16, 40, 0.01, random_state=0)
    # every point's nearest neighbour is much closer than the nearest point of another cluster:
    # the single-linkage gap splits the data into exactly 40 groups
    from scipy.cluster.hierarchy import fcluster, linkage
    lab = fcluster(linkage(X, "single"), t=1.0, criterion="distance")
    assert len(np.unique(lab)) == 40
    assert np.bincount(lab)[1:].min() == 50  # equal sizes


def test_duplicates_and_sift_like_and_skewed():
    X = make_duplicates(3000, 3, 400, random_state=1)
    u, cnt = np.unique(X, axis=0, return_counts=True)
    assert len(u) == 400 and cnt.max() > 50
    S = make_sift_like_uint8(1000, random_state=1)
    assert (S == 0).mean() > 0.1 and S.max() > 100
    N = np.linalg.norm(make_skewed_norms(3000, 16, random_state=1), axis=1)
    assert N.max() / np.median(N) > 10


def test_manifold_has_low_intrinsic_dimension():
    X = make_manifold(3000, 64, intrinsic=2, noise=0.0, random_state=0)
    # local PCA around a point: 2 directions hold nearly all the variance of its 30 neighbours
    d = ((X - X[0]) ** 2).sum(1)
    nb = X[np.argsort(d)[:30]]
    s = np.linalg.svd(nb - nb.mean(0), compute_uv=False) ** 2
    assert s[:2].sum() / s.sum() > 0.95
    assert np.linalg.matrix_rank(X[:500] - X[:500].mean(0), tol=1e-3) > 10  # curved: spans many dims


@pytest.mark.parametrize("call,param", [
    (lambda: make_tight_clusters(100, 4, 10, float("nan")), "spread"),
    (lambda: make_tight_clusters(100, 4, 10, -1.0), "spread"),
    (lambda: make_tight_clusters(100, 4, 101, 0.1), "n_clusters"),
    (lambda: make_tight_clusters(0, 4, 1, 0.1), "n"),
    (lambda: make_broad_clusters(100, 4, spread=float("inf")), "spread"),
    (lambda: make_manifold(100, 8, intrinsic=9), "intrinsic"),
    (lambda: make_manifold(100, 8, noise=float("nan")), "noise"),
    (lambda: make_duplicates(100, 3, 0), "n_distinct"),
    (lambda: make_duplicates(100, 3, 101), "n_distinct"),
    (lambda: make_skewed_norms(100, 3, norm_sigma=0), "norm_sigma"),
    (lambda: make_sift_like_uint8(100, d=0), "d"),
    (lambda: make_2d(10, n_queries=-1), "n_queries"),
    (lambda: make_uniform_cube(10, 2.5), "d"),
    (lambda: robustness_sets("huge"), "scale"),
    (lambda: robustness_sets("ci", names=["nope"]), "names"),
])
def test_bad_arguments(call, param):
    with pytest.raises(ValueError, match=param):
        call()


def test_robustness_sets_ci():
    sets = robustness_sets("ci", real=False)
    names = [s[0] for s in sets]
    assert len(names) == len(set(names)) == len([s for s in suite._spec() if "ci" in s[2]])
    for name, X, Q, metric in sets:
        assert X.ndim == 2 and Q.shape[1] == X.shape[1] and X.shape[0] <= 10_000, name
        assert metric in ("sqeuclidean", "inner_product")
    tight = dict((s[0], s) for s in sets)["tight_c1000"][1]
    assert 100 > np.sqrt(tight.shape[0])  # more clusters than the default sqrt(n) entry points
    again = robustness_sets("ci", names=["points_2d"], real=False)
    assert np.array_equal(again[0][1], dict((s[0], s[1]) for s in sets)["points_2d"])


def test_real_sets_skipped_or_loaded(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("KNNKIT_DATA", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    np.save(tmp_path / "skin_rgb_u8.npy", np.arange(300 * 3, dtype=np.uint8).reshape(300, 3) % 7)
    import logging

    from knnkit.datasets.real import find_data_dir

    try:  # CI installs the Debian package of Fashion-MNIST; elsewhere it is absent
        find_data_dir("fashion-mnist", ["train-images-idx3-ubyte.gz"])
        have_fmnist = True
    except FileNotFoundError:
        have_fmnist = False
    with caplog.at_level(logging.INFO, logger="knnkit"):
        sets = robustness_sets("ci", names=["skin_u8", "fashion_mnist_u8"], n_queries=20)
    assert [s[0] for s in sets] == ["skin_u8"] + (["fashion_mnist_u8"] if have_fmnist else [])
    assert sets[0][1].shape == (280, 3) and sets[0][2].shape == (20, 3)
    if not have_fmnist:
        assert "fashion-mnist skipped" in caplog.text
