"""RobustPrune on tensor cores (``robust_prune_tc`` in ``prune.cu``) against the fp32 kernel.

On small-integer data every quantity of the tensor-core kernel is exact (centred differences,
power-of-two scale, fp16 values, fp32 sums of integers), so both kernels must give the same lists
bit for bit -- which checks the bands, the early stop once R are kept, the warp's greedy pass and
``fill``. On real-valued data the tensor-core kernel decides the occlusion tests near their
threshold on the fp32 distance, so the lists agree too, but for rare near-ties past the recheck's
band; offsets, extreme magnitudes and tight clusters (all distances near-equal) must not change that.
"""

import numpy as np
import pytest

import knnkit
from knnkit.index._build import exact_knn_cpu
from knnkit.index._prune_cpu import pair_distances

needs_gpu = pytest.mark.skipif(not knnkit.gpu_available(), reason="needs an NVIDIA GPU and CuPy")


def on_gpu(test):
    return pytest.mark.gpu(needs_gpu(test))


def _both(X, ci, cd, R, alpha, fill=True, node_ids=None):
    import cupy as cp

    from knnkit.index import _prune_gpu

    args = (cp.asarray(X), cp.asarray(ci), cp.asarray(cd), R, alpha, "l2")
    kw = dict(fill=fill, return_distances=True, node_ids=None if node_ids is None else cp.asarray(node_ids))
    old = _prune_gpu.USE_TENSOR_CORES
    try:
        _prune_gpu.USE_TENSOR_CORES = True
        tc = [cp.asnumpy(a) for a in _prune_gpu.prune_gpu(*args, **kw)]
        _prune_gpu.USE_TENSOR_CORES = False
        ref = [cp.asnumpy(a) for a in _prune_gpu.prune_gpu(*args, **kw)]
    finally:
        _prune_gpu.USE_TENSOR_CORES = old
    return tc, ref


def _candidates(X, C, seed, shuffle=True):
    _cd, ci = exact_knn_cpu(X, X, C, "l2", exclude_self=True)
    if shuffle:  # the kernel sorts its input; the reverse stage passes two sorted runs
        rng = np.random.default_rng(seed)
        ci = np.take_along_axis(ci, rng.permuted(np.tile(np.arange(C), (ci.shape[0], 1)), axis=1), axis=1)
    return np.ascontiguousarray(ci.astype(np.int32)), pair_distances(X, ci, "l2")


@on_gpu
@pytest.mark.parametrize("n,d,C,R,alpha", [(600, 8, 40, 12, 1.2), (900, 5, 130, 64, 1.0), (1200, 6, 256, 128, 1.0),
                                           (1000, 7, 384, 128, 1.0), (800, 3, 300, 16, 1.2), (700, 1, 200, 8, 1.0),
                                           (500, 36, 250, 200, 1.0), (400, 200, 130, 32, 1.0),
                                           (300, 131, 64, 16, 1.2), (350, 260, 300, 64, 1.0)])
def test_integer_data_equals_fp32_kernel_exactly(n, d, C, R, alpha):
    rng = np.random.default_rng(n + d + C)
    X = rng.integers(0, 16, size=(n, d)).astype(np.float32)  # many exact ties too
    ci, cd = _candidates(X, C, seed=1)
    (g, gd), (g0, gd0) = _both(X, ci, cd, R, alpha)
    np.testing.assert_array_equal(g, g0)
    np.testing.assert_array_equal(gd, gd0)
    (g, _), (g0, _) = _both(X, ci, cd, R, alpha, fill=False)
    np.testing.assert_array_equal(g, g0)


@on_gpu
@pytest.mark.parametrize("offset,scale,clusters", [(0.0, 1.0, 0), (1000.0, 1.0, 0), (0.0, 1e-6, 0), (0.0, 1e6, 0),
                                                   (-50.0, 3.0, 0), (0.0, 1.0, 300), (100.0, 1e-3, 300)])
def test_real_data_agrees_with_fp32_kernel_whatever_the_magnitude(offset, scale, clusters):
    rng = np.random.default_rng(7)
    X = rng.standard_normal((3000, 48))
    if clusters:  # tight clusters of ~10: every intra-cluster distance is a near-tie of the rule
        X = X[rng.integers(0, clusters, 3000)] + 0.01 * rng.standard_normal((3000, 48))
    X = (X * scale + offset).astype(np.float32)
    ci, cd = _candidates(X, 200, seed=2)
    (g, gd), (g0, _gd0) = _both(X, ci, cd, 64, 1.0)
    rows_equal = np.mean(np.all(g == g0, axis=1))
    # the recheck band is the typical rounding error, not its worst case: tight clusters, where every
    # intra-cluster test is a near-tie, flipped 0.23 % of rows on the H200 (no row on 1M x 128 sets)
    assert rows_equal >= (0.99 if clusters else 0.999), rows_equal
    # the distances returned are the caller's own (exact) ones
    valid = g >= 0
    np.testing.assert_allclose(gd[valid], pair_distances(X, g, "l2")[valid], rtol=1e-5, atol=1e-5 * scale ** 2)


@on_gpu
def test_duplicates_identical_points_and_subsets_of_rows():
    rng = np.random.default_rng(3)
    base = rng.integers(0, 4, size=(50, 4)).astype(np.float32)
    X = np.concatenate([base] * 8 + [np.zeros((20, 4), np.float32)])  # 420 rows, heavy duplicates
    ci, cd = _candidates(X, 100, seed=3)
    ci[:, 50:60] = ci[:, :10]  # repeated ids in a row
    cd[:, 50:60] = cd[:, :10]
    ci[:, 60:64] = -1
    (g, gd), (g0, gd0) = _both(X, ci, cd, 24, 1.0)
    np.testing.assert_array_equal(g, g0)
    rows = np.arange(0, X.shape[0], 3, dtype=np.int32)
    (g, _), (g0, _) = _both(X, ci[rows], cd[rows], 24, 1.0, node_ids=rows)
    np.testing.assert_array_equal(g, g0)
    same_point = np.zeros((300, 16), np.float32)  # every candidate at distance 0
    ci, cd = _candidates(same_point, 64, seed=4, shuffle=False)
    (g, _), (g0, _) = _both(same_point, ci, cd, 16, 1.2)
    np.testing.assert_array_equal(g, g0)


@pytest.mark.parametrize("cc,limit,need,runs", [(90, 232448, 130 << 10, True), (80, 166912, 130 << 10, True),
                                                (86, 101376, 130 << 10, False), (86, 101376, 40 << 10, True),
                                                (75, 65536, 40 << 10, False), (70, 98304, 40 << 10, False)])
def test_tensor_core_kernel_only_where_the_device_runs_it(monkeypatch, cc, limit, need, runs):
    """robust_prune_tc needs mma.sync on fp16 (compute capability 8.0) and up to 130 KB of shared
    memory per block: other devices (T4, V100, consumer cards) get the fp32 kernel instead of a
    launch failure. Checked with a stand-in device (no GPU needed)."""
    import sys
    import types

    from knnkit.index import _prune_gpu

    class Device:
        id = 0
        compute_capability = str(cc)
        attributes = {"MaxSharedMemoryPerBlockOptin": limit}

    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=types.SimpleNamespace(Device=Device)))
    monkeypatch.setattr(_prune_gpu, "_TC_FITS", {})
    assert _prune_gpu._tensor_cores_fit(need) is runs
