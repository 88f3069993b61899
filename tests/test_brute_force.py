"""Exact k-NN (knnkit.knn): CPU against a float64 NumPy/SciPy reference, GPU against CPU."""

import numpy as np
import pytest
from scipy.spatial.distance import cdist

import knnkit
from knnkit.exact import _cpu
from knnkit.exact._cpu import select_rows_cpu

gpu = pytest.mark.skipif(not knnkit.gpu_available(), reason="needs an NVIDIA GPU and CuPy")


# ----------------------------------------------------------------------------- reference


def reference(X, Q, k, metric, exclude_self=False):
    """float64 ground truth: (distances (m, k), indices (m, k), full matrix of internal keys)."""
    X64 = np.asarray(X, np.float64)
    Q64 = X64 if Q is None else np.asarray(Q, np.float64)
    if metric in ("sqeuclidean", "euclidean"):
        keys = cdist(Q64, X64, "sqeuclidean")
    elif metric == "inner_product":
        keys = -(Q64 @ X64.T)
    else:
        nx = np.linalg.norm(X64, axis=1)
        nq = np.linalg.norm(Q64, axis=1)
        keys = -(Q64 @ X64.T) / np.maximum(nq, 1e-300)[:, None] / np.maximum(nx, 1e-300)[None, :]
    if exclude_self:
        np.fill_diagonal(keys, np.inf)
    idx = np.argsort(keys, axis=1, kind="stable")[:, :k]
    kd = np.take_along_axis(keys, idx, 1)
    if metric == "euclidean":
        d = np.sqrt(kd)
    elif metric == "inner_product":
        d = -kd
    elif metric == "cosine":
        d = 1 + kd
    else:
        d = kd
    return d, idx, keys


def assert_knn_ok(d, i, X, Q, k, metric, exclude_self=False, min_exact=0.98):
    """Distances match the reference; every returned index is a true k-NN up to float32 noise;
    rows are sorted; almost every index equals the reference (random floats rarely tie)."""
    d = np.asarray(d)
    i = np.asarray(i)
    rd, ri, keys = reference(X, Q, k, metric, exclude_self)
    m = rd.shape[0]
    assert d.shape == (m, k) and i.shape == (m, k)
    assert d.dtype == np.float32 and i.dtype == np.int64
    scale = max(1.0, float(np.abs(rd).max()))
    tol = 2e-4 * scale
    np.testing.assert_allclose(d, rd, rtol=1e-4, atol=tol)
    # returned index really has the returned distance
    got = np.take_along_axis(keys, i, 1)
    kth = np.take_along_axis(keys, ri[:, -1:], 1)
    assert np.all(got <= kth + 2e-4 * max(1.0, float(np.abs(keys[np.isfinite(keys)]).max()))), "non-neighbour returned"
    # no duplicate index within a row, sorted rows
    assert all(len(set(row)) == k for row in i.tolist())
    if metric == "inner_product":
        assert np.all(np.diff(d, axis=1) <= 0)
    else:
        assert np.all(np.diff(d, axis=1) >= 0)
    if exclude_self:
        assert not np.any(i == np.arange(m)[:, None])
    assert (i == ri).mean() >= min_exact


def rand(shape, dtype=np.float32, seed=None):
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "u":
        return rng.integers(0, 256, size=shape).astype(dt)
    if dt.kind == "i":
        return rng.integers(-128, 128, size=shape).astype(dt)
    return rng.standard_normal(shape).astype(dt)


# ----------------------------------------------------------------------------- CPU correctness


@pytest.mark.parametrize("metric", ["sqeuclidean", "euclidean", "inner_product", "cosine"])
def test_cpu_metrics_against_reference(metric):
    X, Q = rand((1500, 24)), rand((200, 24))
    d, i = knnkit.knn(X, Q, k=9, metric=metric, device="cpu")
    assert_knn_ok(d, i, X, Q, 9, metric)


@pytest.mark.parametrize("metric", ["sqeuclidean", "inner_product", "cosine"])
def test_cpu_all_points_excludes_self(metric):
    X = rand((800, 12))
    d, i = knnkit.knn(X, k=6, metric=metric, device="cpu")
    assert_knn_ok(d, i, X, None, 6, metric, exclude_self=True)


@pytest.mark.parametrize("dtype", [np.float16, np.uint8, np.int8, np.float64])
@pytest.mark.parametrize("metric", ["sqeuclidean", "inner_product", "cosine"])
def test_cpu_dtypes(dtype, metric):
    X, Q = rand((700, 20), dtype), rand((90, 20), dtype)
    d, i = knnkit.knn(X, Q, k=5, metric=metric, device="cpu")
    # the reference sees the same values the library computes on (float32 of the input)
    Xr, Qr = X.astype(np.float32), Q.astype(np.float32)
    # integer data has exact ties: only check distances and neighbour validity there
    exact = 0.98 if np.dtype(dtype).kind == "f" else 0.0
    assert_knn_ok(d, i, Xr, Qr, 5, metric, min_exact=exact)


def test_cpu_k1_and_k_equals_n():
    X, Q = rand((300, 7)), rand((50, 7))
    d, i = knnkit.knn(X, Q, k=1, device="cpu")
    assert_knn_ok(d, i, X, Q, 1, "sqeuclidean")
    d, i = knnkit.knn(X, Q, k=300, device="cpu")
    assert_knn_ok(d, i, X, Q, 300, "sqeuclidean")
    assert np.array_equal(np.sort(i, axis=1), np.tile(np.arange(300), (50, 1)))


def test_cpu_k_equals_n_minus_1_all_points():
    X = rand((64, 5))
    d, i = knnkit.knn(X, k=63, device="cpu")
    assert_knn_ok(d, i, X, None, 63, "sqeuclidean", exclude_self=True)


@pytest.mark.parametrize("sym_block, tiles", [(2048, None), (64, None), (2048, (7, 97))])
def test_cpu_duplicates_and_tie_order(sym_block, tiles, monkeypatch):
    # small-integer data: distances are exact in float32, so ties are exact and the order
    # must be (distance, smaller index) exactly as a stable sort of the float64 reference;
    # sym_block=64 runs the all-points graph through the symmetric (block pair) path (at any d);
    # tiles: the fused GEMM-and-select path in tiles of 7 query rows x 97 data rows
    monkeypatch.setattr(_cpu, "_SYM_BLOCK", sym_block)
    if tiles is not None:
        monkeypatch.setattr(_cpu, "_TILE_ROWS", tiles[0])
        monkeypatch.setattr(_cpu, "_TILE_COLS", tiles[1])
    rng = np.random.default_rng(1)
    base = rng.integers(0, 3, size=(40, 4)).astype(np.float32)
    X = base[rng.integers(0, 40, size=600)]
    d, i = knnkit.knn(X, k=15, device="cpu")
    rd, ri, _ = reference(X, None, 15, "sqeuclidean", exclude_self=True)
    np.testing.assert_array_equal(i, ri)
    np.testing.assert_array_equal(d, rd.astype(np.float32))
    # each point's exact duplicates (other indices) come first, at distance 0
    for r in range(20):
        dups = np.flatnonzero((X == X[r]).all(1))
        dups = dups[dups != r][:15]
        np.testing.assert_array_equal(i[r, : len(dups)], dups)
        assert np.all(d[r, : len(dups)] == 0)


def test_cpu_duplicate_query_of_a_point_is_distance_zero():
    X = rand((500, 16))
    Q = X[[3, 3, 77]]
    d, i = knnkit.knn(X, Q, k=2, device="cpu")
    assert i[0, 0] == 3 and i[1, 0] == 3 and i[2, 0] == 77
    assert d[0, 0] == 0 and d[2, 0] == 0


def test_cpu_d1():
    X, Q = rand((400, 1)), rand((30, 1))
    for metric in ("sqeuclidean", "euclidean"):
        d, i = knnkit.knn(X, Q, k=4, metric=metric, device="cpu")
        assert_knn_ok(d, i, X, Q, 4, metric)


def test_cpu_blocks_with_remainders(monkeypatch):
    # force many data blocks and query blocks, none of them full at the end
    monkeypatch.setattr(_cpu, "_QUERY_BLOCK", 97)
    monkeypatch.setattr(_cpu, "_SYM_BLOCK", 97)
    monkeypatch.setattr(_cpu, "_TILE_ROWS", 13)   # fused tiles: none full at the end either
    monkeypatch.setattr(_cpu, "_TILE_COLS", 101)
    X, Q = rand((2345, 10)), rand((301, 10))
    d, i = knnkit.knn(X, Q, k=11, device="cpu")
    assert_knn_ok(d, i, X, Q, 11, "sqeuclidean")
    d, i = knnkit.knn(X[:777], k=11, device="cpu")
    assert_knn_ok(d, i, X[:777], None, 11, "sqeuclidean", exclude_self=True)
    d, i = knnkit.knn(X[:777], k=11, device="cpu")
    assert_knn_ok(d, i, X[:777], None, 11, "sqeuclidean", exclude_self=True)


def test_cpu_batch_size_argument():
    X, Q = rand((900, 8)), rand((77, 8))
    d1, i1 = knnkit.knn(X, Q, k=5, device="cpu", batch_size=10)
    d2, i2 = knnkit.knn(X, Q, k=5, device="cpu")
    np.testing.assert_array_equal(i1, i2)
    np.testing.assert_array_equal(d1, d2)


def test_cpu_non_contiguous_and_float64():
    base = rand((600, 30), np.float64)
    X = base[:, ::2]            # non-contiguous float64
    Q = base[:40:2, 1::2]
    assert not X.flags.c_contiguous
    d, i = knnkit.knn(X, Q, k=5, device="cpu")
    assert_knn_ok(d, i, X.astype(np.float32), Q.astype(np.float32), 5, "sqeuclidean")
    Xf = np.asfortranarray(X.astype(np.float32))
    d2, i2 = knnkit.knn(Xf, Q, k=5, device="cpu")
    np.testing.assert_array_equal(i, i2)


def test_cpu_lists_accepted():
    d, i = knnkit.knn([[0.0, 0.0], [1.0, 0.0], [5.0, 5.0]], [[0.9, 0.0]], k=2, device="cpu")
    assert i.tolist() == [[1, 0]]
    np.testing.assert_allclose(d, [[0.01, 0.81]], rtol=1e-5)


def test_cpu_torch_in_torch_out():
    torch = pytest.importorskip("torch")
    X = torch.from_numpy(rand((300, 8)))
    d, i = knnkit.knn(X, X[:10], k=3, device="cpu")
    assert isinstance(d, torch.Tensor) and isinstance(i, torch.Tensor)
    assert i.dtype == torch.int64 and d.dtype == torch.float32
    assert i[:, 0].tolist() == list(range(10))


def test_select_rows_cpu():
    D = rand((50, 333))
    D[:, 10] = D[:, 20] = -100.0  # an exact tie: column 10 first
    v, c = select_rows_cpu(D, 7)
    ref = np.argsort(D, axis=1, kind="stable")[:, :7]
    np.testing.assert_array_equal(c, ref)
    np.testing.assert_array_equal(v, np.take_along_axis(D, ref, 1))


def test_knn_cpu_symmetric_task_error_is_raised(monkeypatch):
    # a failing block-pair task must surface as its own exception, not hang the other workers
    # that wait for its blocks
    monkeypatch.setattr(_cpu, "_SYM_BLOCK", 100)

    def boom(*args):
        raise RuntimeError("pair task failed")

    monkeypatch.setattr(_cpu, "_pair_cols", boom)
    X = rand((1000, 6), seed=4)
    with pytest.raises(RuntimeError, match="pair task failed"):
        _cpu.knn_cpu(X, X, 5, "l2", True)


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_knn_cpu_symmetric_equals_plain(metric, monkeypatch):
    X = rand((1000, 6), seed=3)
    monkeypatch.setattr(_cpu, "_SYM_BLOCK", 128)
    d1, i1 = knnkit.exact._cpu.knn_cpu(X, X, 7, metric, True)
    monkeypatch.setattr(_cpu, "_SYMMETRIC_HEAP_BYTES", 0)  # plain query-block path
    d2, i2 = knnkit.exact._cpu.knn_cpu(X, X, 7, metric, True)
    np.testing.assert_array_equal(i1, i2)
    np.testing.assert_array_equal(d1, d2)
    rd, ri, _ = reference(X, None, 7, "sqeuclidean" if metric == "l2" else "inner_product", exclude_self=True)
    if metric == "l2":
        np.testing.assert_allclose(d1, rd, rtol=1e-4, atol=1e-4)
    assert (i1 == ri).mean() > 0.98


# ----------------------------------------------------------------------------- bad input


def _truth_recall(X, Q, ids, k, exclude_self):
    D = cdist(Q.astype(np.float64), X.astype(np.float64), "sqeuclidean")
    if exclude_self:
        np.fill_diagonal(D, np.inf)
    kth = np.sort(D, axis=1)[:, k - 1:k]
    return float(np.mean(np.take_along_axis(D, ids, axis=1) <= kth * (1 + 1e-6)))


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("all_points", [True, False])
def test_certificate_on_heavy_tails(all_points, device, monkeypatch):
    """Heavy-tailed rows (Cauchy): the squared-L2 certificate bounds the key error by the points
    within the k-th's reach, not by the largest norm (an outlier's), so rows certify instead of
    falling back to float64 (before: 98 % of rows recomputed); the answer stays exact. Outliers
    as queries and a tight far cluster check the reach argument where it is short."""
    rng = np.random.default_rng(11)
    X = rng.standard_cauchy((3000, 16)).astype(np.float32)
    X[:40] = (5e3 + 1e-3 * rng.standard_normal((40, 16))).astype(np.float32)  # a tight cluster far out
    Q = X if all_points else np.concatenate([X[:60], rng.standard_cauchy((200, 16)).astype(np.float32)])
    seen = {}
    if device == "cpu":
        certify = _cpu._certify

        def counting(*args):
            ok = certify(*args)
            seen["failed"] = seen.get("failed", 0) + int((~ok).sum())
            return ok

        monkeypatch.setattr(_cpu, "_certify", counting)
    else:
        from knnkit.exact import _gpu

        certify = _gpu.certify

        def counting(*args, **kw):
            ok, bad = certify(*args, **kw)
            assert bad == 0  # the self-check never sees the bound violated
            seen["failed"] = seen.get("failed", 0) + int((~ok).sum())
            return ok, bad

        monkeypatch.setattr(_gpu, "certify", counting)
    k = 20
    d, i = knnkit.knn(X, None if all_points else Q, k=k, method="gemm", device=device)
    assert seen["failed"] < 40 + 0.05 * Q.shape[0]  # the far cluster's rows cannot certify (spread 1e-3 at 5e3)
    i = i.get() if hasattr(i, "get") else np.asarray(i)
    assert _truth_recall(X, Q, i, k, all_points) == 1.0


def test_bad_k_zero():
    with pytest.raises(ValueError, match="k must be >= 1"):
        knnkit.knn(rand((10, 3)), k=0, device="cpu")


def test_bad_k_negative():
    with pytest.raises(ValueError):
        knnkit.knn(rand((10, 3)), rand((2, 3)), k=-1, device="cpu")


def test_bad_k_greater_than_n():
    with pytest.raises(ValueError, match="exceeds"):
        knnkit.knn(rand((10, 3)), rand((2, 3)), k=11, device="cpu")


def test_bad_k_equal_n_all_points():
    with pytest.raises(ValueError, match="excludes itself"):
        knnkit.knn(rand((10, 3)), k=10, device="cpu")


def test_bad_k_not_integer():
    with pytest.raises(TypeError):
        knnkit.knn(rand((10, 3)), k=2.5, device="cpu")


def test_bad_dimension_mismatch():
    with pytest.raises(ValueError, match="dimension mismatch"):
        knnkit.knn(rand((10, 3)), rand((2, 4)), k=1, device="cpu")


def test_bad_1d_input():
    with pytest.raises(ValueError, match="2-D"):
        knnkit.knn(rand((10,)), k=1, device="cpu")


def test_bad_3d_input():
    with pytest.raises(ValueError, match="2-D"):
        knnkit.knn(rand((10, 3)), rand((2, 3, 1)), k=1, device="cpu")


def test_bad_empty_data():
    with pytest.raises(ValueError, match="empty"):
        knnkit.knn(np.zeros((0, 3), np.float32), k=1, device="cpu")


def test_bad_empty_queries():
    with pytest.raises(ValueError, match="empty"):
        knnkit.knn(rand((10, 3)), np.zeros((0, 3), np.float32), k=1, device="cpu")


def test_bad_nan():
    X = rand((10, 3))
    X[4, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        knnkit.knn(X, k=1, device="cpu")


def test_bad_inf_in_queries():
    Q = rand((2, 3))
    Q[0, 0] = np.inf
    with pytest.raises(ValueError, match="Inf"):
        knnkit.knn(rand((10, 3)), Q, k=1, device="cpu")


def test_bad_dtype():
    with pytest.raises(TypeError, match="dtype"):
        knnkit.knn(np.ones((10, 3), np.complex64), k=1, device="cpu")
    with pytest.raises(TypeError, match="dtype"):
        knnkit.knn(np.ones((10, 3), np.int64), k=1, device="cpu")


def test_bad_metric():
    with pytest.raises(ValueError, match="unknown metric"):
        knnkit.knn(rand((10, 3)), k=1, metric="hamming", device="cpu")


def test_bad_precision():
    with pytest.raises(ValueError, match="precision"):
        knnkit.knn(rand((10, 3)), k=1, precision="fp8", device="cpu")


def test_bad_device():
    with pytest.raises(ValueError, match="device"):
        knnkit.knn(rand((10, 3)), k=1, device="tpu")


def test_bad_batch_size():
    with pytest.raises(ValueError, match="batch_size"):
        knnkit.knn(rand((10, 3)), k=1, device="cpu", batch_size=0)


def test_bad_none_data():
    with pytest.raises(TypeError):
        knnkit.knn(None, k=1, device="cpu")


# ----------------------------------------------------------------------------- GPU


def gpu_vs_cpu(X, Q, k, metric, precision="exact", exact_ties_only=False, **kw):
    """GPU result equals the CPU one: same distances (float32 noise), same indices except
    where distances tie within noise."""
    dg, ig = knnkit.knn(X, Q, k=k, metric=metric, device="gpu", precision=precision, **kw)
    dc, ic = knnkit.knn(X, Q, k=k, metric=metric, device="cpu")
    dg, ig = np.asarray(dg), np.asarray(ig)
    assert dg.dtype == np.float32 and ig.dtype == np.int64 and dg.shape == dc.shape
    scale = max(1.0, float(np.abs(dc).max()))
    np.testing.assert_allclose(dg, dc, rtol=1e-5, atol=1e-5 * scale)
    diff = ig != ic
    if exact_ties_only:
        np.testing.assert_array_equal(ig, ic)
    elif diff.any():
        # mismatches only among (near-)equal distances
        assert np.all(np.abs(dg[diff] - dc[diff]) <= 1e-5 * scale)
        assert diff.mean() < 0.01
    return dg, ig


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("metric", ["sqeuclidean", "euclidean", "inner_product", "cosine"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.uint8, np.int8])
def test_gpu_matches_cpu_metrics_dtypes(metric, dtype):
    X, Q = rand((3001, 33), dtype, seed=1), rand((257, 33), dtype, seed=2)
    gpu_vs_cpu(X, Q, 10, metric)
    gpu_vs_cpu(X, None, 7, metric)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("n,d,k", [(5000, 16, 1), (2000, 24, 1024), (3000, 1, 5), (1500, 960, 20),
                                   (1025, 8, 1024), (777, 3, 776)])
def test_gpu_odd_shapes(n, d, k):
    X = rand((n, d), seed=n + d)
    Q = rand((123, d), seed=k)
    if k < n:
        gpu_vs_cpu(X, Q, k, "sqeuclidean")
    if k < n:
        gpu_vs_cpu(X, None, k, "sqeuclidean")


@pytest.mark.gpu
@gpu
def test_gpu_many_tiles_with_remainders(monkeypatch):
    from knnkit.exact import _gpu

    # narrow data tiles (2560 columns for 300 queries) and query tiles with remainders
    monkeypatch.setattr(_gpu, "_MIN_TILE_ELEMS", 1)
    monkeypatch.setattr(_gpu, "_MAX_TILE_ELEMS", 300 * 2560)
    X, Q = rand((20011, 12), seed=5), rand((1003, 12), seed=6)
    gpu_vs_cpu(X, Q, 17, "sqeuclidean", batch_size=300)
    gpu_vs_cpu(X[:5003], None, 9, "inner_product", batch_size=300)
    gpu_vs_cpu(X, Q, 100, "sqeuclidean", batch_size=300, precision="fp16_rerank")
    monkeypatch.setattr(_gpu, "_OVERLAP", True)  # two-stream variant
    gpu_vs_cpu(X, Q, 17, "sqeuclidean", batch_size=300)
    gpu_vs_cpu(X[:5003], None, 33, "cosine", batch_size=300, precision="tf32_rerank")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("precision", ["exact", "fp16_rerank", "bf16_rerank", "tf32_rerank"])
def test_gpu_preparation_in_row_chunks(monkeypatch, precision):
    """The data's checks, norms and low-precision copy made a few rows at a time (no temporary of
    the data's size): the same lists as in one chunk, and the CPU's; offset clusters (centred in
    the exact mode) and integer data (exact keys)."""
    from knnkit.exact import _gpu

    rng = np.random.default_rng(11)
    X = (rng.standard_normal((6007, 24)) * 0.01 + 1.0).astype(np.float32)
    Q = X[rng.choice(6007, 200, replace=False)] + np.float32(1e-3)
    Xi = rng.integers(0, 200, size=(5003, 16)).astype(np.float32)
    one = [knnkit.knn(A, B, k=12, device="gpu", precision=precision) for A, B in ((X, Q), (Xi, Xi[:150]))]
    monkeypatch.setattr(_gpu, "_PREP_CHUNK_BYTES", 24 * 4 * 97)  # 97 rows of X per chunk
    for (A, B), (d1, i1) in zip(((X, Q), (Xi, Xi[:150])), one):
        d2, i2 = gpu_vs_cpu(A, B, 12, "sqeuclidean", precision=precision)
        np.testing.assert_array_equal(np.asarray(i1), i2)
        np.testing.assert_array_equal(np.asarray(d1), d2)


@pytest.mark.gpu
@gpu
def test_gpu_duplicates_tie_order_exact():
    rng = np.random.default_rng(3)
    base = rng.integers(0, 3, size=(40, 4)).astype(np.uint8)
    X = base[rng.integers(0, 40, size=3000)]
    dg, ig = gpu_vs_cpu(X, None, 40, "sqeuclidean", exact_ties_only=True)
    rd, ri, _ = reference(X, None, 40, "sqeuclidean", exclude_self=True)
    np.testing.assert_array_equal(ig, ri)


def _far_tight_2d(n, seed):
    """2-D tight clusters far from the origin (neighbour gaps far below the float32 GEMM keys'
    rounding bound: nearly no row certifies) with 300 copies of one point (more exact ties than
    the float64 threshold lists' first 256 slots)."""
    rng = np.random.default_rng(seed)
    centers = rng.uniform(-2000, 2000, (12, 2))
    X = centers[rng.integers(0, 12, n)] + rng.normal(0, 2e-3, (n, 2))
    X[:300] = X[300]
    return X.astype(np.float32)


@pytest.mark.parametrize("k", [1, 20, 300])
def test_cpu_float64_threshold_lists(monkeypatch, k):
    """CPU twin of the GPU threshold lists: rows that fail the certificate are answered from the
    points within their k-th candidate distance (a window on the main axis, float64 sums with an
    early stop); against the float64 reference, and equal to the sorting fallback row for row
    (which overflowing lists, 300 duplicates, still take)."""
    X = _far_tight_2d(3000, 11)
    calls = []
    real = _cpu._rows_within64
    monkeypatch.setattr(_cpu, "_rows_within64", lambda *a: calls.append(a[2].size) or real(*a))
    d, i = knnkit.knn(X, k=k, method="gemm", device="cpu")
    assert calls and calls[0] > 1000  # most rows failed the certificate
    assert_knn_ok(d, i, X, None, k, "sqeuclidean", exclude_self=True, min_exact=0.0)
    rows = np.arange(0, 3000, 7)
    new_d, new_i = real(X, X, rows, k, np.asarray(d)[rows, k - 1], True)
    old_d, old_i = _cpu._rows_float64(X, X, rows, k, True, True)
    np.testing.assert_array_equal(new_i, old_i)
    np.testing.assert_array_equal(new_d, old_d)
    # 64-d tight clusters far from the origin (the main axis matters), queries not in the data
    rng = np.random.default_rng(k)
    C = rng.normal(0, 50, (40, 64))
    Y = (C[rng.integers(0, 40, 2000)] + rng.normal(0, 1e-3, (2000, 64))).astype(np.float32)
    Qy = (C[rng.integers(0, 40, 150)] + rng.normal(0, 1e-3, (150, 64))).astype(np.float32)
    kk = min(k, 40)
    d2, i2 = knnkit.knn(Y, Qy, k=kk, method="gemm", device="cpu")
    assert_knn_ok(d2, i2, Y, Qy, kk, "sqeuclidean", min_exact=0.0)
    rows = np.arange(150)
    a_d, a_i = real(Y, Qy, rows, kk, np.asarray(d2)[:, kk - 1], False)
    b_d, b_i = _cpu._rows_float64(Y, Qy, rows, kk, True, False)
    np.testing.assert_array_equal(a_i, b_i)
    np.testing.assert_array_equal(a_d, b_d)


def test_cpu_float64_fallback_row_blocks(monkeypatch):
    """The sorting fallback in row blocks (its float64 block bounded) gives the one-block answer."""
    X = _far_tight_2d(1500, 12)
    rows = np.arange(0, 1500, 3)
    one_d, one_i = _cpu._rows_float64(X, X, rows, 9, True, True)
    monkeypatch.setattr(_cpu, "_ROWS64_BLOCK_ELEMS", 1000)  # 1 row per block at 1500 columns
    blk_d, blk_i = _cpu._rows_float64(X, X, rows, 9, True, True, chunk=700)
    np.testing.assert_array_equal(blk_i, one_i)
    np.testing.assert_array_equal(blk_d, one_d)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("k", [1, 20, 300])
def test_gpu_float64_threshold_lists(monkeypatch, k):
    """Rows that fail the float32 certificate in the exact mode are answered from float64
    threshold lists (``topk_rows_within_f64``): against the float64 reference, and ids and
    distances equal to the former sorting fallback (``_rows_float64``) row for row; lists that
    overflow take a second pass, or the sorting fallback when that would be too large."""
    import cupy as cp

    from knnkit.exact import _gpu

    X = _far_tight_2d(3000, 11)
    d, i = knnkit.knn(X, k=k, method="gemm", device="gpu")
    assert _gpu.knn_gpu.last_fallback > 1000  # the threshold path answered most rows
    assert_knn_ok(d, i, X, None, k, "sqeuclidean", exclude_self=True, min_exact=0.0)
    Xd = cp.asarray(X)
    rows = cp.arange(0, 3000, 7, dtype=cp.int32)
    kth = cp.asarray(np.asarray(d)[rows.get(), k - 1])
    old_d, old_i = _gpu._rows_float64(Xd, Xd[rows], k, "l2", rows)
    for slots, per_launch in ((_gpu._WITHIN_MAX_SLOTS, _gpu._WITHIN_ROWS), (1000, 50)):
        monkeypatch.setattr(_gpu, "_WITHIN_MAX_SLOTS", slots)   # 1000: the sorting fallback
        monkeypatch.setattr(_gpu, "_WITHIN_ROWS", per_launch)   # 50: several launches
        new_d, new_i = _gpu._rows_within_f64(Xd, Xd[rows], k, kth, rows)
        np.testing.assert_array_equal(new_i.get(), old_i.get())
        np.testing.assert_array_equal(new_d.get(), old_d.get())


@pytest.mark.gpu
@gpu
def test_gpu_k_above_1024_fallback():
    X, Q = rand((3000, 8), seed=9), rand((40, 8), seed=10)
    gpu_vs_cpu(X, Q, 1500, "sqeuclidean")


@pytest.mark.gpu
@gpu
def test_gpu_cupy_in_cupy_out():
    import cupy as cp

    X = cp.asarray(rand((2000, 16), seed=11))
    d, i = knnkit.knn(X, X[:50], k=5)
    assert isinstance(d, cp.ndarray) and isinstance(i, cp.ndarray)
    assert i.dtype == cp.int64 and d.dtype == cp.float32
    assert cp.all(i[:, 0] == cp.arange(50))
    d2, i2 = knnkit.knn(X, k=5)
    assert isinstance(i2, cp.ndarray) and not bool(cp.any(i2 == cp.arange(2000)[:, None]))


@pytest.mark.gpu
@gpu
def test_gpu_torch_cuda_in_torch_out():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    X = torch.from_numpy(rand((1000, 8), seed=12)).cuda()
    d, i = knnkit.knn(X, X[:20], k=3)
    assert isinstance(i, torch.Tensor) and i.is_cuda and i.dtype == torch.int64
    assert i[:, 0].tolist() == list(range(20))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("precision", ["fp16_rerank", "tf32_rerank", "bf16_rerank"])
@pytest.mark.parametrize("metric", ["sqeuclidean", "inner_product", "cosine"])
def test_gpu_tensor_core_modes_recall_one(precision, metric):
    X, Q = rand((20000, 64), seed=13), rand((500, 64), seed=14)
    X += 3.0  # off-centre data: the centring must keep the bound useful
    Q += 3.0
    de, ie = knnkit.knn(X, Q, k=10, metric=metric, device="gpu")
    dl, il = knnkit.knn(X, Q, k=10, metric=metric, device="gpu", precision=precision)
    ie, il = np.asarray(ie), np.asarray(il)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ie.tolist(), il.tolist())])
    assert recall == 1.0
    np.testing.assert_allclose(np.asarray(dl), np.asarray(de), rtol=1e-5, atol=1e-5)
    # and against the float64 reference
    assert_knn_ok(dl, il, X, Q, 10, metric)


@pytest.mark.gpu
@gpu
def test_gpu_tensor_core_all_points():
    X = rand((6000, 32), seed=15)
    de, ie = knnkit.knn(X, k=10, device="gpu")
    dl, il = knnkit.knn(X, k=10, device="gpu", precision="fp16_rerank")
    assert (np.asarray(ie) == np.asarray(il)).mean() > 0.999
    np.testing.assert_allclose(np.asarray(dl), np.asarray(de), rtol=1e-5, atol=1e-5)


def test_topk_rows_validates_its_column_offset():
    """The columns come back as int32: an offset that would wrap them is refused at the entry point
    (before any GPU work), as are a negative or non-integer offset and k."""
    from knnkit.exact import topk_rows

    D = np.zeros((2, 10), np.float32)
    with pytest.raises(ValueError, match="col_offset"):
        topk_rows(D, 3, col_offset=2**31 - 5)
    with pytest.raises(ValueError, match="col_offset"):
        topk_rows(D, 3, col_offset=-1)
    with pytest.raises(TypeError, match="col_offset"):
        topk_rows(D, 3, col_offset=1.5)
    with pytest.raises(TypeError, match="k must be an integer"):
        topk_rows(D, "3")


@pytest.mark.gpu
@gpu
def test_gpu_topk_rows():
    import cupy as cp
    from knnkit.exact import topk_rows

    D = rand((300, 5000), seed=16)
    D[:, 7] = D[:, 4000] = -50  # exact tie: column 7 first
    for k in (1, 10, 100, 1000, 1024, 2000):
        v, c = topk_rows(cp.asarray(D), k)
        ref = np.argsort(D, axis=1, kind="stable")[:, :k]
        np.testing.assert_array_equal(cp.asnumpy(c), ref)
        np.testing.assert_array_equal(cp.asnumpy(v), np.take_along_axis(D, ref, 1))
    v, c = topk_rows(cp.asarray(D).astype(cp.float16), 5)
    ref = np.argsort(D.astype(np.float16), axis=1, kind="stable")[:, :5]
    np.testing.assert_array_equal(cp.asnumpy(c), ref)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("precision", ["fp16_rerank", "tf32_rerank", "bf16_rerank"])
@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_gpu_certificate_bound_holds(precision, metric):
    """The per-row error bound used by the certificate really bounds |approximate key - key|
    (checked against float64 on every pair), and is not uselessly loose."""
    import cupy as cp
    from knnkit.exact import _gpu

    X = rand((3000, 64), seed=21) * 2 + 5
    Q = rand((200, 64), seed=22) * 2 + 5
    prep = _gpu._Prepared(cp.asarray(X), metric, precision)
    Qlow, sq, info = prep.queries(cp.asarray(Q))
    tile = cp.float16 if (precision == "fp16_rerank" and _gpu._FP16_TILE) else cp.float32
    G = cp.empty((200, 3000), tile)
    _gpu._gemm(Qlow, prep.X, G, precision)
    alpha = (-2.0 if metric == "l2" else -1.0) / (prep.sx * sq)
    approx = alpha * G.astype(cp.float64)
    if metric == "l2":
        approx += prep.xnorm2.astype(cp.float64)[None, :]
    approx = cp.asnumpy(approx)
    mu = cp.asnumpy(prep.mu).astype(np.float64)
    Xc = X.astype(np.float64) - mu
    if metric == "l2":
        Qc = Q.astype(np.float64) - mu
        exact = (Xc ** 2).sum(1)[None, :] - 2 * Qc @ Xc.T
    else:
        exact = -(Q.astype(np.float64) @ Xc.T)
    err = np.abs(approx - exact).max(axis=1)
    eps = prep.key_error(info, 64)
    assert np.all(err <= eps), (err / eps).max()
    assert np.median(err / eps) > 0.01   # a bound 100x above the real error would be useless


def test_certify_logic_numpy():
    """The certificate of the tensor-core modes (array-module agnostic, checked with NumPy)."""
    from knnkit.exact._gpu import certify

    rng = np.random.default_rng(0)
    m, kc, k, dim = 6, 8, 3, 16
    true_key = np.sort(rng.random((m, kc)) * 10, axis=1)
    shift = rng.random(m)
    exact = true_key - shift[:, None]                    # exact distance = key - shift
    eps = np.full(m, 0.01)
    approx = true_key + rng.uniform(-0.01, 0.01, (m, kc))
    approx.sort(axis=1)
    ok, bad = certify(np, approx, exact, eps, shift, k, dim, False)
    gap = approx[:, -1] - approx[:, k - 1]
    np.testing.assert_array_equal(ok, gap > 0.02)
    assert bad == 0
    # a small gap fails
    approx2 = approx.copy()
    approx2[0, -1] = approx2[0, k - 1] + 0.015
    ok2, _ = certify(np, approx2, exact, eps, shift, k, dim, False)
    assert not ok2[0]
    # a violated bound (wrong scale, as a bug would give) is detected and not certified
    ok3, bad3 = certify(np, approx * 8, exact, eps, shift, k, dim, False)
    assert not ok3.any() and bad3 == int((np.diff((approx * 8)[:, [k - 1, -1]], axis=1)[:, 0] > 0.02).sum())
    ok4, _ = certify(np, approx, exact, eps, shift, k, dim, True)
    assert ok4.all()


