"""Test helpers shared by the test files (one copy): data makers, a float64 exact reference and
recall. Import them as ``from helpers import ...`` (pytest puts this folder on ``sys.path``)."""

import numpy as np

__all__ = ["gaussian_clusters", "exact_neighbours", "recall_at", "check_cosine_resolution_warning"]


def gaussian_clusters(n, d, seed=0, centres=20):
    """``n`` points around ``centres`` Gaussian centres (spread 4) with unit noise, float32."""
    rng = np.random.default_rng(seed)
    C = rng.normal(size=(centres, d)) * 4
    return (C[rng.integers(0, centres, n)] + rng.normal(size=(n, d))).astype(np.float32)


def exact_neighbours(X, k, metric="sqeuclidean"):
    """Exact neighbours of every row of ``X`` (self excluded) in float64 numpy: ``(ids, distances)``,
    distances in the user metric, equal distances ordered by the smaller id."""
    X = X.astype(np.float64)
    if metric in ("sqeuclidean", "euclidean"):
        sq = (X * X).sum(1)
        D = np.maximum(sq[:, None] + sq[None] - 2 * X @ X.T, 0)
    elif metric == "cosine":
        Y = X / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-30)
        D = 1 - Y @ Y.T
    elif metric == "inner_product":
        D = -(X @ X.T)
    elif metric == "manhattan":
        D = np.abs(X[:, None, :] - X[None, :, :]).sum(-1)
    else:
        raise ValueError(metric)
    np.fill_diagonal(D, np.inf)
    ids = np.argsort(D, axis=1, kind="stable")[:, :k]
    Dk = np.take_along_axis(D, ids, 1)
    if metric == "euclidean":
        Dk = np.sqrt(Dk)
    if metric == "inner_product":
        Dk = -Dk
    return ids, Dk


def recall_at(found, truth):
    """Mean fraction of each row's true ids found (rows of equal count; -1 never counts)."""
    found, truth = np.asarray(found), np.asarray(truth)
    return float(np.mean([len(set(a[a >= 0].tolist()) & set(b.tolist())) / len(b) for a, b in zip(found, truth)]))


def check_cosine_resolution_warning(calls, seed=1):
    """Each of ``calls`` (functions of one data array that search it by cosine) raises the cosine
    resolution RuntimeWarning on rows sharing a direction with similarities ~0.99999, and no
    RuntimeWarning at ~0.9999 nor on exact copies and multiples (parallel rows: ties at 0)."""
    import warnings

    import pytest

    rng = np.random.default_rng(seed)
    b = rng.standard_normal(16)
    close = (b + 1e-3 * rng.standard_normal((1500, 16))).astype(np.float32)
    fine = (b + 1e-2 * rng.standard_normal((1500, 16))).astype(np.float32)
    copies = np.concatenate([fine[:300], fine[:50], fine[50:80] * np.float32(3.0)])  # copies and multiples
    for call in calls:
        with pytest.warns(RuntimeWarning, match="cannot order them"):
            call(close)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for call in calls:
            call(fine)
            call(copies)
