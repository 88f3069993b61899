"""Sweet KNN on the GPU: the same cases as tests/test_sweet.py against the GEMM GPU path
(bit-identical distances by construction, so ids agree too) and the CPU twin (same distances to
float32 rounding)."""

import numpy as np
import pytest

from knnkit.exact.sweet import SweetParams, estimate_savings, sweet_knn

pytestmark = pytest.mark.gpu


def gpu_vs_gemm(X, Q, k, params=None, seed=0):
    import cupy as cp

    from knnkit.exact._gpu import knn_gpu

    all_points = Q is None
    Xd = cp.asarray(X)
    Qd = Xd if all_points else cp.asarray(Q)
    d, i, stats = sweet_knn(Xd, Qd, k, metric="l2", exclude_self=all_points, params=params, seed=seed)
    assert isinstance(d, cp.ndarray) and d.dtype == cp.float32 and i.dtype == cp.int64
    d, i = d.get(), i.get()
    d0, i0 = knn_gpu(Xd, Qd, k, "l2", all_points)
    d0, i0 = d0.get(), i0.get()
    # the GEMM path's candidate selection uses float32 keys: compare ids where its distances
    # are distinct from their neighbours' and the distance multiset everywhere
    np.testing.assert_allclose(np.sort(d, 1), np.sort(d0, 1), rtol=1e-4,
                               atol=1e-6 * float(np.abs(X).max() + 1) ** 2)
    assert (np.diff(d, axis=1) >= 0).all()
    distinct = np.ones_like(d, dtype=bool)
    distinct[:, 1:] &= np.diff(d0, axis=1) > 1e-4 * np.abs(d0[:, 1:])
    distinct[:, :-1] &= np.diff(d0, axis=1) > 1e-4 * np.abs(d0[:, 1:])
    np.testing.assert_array_equal(i[distinct], i0[distinct])
    # the CPU twin computes distances in float64: equal up to float32 rounding
    Qh = X if all_points else Q
    dc, ic, _ = sweet_knn(X, Qh, k, metric="l2", exclude_self=all_points, params=params, seed=seed)
    np.testing.assert_allclose(d, dc, rtol=1e-5, atol=1e-7 * float(np.abs(X).max() + 1) ** 2)
    same = d == dc
    exact_rows = same.all(axis=1)
    np.testing.assert_array_equal(i[exact_rows], ic[exact_rows])
    if all_points:
        assert not (i == np.arange(X.shape[0])[:, None]).any()
    return stats


@pytest.mark.parametrize("dim", [1, 2, 3, 8, 32, 40])
def test_random_all_points(rng, dim):
    X = rng.standard_normal((3000 + int(rng.integers(0, 97)), dim)).astype(np.float32)
    gpu_vs_gemm(X, None, int(rng.integers(1, 25)), seed=int(rng.integers(1 << 30)))


@pytest.mark.parametrize("dim", [2, 3, 8])
def test_random_separate_queries(rng, dim):
    X = rng.random((4003, dim), dtype=np.float32)
    Q = rng.random((1517, dim), dtype=np.float32) * 1.4 - 0.2
    gpu_vs_gemm(X, Q, 10)


def test_heavy_duplicates(rng):
    base = rng.integers(0, 8, (300, 3)).astype(np.float32)
    X = base[rng.integers(0, 300, 2000)]
    for k in (1, 7, 30):
        gpu_vs_gemm(X, None, k)


def test_identical_single_cluster_far_queries(rng):
    X = np.full((400, 4), 3.25, np.float32)
    stats = gpu_vs_gemm(X, None, 12)
    assert stats["distance_computations"] == 400 * 399
    one = rng.standard_normal((300, 3)).astype(np.float32) * 1e-3 + 5
    gpu_vs_gemm(one, None, 8, params=SweetParams(n_landmarks_data=1))
    Y = rng.random((1777, 3), dtype=np.float32)
    gpu_vs_gemm(Y, Y[:99] + np.float32(1000), 6)


def test_k_extremes(rng):
    X = rng.standard_normal((211, 3)).astype(np.float32)
    gpu_vs_gemm(X, None, 210)   # global-memory kNearests (k > 128)
    gpu_vs_gemm(X, None, 100)   # local, KCAP 128
    gpu_vs_gemm(X, None, 1)


@pytest.mark.parametrize("filt", ["full", "partial"])
@pytest.mark.parametrize("par", ["query", "split"])
def test_forced_branches(rng, filt, par):
    X = rng.standard_normal((5000, 4)).astype(np.float32)
    Q = rng.standard_normal((31, 4)).astype(np.float32)
    p = SweetParams(filter=filt, parallelism=par)
    s = gpu_vs_gemm(X, None, 9, params=p)
    assert s["filter"] == filt and s["parallelism"] == par
    s = gpu_vs_gemm(X, Q, 140, params=p)
    assert s["filter"] == filt and s["parallelism"] == par


def test_estimate_savings_gpu(rng):
    import cupy as cp

    centres = rng.standard_normal((30, 3)).astype(np.float32) * 30
    X = (centres[rng.integers(0, 30, 20000)] + rng.standard_normal((20000, 3)).astype(np.float32)).astype(np.float32)
    est = estimate_savings(cp.asarray(X), None, 10, sample=500)
    assert 0.9 < est <= 1.0


def test_ip_rejected_gpu():
    import cupy as cp

    X = cp.zeros((10, 2), cp.float32)
    with pytest.raises(ValueError, match="inner product"):
        sweet_knn(X, X, 1, metric="ip")
