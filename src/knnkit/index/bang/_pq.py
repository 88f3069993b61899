"""Product quantisation (Jegou et al.; BANG sections 2.3 and 4.2): k-means per subspace trained on a
sample, uint8 codes, per-query distance tables. CPU (NumPy + Numba) and GPU (CuPy GEMMs) twins in
one module: both run the same Lloyd iterations from the same initial centroids.

The prepared float32 vectors (metric transform applied, see :func:`knnkit._core.metrics.prepare_vectors`)
are zero-padded from ``d`` to ``m * dsub`` dimensions (``dsub = ceil(d / m)``): the padded
coordinates are 0 in every vector and every centroid, so they add nothing to any distance.
"""

import math

import numba
import numpy as np

from ..._core.backend import get_array_module
from ..._core.config import logger

__all__ = ["choose_m", "pad_dim", "train_pq", "train_opq", "use_opq", "encode", "pq_tables", "reconstruct", "KSUB",
           "round_bf16", "TABLE_BITS"]

KSUB = 256  #: centroids per subspace (codes are uint8)
TRAIN_SAMPLE = 65536  #: points the k-means sees at most
TRAIN_ITERS = 20
#: OPQ (Ge et al., non-parametric): alternations of rotation and codebook, Lloyd iterations per
#: alternation (the final codebook gets TRAIN_ITERS)
OPQ_ITERS = 6
OPQ_KMEANS_ITERS = 4
#: compression=None uses OPQ from this many dimensions per subspace on. Measured (CPU, 50k points
#: of four robustness sets, recall@10 of the PQ order, benchmarks/opq_measure.py): at the default
#: dsub = 2 OPQ changes -0.03..+0.01 (no gain); at dsub = 8 (codes cut by the memory budget)
#: +0.01..+0.11 (manifold 0.635 -> 0.749)
OPQ_AUTO_MIN_DSUB = 8
#: Bits of a distance-table entry in the walk: 16 = bfloat16 (the float32 entry rounded to nearest,
#: ties to even; 8 significant bits, float32's range, so no scaling), 32 = float32. The GPU walk
#: reloads each live query's table into shared memory every step (48 KB at m = 48 in float32): in
#: bfloat16 the load and the per-query state halve. The CPU twin walks the same rounded values, so
#: both walks stay equal. See NOTES.md ("bfloat16 tables").
TABLE_BITS = 16
#: How the tables are computed: "direct" sums the subspace's squared differences (or products) in
#: dimension order, each step rounded (no fused multiply-add), one pass that writes the table
#: (``_tables_cpu`` here, ``bang_tables_direct`` in ``bang.cu``: the same operations, so CPU and
#: GPU tables are equal bit for bit); "gemm" is the batched GEMM expansion |q|^2 - 2 q.c + |c|^2
#: of earlier sessions (on the GPU a cuBLAS GEMM writing float32 dot products, then a second
#: pass), kept for before/after measurements. See NOTES.md ("Direct tables").
TABLE_METHOD = "direct"


def pad_dim(d, m):
    """``(dsub, padded dimension)`` of ``m`` subspaces over ``d`` dimensions."""
    dsub = -(-d // m)
    return dsub, dsub * m


#: up to this dimension the codes take one byte a dimension (a subspace of one dimension, 256
#: levels learned by k-means): two dimensions a byte leave 2-d data 256 cells and 3-d data 65,536,
#: so at 100k points hundreds of points share a code and the PQ walk cannot order them (H200,
#: robustness suite, host placement: points_2d 0.81 and duplicates 0.97 at the default beam, and
#: 0.16 and 0.81 at beam 64 in the build's check; results/robustness/gpu_small_host_2026-12-01_s42_before.md)
ONE_DIM_SUBSPACES_UP_TO = 8


def choose_m(n, d, *, pq_bytes=None, budget=0):
    """Code bytes per vector: ``pq_bytes`` when given, else ``ceil(d / 2)`` (two dimensions per
    subspace; BANG's 74 bytes for 128-d is close to this) capped at 128, or ``d`` up to
    :data:`ONE_DIM_SUBSPACES_UP_TO` dimensions; lowered until the codes take at most half of
    ``budget`` (bytes of GPU memory; 0 = no limit).

    >>> choose_m(1000, 96), choose_m(10**6, 96, budget=40 * 10**6), choose_m(1000, 2)
    (48, 20, 2)
    """
    if pq_bytes is not None:
        return int(pq_bytes)
    m = max(1, d) if d <= ONE_DIM_SUBSPACES_UP_TO else min(128, -(-d // 2))
    if budget and n * m > budget // 2:
        fit = int(budget // 2 // max(1, n))
        if fit < 1:
            raise ValueError(f"PQ codes of {n} points need at least {n} bytes of GPU memory, the memory budget "
                             f"is {budget} bytes: raise knnkit.set_memory_budget or search on the CPU")
        logger.info("PQ: %d bytes per vector lowered to %d to fit the memory budget (%d bytes)", m, fit, budget)
        m = fit
    return m


def _padded(X, m, rotation=None):
    """``X`` zero-padded to ``m * dsub`` dimensions, then rotated (OPQ: ``X @ rotation``), as
    (n, m, dsub)."""
    xp = get_array_module(X)
    d = X.shape[1]
    dsub, dp = pad_dim(d, m)
    if dp != d:
        X = xp.concatenate([X, xp.zeros((X.shape[0], dp - d), xp.float32)], axis=1)
    if rotation is not None:
        X = xp.matmul(X, xp.asarray(rotation, dtype=xp.float32))
    return X.reshape(X.shape[0], m, dsub)


# ---------------------------------------------------------------------------------------- CPU
_FLOAT32_INF_BITS = 0x7F800000


@numba.njit(cache=True)
def _nearest_centroid(S, i, j, CT, dist):
    """``(index, squared distance)`` of the centroid nearest to ``S[i, j]`` among the columns of
    ``CT`` (dsub, ksub <= 256: one subspace's codebook, transposed); ``dist`` a float32 scratch of
    ksub. The distances to all centroids are summed one dimension at a time, so the loop over
    centroids vectorises; each centroid's sum is still ``0 + e_0^2 + e_1^2 + ...`` in dimension
    order in float32, the same operations as a loop per centroid. The smallest is found as the
    smallest integer ``bits << 8 | index`` (a sum of squares is >= +0, whose float32 bits order as
    integers; the index breaks ties, smaller first), a reduction that vectorises too. Where no
    distance is finite (inf or NaN), ``(0, inf)``: what a scan keeping the first strictly smaller
    value from ``inf`` returns."""
    dsub, ksub = CT.shape
    for c in range(ksub):
        dist[c] = np.float32(0.0)
    for t in range(dsub):
        x = S[i, j, t]
        for c in range(ksub):
            e = x - CT[t, c]
            dist[c] += e * e
    bits = dist.view(np.int32)
    key = np.int64(0x7FFFFFFFFFFFFFFF)
    for c in range(ksub):
        key = min(key, (np.int64(bits[c]) << 8) | c)
    if (key >> 8) >= _FLOAT32_INF_BITS:
        return 0, np.float32(np.inf)
    bi = key & 0xFF
    return bi, dist[bi]


@numba.njit(parallel=True, cache=True)
def _kmeans_cpu(S, C, iters):
    """Lloyd iterations on every subspace (in place on ``C``: (m, ksub, dsub)); ``S``: (s, m, dsub).
    An empty cluster takes the point that is farthest from its centroid (deterministic)."""
    s, m, dsub = S.shape
    ksub = C.shape[1]
    for j in numba.prange(m):
        lab = np.empty(s, np.int64)
        dmin = np.empty(s, np.float32)
        dist = np.empty(ksub, np.float32)
        CT = np.empty((dsub, ksub), np.float32)
        for _it in range(iters):
            for c in range(ksub):
                for t in range(dsub):
                    CT[t, c] = C[j, c, t]
            for i in range(s):
                lab[i], dmin[i] = _nearest_centroid(S, i, j, CT, dist)
            sums = np.zeros((ksub, dsub), np.float64)
            cnt = np.zeros(ksub, np.int64)
            for i in range(s):
                cnt[lab[i]] += 1
                for t in range(dsub):
                    sums[lab[i], t] += S[i, j, t]
            for c in range(ksub):
                if cnt[c] > 0:
                    for t in range(dsub):
                        C[j, c, t] = np.float32(sums[c, t] / cnt[c])
                else:
                    far = np.argmax(dmin)
                    dmin[far] = -1.0
                    for t in range(dsub):
                        C[j, c, t] = S[far, j, t]


#: rows a parallel chunk of :func:`_encode_cpu` codes (one distance buffer a chunk)
_ENCODE_CHUNK = 256


@numba.njit(parallel=True, cache=True)
def _encode_cpu(S, C, out):
    n, m, dsub = S.shape
    ksub = C.shape[1]
    CT = np.empty((m, dsub, ksub), np.float32)
    for j in range(m):
        for c in range(ksub):
            for t in range(dsub):
                CT[j, t, c] = C[j, c, t]
    for b in numba.prange((n + _ENCODE_CHUNK - 1) // _ENCODE_CHUNK):
        dist = np.empty(ksub, np.float32)
        for i in range(b * _ENCODE_CHUNK, min(n, (b + 1) * _ENCODE_CHUNK)):
            for j in range(m):
                out[i, j] = _nearest_centroid(S, i, j, CT[j], dist)[0]


# ---------------------------------------------------------------------------------------- GPU
def _assign_gpu(cp, Sj, Cj):
    """Nearest centroid of every row of ``Sj`` (s, dsub) among ``Cj`` (ksub, dsub) by one GEMM."""
    d = (Cj * Cj).sum(axis=1)[None, :] - 2.0 * (Sj @ Cj.T)
    lab = cp.argmin(d, axis=1)
    rowmin = d[cp.arange(d.shape[0]), lab] + (Sj * Sj).sum(axis=1)
    return lab, rowmin


def _kmeans_gpu(S, C, iters):
    """GPU Lloyd iterations (same rules as :func:`_kmeans_cpu`). Centroid sums are a one-hot GEMM,
    not atomics: the result is the same on every run."""
    import cupy as cp

    s, m, _dsub = S.shape
    ksub = C.shape[1]
    ar = cp.arange(ksub, dtype=cp.int64)
    for j in range(m):
        Sj = cp.ascontiguousarray(S[:, j, :])
        Cj = C[j]
        for _it in range(iters):
            lab, dmin = _assign_gpu(cp, Sj, Cj)
            onehot = (lab[:, None] == ar[None, :]).astype(cp.float32)
            cnt = onehot.sum(axis=0)
            sums = onehot.T @ Sj
            newC = sums / cp.maximum(cnt, 1.0)[:, None]
            empty = cp.nonzero(cnt == 0)[0]
            if empty.size:  # farthest points, as the CPU twin
                far = cp.argsort(-dmin)[:empty.size]
                newC[empty] = Sj[far]
            Cj = newC.astype(cp.float32)
        C[j] = Cj


# ---------------------------------------------------------------------------------------- API
def _training_rows(sample, random_state):
    """``sample`` cut to at most TRAIN_SAMPLE rows (seeded, in row order)."""
    s = sample.shape[0]
    if s <= TRAIN_SAMPLE:
        return sample
    rows = np.sort(np.random.default_rng(random_state).choice(s, TRAIN_SAMPLE, replace=False))
    return sample[get_array_module(sample).asarray(rows)]


def use_opq(compression, d, m):
    """Whether a host index of dimension ``d`` with ``m`` code bytes uses OPQ: ``compression``
    "opq" (yes), "pq" (no), None (when ``dsub >= OPQ_AUTO_MIN_DSUB``, where it was measured to pay)."""
    if compression is not None:
        return compression == "opq"
    return pad_dim(d, m)[0] >= OPQ_AUTO_MIN_DSUB


def train_opq(sample, m, *, random_state=0, iters=OPQ_ITERS):
    """OPQ (Ge et al. 2013, non-parametric): an orthogonal rotation ``R`` (dp, dp) of the padded
    space and the codebook trained on ``sample @ R``, alternating a few Lloyd iterations of the
    codebook with the Procrustes step ``R = U V^T`` (``U S V^T = svd(S^T Y^)``, ``Y^`` the
    reconstruction). Distances are kept by ``R`` (orthogonal), so tables of rotated queries
    against codes of rotated data rank as PQ does, with less quantisation error where the data's
    variance is not spread evenly over the subspaces. Runs where the sample lives.

    >>> X = np.random.default_rng(0).random((600, 8), dtype=np.float32)
    >>> R, C = train_opq(X, 2, random_state=0)
    >>> R.shape, C.shape, bool(np.allclose(R @ R.T, np.eye(8), atol=1e-4))
    ((8, 8), (2, 256, 4), True)
    """
    xp = get_array_module(sample)
    sample = _training_rows(sample, random_state)
    S = _padded(xp.ascontiguousarray(sample, dtype=xp.float32), m).reshape(sample.shape[0], -1)
    dp = S.shape[1]
    R = xp.eye(dp, dtype=xp.float32)
    for _ in range(int(iters)):
        C = train_pq(S, m, random_state=random_state, iters=OPQ_KMEANS_ITERS, rotation=R)
        Y = reconstruct(encode(S, C, rotation=R), C, dp)
        U, _sv, Vt = xp.linalg.svd(S.T.astype(xp.float64) @ Y.astype(xp.float64))
        R = (U @ Vt).astype(xp.float32)
    return R, train_pq(S, m, random_state=random_state, rotation=R)


def train_pq(sample, m, *, random_state=0, iters=TRAIN_ITERS, rotation=None):
    """Codebook (m, ksub, dsub) float32 trained on ``sample`` (prepared float32 vectors, numpy or
    cupy: the k-means runs where the sample lives). ``ksub = min(256, len(sample))``; initial
    centroids are distinct sample rows drawn with ``random_state``. ``rotation``: OPQ's (dp, dp)
    rotation applied to the padded rows first.

    >>> X = np.random.default_rng(0).random((500, 8), dtype=np.float32)
    >>> train_pq(X, 4, random_state=0).shape
    (4, 256, 2)
    """
    xp = get_array_module(sample)
    sample = _training_rows(sample, random_state)
    s = sample.shape[0]
    S = _padded(xp.ascontiguousarray(sample, dtype=xp.float32), m, rotation)
    ksub = min(KSUB, s)
    init = np.random.default_rng([int(random_state) & 0xFFFFFFFF, 0x50C0]).choice(s, ksub, replace=False)
    C = xp.ascontiguousarray(S[xp.asarray(init)].transpose(1, 0, 2))  # (m, ksub, dsub)
    if xp is np:
        _kmeans_cpu(S, C, int(iters))
    else:
        _kmeans_gpu(S, C, int(iters))
    return C


def encode(X, codebook, *, batch=None, rotation=None):
    """uint8 codes (n, m) of prepared vectors ``X`` (numpy or cupy, like the codebook);
    ``rotation``: OPQ's, applied to the padded rows first."""
    xp = get_array_module(X)
    m, ksub, dsub = codebook.shape
    S = _padded(xp.ascontiguousarray(X, dtype=xp.float32), m, rotation)
    if xp is np:
        out = np.empty((S.shape[0], m), np.uint8)
        _encode_cpu(S, np.ascontiguousarray(codebook), out)
        return out
    n = S.shape[0]
    out = xp.empty((n, m), xp.uint8)
    cn = (codebook * codebook).sum(axis=2)  # (m, ksub)
    # (m, b, ksub) float32 scores per batch: about 256 MB
    b = batch or max(256, min(n, (1 << 26) // max(1, m * ksub)))
    for s in range(0, n, b):
        Sb = S[s:s + b].transpose(1, 0, 2)  # (m, b, dsub)
        score = cn[:, None, :] - 2.0 * xp.matmul(Sb, codebook.transpose(0, 2, 1))
        out[s:s + b] = xp.argmin(score, axis=2).T.astype(xp.uint8)
    return out


def reconstruct(codes, codebook, d):
    """The vectors the codes stand for (n, d) float32 (padding dropped)."""
    xp = get_array_module(codebook)
    m = codebook.shape[0]
    rec = codebook[xp.arange(m)[None, :], xp.asarray(codes).astype(xp.int64)]  # (n, m, dsub)
    return rec.reshape(rec.shape[0], -1)[:, :d]


def table_bits():
    """:data:`TABLE_BITS` as set now (read at each call, so a measurement may switch it)."""
    return TABLE_BITS


def table_method():
    """:data:`TABLE_METHOD` as set now."""
    return TABLE_METHOD


def round_bf16(T, *, may_overwrite=False):
    """float32 values rounded to bfloat16 (nearest, ties to even), as float32 (numpy or cupy).
    The same bit operation as ``bang_tables_direct`` / ``bang_tables`` in ``bang.cu``: the CPU and GPU
    walks see equal values. ``may_overwrite``: a float32 NumPy ``T`` may be rounded in place (the
    tables :func:`pq_tables` just made: no second array of their size)."""
    xp = get_array_module(T)
    u = xp.ascontiguousarray(T, dtype=xp.float32).view(xp.uint32)
    if xp is np:  # one parallel pass (the NumPy expression took 4x the tables' own time)
        r = u if may_overwrite else np.empty_like(u)
        _round_bf16_cpu(u.reshape(-1), r.reshape(-1))
        return r.view(np.float32)
    r = (u + xp.uint32(0x7FFF) + ((u >> xp.uint32(16)) & xp.uint32(1))) & xp.uint32(0xFFFF0000)
    return r.view(xp.float32)


@numba.njit(parallel=True, cache=True)
def _round_bf16_cpu(u, out):
    """:func:`round_bf16` on float32 bits ``u`` (uint32, 1-D) into ``out``. Numba adds in 64 bits
    where the expression wraps at 32; the mask keeps bits 16-31 only, so the two agree."""
    for i in numba.prange(u.shape[0]):
        x = np.uint64(u[i])
        out[i] = np.uint32((x + np.uint64(0x7FFF) + ((x >> np.uint64(16)) & np.uint64(1))) & np.uint64(0xFFFF0000))


@numba.njit(parallel=True, cache=True)
def _tables_cpu(Qs, C, ip, out):
    """Direct tables: ``out[q, j, c]`` (float32) = sum over s of (Qs[q, j, s] - C[j, c, s])^2, or
    minus the sum of the products (``ip``), in dimension order, float32 all the way (Numba does not
    fuse the multiply-adds: the GPU kernel rounds each step the same way)."""
    nq, m, dsub = Qs.shape
    ksub = C.shape[1]
    for q in numba.prange(nq):
        for j in range(m):
            for c in range(ksub):
                t = np.float32(0.0)
                for u in range(dsub):
                    if ip:
                        t = t + Qs[q, j, u] * C[j, c, u]
                    else:
                        e = Qs[q, j, u] - C[j, c, u]
                        t = t + e * e
                out[q, j, c] = -t if ip else t


def _tables_gpu(Qs, C, ip, out):
    """``bang_tables_direct`` on the current stream: the tables of ``Qs`` (nq, m, dsub) float32
    into ``out`` (nq, m, ksub), float32 or (uint16 ``out``) their bfloat16 bits."""
    from ..._core.cuda import get_kernel, kernel_path

    nq, m, dsub = Qs.shape
    ksub = C.shape[1]
    total = nq * m * ksub
    get_kernel(kernel_path(__file__, "bang.cu"), "bang_tables_direct")(
        (int(min(-(-total // 256), 1 << 20)),), (256,),
        (Qs, C, out, np.int32(nq), np.int32(m), np.int32(ksub), np.int32(dsub), np.int32(1 if ip else 0),
         np.int32(1 if out.dtype.itemsize == 2 else 0)))


def tables_into(Q, codebook, metric, out, rotation=None):
    """Direct tables (:data:`TABLE_METHOD` "direct") of prepared queries ``Q`` into ``out`` (nq, m,
    ksub): float32 values, or on the GPU a uint16 ``out`` of bfloat16 bits (rounded as
    :func:`round_bf16`)."""
    xp = get_array_module(Q)
    m = codebook.shape[0]
    Qs = xp.ascontiguousarray(_padded(xp.ascontiguousarray(Q, dtype=xp.float32), m, rotation))  # (nq, m, dsub)
    C = xp.ascontiguousarray(codebook, dtype=xp.float32)
    if xp is np:
        o = np.asarray(out)
        if o.dtype == np.uint16:  # bfloat16 bits, as the GPU kernel stores them
            tmp = np.empty(o.shape, np.float32)
            _tables_cpu(np.asarray(Qs), np.asarray(C), metric == "ip", tmp)
            o[...] = (round_bf16(tmp).view(np.uint32) >> np.uint32(16)).astype(np.uint16)
        else:
            _tables_cpu(np.asarray(Qs), np.asarray(C), metric == "ip", o)
    else:
        _tables_gpu(Qs, C, metric == "ip", out)
    return out


def pq_tables(Q, codebook, metric, rotation=None, bits=None):
    """Per-query distance tables (nq, m, ksub) float32 (BANG 4.2): entry ``[q, j, c]`` is the
    squared distance (``"l2"``) or the negative inner product (``"ip"``) between subvector ``j``
    of query ``q`` and centroid ``c`` of subspace ``j``; a code's distance is the sum over ``j``.
    Computed on the device of ``Q``: by :func:`tables_into` (one pass, the default) or, with
    :data:`TABLE_METHOD` "gemm", one batched GEMM and the expansion. ``rotation``: OPQ's (the
    queries are rotated as the data was; an orthogonal rotation keeps both the distances and the
    inner products). ``bits``
    (default :data:`TABLE_BITS`): 16 rounds the entries to bfloat16 (:func:`round_bf16`), the
    values the walks use; 32 keeps float32."""
    xp = get_array_module(Q)
    m = codebook.shape[0]
    if TABLE_METHOD == "direct":
        T = tables_into(Q, codebook, metric, xp.empty((Q.shape[0], m, codebook.shape[1]), xp.float32), rotation)
    else:
        T = _tables_gemm(xp, Q, codebook, metric, rotation)
    return round_bf16(T, may_overwrite=True) if (TABLE_BITS if bits is None else bits) == 16 else T


def _tables_gemm(xp, Q, codebook, metric, rotation):
    """``TABLE_METHOD = "gemm"``: the batched GEMM expansion, float32 (nq, m, ksub)."""
    m = codebook.shape[0]
    Qs = _padded(xp.ascontiguousarray(Q, dtype=xp.float32), m, rotation).transpose(1, 0, 2)  # (m, nq, dsub)
    dots = xp.matmul(Qs, codebook.transpose(0, 2, 1))  # (m, nq, ksub)
    if metric == "ip":
        T = -dots
    else:
        T = (Qs * Qs).sum(axis=2)[:, :, None] - 2.0 * dots + (codebook * codebook).sum(axis=2)[:, None, :]
        T = xp.maximum(T, 0.0)
    return xp.ascontiguousarray(T.transpose(1, 0, 2).astype(xp.float32))


def table_bytes(m, ksub=KSUB, bits=None):
    """Bytes of one query's table in the GPU walk (BANG keeps it in shared memory where it fits)."""
    return int(m) * int(ksub) * (TABLE_BITS if bits is None else bits) // 8


def log2ceil(x):
    return int(math.ceil(math.log2(max(1, x))))
