"""Exact k-NN on the GPU: cuBLAS GEMM tiles + the row-wise k-selection kernel of ``topk.cu``.

For each tile of queries the data is streamed in column tiles: ``G = Q_t X_t^T`` (cuBLAS via
``cublasGemmEx``), then ``topk_tile`` turns every row of ``G`` into keys
``||x||^2 - 2 q.x`` (squared L2; the row constant is dropped) or ``-q.x`` and merges them
into a running top-k kept in device memory. Only one ``(queries x data)`` tile of distances
ever exists. The selected pairs are then re-ranked with exact float32 distances computed
directly (``sum (q - x)^2``), so reported distances carry no GEMM cancellation error.

Low-precision modes (``*_rerank``) use tensor cores for the GEMM on centred data and select
``k' > k`` candidates. Each row is certified: with ``eps`` a worst-case bound on the key
error (from the unit roundoff of the format, the query norm and the largest data norm),
the true top-k is guaranteed inside the candidates when
``key[k'] - key[k] > 2 eps`` (anything outside the candidates has a true key above
``key[k'] - eps``; the k-th best true key is at most ``key[k] + eps``). Rows failing the test
are recomputed in exact mode, so these modes return the exact answer up to float32 rounding.
"""

import math

import numpy as np

from .._core.config import logger, get_memory_budget, progress
from .._core.cuda import get_kernel, kernel_path, retry_on_oom
from ._reach import reach_bound

_KERNEL = kernel_path(__file__, "topk.cu")
_FUSED_KERNEL = kernel_path(__file__, "fused_topk.cu")

__all__ = ["knn", "knn_gpu", "topk_rows", "queue_length", "MAX_K", "use_fused", "fused_candidates"]

MAX_K = 1024
# bounds on the elements of one distance tile (64 MiB .. 2 GiB of float32); the budget picks
# a value in between (tests lower them to force many tiles)
_MIN_TILE_ELEMS = 1 << 24
_MAX_TILE_ELEMS = 1 << 29
# fp16_rerank writes its distance tile in float16 (half the bytes of the dominant traffic)
_FP16_TILE = True
# overlap GEMM and selection on two streams (set by the benchmark to compare)
_OVERLAP = False
# fp16_rerank: fused GEMM + selection kernel (fused_topk.cu) instead of cuBLAS + topk_tile.
# "auto": fused when the padded dimension is <= _FUSED_AUTO_MAX_DIM and the device supports it;
# True: fused wherever a launch configuration fits the device; False: the unfused path (A/B)
_FUSED = "auto"
_FUSED_AUTO_MAX_DIM = 256
_FUSED_AUTO_MIN_WAVES = 2
# queries per fused launch (when batch_size is not given): enough blocks to fill every SM a few
# waves deep (1 << 17 rows = 1024 blocks of 128), bounded memory for the candidates and re-rank
_FUSED_QUERY_TILE = 1 << 17
_K_CHOICES = (32, 64, 128, 256, 512, 1024)
_NOIDX = 0x7FFFFFFF

# cuBLAS / CUDA enums (cublas_api.h, library_types.h)
_R_32F, _R_16F, _R_16BF = 0, 2, 14
_COMPUTE_32F, _COMPUTE_32F_FAST_TF32 = 68, 77
_OP_N, _OP_T = 0, 1



def queue_length(k):
    """The templated queue length K (power of two, >= 32) that serves ``k``."""
    for K in _K_CHOICES:
        if k <= K:
            return K
    raise ValueError(f"k={k} exceeds the GPU selection maximum {MAX_K}")


def _tile_cfg(K, half=False):
    """(threads, shared capacity) of ``topk_tile`` for queue length K; a chunk is one 16-byte
    vector per thread (4 floats / 8 halves) and the buffer holds several chunks."""
    nt = 128 if K <= 128 else 256
    chunk = nt * (8 if half else 4)
    s = max(2 * K, (2 if half else 4) * chunk)
    return nt, s


def _names():
    names = []
    for K in _K_CHOICES:
        for t in ("float", "__half"):
            nt, s = _tile_cfg(K, t == "__half")
            names.append(f"topk_tile<{t},{K},{nt},{s}>")
        names.append(f"topk_sort_pairs<{K},128>")
    return tuple(names)


_NAMES = _names()


def _kernel(name):
    return get_kernel(_KERNEL, name, name_expressions=_NAMES)


def _null():
    return np.uint64(0)


# --------------------------------------------------------------------------- selection


def _select_tile(G, k, col_offset, colbias, alpha, self_ids, best_d, best_i, has_prev):
    """Merge the keys of tile ``G`` (cupy (m, w) float32/float16, unit column stride) into best_*."""
    import cupy as cp

    m, w = G.shape
    K = queue_length(k)
    t = "__half" if G.dtype == cp.float16 else "float"
    nt, s = _tile_cfg(K, t == "__half")
    assert G.strides[1] == G.itemsize
    ld = G.strides[0] // G.itemsize
    kern = _kernel(f"topk_tile<{t},{K},{nt},{s}>")
    kern((m,), (nt,), (G, np.int64(ld), np.int32(m), np.int32(w), np.int32(col_offset),
                        colbias if colbias is not None else _null(), np.float32(alpha),
                        self_ids if self_ids is not None else _null(),
                        best_d, best_i, np.int32(k), np.int32(1 if has_prev else 0)))


def _sort_pairs(d, i, k):
    """Sort rows of (m, kc) (distance, index) pairs by (distance, index); keep the first k."""
    import cupy as cp

    m, kc = d.shape
    out_d = cp.empty((m, k), cp.float32)
    out_i = cp.empty((m, k), cp.int32)
    if kc <= MAX_K:
        P = queue_length(kc)
        _kernel(f"topk_sort_pairs<{P},128>")((m,), (128,), (d, i, np.int32(m), np.int32(kc), out_d, out_i,
                                                            np.int32(k)))
        return out_d, out_i
    # large k: two stable sorts give (distance, index) order
    o = cp.argsort(i, axis=1)
    i2 = cp.take_along_axis(i, o, 1)
    d2 = cp.take_along_axis(d, o, 1)
    o = cp.argsort(d2, axis=1)
    return cp.ascontiguousarray(cp.take_along_axis(d2, o, 1)[:, :k]), \
        cp.ascontiguousarray(cp.take_along_axis(i2, o, 1)[:, :k])


def topk_rows(D, k, *, col_offset=0, self_ids=None):
    """The k smallest entries of every row of a CuPy matrix, sorted by (value, column).

    Parameters
    ----------
    D : cupy.ndarray, float32 or float16, shape (m, n)
        Any row-major matrix (a row stride larger than n is fine).
    k : int
        1 <= k <= n. Up to 1024 uses the selection kernel; larger k falls back to a sort.
    col_offset : int
        Added to the returned column numbers.
    self_ids : cupy.ndarray of int32, shape (m,), optional
        Row r never returns column ``self_ids[r]`` (given with ``col_offset`` included).

    Returns
    -------
    values : cupy.ndarray float32 (m, k)
    columns : cupy.ndarray int32 (m, k)

    Examples
    --------
    >>> import cupy as cp                                      # doctest: +SKIP
    >>> v, c = topk_rows(cp.random.rand(4, 1000, dtype=cp.float32), 5)   # doctest: +SKIP
    """
    import cupy as cp

    if D.ndim != 2:
        raise ValueError("topk_rows expects a 2-D matrix")
    if D.dtype not in (cp.float32, cp.float16):
        D = D.astype(cp.float32)
    if D.strides[1] != D.itemsize:
        D = cp.ascontiguousarray(D)
    m, n = D.shape
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, {n}], got {k}")
    if self_ids is not None:
        self_ids = cp.ascontiguousarray(self_ids, dtype=cp.int32)
    if k > MAX_K:
        keys = D.astype(cp.float32, copy=True)
        if self_ids is not None:
            rows = cp.arange(m)
            loc = self_ids.astype(cp.int64) - col_offset
            ok = (loc >= 0) & (loc < n)
            keys[rows[ok], loc[ok]] = cp.inf
        o = cp.argsort(keys, axis=1)[:, :k]
        return cp.take_along_axis(keys, o, 1), (o + col_offset).astype(cp.int32)
    best_d = cp.empty((m, k), cp.float32)
    best_i = cp.empty((m, k), cp.int32)
    _select_tile(D, k, col_offset, None, 1.0, self_ids, best_d, best_i, False)
    return best_d, best_i


# --------------------------------------------------------------------------- GEMM


def _gemm(A, B, out, mode):
    """``out[i, j] = A[i] . B[j]`` in float32 (A (mq, d), B (nt, d) row-major, out unit column stride).

    ``mode`` picks the input type/compute: "exact" fp32, "tf32_rerank" fp32 inputs on TF32
    tensor cores, "fp16_rerank" float16 inputs, "bf16_rerank" bfloat16 bits (uint16).
    """
    import cupy as cp
    from cupy.cuda import device

    try:
        from cupy_backends.cuda.libs import cublas
    except ImportError:  # older layouts
        from cupy.cuda import cublas

    mq, d = A.shape
    nt = B.shape[0]
    dtype, compute = {"exact": (_R_32F, _COMPUTE_32F), "tf32_rerank": (_R_32F, _COMPUTE_32F_FAST_TF32),
                      "fp16_rerank": (_R_16F, _COMPUTE_32F), "bf16_rerank": (_R_16BF, _COMPUTE_32F)}[mode]
    ctype = _R_16F if out.dtype == cp.float16 else _R_32F
    ldc = out.strides[0] // out.itemsize
    one = np.ones(1, np.float32)
    zero = np.zeros(1, np.float32)
    handle = device.get_cublas_handle()
    try:
        mode_before = cublas.getPointerMode(handle)
        cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
        try:
            # column-major view: out^T (nt x mq) = X (nt x d) . Q^T (d x mq)
            cublas.gemmEx(handle, _OP_T, _OP_N, nt, mq, d, one.ctypes.data, B.data.ptr, dtype, d,
                          A.data.ptr, dtype, d, zero.ctypes.data, out.data.ptr, ctype, ldc, compute, -1)
        finally:
            cublas.setPointerMode(handle, mode_before)
    except (AttributeError, TypeError) as e:  # very old CuPy without gemmEx: plain matmul
        if mode not in ("exact", "tf32_rerank"):
            raise RuntimeError(f"precision {mode!r} needs cublas.gemmEx in CuPy: {e}") from None
        out[...] = cp.matmul(A, B.T)


def _elementwise(name, a, out_dtype):
    """Run one of the grid-stride conversion kernels of topk.cu on a float32/uint16 array."""
    import cupy as cp

    a = cp.ascontiguousarray(a)
    out = cp.empty(a.shape, out_dtype)
    n = a.size
    get_kernel(_KERNEL, name, name_expressions=_NAMES)(
        (int(min(4096, max(1, (n + 255) // 256))),), (256,), (a, out, np.int64(n)))
    return out


def _to_bf16(a):
    """float32 -> bfloat16 bits (uint16), round to nearest even."""
    import cupy as cp

    return _elementwise("topk_to_bf16", a.astype(cp.float32, copy=False), cp.uint16)


def _round_tf32(a):
    """float32 -> the nearest TF32 value, stored as float32."""
    import cupy as cp

    return _elementwise("topk_round_tf32", a.astype(cp.float32, copy=False), cp.float32)


def _pow2_scale(maxnorm):
    """A power of two bringing the largest row norm to (90, 180]: every component and every
    dot product of two scaled rows (<= 180^2 = 32400) then fits float16, the distance tile
    included."""
    if maxnorm <= 0:
        return 1.0
    return float(2.0 ** math.floor(math.log2(180.0 / maxnorm)))


def _lowp(A, mode, scale=None):
    """(GEMM operand, its scale, the values it represents in A's units as float32)."""
    import cupy as cp

    if mode == "fp16_rerank":
        low = (A * np.float32(scale)).astype(cp.float16)
        return low, scale, low.astype(cp.float32) * np.float32(1.0 / scale)
    if mode == "bf16_rerank":
        low = _to_bf16(A)
        return low, 1.0, _elementwise("topk_from_bf16", low, cp.float32)
    low = _round_tf32(A)  # tf32_rerank
    return low, 1.0, low


def _row_norms(A):
    """Euclidean norms of the rows of a float32 cupy matrix, float64 on the host."""
    import cupy as cp

    if not A.shape[0]:
        return np.zeros(0)
    return cp.sqrt((A * A).sum(axis=1, dtype=cp.float64)).get()  # float64 accumulation


#: Rows per pass of :class:`_Prepared`'s checks, norms and low-precision copies: ~256 MiB of float32,
#: so that no temporary of the whole data's size is made beside the GEMM operand.
_PREP_CHUNK_BYTES = 256 << 20


def _row_chunks(n, d):
    """``(start, stop)`` row ranges of about ``_PREP_CHUNK_BYTES`` of float32 each."""
    step = max(1, _PREP_CHUNK_BYTES // (4 * max(int(d), 1)))
    return [(a, min(n, a + step)) for a in range(0, n, step)]


def _sq_norms(A, chunks):
    """Squared row norms of float32 ``A`` (float32, cupy), a chunk of rows at a time."""
    import cupy as cp

    out = cp.empty(A.shape[0], cp.float32)
    for a, b in chunks:
        part = A[a:b]
        out[a:b] = (part * part).sum(axis=1)
    return out


class _Prepared:
    """Data in the form the GEMM of one precision mode consumes, with its norms and bounds.

    For the tensor-core modes the rounding error of every operand is *measured*
    (``|x_rounded - x|`` per row) instead of bounded by the unit roundoff, which makes the
    certificate of :meth:`key_error` rigorous and about twice as tight.
    """

    def __init__(self, Xd, metric, mode):
        import cupy as cp

        self.metric, self.mode = metric, mode
        self.sx = 1.0
        if mode == "exact":
            # float32 GEMM keys ||x||^2 - 2 q.x lose the small distances of points far from the
            # origin to cancellation (tight clusters at offset 1: the 10th neighbour missed by
            # 3e-4 relative). Centring shrinks the norms the error scales with, and the rows are
            # then certified against the rounding bound like the tensor-core modes.
            # Integer-valued data of small magnitude (uint8/int8 input, pixel and count data) gives
            # exact float32 keys when every partial sum stays below 2^24: then nothing is centred
            # (centring would make them inexact) and the certificate is exact (eps = 0), so ties
            # among duplicates (skin: 245k points, 51k distinct) certify too.
            # (in chunks of rows: a temporary of the data's size beside the centred copy ran a
            # 40M x 96 search out of GPU memory)
            chunks = _row_chunks(*Xd.shape)
            amax = max((float(cp.abs(Xd[a:b]).max()) for a, b in chunks), default=0.0)
            # the integrality pass only where the magnitude allows exact keys at all
            self.exact_keys = (Xd.shape[1] * amax * 3 * amax < 2.0 ** 24
                               and all(bool((Xd[a:b] == cp.rint(Xd[a:b])).all()) for a, b in chunks))
            if metric == "l2" and not self.exact_keys:
                # the mean by a cuBLAS GEMV: CuPy's axis-0 reduction runs on too few blocks and cost
                # ~30 ms at 1M x 128; any shift is correct (the certificate measures the norms)
                n = Xd.shape[0]
                self.mu = (cp.ones(n, cp.float32) @ Xd) * cp.float32(1.0 / n)
                self.X = Xd - self.mu
            else:
                self.mu = cp.zeros(Xd.shape[1], cp.float32)
                self.X = Xd
            norms2 = _sq_norms(self.X, chunks)
            self.xnorm2 = norms2 if metric == "l2" else None
            self.xmax = self.xrmax = float(cp.sqrt(norms2.max())) if norms2.size else 0.0
            self.amax = amax
            self.dxmax = 0.0
            return
        # centring: squared L2 is translation invariant, and for the inner product
        # q.(x - mu) differs from q.x by a per-query constant, so the order is unchanged;
        # it shrinks the norms that the GEMM rounding error scales with
        self.mu = Xd.mean(axis=0, dtype=cp.float64).astype(cp.float32)
        n = Xd.shape[0]
        chunks = _row_chunks(n, Xd.shape[1])
        # the centred rows are made a chunk at a time (twice: norms, then operands), never whole
        xn2 = cp.empty(n, cp.float32)
        for a, b in chunks:
            xc = Xd[a:b] - self.mu
            xn2[a:b] = (xc * xc).sum(axis=1)
        self.xnorm2 = xn2 if metric == "l2" else None
        xmax = xrmax = dxmax = 0.0
        low_all = None  # the operand, filled a chunk at a time (no list of chunks concatenated)
        # only float16 needs (and applies) a power-of-two scale; TF32/bf16 keep fp32's range, and
        # alpha = -2 / (sx * sq) must use the scale actually applied
        self.sx = _pow2_scale(float(cp.sqrt(xn2.max()))) if mode == "fp16_rerank" and n else 1.0
        for a, b in chunks:   # chunks bound the temporary float32/float64 copies
            xc = Xd[a:b] - self.mu
            low, sx_used, rep = _lowp(xc, mode, self.sx)
            assert sx_used == self.sx
            if low_all is None:
                low_all = cp.empty((n,) + low.shape[1:], low.dtype)
            low_all[a:b] = low
            xmax = max(xmax, float(_row_norms(xc).max()))
            xrmax = max(xrmax, float(_row_norms(rep).max()))
            dxmax = max(dxmax, float(_row_norms(rep - xc).max()))
            del rep, xc, low
        self.X = low_all
        self.xmax, self.xrmax, self.dxmax = xmax, xrmax, dxmax

    def queries(self, Q):
        """(GEMM operand, its scale, per-row error info for :meth:`key_error`)."""
        import cupy as cp

        Qc = Q - self.mu if (self.metric == "l2" and self.mu is not None) else Q
        if self.mode == "exact":
            qn = _row_norms(Qc)  # float64 on the host, as key_error expects
            # the queries' keys are exact too when they are integers within the same bound
            qmax = float(cp.abs(Q).max()) if Q.size else 0.0
            q_exact = bool(self.exact_keys and Q.shape[1] * max(qmax, self.amax) * 3 * max(qmax, self.amax) < 2.0 ** 24
                           and bool((Q == cp.rint(Q)).all()))
            return cp.ascontiguousarray(Qc), 1.0, (qn, qn, np.zeros_like(qn), q_exact)
        qn = _row_norms(Qc)
        sq = _pow2_scale(float(qn.max()))
        low, sq, rep = _lowp(cp.ascontiguousarray(Qc), self.mode, sq)
        info = (qn, _row_norms(rep), _row_norms(rep - Qc))
        return low, sq, info

    exact_keys = False
    X_fused = None  # the fp16 data padded for fused_topk.cu (made on first use)

    def key_error(self, info, dim, fp16_tile=None):
        """Worst-case |approximate key - exact key| per query row (float64 numpy).

        dot error <= |q| max|dx| + |dq| max|x~| + accumulation (+ float16 storage of the
        product); squared-L2 keys carry twice the dot error plus the float32 rounding of
        ||x||^2 and of forming the key. ``fp16_tile``: whether the products were stored as
        float16 (default ``_FP16_TILE``; the fused kernel keeps them in fp32 registers: False).
        """
        qn, qrn, dqn = info[:3]
        if self.mode == "exact" and self.exact_keys and info[3]:
            return np.zeros_like(qn)  # integer keys below 2^24: the GEMM is exact
        acc = (dim + 2) * 2.0 ** -22          # fp32 accumulation (tensor cores may truncate)
        dot_err = qn * self.dxmax + dqn * self.xrmax + acc * qrn * self.xrmax
        if fp16_tile is None:
            fp16_tile = _FP16_TILE
        if self.mode == "fp16_rerank" and fp16_tile:
            dot_err = dot_err + 2.0 ** -11 * qrn * self.xrmax   # the product stored as float16
        key_round = 4 * 2.0 ** -24 * (self.xmax ** 2 + 2 * qrn * self.xrmax)
        if self.metric == "l2":
            err = 2 * dot_err + (dim + 2) * 2.0 ** -24 * self.xmax ** 2 + key_round
        else:
            err = dot_err + key_round
        return 1.05 * err + 1e-30


# --------------------------------------------------------------------------- fused fp16 kernel

# constants mirrored from fused_topk.cu (FT_BN, FT_KS, FT_STAGES, FT_CAP, FT_CBS)
_FT_BN, _FT_KS, _FT_STAGES, _FT_CAP, _FT_CBS = 64, 64, 3, 32, 4
# (m16 tiles per warp, warps): 128, 64, then 32 query rows per block; the first whose shared
# memory fits is used (more rows per block = fewer re-reads of the data from L2)
_FT_CONFIGS = ((2, 4), (1, 4), (1, 2))
# prefer configurations that leave room for two blocks per SM on H100 and that run unchanged on
# GPUs whose opt-in limit is 99 KB (sm_86/89)
_FT_SMEM_PREF = 99 * 1024
# padded d <= 128: fused_topk_fp16_ar keeps the query fragments in registers (KST = dp / 16 k-steps)
_FT_AR_KST = (2, 4, 6, 8)
_FUSED_AREG = True  # A/B switch for the register-resident variant (False: fused_topk_fp16 always)
# A/B switch for the selection protocol inside the fused kernels (NOTES_topk.md, "Cheaper
# selection"): False = v2 (register thresholds and counts, shuffle-prefix appends, merges without
# global binary search), True = the original v1 (compiled with -DFT_SEL_V1). Same outputs.
_FUSED_SEL_V1 = False
# A/B switch for the main loop of fused_topk_fp16_ar (NOTES_topk.md, "Pipelined main loop"): False =
# v2 (half-chunk software pipeline: the keys of one 32-column half are filtered while the other
# half's mma run), True = the original loop (compiled with -DFT_MAIN_V1). Same keys and ids, bit for
# bit. The v1 selection (_FUSED_SEL_V1) always runs the original loop.
_FUSED_MAIN_V1 = False
_FT_NAMES = tuple(f"fused_topk_fp16<{mt},{nw}>" for mt, nw in _FT_CONFIGS) + tuple(
    f"fused_topk_fp16_ar<2,4,{kst}>" for kst in _FT_AR_KST)


def _fused_options():
    """NVRTC options of fused_topk.cu for the selection protocol and main loop chosen by
    ``_FUSED_SEL_V1`` and ``_FUSED_MAIN_V1``."""
    return (("-DFT_SEL_V1",) if _FUSED_SEL_V1 else ()) + (("-DFT_MAIN_V1",) if _FUSED_MAIN_V1 else ())


def _fused_dim(d):
    """Padded dimension of the fused kernel's operands (a multiple of 32 halves)."""
    return -(-d // 32) * 32


def _fused_smem_bytes(mt, nw, dp):
    """Dynamic shared memory of ``fused_topk_fp16<mt, nw>`` (the layout in fused_topk.cu)."""
    bm = 16 * mt * nw
    return (bm * (dp + 8) * 2 + _FT_STAGES * _FT_BN * (_FT_KS + 8) * 2
            + bm * _FT_CAP * 8 + 3 * bm * 4)


def _fused_ar_smem_bytes(dp):
    """Dynamic shared memory of ``fused_topk_fp16_ar<2, 4, dp / 16>`` (ring of whole chunks, the
    query tile staged in the ring's space, then the buffers and per-row state, then the main loop
    v2's colbias ring of _FT_CBS chunks; the original loop leaves those 1 KB unused)."""
    bm = 128
    return _FT_STAGES * _FT_BN * (dp + 8) * 2 + bm * _FT_CAP * 8 + 3 * bm * 4 + _FT_CBS * _FT_BN * 4


def _fused_config(d):
    """(mt, nw, shared bytes) for dimension d on the current device, or None when the fused
    kernel cannot run there (compute capability < 8.0 or no configuration fits)."""
    import cupy as cp

    dev = cp.cuda.Device()
    cc = int(dev.compute_capability)
    if cc < 80:
        return None
    attrs = dev.attributes
    limit = int(attrs.get("MaxSharedMemoryPerBlockOptin", attrs.get("MaxSharedMemoryPerBlock", 48 * 1024)))
    dp = _fused_dim(d)
    fits = [(mt, nw, _fused_smem_bytes(mt, nw, dp)) for mt, nw in _FT_CONFIGS]
    # 128 or 64 rows within the preferred size; else whatever fits the device (d > 256: 64 rows
    # at ~150 KB beat 32 rows, which would read the data from L2 twice as often)
    for cap, cands in ((min(limit, _FT_SMEM_PREF), fits[:2]), (limit, fits)):
        for mt, nw, sm in cands:
            if sm <= cap:
                return mt, nw, sm
    return None


def use_fused(mode, kc, d, m=None):
    """Whether the fp16_rerank candidate selection of ``m`` queries runs the fused kernel (see
    ``_FUSED``). "auto" also asks for at least ``_FUSED_AUTO_MIN_WAVES`` blocks per SM: one block
    serves 128 queries, and 10k queries against 1M x 128 (79 blocks on 132 SMs) took 0.111 s fused
    against 0.087 s unfused on an H100, where the 1M all-points graph took 2.69 s against 3.99 s."""
    if mode != "fp16_rerank" or not _FP16_TILE or _FUSED is False or not 1 <= kc <= MAX_K:
        return False
    if _FUSED == "auto" and _fused_dim(d) > _FUSED_AUTO_MAX_DIM:
        return False
    try:
        cfg = _fused_config(d)
        if cfg is None:
            return False
        if _FUSED == "auto" and m is not None:
            import cupy as cp

            sms = int(cp.cuda.Device().attributes["MultiProcessorCount"])
            if -(-int(m) // (16 * cfg[0] * cfg[1])) < _FUSED_AUTO_MIN_WAVES * sms:  # blocks of 16 mt nw rows
                return False
        return True
    except Exception as e:  # noqa: BLE001 - no usable device attributes: keep the unfused path
        logger.debug("fused kernel unavailable: %s", e)
        return False


def _pad_half(A, dp):
    """Row-major float16 copy of A with dp columns (zero padded); A itself when already so."""
    import cupy as cp

    if A.shape[1] == dp and A.flags.c_contiguous:
        return A
    out = cp.zeros((A.shape[0], dp), cp.float16)
    out[:, : A.shape[1]] = A
    return out


def fused_candidates(Qlow, Xlow, kc, colbias, alpha, self_ids):
    """Top-kc (key, id) per query row with the fused kernel; keys as in :func:`_select_tile`.

    Qlow (m, d), Xlow (n, d): float16 cupy operands (scaled, centred); colbias (n,) float32 or
    None; self_ids (m,) int32 or None. Returns best_d (m, kc) float32, best_i (m, kc) int32, each
    row sorted by (key, id), padded with (+inf, 0x7fffffff) past the available points.
    """
    import cupy as cp

    m, d = Qlow.shape
    n = Xlow.shape[0]
    cfg = _fused_config(d)
    if cfg is None:
        raise RuntimeError("the fused kernel needs compute capability >= 8.0 and enough shared memory")
    mt, nw, smem = cfg
    dp = _fused_dim(d)
    Qp = _pad_half(Qlow, dp)
    Xp = _pad_half(Xlow, dp)
    best_d = cp.empty((m, kc), cp.float32)
    best_i = cp.empty((m, kc), cp.int32)
    if m == 0:
        return best_d, best_i
    name = f"fused_topk_fp16<{mt},{nw}>"
    if _FUSED_AREG and dp // 16 in _FT_AR_KST and _fused_ar_smem_bytes(dp) <= smem:
        # register-resident query fragments (padded d <= 128; no more shared memory than the
        # configuration chosen above, so it runs wherever that one does)
        mt, nw, smem = 2, 4, _fused_ar_smem_bytes(dp)
        name = f"fused_topk_fp16_ar<2,4,{dp // 16}>"
    kern = get_kernel(_FUSED_KERNEL, name, options=_fused_options(), name_expressions=_FT_NAMES)
    if smem > 48 * 1024:
        # opt in to more than the default 48 KB of dynamic shared memory per block
        kern.max_dynamic_shared_size_bytes = smem
    bm = 16 * mt * nw
    kern((-(-m // bm),), (32 * nw,),
         (Qp, Xp, np.int32(m), np.int32(n), np.int32(dp),
          colbias if colbias is not None else _null(), np.float32(alpha),
          self_ids if self_ids is not None else _null(), best_d, best_i, np.int32(kc)),
         shared_mem=smem)
    return best_d, best_i


# --------------------------------------------------------------------------- main loop


def _tile_shape(n, m, dim, kc, batch_size, extra_bytes):
    """(queries per tile, data columns per tile) under the memory budget."""
    budget = get_memory_budget()
    if budget <= 0:
        budget = 1 << 30
    avail = max(budget - extra_bytes, 64 << 20)
    tile_elems = int(min(max(avail // 6, _MIN_TILE_ELEMS), _MAX_TILE_ELEMS))
    if batch_size is not None:
        mq = min(m, batch_size)
    else:
        n_qt = max(1, -(-m // 8192))
        mq = -(-m // n_qt)
    nt = max(1024, tile_elems // max(mq, 1))
    nt = min(n, (nt // 256) * 256 if nt < n else n)
    nt = min(n, max(nt, kc))  # the first tile must fill the running top-k
    return max(1, mq), max(1, nt)


def _pair_distances(Xd, Qt, cand, use_l2):
    import cupy as cp

    mq, kc = cand.shape
    out = cp.empty((mq, kc), cp.float32)
    npairs = mq * kc
    blocks = int(min(max(1, (npairs * 32 + 255) // 256), 132 * 32))
    get_kernel(_KERNEL, "topk_pair_distances", name_expressions=_NAMES)(
        (blocks,), (256,), (Xd, Qt, np.int32(Xd.shape[1]), cand, np.int64(npairs), np.int32(kc),
                            np.int32(1 if use_l2 else 0), out))
    return out


def _knn_rows(Xd, prep, Qd, self_ids, k, kc, metric, mode, nt, certify_rows=True):
    """Top-k of the queries ``Qd`` (one query tile) in the given mode; returns exact fp32
    distances (m, k), int32 ids (m, k) and, for rerank modes, the boolean certificate per row
    (None when ``certify_rows`` is False: see :func:`knn_gpu`)."""
    import cupy as cp

    n, dim = Xd.shape
    m = Qd.shape[0]
    Qlow, sq, qinfo = prep.queries(Qd)
    if metric == "l2":
        alpha = -2.0 / (prep.sx * sq)
    else:
        alpha = -1.0 / (prep.sx * sq)
    best_d = cp.empty((m, kc), cp.float32)
    best_i = cp.empty((m, kc), cp.int32)
    tile_dtype = cp.float16 if (mode == "fp16_rerank" and _FP16_TILE) else cp.float32
    # row stride padded to 8 elements: 16-byte aligned rows for the vector loads of topk_tile
    width = -(-min(nt, n) // 8) * 8
    starts = list(range(0, n, nt))
    fused = use_fused(mode, kc, dim, m)
    if fused:
        # one launch for the whole query tile: no distance tile in global memory; the padded
        # data copy (only when d is not a multiple of 32) is made once per call and kept on prep
        if getattr(prep, "X_fused", None) is None:
            prep.X_fused = _pad_half(prep.X, _fused_dim(dim))
        best_d, best_i = fused_candidates(Qlow, prep.X_fused, kc, prep.xnorm2, alpha, self_ids)
    elif _OVERLAP and len(starts) > 1 and kc <= MAX_K:
        # two tiles of half width on two streams: the GEMM of tile j+1 (compute bound) can run
        # beside the selection of tile j (memory bound); selections stay in order via events
        half_nt = max(kc, -(-nt // 2 // 256) * 256)
        width = -(-min(half_nt, n) // 8) * 8
        bufs = [cp.empty((m, width), tile_dtype) for _ in range(2)]
        streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
        start_evt = cp.cuda.get_current_stream().record()
        prev = None
        for j, c0 in enumerate(range(0, n, half_nt)):
            c1 = min(n, c0 + half_nt)
            st = streams[j % 2]
            with st:
                st.wait_event(start_evt)
                g = bufs[j % 2][:, : c1 - c0]
                _gemm(Qlow, prep.X[c0:c1], g, mode)
                if prev is not None:
                    st.wait_event(prev)
                _select_tile(g, kc, c0, prep.xnorm2, alpha, self_ids, best_d, best_i, c0 > 0)
                prev = st.record()
        cp.cuda.get_current_stream().wait_event(prev)
        del bufs
    else:
        G = cp.empty((m, width), tile_dtype)
        for c0 in starts:
            c1 = min(n, c0 + nt)
            g = G[:, : c1 - c0]
            _gemm(Qlow, prep.X[c0:c1], g, mode)
            if kc <= MAX_K:
                _select_tile(g, kc, c0, prep.xnorm2, alpha, self_ids, best_d, best_i, c0 > 0)
            else:
                _merge_by_sort(g, c0, prep.xnorm2, alpha, self_ids, best_d, best_i, c0 > 0)
        del G
    exact_d = _pair_distances(Xd, Qd, best_i, metric == "l2")
    out_d, out_i = _sort_pairs(exact_d, best_i, k)
    ok = None
    if certify_rows:  # every mode certifies its rows (exact mode against float32 GEMM rounding)
        avail = n - (1 if self_ids is not None else 0)
        # fused keys come from fp32 accumulators (no float16 product storage term)
        eps_h = prep.key_error(qinfo, dim, fp16_tile=False if fused else None)
        if mode == "exact" and not eps_h.any():
            # exact integer keys: the (key, id) selection is already the exact answer, ties included
            return out_d, out_i, None
        eps = cp.asarray(eps_h, dtype=cp.float64)
        # exact key = exact distance + shift (shift = -||q - mu||^2, or q.mu for the inner product)
        if metric == "l2":
            Qc = Qd - prep.mu
            shift = -(Qc.astype(cp.float64) ** 2).sum(axis=1)
            del Qc
        else:
            shift = Qd.astype(cp.float64) @ prep.mu.astype(cp.float64)
        reach = None
        if mode == "exact" and metric == "l2" and kc < avail:
            reach = reach_bound(cp, cp.asarray(qinfo[0], dtype=cp.float64), 4 * (dim + 2) * 2.0 ** -24,
                                out_d[:, k - 1], prep.xmax, dim)
        ok, n_bad = certify(cp, best_d, exact_d, eps, shift, k, dim, kc >= avail, reach=reach)
        if n_bad:
            logger.warning("%s: the rounding bound was violated on %d rows (recomputed exactly); "
                           "please report this", mode, n_bad)
    return out_d, out_i, ok


def certify(xp, approx, exact, eps, shift, k, dim, all_candidates, reach=None):
    """Rows whose top-k is proven to lie inside the candidates.

    approx (m, kc): approximate keys sorted ascending; exact (m, kc): exact distances of the same
    candidates; eps (m,): bound on |approx key - exact key|; shift (m,): exact key = exact
    distance + shift. A row is certified when ``approx[k'] - approx[k] > 2 eps`` (or when the
    candidates are all the points) *and* the bound is seen to hold on its candidates (a
    self-check: a violated bound means a bug, and the row is recomputed). ``reach``: from
    :func:`knnkit.exact._reach.reach_bound` (exact mode, squared L2), the gap test is then ``approx[k'] - eps_reach >
    upper key of the k-th`` (the self-check keeps ``eps``). Returns ``(ok (m,) bool, number of
    rows that violated the bound)``.
    """
    kc = approx.shape[1]
    a = approx.astype(xp.float64)
    e = exact.astype(xp.float64)
    key = e + shift[:, None]
    # float32 rounding of the exact re-rank itself
    tol = 2 * eps[:, None] + (dim + 2) * 2.0 ** -22 * (xp.abs(e) + xp.abs(shift)[:, None]) + 1e-30
    consistent = (xp.abs(a - key) <= tol).all(axis=1)
    if all_candidates:
        gap_ok = xp.ones(a.shape[0], bool)
    elif reach is not None:
        eps_reach, kth_key = reach
        gap_ok = (a[:, kc - 1] - eps_reach) > kth_key
    else:
        gap_ok = (a[:, kc - 1] - a[:, k - 1]) > 2 * eps
    n_bad = int((gap_ok & ~consistent).sum())
    return gap_ok & consistent, n_bad


def _rows_float64(Xd, Q, k, metric, self_ids, chunk=1 << 16):
    """Exact top-k of the few query rows whose float32 certificate failed: float64 keys over all
    points (cancellation ~1e-16 of the norms, far below float32's), a margin of 8 candidates, then
    the same exact re-rank kernel and (distance, id) sort as every other row."""
    import cupy as cp

    m = Q.shape[0]
    kk = min(Xd.shape[0], k + 8)
    q = Q.astype(cp.float64)
    qn = (q * q).sum(1)[:, None]
    best_d = cp.full((m, kk), cp.inf, cp.float64)
    best_i = cp.full((m, kk), -1, cp.int64)
    for c0 in range(0, Xd.shape[0], chunk):
        x = Xd[c0:c0 + chunk].astype(cp.float64)
        d = (qn - 2 * q @ x.T + (x * x).sum(1)[None, :]) if metric == "l2" else -(q @ x.T)
        ids = cp.arange(c0, c0 + x.shape[0], dtype=cp.int64)
        if self_ids is not None:
            d[ids[None, :] == self_ids[:, None].astype(cp.int64)] = cp.inf
        cd = cp.concatenate([best_d, d], axis=1)
        ci = cp.concatenate([best_i, cp.broadcast_to(ids, d.shape)], axis=1)
        keep = cp.argsort(cd, axis=1)[:, :kk]
        best_d = cp.take_along_axis(cd, keep, axis=1)
        best_i = cp.take_along_axis(ci, keep, axis=1)
    cand = cp.ascontiguousarray(best_i.astype(cp.int32))
    # -1 (fewer points than k + 8 besides the excluded one) must not reach the kernel as an index
    exact = _pair_distances(Xd, cp.ascontiguousarray(Q, dtype=cp.float32), cp.maximum(cand, 0), metric == "l2")
    exact = cp.where(cand < 0, cp.float32(cp.inf), exact)
    return _sort_pairs(exact, cand, k)


#: the float64 threshold kernel keeps a tile of queries in 48 KiB of shared memory
_WITHIN_MAX_DIM = 12288
#: rows of one launch of the threshold kernel (the grid's y extent is at most 65535 query tiles, of
#: one row each at the largest dimensions), and list slots per row in its first pass
_WITHIN_ROWS = 65535
_WITHIN_CAP = 256
#: largest (rows x slots) of the second pass for overflowing rows (many exact ties); beyond it
#: those rows take :func:`_rows_float64`
_WITHIN_MAX_SLOTS = 1 << 26


def _within_lists(Xd, Q, ub, self_ids, cap):
    """One launch of ``topk_rows_within_f64``: (counts (m,), ids (m, cap) with -1 in empty slots)."""
    import cupy as cp

    n, dim = Xd.shape
    m = Q.shape[0]
    qt = int(max(1, min(32, (_WITHIN_MAX_DIM // max(dim, 1)))))
    grid_y = -(-m // qt)
    grid_x = int(max(1, min(-(-n // 256), 65536 // grid_y + 1, 1024)))
    cnt = cp.zeros(m, cp.int32)
    ids = cp.full((m, cap), -1, cp.int32)
    _kernel("topk_rows_within_f64")(
        (grid_x, grid_y), (256,),
        (Xd, np.int64(n), np.int32(dim), Q, np.int32(m), np.int32(qt), ub,
         self_ids if self_ids is not None else _null(), np.int32(cap), cnt, ids),
        shared_mem=qt * dim * 4)
    return cnt, ids


def _rows_within_f64(Xd, Q, k, kth, self_ids):
    """Exact top-k (squared L2) of the query rows whose float32 certificate failed.

    ``kth`` (m,) is each row's float32-exact distance to its k-th candidate: the true k-th
    distance is at most that, so every point within it (plus a rounding margin, in float64 from
    the coordinate differences) is listed by ``topk_rows_within_f64`` and the list is re-ranked
    by the same exact kernel and (distance, id) sort as every other row. A point left out has a
    float32 distance above the k-th, so neither the answer nor its ties change. Cost: one pass
    over the points per tile of rows, without the sorts of :func:`_rows_float64` (2-D clustered
    500k all points k = 1: 32 s there, where nearly no row certifies)."""
    import cupy as cp

    n, dim = Xd.shape
    m = Q.shape[0]
    Q = cp.ascontiguousarray(Q, dtype=cp.float32)
    # float32 rounding of the exact kernel (differences, fma chain, shuffle tree) with a 2x margin
    ub = kth.astype(cp.float64) * (1.0 + (dim + 16) * 2.0 ** -22) + 1e-37
    out_d = cp.empty((m, k), cp.float32)
    out_i = cp.empty((m, k), cp.int32)
    cap = int(max(_WITHIN_CAP, 2 * k))
    for r0 in range(0, m, _WITHIN_ROWS):
        r1 = min(m, r0 + _WITHIN_ROWS)
        sid = self_ids[r0:r1] if self_ids is not None else None
        cnt, ids = _within_lists(Xd, Q[r0:r1], ub[r0:r1], sid, cap)
        top = int(cnt.max())
        short = top < k or bool((cnt < k).any())  # cannot happen (the k candidates lie within)
        over = cp.nonzero(cnt > cap)[0]
        if over.size and not short:
            cap2 = int(cnt[over].max())
            if over.size * cap2 <= _WITHIN_MAX_SLOTS:
                c2, ids2 = _within_lists(Xd, Q[r0:r1][over], ub[r0:r1][over],
                                         sid[over] if sid is not None else None, cap2)
                if bool((c2 == cnt[over]).all()):
                    width = cap2
                    full = cp.full((r1 - r0, width), -1, cp.int32)
                    full[:, :cap] = ids
                    full[over] = ids2
                    ids, over = full, over[:0]
        if short or over.size:
            logger.warning("exact k-NN: float64 threshold lists %s for %d rows; sorting fallback",
                           "short" if short else "overflowed", r1 - r0 if short else int(over.size))
            rows = cp.arange(r1 - r0) if short else over
            d2, i2 = _rows_float64(Xd, Q[r0:r1][rows], k, "l2", sid[rows] if sid is not None else None)
            if short:
                out_d[r0:r1], out_i[r0:r1] = d2, i2
                continue
            keep = cp.ones(r1 - r0, bool)
            keep[rows] = False
            ids = cp.where(keep[:, None], ids, -1)
            out_d[r0 + rows], out_i[r0 + rows] = d2, i2
        else:
            keep = None
        width = int(min(ids.shape[1], max(k, top)))
        cand = cp.ascontiguousarray(ids[:, :width])
        exact = _pair_distances(Xd, Q[r0:r1], cand, True)
        d2, i2 = _sort_pairs(exact, cand, k)
        if keep is None:
            out_d[r0:r1], out_i[r0:r1] = d2, i2
        else:
            rows = cp.nonzero(keep)[0]
            out_d[r0 + rows], out_i[r0 + rows] = d2[rows], i2[rows]
    return out_d, out_i


def _merge_by_sort(g, c0, colbias, alpha, self_ids, best_d, best_i, has_prev):
    """k > 1024: merge a tile into the running top-k with a stable sort (slow but general)."""
    import cupy as cp

    m, w = g.shape
    k = best_d.shape[1]
    keys = g * np.float32(alpha)
    if colbias is not None:
        keys += colbias[c0:c0 + w][None, :]
    if self_ids is not None:
        loc = self_ids.astype(cp.int64) - c0
        rows = cp.arange(m)
        okr = (loc >= 0) & (loc < w)
        keys[rows[okr], loc[okr]] = cp.inf
    ids = cp.broadcast_to(cp.arange(c0, c0 + w, dtype=cp.int32), (m, w))
    if has_prev:
        keys = cp.concatenate([best_d, keys], axis=1)
        ids = cp.concatenate([best_i, ids], axis=1)
    o = cp.argsort(keys, axis=1)[:, :k]   # stable: earlier (smaller) ids win ties
    best_d[...] = cp.take_along_axis(keys, o, 1)
    best_i[...] = cp.take_along_axis(ids, o, 1)


def _candidates_k(k, avail, mode):
    if mode == "exact":
        # a few extra candidates give the certificate its gap (k = 10: 18, still one 32-entry
        # queue); above the queue's limit the running top-k is kept by sorting (_merge_by_sort)
        return int(min(avail, k + max(8, k // 4)))
    # a wider candidate list widens the gap key[k'] - key[k] the certificate needs
    return int(min(avail, MAX_K, max(4 * k, 128)))


def knn(X, Q, k, metric, exclude_self, *, precision="exact", batch_size=None, certify=True, candidates=None):
    """GPU twin of :func:`knnkit.exact._cpu.knn` (same signature); see :func:`knn_gpu`.
    ``certify`` is the CPU twin's: here the exact mode certifies every row whatever it says (the
    rejected rows cost milliseconds on the device), and the tensor-core modes take it as
    ``certify_rows``."""
    return knn_gpu(X, Q, k, metric, exclude_self, precision=precision, batch_size=batch_size,
                   certify_rows=certify, candidates=candidates)


def knn_gpu(Xd, Qd, k, metric_internal, exclude_self, precision="exact", batch_size=None, self_ids=None,
            certify_rows=True, candidates=None):
    """Exact k-NN on the GPU with internal (minimised) distances.

    Parameters
    ----------
    Xd, Qd : cupy.ndarray float32 (n, d), (m, d)
        Prepared data and queries (``Qd`` is ``Xd`` for the all-points graph).
    k : int
    metric_internal : {"l2", "ip"}
    exclude_self : bool
        Query row i excludes data index i (all-points graph).
    precision : {"exact", "fp16_rerank", "tf32_rerank", "bf16_rerank"}
    batch_size : int, optional
        Queries per tile.
    self_ids : cupy int32 (m,), optional
        Explicit data index excluded per query row (overrides ``exclude_self``).
    certify_rows : bool
        False (internal callers that want near-exact lists fast, e.g. an index's candidate
        graph): a low-precision mode keeps only k candidates per row, re-ranks them with exact
        distances and skips the certificate, so a row can differ from the exact one where the
        k-th and (k+1)-th keys are closer than the rounding bound.
    candidates : int, optional
        With ``certify_rows=False``: candidates kept per row before the exact re-rank (default
        ``k``; more candidates let the re-rank repair swaps across the k-th place). Ignored when
        the rows are certified (the certificate chooses its own).

    Returns
    -------
    distances : cupy float32 (m, k), indices : cupy int64 (m, k)
        Sorted by (distance, index).
    """
    import cupy as cp

    if metric_internal not in ("l2", "ip"):
        raise ValueError(f"knn_gpu supports internal metrics 'l2' and 'ip', got {metric_internal!r}")
    Xd = cp.ascontiguousarray(Xd, dtype=cp.float32)
    Qd = Xd if Qd is Xd else cp.ascontiguousarray(Qd, dtype=cp.float32)
    n, dim = Xd.shape
    m = Qd.shape[0]
    if self_ids is None and exclude_self:
        self_ids = cp.arange(m, dtype=cp.int32)
    avail = n - (1 if self_ids is not None else 0)
    mode = precision
    if mode != "exact" and k > MAX_K // 4:
        logger.info("precision=%r with k=%d > %d: using exact mode", mode, k, MAX_K // 4)
        mode = "exact"
    certify_rows = certify_rows or mode == "exact"  # the exact mode always certifies
    if certify_rows:
        kc = _candidates_k(k, avail, mode)
    else:
        kc = int(min(avail, MAX_K, max(k, candidates or k)))
    prep = _Prepared(Xd, metric_internal, mode)
    extra = (prep.X.nbytes if prep.X is not Xd else 0) + Xd.nbytes // 4

    out_d = cp.empty((m, k), cp.float32)
    out_i = cp.empty((m, k), cp.int64)
    mq0, nt = _tile_shape(n, m, dim, kc, batch_size, extra)
    if batch_size is None and use_fused(mode, kc, dim, m):
        # the fused kernel has one block per 128 queries: large query tiles keep every SM busy
        # (the unfused path's 8192-row tiles would launch 64 blocks)
        mq0 = min(m, max(mq0, _FUSED_QUERY_TILE))
    n_fallback = 0

    def run(mq):
        nonlocal n_fallback
        n_fallback = 0
        ntile = nt  # halving the query tile on OOM halves the distance tile
        # a host-side counter per query tile: no synchronisation is added for it
        with progress(total=m, desc="exact k-NN (GPU)", unit="query") as bar:
            _run_tiles(mq, ntile, bar)
        return None

    def _run_tiles(mq, ntile, bar):
        nonlocal n_fallback
        for q0 in range(0, m, mq):
            q1 = min(m, q0 + mq)
            sid = self_ids[q0:q1] if self_ids is not None else None
            d, i, ok = _knn_rows(Xd, prep, Qd[q0:q1], sid, k, kc, metric_internal, mode, ntile,
                                 certify_rows=certify_rows)
            if ok is not None and not bool(ok.all()):
                bad = cp.nonzero(~ok)[0]
                n_fallback += int(bad.size)
                if mode == "exact" and metric_internal == "l2" and dim <= _WITHIN_MAX_DIM:
                    d2, i2 = _rows_within_f64(Xd, Qd[q0:q1][bad], k, d[bad, k - 1],
                                              sid[bad] if sid is not None else None)
                elif mode == "exact":
                    d2, i2 = _rows_float64(Xd, Qd[q0:q1][bad], k, metric_internal,
                                           sid[bad] if sid is not None else None)
                else:
                    d2, i2 = knn_gpu(Xd, Qd[q0:q1][bad], k, metric_internal, False, "exact", batch_size,
                                     self_ids=sid[bad] if sid is not None else None)
                d[bad] = d2
                i[bad] = i2.astype(cp.int32)
            out_d[q0:q1] = d
            out_i[q0:q1] = i
            bar.update(q1 - q0)

    retry_on_oom(run, mq0, min_tile=1, what="brute-force k-NN")
    if n_fallback:
        logger.info("%s: %d of %d rows failed the error-bound certificate and were recomputed exactly",
                    mode, n_fallback, m)
    knn_gpu.last_fallback = n_fallback  # read by the benchmark
    # internal distances: squared L2 / negative dot, matching the CPU path
    return out_d, out_i


knn_gpu.last_fallback = 0
