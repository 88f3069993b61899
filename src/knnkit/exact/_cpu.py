"""Exact k-NN on the CPU: blocked BLAS GEMM for the dot products, Numba for the selection.

For a tile of queries ``Qb`` and a tile of data ``Xb`` the dot products ``G = Qb @ Xb.T``
come from the BLAS that NumPy links (the only part that needs high FLOP rates), one
single-threaded GEMM per task on each of Numba's threads (:func:`_gemm_select`). A Numba
kernel then streams each row of the tile once, while it is cached: it forms the key
``||x||^2 - 2 q.x`` (squared L2 less the row constant ``||q||^2``) or ``-q.x`` and offers it
to a bounded max-heap of the k best seen so far. Runs of keys are screened first by a vectorised
count of those at or below the heap's root (the current k-th best), so a run with no entrant
costs a fraction of a nanosecond per key.
The heaps compare ``(key, index)`` pairs, so the order in which data rows reach a heap does not
matter: the query-block path visits them in index order; the all-points graph's symmetric path
(:func:`_knn_cpu_symmetric`) computes each pair of blocks once for both of its sides, in a
locality order that fills the heaps early.

After selection the k winners of each row get their distance recomputed directly
(``sum((q - x)^2)`` or ``-sum(q * x)``, accumulated in float64), which removes the
cancellation error of the GEMM expansion from the reported distances (an exact duplicate of a
query reads exactly 0), and each row is sorted by ``(distance, index)``.

Memory stays bounded: one key tile per task (``_TILE_ROWS x _TILE_COLS``; the symmetric path's
``_PAIR_TILE_ROWS x _PAIR_TILE_COLS``) plus the heaps of one query block (the symmetric path: of
every point, up to ``_SYMMETRIC_HEAP_BYTES``).
"""

import threading

import numpy as np
from numba import prange

from .._core.config import logger, progress
from .._core.metrics import top_direction
from .._core.jit import Family, chunks, num_threads, parallel_for
from .._core.kmeans import lloyd, nearest_centroid
from ._sort_cpu import sort_pairs
from ._reach import reach_bound

# one announcement line for the family's first cold compile (seconds: measured on two cores)
_family = Family("exact", "exact k-NN", seconds=1.5)
njit = _family.njit
kernel = _family.kernel

__all__ = ["knn", "knn_cpu", "select_rows_cpu"]

_QUERY_BLOCK = 2048
#: rows per block of the symmetric path (one task is a pair of blocks)
_SYM_BLOCK = 2048
#: columns of a key tile that :func:`_pair_cols` walks down together (8 cache lines per row)
_TRANSPOSED_STRIP = 128
#: the all-points graph takes the symmetric path (:func:`_knn_cpu_symmetric`) while the heaps of
#: every point fit this many bytes; it beat the query-block path at every d measured (2 cores,
#: 2026-11-30: 50k x 3 / 16 / 32, 100k x 64 tight and broad clusters, 100k x 128, 20k x 128)
_SYMMETRIC_HEAP_BYTES = 1 << 30


@njit(inline="always")
def _sift_down(hd, hi, pos, k):
    """Restore the max-heap order of ``(hd, hi)`` (lexicographic on (key, index)) below ``pos``."""
    d = hd[pos]
    ix = hi[pos]
    while True:
        c = 2 * pos + 1
        if c >= k:
            break
        if c + 1 < k and (hd[c + 1] > hd[c] or (hd[c + 1] == hd[c] and hi[c + 1] > hi[c])):
            c += 1
        if hd[c] > d or (hd[c] == d and hi[c] > ix):
            hd[pos] = hd[c]
            hi[pos] = hi[c]
            pos = c
        else:
            break
    hd[pos] = d
    hi[pos] = ix


#: columns of a row that :func:`_tile_rows` screens at a time before offering any of them
_SCREEN = 128


@kernel(fastmath=False)
def _tile_rows(G, xn_b, id_b, id_a, heap_d, heap_i, use_l2):
    """The rows of a key tile ``G`` offered to their heaps (``heap_d[r]``, ``heap_i[r]``): candidate
    ``id_b[j]`` with key ``xn_b[j] - c G[r, j]`` (``xn_b``: the columns' squared norms for ``use_l2``,
    zeros for the inner product), a row's own id ``id_a[r]`` skipped (-1: none). The offer compares
    ``(key, id)`` pairs, so the order in which columns reach a row does not matter.

    Each row is screened ``_SCREEN`` columns at a time: a count of the keys at or below the heap's
    root, a loop without a branch that LLVM vectorises, and only a run holding one is offered key by
    key. Why: once a heap is full almost no key enters it, and the offer loop (a compare and branch
    per key, the root reloaded after each insert) cost 2.4 ns per key on one core (AMD EPYC, AVX2),
    as much as the GEMM that made the key. The screen computes the key in float32 and counts
    ``<=`` the float32 root: the offer's float64 test ``v < top`` implies it (rounding to float32
    is monotone and the root is a float32), so no run holding an entrant is skipped; a NaN key
    passes neither test. The run's float32 keys are kept, so the offer pass computes the float64
    key only for those that pass."""
    nb = G.shape[1]
    k = heap_d.shape[1]
    # one formula for both metrics, no metric test in the loops: key = xn - c g, with xn all zeros
    # for 'ip' (the caller's), c = 2 for 'l2' and 1 for 'ip' (0 - g is -g exactly)
    c64 = 2.0 if use_l2 else 1.0
    c32 = np.float32(c64)
    run = np.empty(_SCREEN, np.float32)  # the screened run's float32 keys
    for r in range(G.shape[0]):
        own = id_a[r]
        hd = heap_d[r]
        hx = heap_i[r]
        g = G[r]
        top = hd[0]
        topi = hx[0]
        for s0 in range(0, nb, _SCREEN):
            s1 = min(nb, s0 + _SCREEN)
            # slices and a loop from 0: with the offsets in the index LLVM left this loop scalar
            # (1.2 ns per key instead of 0.4)
            gs = g[s0:s1]
            xs = xn_b[s0:s1]
            hits = 0
            for j in range(gs.shape[0]):
                run[j] = xs[j] - c32 * gs[j]
                hits += np.int32(run[j] <= top)
            if hits == 0:
                continue
            ids = id_b[s0:s1]
            for j in range(gs.shape[0]):
                # the float32 key first (implied by the exact test below, as in the screen; `top`
                # only falls), so most keys of a run cost one float32 compare
                if run[j] > top:
                    continue
                v = xs[j] - c64 * gs[j]
                c = ids[j]
                if v < top or (v == top and c < topi):
                    if c == own:
                        continue
                    _offer_root(hd, hx, v, c, k)
                    top = hd[0]
                    topi = hx[0]


@kernel(fastmath=False)
def _pair_cols(G, xn_a, id_a, id_b, heap_d, heap_i, use_l2):
    """The columns of a key tile ``G`` offered to the heaps of ``id_b``: heap ``id_b[t]`` gets
    candidate ``id_a[i]`` with key ``xn_a[i] - c G[i, t]`` (the symmetric path computes each tile
    once for both of its sides). The tile walks down in strips of ``_TRANSPOSED_STRIP`` columns,
    each step a branch-free count of the strip's keys at or below their heaps' roots (vectorised),
    then offers only where one is. The tile is small enough to stay in the core's cache, so the
    column walk costs about what the row walk does."""
    mi, mc = G.shape
    k = heap_d.shape[1]
    W = _TRANSPOSED_STRIP
    c64 = 2.0 if use_l2 else 1.0
    c32 = np.float32(c64)
    tops = np.empty(W, np.float32)
    topi = np.empty(W, np.int64)
    for c0 in range(0, mc, W):
        w = min(W, mc - c0)
        for t in range(w):
            tops[t] = heap_d[c0 + t, 0]
            topi[t] = heap_i[c0 + t, 0]
        for i in range(mi):
            gs = G[i, c0:c0 + w]
            x32 = xn_a[i]
            hits = 0
            for t in range(w):
                hits += np.int32(x32 - c32 * gs[t] <= tops[t])
            if hits == 0:
                continue
            c = id_a[i]
            for t in range(w):
                if x32 - c32 * gs[t] > tops[t]:
                    continue
                v = x32 - c64 * gs[t]
                if v < tops[t] or (v == tops[t] and c < topi[t]):
                    if id_b[c0 + t] == c:
                        continue
                    _offer_root(heap_d[c0 + t], heap_i[c0 + t], v, c, k)
                    tops[t] = heap_d[c0 + t, 0]
                    topi[t] = heap_i[c0 + t, 0]


@njit(inline="always")
def _offer_root(hd, hx, v, j, k):
    """Replace the heap's root by ``(v, j)`` and restore the heap."""
    hd[0] = v
    hx[0] = j
    _sift_down(hd, hx, 0, k)


@njit(parallel=True, cache=True)
def _select_dense(D, heap_d, heap_i, col0):
    """Offer every entry of a ready-made key matrix ``D`` to the heaps (generic top-k)."""
    m, nb = D.shape
    k = heap_d.shape[1]
    for r in prange(m):
        hd = heap_d[r]
        hi = heap_i[r]
        d = D[r]
        top = hd[0]
        topi = hi[0]
        for j in range(nb):
            v = d[j]
            if v < top or (v == top and col0 + j < topi):
                hd[0] = v
                hi[0] = col0 + j
                _sift_down(hd, hi, 0, k)
                top = hd[0]
                topi = hi[0]


def _refine_and_sort(X, Q, q0, heap_d, heap_i, use_l2, out_d, out_i):
    """Exact distances of the selected pairs (float64 accumulation), then sort each row."""
    parts = chunks(heap_d.shape[0], 4 * num_threads())
    parallel_for(lambda c: _refine_rows(X, Q, q0, heap_d, heap_i, use_l2, out_d, out_i, parts[c][0], parts[c][1]),
                 len(parts))


@kernel()
def _refine_rows(X, Q, q0, heap_d, heap_i, use_l2, out_d, out_i, lo, hi):
    """Rows ``lo .. hi - 1`` of :func:`_refine_and_sort`. Four candidates at a time, each summed
    over the coordinates in order (so each sum is the one-at-a-time sum, bit for bit): one float64
    sum is a chain of dependent adds, and four chains side by side let the core overlap them and
    the four rows' cache misses (100k x 64, 80 candidates a row: ~1.5 s of gathers and chains)."""
    k = heap_d.shape[1]
    dim = X.shape[1]
    for r in range(lo, hi):
        q = Q[q0 + r]
        tmp = np.empty(k, np.float32)
        ti = np.empty(k, np.int64)
        for t in range(k):
            ti[t] = heap_i[r, t]
        t = 0
        while t < k:
            # the next four slots (past the end, or id -1: row 0 is read and the slot set to +inf)
            j0 = ti[t]
            j1 = ti[t + 1] if t + 1 < k else -1
            j2 = ti[t + 2] if t + 2 < k else -1
            j3 = ti[t + 3] if t + 3 < k else -1
            x0 = X[max(j0, 0)]
            x1 = X[max(j1, 0)]
            x2 = X[max(j2, 0)]
            x3 = X[max(j3, 0)]
            a0 = 0.0
            a1 = 0.0
            a2 = 0.0
            a3 = 0.0
            if use_l2:
                for c in range(dim):
                    qc = np.float64(q[c])
                    e0 = qc - np.float64(x0[c])
                    e1 = qc - np.float64(x1[c])
                    e2 = qc - np.float64(x2[c])
                    e3 = qc - np.float64(x3[c])
                    a0 += e0 * e0
                    a1 += e1 * e1
                    a2 += e2 * e2
                    a3 += e3 * e3
            else:
                for c in range(dim):
                    qc = np.float64(q[c])
                    a0 -= qc * np.float64(x0[c])
                    a1 -= qc * np.float64(x1[c])
                    a2 -= qc * np.float64(x2[c])
                    a3 -= qc * np.float64(x3[c])
            tmp[t] = np.float32(a0) if j0 >= 0 else np.inf
            if t + 1 < k:
                tmp[t + 1] = np.float32(a1) if j1 >= 0 else np.inf
            if t + 2 < k:
                tmp[t + 2] = np.float32(a2) if j2 >= 0 else np.inf
            if t + 3 < k:
                tmp[t + 3] = np.float32(a3) if j3 >= 0 else np.inf
            t += 4
        # sort by (distance, index), NaN last
        sort_pairs(tmp, ti)
        for t in range(k):
            out_d[q0 + r, t] = tmp[t]
            out_i[q0 + r, t] = ti[t]


@njit(parallel=True, cache=True)
def _sort_heaps(heap_d, heap_i):
    """Sort each heap row ascending by (key, index) in place."""
    m, k = heap_d.shape
    for r in prange(m):
        order = np.argsort(heap_d[r], kind="mergesort")
        d = heap_d[r][order].copy()
        ix = heap_i[r][order].copy()
        for t in range(1, k):
            dd = d[t]
            ii = ix[t]
            u = t - 1
            while u >= 0 and d[u] == dd and ix[u] > ii:
                d[u + 1] = d[u]
                ix[u + 1] = ix[u]
                u -= 1
            d[u + 1] = dd
            ix[u + 1] = ii
        heap_d[r] = d
        heap_i[r] = ix


def _query_block(m, query_block=None):
    """Queries per block (their heaps are allocated together)."""
    return min(m, query_block or _QUERY_BLOCK)


def knn(X, Q, k, metric, exclude_self, *, precision="exact", batch_size=None, certify=True, candidates=None):
    """CPU twin of :func:`knnkit.exact._gpu.knn` (same signature). ``precision`` must be
    ``"exact"`` here: the facade refuses the tensor-core modes on the CPU. ``certify=False``:
    rows the float32 rounding certificate rejects keep their float32 answer instead of being
    recomputed in float64 (estimates only: see :func:`knnkit.exact.knn_lists`). ``candidates``
    is the GPU tensor-core modes' (unused here: float32 keys need no re-rank margin)."""
    if precision != "exact":
        raise ValueError(f"precision={precision!r} needs the GPU; the CPU path is always exact")
    return knn_cpu(X, Q, k, metric, exclude_self, batch_size=batch_size, certify=certify)


def _blas_one_thread():
    """One BLAS thread while the selection runs on Numba's threads: OpenBLAS workers keep spinning
    after each GEMM and halved the selection's speed (2 cores, 20k x 128 all-points: 3.3-3.9 s
    with 2 BLAS threads, 2.5-2.6 s with one)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # optional: without it the BLAS keeps its own thread count
        import contextlib

        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


#: rows x columns of the key tiles :func:`_gemm_select` makes and screens in turn (1 MiB of float32)
_TILE_ROWS = 256
_TILE_COLS = 1024


def _gemm_select(Qb, Xc, xn, q0, heap_d, heap_i, use_l2, exclude_self):
    """Offer the keys of every data row to the heaps of the queries ``Qb`` (rows ``q0 ..`` of the
    query set): tasks of up to ``_TILE_ROWS`` query rows on Numba's thread count, each walking the
    data in ``_TILE_COLS``-row steps, a single-threaded BLAS GEMM into its own tile followed at once
    by :func:`_tile_rows` on that tile.

    Why: with one GEMM of the whole query block (2048 x 4096 keys, 32 MiB) and then a selection
    over it, the GEMM ran on one core (BLAS held to one thread, see :func:`_blas_one_thread`) and
    the selection read the keys back from memory. Per task, every core multiplies, and a 1 MiB tile
    is still in the core's cache when it is screened."""
    m, n = Qb.shape[0], Xc.shape[0]
    rows = chunks(m, max(num_threads(), -(-m // _TILE_ROWS)))
    cols = min(n, _TILE_COLS)
    ids = np.arange(n, dtype=np.int64)
    # a query's own data row (all-points graph), never listed; -1: none
    own = np.arange(q0, q0 + m, dtype=np.int64) if exclude_self else np.full(m, -1, np.int64)

    def task(c):
        lo, hi = rows[c]
        tile = np.empty((hi - lo) * cols, np.float32)
        for c0 in range(0, n, cols):
            c1 = min(n, c0 + cols)
            # a contiguous view: numpy's matmul leaves BLAS (and gets far slower) for a strided out
            g = tile[: (hi - lo) * (c1 - c0)].reshape(hi - lo, c1 - c0)
            np.matmul(Qb[lo:hi], Xc[c0:c1].T, out=g)
            _tile_rows(g, xn[c0:c1], ids[c0:c1], own[lo:hi], heap_d[lo:hi], heap_i[lo:hi], use_l2)

    parallel_for(task, len(rows))


def knn_cpu(X, Q, k, metric_internal, exclude_self, batch_size=None, certify=True):
    """Exact k-NN of the rows of ``Q`` among the rows of ``X`` (internal minimised distances).

    Parameters
    ----------
    X : ndarray, float32, shape (n, d), C-contiguous
        Data (already prepared by :func:`knnkit._metrics.prepare_vectors`).
    Q : ndarray, float32, shape (m, d), C-contiguous
        Queries; pass ``X`` itself with ``exclude_self=True`` for the all-points graph.
    k : int
        Neighbours per query (``k <= n``, or ``k <= n - 1`` when excluding self).
    metric_internal : {"l2", "ip"}
        Squared L2 or negative inner product.
    exclude_self : bool
        Query ``i`` never returns data index ``i`` (``Q`` must then be ``X``).
    batch_size : int, optional
        Queries per block (default 2048).
    certify : bool
        Recompute in float64 the rows whose float32 result the rounding certificate cannot
        vouch for (default). False keeps their float32 answer: the top-k may then differ from
        the exact one among distances equal to float32 rounding (for estimates).

    Returns
    -------
    distances : ndarray, float32, shape (m, k)
        Internal distances (squared L2 or negative dot product), ascending.
    indices : ndarray, int64, shape (m, k)
        Ties in distance are ordered by smaller index.

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).random((100, 8), dtype=np.float32)
    >>> d, i = knn_cpu(X, X, 3, "l2", True)
    >>> d.shape, i.dtype
    ((100, 3), dtype('int64'))
    """
    with _blas_one_thread():
        return _knn_cpu(X, Q, k, metric_internal, exclude_self, batch_size, certify)


def _knn_cpu(X, Q, k, metric_internal, exclude_self, batch_size=None, certify=True):
    if metric_internal not in ("l2", "ip"):
        raise ValueError(f"knn_cpu supports internal metrics 'l2' and 'ip', got {metric_internal!r}")
    same = Q is X
    X = np.ascontiguousarray(X, dtype=np.float32)
    Q = X if same else np.ascontiguousarray(Q, dtype=np.float32)
    n, m = X.shape[0], Q.shape[0]
    use_l2 = metric_internal == "l2"
    avail = n - (1 if exclude_self else 0)
    # a few candidates beyond k give the rounding certificate its gap (see _certify)
    kc = int(min(avail, k + max(8, k // 4)))
    exact_keys = _integer_keys(X) and (same or _integer_keys(Q, _absmax(X)))
    if use_l2 and not exact_keys:
        # centring: squared L2 is translation invariant, and the GEMM keys' cancellation error
        # scales with the norms (tight clusters far from the origin lost true neighbours)
        mu = X.mean(axis=0, dtype=np.float64).astype(np.float32)
        Xc = X - mu
        Qc = Xc if same else Q - mu
        xn = np.einsum("ij,ij->i", Xc, Xc).astype(np.float32)
    else:
        Xc, Qc = X, Q
        xn = np.einsum("ij,ij->i", X, X).astype(np.float32) if use_l2 else np.zeros(n, np.float32)
    cand_d = np.empty((m, kc), np.float32)
    cand_i = np.empty((m, kc), np.int64)
    approx = np.empty((m, 2), np.float32)  # per row: the k-th and the last (kc-th) approximate key
    if exclude_self and same and n * kc * 12 <= _SYMMETRIC_HEAP_BYTES and n > _SYM_BLOCK and batch_size is None:
        _knn_cpu_symmetric(Xc, X, xn, kc, use_l2, cand_d, cand_i, approx, k)
    else:
        qb = _query_block(m, batch_size)
        bar = progress(total=m, desc="exact k-NN (CPU)", unit="query")
        for q0 in range(0, m, qb):
            q1 = min(m, q0 + qb)
            heap_d = np.full((q1 - q0, kc), np.inf, np.float32)
            heap_i = np.full((q1 - q0, kc), -1, np.int64)
            _gemm_select(Qc[q0:q1], Xc, xn, q0, heap_d, heap_i, use_l2, bool(exclude_self))
            _approx_bounds(heap_d, k, approx[q0:q1])
            _refine_and_sort(X, Q, q0, heap_d, heap_i, use_l2, cand_d, cand_i)
            bar.update(q1 - q0)
        bar.close()
    out_d = np.ascontiguousarray(cand_d[:, :k])
    out_i = np.ascontiguousarray(cand_i[:, :k])
    if kc < avail and not exact_keys and certify:
        bad = np.nonzero(~_certify(approx, cand_d, Qc, Xc, k, use_l2))[0]
        if bad.size:
            logger.debug("exact k-NN (CPU): %d of %d rows recomputed in float64 (rounding certificate)",
                         bad.size, m)
            if use_l2:
                d2, i2 = _rows_within64(X, Q, bad, k, out_d[bad, k - 1], exclude_self)
            else:
                d2, i2 = _rows_float64(X, Q, bad, k, use_l2, exclude_self)
            out_d[bad] = d2
            out_i[bad] = i2
    return out_d, out_i


def _absmax(A):
    return float(np.abs(A).max()) if A.size else 0.0


def _integer_keys(A, other_max=0.0):
    """True when the float32 GEMM keys of ``A`` are exact: integer values small enough that every
    partial sum of ``||x||^2 - 2 q.x`` stays below 2^24 (uint8/int8 data in a few dimensions:
    then nothing is centred and no certificate is needed, ties among duplicates included)."""
    a = max(_absmax(A), other_max)
    return A.shape[1] * a * 3 * a < 2.0 ** 24 and bool(np.all(A == np.rint(A)))


def _approx_bounds(heap_d, k, out):
    """The k-th smallest and the largest approximate key of every heap row."""
    kc = heap_d.shape[1]
    out[:, 1] = heap_d.max(axis=1)
    out[:, 0] = np.partition(heap_d, k - 1, axis=1)[:, k - 1] if k < kc else out[:, 1]


def _certify(approx, cand_d, Qc, Xc, k, use_l2):
    """Rows whose true top-k provably lies among their candidates.

    A point left out has an approximate key >= the last candidate's, so a true key >= that minus
    the rounding bound ``eps``. ``eps`` bounds the float32 GEMM key error (worst-case accumulation
    ``(d + 2) u`` with a 4x margin, as the GPU certificate) from the norms of the operands.

    Inner product: the k-th smallest true key among the candidates is <= the k-th approximate key
    plus ``eps``, with the largest data norm in ``eps``.

    Squared L2: a point farther from the centre than ``|q| + d_k`` (``d_k`` the k-th candidate's
    exact distance) lies beyond the k-th, so only points within that reach need the bound, and
    ``eps`` takes the smaller of the reach and the largest norm; the k-th's true key is bounded
    from its exact distance. On heavy-tailed data the largest norm is an outlier's: Cauchy
    20k x 16 certified almost no row against it and spent 6 of 9 s in the float64 fallback."""
    dim = Xc.shape[1]
    xmax = float(np.sqrt(np.einsum("ij,ij->i", Xc, Xc).max())) if Xc.size else 0.0
    qn = np.sqrt(np.einsum("ij,ij->i", Qc, Qc).astype(np.float64))
    u = 2.0 ** -24
    a_last = approx[:, 1].astype(np.float64)
    if use_l2:
        # (norms summed in float32: relative error below (d + 2) u, taken with a 4x margin)
        eps, upper = reach_bound(np, qn, 4 * (dim + 2) * u, cand_d[:, k - 1], xmax, dim)
        return a_last - eps > upper  # (upper is inf where the row has no k-th)
    dot_err = (dim + 2) * 4 * u * qn * xmax
    key_round = 4 * u * (xmax ** 2 + 2 * qn * xmax)
    eps = 1.05 * (dot_err + key_round) + 1e-30
    a_k = approx[:, 0].astype(np.float64)
    return (a_last - a_k > 2 * eps) & np.isfinite(cand_d[:, k - 1])


#: list slots per row of :func:`_rows_within64` (2k if larger); rows whose lists overflow go to
#: :func:`_rows_float64`
_WITHIN_CAP = 256


def _rows_within64(X, Q, rows, k, kth, exclude_self):
    """Exact top-k (squared L2) of the query rows whose certificate failed: the CPU twin of the GPU
    path's float64 threshold lists (``exact/_gpu.py``, ``_rows_within_f64``).

    ``kth`` (rows,) is each row's float32 exact distance to its k-th candidate: every point whose
    squared distance, summed in float64 from the coordinate differences (stopping as soon as a
    partial sum passes the bound), is within it (plus a rounding margin) is listed, and the lists
    are re-ranked as every other row (:func:`_refine_and_sort`). A point left out has a float32
    distance above the k-th: the answer and its ties are those of the sorting fallback. Rows
    whose list overflows (many exact ties) take :func:`_rows_float64`. Tight clusters, 30k all
    points, no row certified, 2 cores: 4.9 s through the float64 GEMM blocks."""
    cap = int(max(_WITHIN_CAP, 2 * k))
    ub = kth.astype(np.float64) * (1.0 + 2.0 ** -20) + 1e-37
    ids = np.full((rows.size, cap), -1, np.int64)
    cnt = np.zeros(rows.size, np.int64)
    rows = np.ascontiguousarray(rows, np.int64)
    # only the points whose projection on the data's main axis lies within sqrt(bound) of the
    # query's can be within the bound (|p.(q - x)| <= |q - x| for a unit p): one sorted pass
    # of projections, a window per row (tight clusters, 30k all points: 4.3 s -> see NOTES)
    p = _main_axis(X)
    px = X.astype(np.float64) @ p
    order = np.argsort(px, kind="stable")
    ps = px[order]
    pq = Q[rows].astype(np.float64) @ p
    slack = 1e-12 * (np.abs(pq) + float(np.abs(ps).max(initial=0.0))) + 1e-300
    half = np.sqrt(ub) * (1.0 + 1e-9) + slack
    lo_i = np.searchsorted(ps, pq - half, side="left")
    hi_i = np.searchsorted(ps, pq + half, side="right")
    parts = chunks(rows.size, 4 * num_threads())
    parallel_for(lambda c: _within_rows(X, Q, rows, ub, bool(exclude_self), order, lo_i, hi_i, ids, cnt,
                                        parts[c][0], parts[c][1]), len(parts))
    out_d = np.empty((rows.size, k), np.float32)
    out_i = np.empty((rows.size, k), np.int64)
    over = cnt > cap
    short = cnt < k  # cannot happen: the row's k candidates lie within its bound
    redo = np.flatnonzero(over | short)
    keep = np.flatnonzero(~(over | short))
    if keep.size:
        width = int(max(k, cnt[keep].max()))
        cand = np.ascontiguousarray(ids[keep, :width])
        d_all = np.empty((keep.size, width), np.float32)
        i_all = np.empty((keep.size, width), np.int64)
        _refine_and_sort(X, np.ascontiguousarray(Q[rows[keep]]), 0, np.zeros((keep.size, width), np.float32), cand,
                         True, d_all, i_all)
        out_d[keep] = d_all[:, :k]
        out_i[keep] = i_all[:, :k]
    if redo.size:
        logger.debug("exact k-NN (CPU): %d threshold lists %s; sorting fallback", redo.size,
                     "overflowed" if over.any() else "short")
        d2, i2 = _rows_float64(X, Q, rows[redo], k, True, exclude_self)
        out_d[redo] = d2
        out_i[redo] = i2
    return out_d, out_i


def _main_axis(X, sample=4096, iters=8):
    """A unit vector along the data's main axis (power iteration on the covariance of a fixed
    sample of rows, float64); any unit vector keeps :func:`_rows_within64` exact, a good one
    narrows its windows."""
    n, dim = X.shape
    S = X[:: max(1, n // sample)][:sample].astype(np.float64)
    return top_direction(S - S.mean(axis=0), np.ones(dim) / np.sqrt(dim), iters)


@kernel(fastmath=False)
def _within_rows(X, Q, rows, ub, exclude_self, order, lo_i, hi_i, ids, cnt, lo, hi):
    """Rows ``lo .. hi - 1`` of :func:`_rows_within64`: the points ``order[lo_i[r] .. hi_i[r]]``."""
    n, dim = X.shape
    cap = ids.shape[1]
    for r in range(lo, hi):
        qi = rows[r]
        q = Q[qi]
        bound = ub[r]
        c = 0
        for t0 in range(lo_i[r], hi_i[r]):
            j = order[t0]
            if exclude_self and j == qi:
                continue
            x = X[j]
            acc = 0.0
            t = 0
            while t < dim:
                diff = np.float64(q[t]) - np.float64(x[t])
                acc += diff * diff
                t += 1
                if (t & 7) == 0 and acc > bound:
                    break
            if acc <= bound:
                if c < cap:
                    ids[r, c] = j
                c += 1
        cnt[r] = c


#: largest float64 block (rows x columns) of :func:`_rows_float64`
_ROWS64_BLOCK_ELEMS = 1 << 23


def _rows_float64(X, Q, rows, k, use_l2, exclude_self, chunk=1 << 15):
    """Exact top-k of the rows whose certificate failed: float64 keys over all points, a margin of 8
    candidates, then the same exact re-rank and (distance, index) sort as every other row.

    The keys (``(qn - (2q).x) + xn`` or ``-q.x``, the same float64 operations as a NumPy
    expression would do) go straight from the GEMM block into a bounded (key, index) heap per row
    (:func:`_select_rows64`): the kk smallest by (key, index), i.e. what a stable sort of each
    row would keep. Before, NumPy built the keys, concatenated them to the running best and took
    a partition and a lexsort per block: ten passes over a (rows, 32k) float64 array, 1.5-2 s per
    call on tight clusters where no row certifies (500 rows x 100k, 2 cores)."""
    n = X.shape[0]
    kk = min(n, k + 8)
    q = Q[rows].astype(np.float64)
    q2 = 2 * q if use_l2 else q
    qn = (q * q).sum(1)
    best_d = np.full((rows.size, kk), np.inf)
    best_i = np.full((rows.size, kk), -1, np.int64)
    self_ids = np.asarray(rows, np.int64) if exclude_self else np.full(rows.size, -1, np.int64)
    # row blocks keep the float64 block G at most _ROWS64_BLOCK_ELEMS (64 MiB): all rows at once
    # made a (rows, 32k) block, 7.8 GB for 30k failing rows (tight clusters, all points: 18 s)
    rb = int(max(1, min(rows.size, _ROWS64_BLOCK_ELEMS // min(chunk, max(n, 1)))))
    for r0 in range(0, rows.size, rb):
        r1 = min(rows.size, r0 + rb)
        parts = [(r0 + a, r0 + b) for a, b in chunks(r1 - r0, 4 * num_threads())]
        for c0 in range(0, n, chunk):
            x = X[c0:c0 + chunk].astype(np.float64)
            G = np.ascontiguousarray(q2[r0:r1] @ x.T)
            xn = (x * x).sum(1) if use_l2 else np.zeros(x.shape[0])
            parallel_for(lambda c, G=G, xn=xn, c0=c0, r0=r0, parts=parts:
                         _select_rows64(G, qn, xn, c0, self_ids, best_d, best_i, use_l2, parts[c][0], parts[c][1],
                                        r0), len(parts))
    Qr = np.ascontiguousarray(Q[rows])
    out_d = np.empty((rows.size, kk), np.float32)
    out_i = np.empty((rows.size, kk), np.int64)
    _refine_and_sort(X, Qr, 0, best_d.astype(np.float32), best_i, use_l2, out_d, out_i)
    return out_d[:, :k], out_i[:, :k]


@kernel(fastmath=False)
def _select_rows64(G, qn, xn, col0, self_ids, heap_d, heap_i, use_l2, lo, hi, row0):
    """Rows ``lo .. hi - 1`` of one block of :func:`_rows_float64` (``G`` holds rows ``row0 ..``):
    key ``(qn - G) + xn`` (l2, ``G = (2q).x``) or ``-G`` (ip), a row's own id (``self_ids``, -1
    for none) skipped."""
    nb = G.shape[1]
    k = heap_d.shape[1]
    for r in range(lo, hi):
        hd = heap_d[r]
        hx = heap_i[r]
        g = G[r - row0]
        own = self_ids[r]
        top = hd[0]
        topi = hx[0]
        for j in range(nb):
            v = (qn[r] - g[j]) + xn[j] if use_l2 else -g[j]
            if v < top or (v == top and col0 + j < topi):
                if col0 + j == own:
                    continue
                hd[0] = v
                hx[0] = col0 + j
                _sift_down(hd, hx, 0, k)
                top = hd[0]
                topi = hx[0]


#: rows x columns of a key tile of the symmetric path (512 KiB of float32: it stays in a core's L2
#: while both of its sides are selected)
_PAIR_TILE_ROWS = 256
_PAIR_TILE_COLS = 512
#: smallest block of the symmetric path on many threads (see :func:`_knn_cpu_symmetric`)
_PAIR_MIN_BLOCK = 256
#: Lloyd iterations of the symmetric path's locality order (on a sample of at most _ORDER_SAMPLE
#: rows), fewer below _ORDER_FULL_FROM points: the order's gain (heap inserts saved) grows with n
#: while the k-means costs about the same (2 cores: tight clusters 100k x 64 with 2 iterations
#: 14.0-14.6 s against 13.4-13.7 s; siftsmall 10k x 128 0.38-0.49 s against 0.45-0.51 s)
_ORDER_ITERS = 6
_ORDER_ITERS_SMALL = 2
_ORDER_FULL_FROM = 50_000
_ORDER_SAMPLE = 20_000


def _locality_order(Xc, groups):
    """A permutation of the rows of ``Xc`` that puts near rows together: rows sorted by their cell
    of a coarse k-means (``groups`` centroids, a few Lloyd iterations on a sample, fixed seed).

    Why: the symmetric path's heaps fill fastest when a row meets its near rows first. In index
    order a row's heap takes ~k ln(n / k) inserts, each a run re-screened key by key and a sift
    down; block pairs of near cells first leave the later blocks almost nothing to insert (100k x
    64, k 80: inserts were 4.6 of 14.4 s). The order changes no result: the heaps compare (key,
    original id) pairs and the final lists are re-ranked exactly."""
    n = Xc.shape[0]
    if groups < 2 or n < 2 * groups:
        return np.arange(n, dtype=np.int64)
    rng = np.random.default_rng(0x5EED)
    S = Xc[np.sort(rng.choice(n, min(n, _ORDER_SAMPLE), replace=False))]
    C = S[rng.choice(S.shape[0], groups, replace=False)].astype(np.float32)
    C = lloyd(np, S, C, _ORDER_ITERS if n >= _ORDER_FULL_FROM else _ORDER_ITERS_SMALL, "l2")
    return np.argsort(nearest_centroid(np, Xc, C, "l2"), kind="stable").astype(np.int64)


def _pair_schedule(Xp, S):
    """Block pairs ``(I, J)``, ``I <= J``, of the permuted data in blocks of ``S`` rows: every block
    with itself first, then pairs by the squared distance between their block means (near blocks
    first, see :func:`_locality_order`)."""
    n = Xp.shape[0]
    nb = -(-n // S)
    means = np.stack([Xp[b * S:min(n, b * S + S)].mean(axis=0, dtype=np.float64) for b in range(nb)])
    sq = (means * means).sum(1)
    dist = sq[:, None] + sq[None, :] - 2 * means @ means.T
    iu, ju = np.triu_indices(nb, 1)
    order = np.argsort(dist[iu, ju], kind="stable")
    return [(b, b) for b in range(nb)] + [(int(iu[t]), int(ju[t])) for t in order]


def _run_pairs(pairs, fn, bar):
    """``fn(I, J)`` for every pair, on Numba's thread count, never two pairs sharing a block at once
    (each writes the heaps of its two blocks): a worker takes the first pair in order whose blocks
    are free, and waits when none is."""
    pending = list(pairs)
    busy = set()
    cond = threading.Condition()
    failed = []

    def worker(_):
        while True:
            with cond:
                while True:
                    if failed or not pending:
                        return
                    pick = next((t for t, (a, b) in enumerate(pending) if a not in busy and b not in busy), None)
                    if pick is not None:
                        a, b = pending.pop(pick)
                        busy.update((a, b))
                        break
                    cond.wait()
            try:
                fn(a, b)
            except BaseException as e:
                failed.append(e)
                raise
            finally:
                with cond:
                    busy.difference_update((a, b))
                    bar.update()
                    cond.notify_all()

    parallel_for(worker, max(1, min(num_threads(), len(pairs))))


def _knn_cpu_symmetric(Xc, X, xn, k, use_l2, out_d, out_i, approx, k_final):
    """All-points graph computing each pair of blocks once: a key tile of blocks I x J serves the
    heaps of I through its rows and those of J through its columns (half the GEMM flops of the
    query-block path). The data are visited in a locality order (:func:`_locality_order`) and the
    block pairs near first (:func:`_pair_schedule`); each task is one block pair, run in cache-sized
    tiles (a single-threaded BLAS GEMM, then both selections), and tasks sharing a block never run
    at once (:func:`_run_pairs`). Heaps compare ``(key, id)`` pairs, so the visiting order does not
    matter. Keys come from the centred ``Xc``, exact distances from ``X``."""
    n = X.shape[0]
    # blocks of _SYM_BLOCK rows, smaller where that leaves fewer than ~4 blocks per thread: pairs
    # sharing a block wait for each other, so nb blocks keep at most nb / 2 threads busy
    S = min(_SYM_BLOCK, max(_PAIR_MIN_BLOCK, -(-n // (4 * num_threads()))))
    perm = _locality_order(Xc, -(-n // S))
    Xp = np.ascontiguousarray(Xc[perm])
    xnp = np.ascontiguousarray(xn[perm])
    heap_d = np.full((n, k), np.inf, np.float32)
    heap_i = np.full((n, k), -1, np.int64)
    pairs = _pair_schedule(Xp, S)
    TR, TC = _PAIR_TILE_ROWS, _PAIR_TILE_COLS
    local = threading.local()

    def pair(I, J):
        tile = getattr(local, "tile", None)
        if tile is None:
            tile = local.tile = np.empty(TR * TC, np.float32)
        i0, i1 = I * S, min(n, I * S + S)
        j0, j1 = J * S, min(n, J * S + S)
        for a0 in range(i0, i1, TR):
            a1 = min(i1, a0 + TR)
            for b0 in range(j0, j1, TC):
                b1 = min(j1, b0 + TC)
                # a contiguous view: numpy's matmul leaves BLAS for a strided out
                g = tile[:(a1 - a0) * (b1 - b0)].reshape(a1 - a0, b1 - b0)
                np.matmul(Xp[a0:a1], Xp[b0:b1].T, out=g)
                _tile_rows(g, xnp[b0:b1], perm[b0:b1], perm[a0:a1], heap_d[a0:a1], heap_i[a0:a1], use_l2)
                if I != J:  # a block with itself: every tile of it is made, rows side only
                    _pair_cols(g, xnp[a0:a1], perm[a0:a1], perm[b0:b1], heap_d[b0:b1], heap_i[b0:b1], use_l2)

    bar = progress(total=len(pairs), desc="exact k-NN graph (CPU)", unit="block")
    try:
        _run_pairs(pairs, pair, bar)
    finally:
        bar.close()
    # the heaps' rows back in the data's order (their ids are the data's already)
    inv = np.empty(n, np.int64)
    inv[perm] = np.arange(n, dtype=np.int64)
    heap_d = heap_d[inv]
    heap_i = heap_i[inv]
    _approx_bounds(heap_d, k_final, approx)
    _refine_and_sort(X, X, 0, heap_d, heap_i, use_l2, out_d, out_i)
    return out_d, out_i


def select_rows_cpu(D, k):
    """The k smallest entries of every row of ``D`` (float32, shape (m, n)), sorted by (value, column).

    Returns ``(values float32 (m, k), columns int64 (m, k))``.
    """
    D = np.ascontiguousarray(D, dtype=np.float32)
    m, n = D.shape
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, {n}], got {k}")
    heap_d = np.full((m, k), np.inf, np.float32)
    heap_i = np.full((m, k), -1, np.int64)
    _select_dense(D, heap_d, heap_i, 0)
    _sort_heaps(heap_d, heap_i)
    return heap_d, heap_i
