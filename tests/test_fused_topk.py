"""The fused fp16 GEMM + top-k' kernel (knnkit/exact/fused_topk.cu) on the GPU.

Two levels: the kernel's candidate lists against float64 keys of the *same* fp16 operands
(catches fragment-layout, masking and merge bugs directly), and knnkit.knn in fp16_rerank mode
with the fused kernel forced on against the float64 reference (the end result, after re-rank and
certificate); the v2 selection (default) against the original v1 (``-DFT_SEL_V1``) and the pipelined
main loop (default) against the original one (``-DFT_MAIN_V1``), ids and keys bit for bit; and, on
the CPU, the lane-level emulation of both selection protocols (and of the pipelined step order)."""

import importlib.util
import os

import numpy as np
import pytest

import knnkit

from test_brute_force import reference

gpu = pytest.mark.skipif(not knnkit.gpu_available(), reason="needs an NVIDIA GPU and CuPy")

# n around the 64-point chunk and the 128-row block; d padded to 32 (1, 3, 17) and past 128 (130)
# padded d 64 / 96 / 128 run fused_topk_fp16_ar with 4 / 6 / 8 register-resident k-steps
SHAPES = [(1, 1), (63, 3), (64, 17), (65, 130), (1000, 1), (4099, 17), (4099, 130), (2051, 3), (1000, 50),
          (2051, 96), (4099, 128)]


def _operands(X, Q, metric="l2"):
    """The fp16 operands, colbias and alpha exactly as _gpu._knn_rows builds them."""
    import cupy as cp

    from knnkit.exact import _gpu

    prep = _gpu._Prepared(cp.asarray(X), metric, "fp16_rerank")
    Qlow, sq, _ = prep.queries(cp.asarray(Q))
    alpha = (-2.0 if metric == "l2" else -1.0) / (prep.sx * sq)
    return prep, Qlow, alpha


def _keys64(prep, Qlow, alpha):
    """float64 keys of every (query, point) pair from the fp16 operands (what the kernel computes
    up to fp32 accumulation)."""
    q = Qlow.get().astype(np.float64)
    x = prep.X.get().astype(np.float64)
    keys = alpha * (q @ x.T)
    if prep.xnorm2 is not None:
        keys += prep.xnorm2.get().astype(np.float64)[None, :]
    return keys


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("n,d", SHAPES)
@pytest.mark.parametrize("kc", [1, 10, 128, 400])
@pytest.mark.parametrize("self_ids", [False, True])
def test_fused_candidates_match_float64_keys(n, d, kc, self_ids):
    import cupy as cp

    from knnkit.exact import _gpu

    rng = np.random.default_rng(n * 1000 + d)
    X = rng.standard_normal((n, d)).astype(np.float32)
    m = min(n, 257) if self_ids else 131
    Q = X[:m] if self_ids else rng.standard_normal((m, d)).astype(np.float32)
    prep, Qlow, alpha = _operands(X, Q)
    sid = cp.arange(m, dtype=cp.int32) if self_ids else None
    avail = n - (1 if self_ids else 0)
    kc_eff = max(1, min(kc, avail))
    bd, bi = _gpu.fused_candidates(Qlow, prep.X, kc_eff, prep.xnorm2, alpha, sid)
    bd, bi = bd.get(), bi.get()
    keys = _keys64(prep, Qlow, alpha)
    if self_ids:
        keys[np.arange(m), np.arange(m)] = np.inf
    # tolerance: fp32 accumulation + key formation, relative to the key magnitudes
    scale = np.abs(keys[np.isfinite(keys)]).max() if np.isfinite(keys).any() else 1.0
    tol = 1e-5 * max(scale, 1.0)
    for r in range(m):
        real = bi[r] != 0x7FFFFFFF
        assert real.sum() == min(kc_eff, avail), (r, real.sum())
        ids = bi[r][real]
        assert len(set(ids.tolist())) == len(ids), "duplicate candidate"
        assert np.all((ids >= 0) & (ids < n))
        if self_ids:
            assert r not in set(ids.tolist())
        # sorted by (key, id); keys equal the float64 keys of those ids
        d_r = bd[r][real].astype(np.float64)
        assert np.all(np.diff(d_r) >= 0)
        np.testing.assert_allclose(d_r, keys[r, ids], rtol=0, atol=tol)
        # the set is the kc smallest up to near-ties: every id left out has a key >= the last kept - tol
        ref = np.sort(keys[r])[: len(ids)]
        np.testing.assert_allclose(d_r, ref, rtol=0, atol=2 * tol)
        assert np.all(np.isinf(bd[r][~real]))


@pytest.mark.gpu
@gpu
def test_fused_candidates_duplicates_tie_order():
    """Exact duplicates give equal keys: the list must hold the smallest ids first (topk.cu's rule)."""
    import cupy as cp

    from knnkit.exact import _gpu

    rng = np.random.default_rng(7)
    base = rng.integers(0, 3, size=(20, 5)).astype(np.float32)
    X = base[rng.integers(0, 20, size=3001)]
    prep, Qlow, alpha = _operands(X, X[:300])
    bd, bi = _gpu.fused_candidates(Qlow, prep.X, 128, prep.xnorm2, alpha, cp.arange(300, dtype=cp.int32))
    bd, bi = bd.get(), bi.get()
    keys = _keys64(prep, Qlow, alpha)
    keys[np.arange(300), np.arange(300)] = np.inf
    for r in range(300):
        order = np.lexsort((np.arange(keys.shape[1]), keys[r]))[:128]
        # keys of duplicates are bit-identical in the kernel too (same fp16 operands, same sums)
        np.testing.assert_array_equal(bi[r], order)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("n,d,kc,dup", [(4099, 128, 128, False), (4099, 96, 10, True), (3001, 17, 400, False),
                                        (2050, 130, 128, True), (70, 3, 64, False)])
def test_fused_selection_v2_equals_v1(n, d, kc, dup, monkeypatch):
    """Both selection protocols keep the kc smallest (key, column) pairs: identical ids and keys (the
    register-resident kernel for padded d <= 128, the shared-query one above; kc 400 takes v2's
    streaming merge, kc <= 128 its register merge)."""
    import cupy as cp

    from knnkit.exact import _gpu

    rng = np.random.default_rng(n + d + kc)
    if dup:
        base = rng.integers(0, 3, size=(50, d)).astype(np.float32)
        X = base[rng.integers(0, 50, size=n)]
    else:
        X = rng.standard_normal((n, d)).astype(np.float32)
    m = min(n, 300)
    prep, Qlow, alpha = _operands(X, X[:m])
    sid = cp.arange(m, dtype=cp.int32)
    kc = min(kc, n - 1)
    out = {}
    for v1 in (True, False):
        monkeypatch.setattr(_gpu, "_FUSED_SEL_V1", v1)
        bd, bi = _gpu.fused_candidates(Qlow, prep.X, kc, prep.xnorm2, alpha, sid)
        out[v1] = (bd.get(), bi.get())
    np.testing.assert_array_equal(out[False][1], out[True][1])
    np.testing.assert_array_equal(out[False][0], out[True][0])


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("n,d,kc,dup,colbias", [(4099, 128, 128, False, "l2"), (4099, 96, 10, True, "l2"),
                                                (65, 17, 64, False, "l2"), (64, 128, 63, False, "ip"),
                                                (2051, 50, 400, False, "misaligned"), (129, 3, 1, True, "misaligned"),
                                                (1000, 128, 128, True, "ip"), (6000, 64, 32, False, "l2")])
def test_fused_main_v2_equals_v1(n, d, kc, dup, colbias, monkeypatch):
    """The pipelined main loop of fused_topk_fp16_ar (default) and the original one (-DFT_MAIN_V1)
    give identical ids and keys, bit for bit (same fp32 accumulation order, same key formula, same
    selection): padded d 32 / 64 / 96 / 128, chunks cut by n, self exclusion, rows past m, kc 1..400,
    no colbias (inner product: zero-filled ring) and a colbias not 16-byte aligned (4-byte copies)."""
    import cupy as cp

    from knnkit.exact import _gpu

    rng = np.random.default_rng(n + d + kc)
    if dup:
        base = rng.integers(0, 3, size=(50, d)).astype(np.float32)
        X = base[rng.integers(0, 50, size=n)]
    else:
        X = rng.standard_normal((n, d)).astype(np.float32)
    m = min(n, 300)
    prep, Qlow, alpha = _operands(X, X[:m], metric="ip" if colbias == "ip" else "l2")
    cb = prep.xnorm2
    if colbias == "misaligned":
        big = cp.empty(n + 1, cp.float32)
        big[1:] = cb
        cb = big[1:]
        assert cb.data.ptr % 16 != 0
    sid = cp.arange(m, dtype=cp.int32)
    kc = min(kc, n - 1)
    out = {}
    for v1 in (True, False):
        monkeypatch.setattr(_gpu, "_FUSED_MAIN_V1", v1)
        bd, bi = _gpu.fused_candidates(Qlow, prep.X, kc, cb, alpha, sid)
        out[v1] = (bd.get(), bi.get())
    np.testing.assert_array_equal(out[False][1], out[True][1])
    np.testing.assert_array_equal(out[False][0], out[True][0])
    if colbias == "misaligned":  # the same values through the 16-byte path
        bd, bi = _gpu.fused_candidates(Qlow, prep.X, kc, prep.xnorm2, alpha, sid)
        np.testing.assert_array_equal(bi.get(), out[False][1])
        np.testing.assert_array_equal(bd.get(), out[False][0])


def _knn_vs_reference(X, Q, k, monkeypatch, fused=True, metric="sqeuclidean", **kw):
    from knnkit.exact import _gpu

    monkeypatch.setattr(_gpu, "_FUSED", fused)
    dg, ig = knnkit.knn(X, Q, k=k, metric=metric, device="gpu", precision="fp16_rerank", **kw)
    dg, ig = np.asarray(dg), np.asarray(ig)
    rd, ri, _ = reference(X, Q, k, metric, exclude_self=Q is None)
    scale = max(1.0, float(np.abs(rd).max()))
    np.testing.assert_allclose(dg, rd, rtol=1e-5, atol=1e-5 * scale)
    diff = ig != ri
    if diff.any():  # only among (near-)equal distances
        assert np.all(np.abs(dg[diff] - rd[diff]) <= 1e-5 * scale)
    return dg, ig


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("n,d", [(1000, 1), (4099, 3), (3001, 17), (2050, 130)])
@pytest.mark.parametrize("k", [1, 10, 100])
def test_fused_knn_matches_reference(n, d, k, monkeypatch):
    rng = np.random.default_rng(n + d + k)
    X = rng.standard_normal((n, d)).astype(np.float32)
    Q = rng.standard_normal((77, d)).astype(np.float32)
    if k < n:
        _knn_vs_reference(X, Q, k, monkeypatch)
        _knn_vs_reference(X, None, k, monkeypatch)


@pytest.mark.gpu
@gpu
def test_fused_knn_duplicates_and_inner_product(monkeypatch):
    rng = np.random.default_rng(11)
    base = rng.integers(0, 3, size=(40, 4)).astype(np.float32)
    X = base[rng.integers(0, 40, size=3000)]
    _knn_vs_reference(X, None, 40, monkeypatch)
    Y = rng.standard_normal((2500, 24)).astype(np.float32)
    _knn_vs_reference(Y, Y[:100] + 0.01, 10, monkeypatch, metric="inner_product")


@pytest.mark.gpu
@gpu
def test_fused_and_unfused_agree_small_batches(monkeypatch):
    """Query tiles with remainders (batch_size) and fused vs unfused on the same data."""
    rng = np.random.default_rng(5)
    X = rng.standard_normal((20011, 40)).astype(np.float32)
    Q = rng.standard_normal((1003, 40)).astype(np.float32)
    d1, i1 = _knn_vs_reference(X, Q, 17, monkeypatch, fused=True, batch_size=300)
    d0, i0 = _knn_vs_reference(X, Q, 17, monkeypatch, fused=False, batch_size=300)
    np.testing.assert_allclose(d1, d0, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
@gpu
def test_fused_auto_choice():
    from knnkit.exact import _gpu

    assert _gpu._FUSED == "auto"
    assert _gpu.use_fused("fp16_rerank", 128, 128)
    assert not _gpu.use_fused("fp16_rerank", 128, 784)      # auto: d <= 256 only
    assert not _gpu.use_fused("exact", 18, 128)
    assert not _gpu.use_fused("fp16_rerank", 128, 128, m=10_000)     # too few blocks to fill the SMs
    assert _gpu.use_fused("fp16_rerank", 128, 128, m=1_000_000)
    cfg = _gpu._fused_config(128)
    assert cfg[:2] == (2, 4) and cfg[2] <= 99 * 1024


@gpu
@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_uncertified_candidates_near_exact(metric):
    """certify_rows=False (an index's candidate graph): K candidates per row from the fp16 keys,
    exact distances, no certificate. The lists hold the exact neighbours up to swaps between keys
    closer than the rounding bound, and every returned distance is the exact one of its id."""
    import cupy as cp

    from knnkit.datasets.suite import make_broad_clusters
    from knnkit.exact import _gpu

    X = cp.asarray(make_broad_clusters(6000, 96, random_state=4))
    K = 32
    D, I = _gpu.knn_gpu(X, X, K, metric, True, precision="fp16_rerank", certify_rows=False)
    De, Ie = _gpu.knn_gpu(X, X, K, metric, True, precision="exact")
    I, Ie, D, De = I.get(), Ie.get(), D.get(), De.get()
    hits = np.mean([len(set(a) & set(b)) / K for a, b in zip(I, Ie)])
    assert hits >= 0.999, hits
    Xh = X.get().astype(np.float64)
    rows = np.arange(0, 6000, 97)
    for r in rows:
        if metric == "l2":
            want = ((Xh[I[r]] - Xh[r]) ** 2).sum(1)
        else:
            want = -(Xh[I[r]] @ Xh[r])
        np.testing.assert_allclose(D[r], want, rtol=1e-4, atol=1e-3)
    assert (np.diff(D, axis=1) >= 0).all()  # sorted
    assert not (I == np.arange(6000)[:, None]).any()  # self excluded


def test_selection_protocol_emulation():
    """CPU: the lane-level emulation of both selection protocols of fused_topk.cu (v1: shared
    atomics; v2, the default: packed register counts, quad-shuffle appends, merges without global
    binary search) equals a plain sort on random, duplicate, descending and self-excluding rows,
    every buffer and merge write landing on a free slot (benchmarks/emulate_fused_merge.py)."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks",
                        "emulate_fused_merge.py")
    spec = importlib.util.spec_from_file_location("emulate_fused_merge", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(trials=40, seed=3) == 40
