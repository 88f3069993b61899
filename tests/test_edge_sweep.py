"""Every public search path against float64 exact truth, on data shapes that break float32 and
float16 shortcuts (the small CPU version of ``benchmarks/edge_sweep.py``): a common offset, cosine
similarities near 1, unit vectors by inner product, huge and tiny magnitudes, skewed norms, a
lattice with ties, dimensions of very different scales, int8, float16 storage, d = 1.

Each shortcut that failed silently here once is named in the set's comment. Recall is counted by
ids: a returned neighbour counts when its float64 distance is within 1e-5 (relative) of the true
k-th."""

import numpy as np
import pytest

import knnkit
from knnkit import GraphIndex
from knnkit.evaluate import float64_distances
from helpers import check_cosine_resolution_warning

N, NQ, K = 1500, 30, 10


def _sets():
    rng = np.random.default_rng(2026)
    b = rng.standard_normal(16)
    m = N + NQ
    unit = b + 1e-2 * rng.standard_normal((m, 16))
    return {
        # host PQ scored by inner product (0.03 at beam 32), GPU fp16 walk (0.05 at beam 16)
        "cosine_shared_direction": ((b + 1e-2 * rng.standard_normal((m, 16))).astype(np.float32), "cosine"),
        "inner_product_unit_rows": ((unit / np.linalg.norm(unit, axis=1, keepdims=True)).astype(np.float32),
                                    "inner_product"),
        "inner_product_skewed_norms": ((rng.standard_normal((m, 16)) * rng.lognormal(0, 2, (m, 1))).astype(np.float32),
                                       "inner_product"),
        # exact candidate lists, host PQ tables, entry k-means, seeds and repair expansions
        "offset_1e4": ((1e4 + rng.standard_normal((m, 16))).astype(np.float32), "sqeuclidean"),
        "tight_clusters_offset_1e3": (
            (1e3 + rng.standard_normal((150, 16))[rng.integers(0, 150, m)] + 0.01 * rng.standard_normal((m, 16)))
            .astype(np.float32), "euclidean"),
        "tiny_1e-15": ((1e-15 * rng.standard_normal((m, 16))).astype(np.float32), "sqeuclidean"),
        "huge_1e15": ((1e15 * rng.standard_normal((m, 16))).astype(np.float32), "sqeuclidean"),
        "d1": (rng.standard_normal((m, 1)).astype(np.float32), "sqeuclidean"),
        "lattice_ties": (rng.integers(0, 4, (m, 3)).astype(np.float32), "sqeuclidean"),
        "mixed_scale_dims": ((rng.standard_normal((m, 16)) * np.logspace(-3, 3, 16)).astype(np.float32), "sqeuclidean"),
        "int8": (rng.integers(-128, 128, (m, 16)).astype(np.int8), "sqeuclidean"),
        "float16_offset_100": ((100 + rng.standard_normal((m, 16))).astype(np.float16), "sqeuclidean"),
        # shapes of benchmarks/unseen_shapes.py: heavy tails (the exact engine's certificate took its
        # bound from an outlier's norm: every row went to the float64 fallback), half the rows near
        # copies of 30 points (queries, the last rows, from the other half)
        "cauchy": (rng.standard_cauchy((m, 16)).astype(np.float32), "sqeuclidean"),
        "half_near_copies": (np.concatenate([
            rng.standard_normal((30, 16))[rng.integers(0, 30, N // 2)] + 1e-3 * rng.standard_normal((N // 2, 16)),
            rng.standard_normal((m - N // 2, 16))]).astype(np.float32), "sqeuclidean"),
    }


SETS = _sets()


def _distances(X, Q, metric):
    D = float64_distances(X, Q, metric)
    return -D if metric == "inner_product" else D  # smaller is nearer here


def _host(a):
    return np.asarray(a.get() if hasattr(a, "get") else a)


def _recall(ids, D, kth, metric=None, dim=1):
    """Fraction of returned ids whose float64 distance is within the k-th's (relative 1e-5). For
    cosine, plus float32's absolute resolution: rows normalised in float32 carry an error of
    ~2^-24 per component, so ``1 - x.y`` moves by ~2^-24 sqrt(d) whichever engine computes it
    (on the H200, three rows of 30 here held neighbours 2e-8..1e-7 apart in the other order)."""
    ids = _host(ids)
    d = np.where(ids >= 0, np.take_along_axis(D, np.maximum(ids, 0), axis=1), np.inf)
    tol = 1e-5 * np.abs(kth) + 1e-300
    if metric == "cosine":
        tol = tol + 4 * 2.0 ** -24 * np.sqrt(dim)
    return float(np.mean(d <= kth + tol))


DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


@pytest.mark.filterwarnings("error::RuntimeWarning")  # no false alarm either (the lattice's host check had one)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(SETS))
def test_every_path_against_float64_truth(name, device):
    A, metric = SETS[name]
    X, Q = A[:N], A[N:]
    D = _distances(X, Q, metric)
    kth = np.sort(D, axis=1)[:, K - 1:K]
    _d, i = knnkit.knn(X, Q, k=K, metric=metric, device=device)
    assert _recall(i, D, kth, metric, X.shape[1]) == 1.0, "knn"
    rows = np.arange(0, N, 15)
    Ds = _distances(X, X[rows], metric)
    Ds[np.arange(rows.size), rows] = np.inf
    g = knnkit.knn_graph(X, k=K, metric=metric, device=device, method="nndescent", random_state=0)
    assert _recall(_host(g.indices)[rows], Ds, np.sort(Ds, axis=1)[:, K - 1:K], metric, X.shape[1]) >= 0.95, \
        "knn_graph"
    for placement in ("device", "host"):
        index = GraphIndex.build(X, metric=metric, device=device, placement=placement, random_state=0)
        _d, i = index.search(Q, k=K, beam=32)
        assert _recall(i, D, kth, metric, X.shape[1]) >= 0.95, placement
        if placement == "host":  # the build's check ran (rows with an exact copy are left out)
            assert index.build_params["host_check"]["rows"] > 0 or name == "lattice_ties"


@pytest.mark.parametrize("device", DEVICES)
def test_cosine_beyond_float32_resolution_warns(device):
    """Rows sharing a direction with similarities ~0.99999: cosine (1 - x.y of rows normalised in
    float32) cannot order their neighbours; knn, knn_graph and GraphIndex.search say so. Similarities
    ~0.9999, exact copies, multiples (parallel rows: ties at 0) and a query's own row do not warn."""
    check_cosine_resolution_warning((
        lambda X: knnkit.knn(X, X[:5], k=5, metric="cosine", device=device),
        lambda X: knnkit.knn_graph(X, k=5, metric="cosine", device=device, random_state=0),
        lambda X: GraphIndex.build(X, metric="cosine", device=device, random_state=0).search(X[:5], k=5)))
