"""CPU twin of the host-placement search (BANG sections 3.2 and 4.1-4.9 on the CPU): the same
algorithm as the GPU loop in ``_search_gpu.py``, one query per Numba thread. It is the reference
that the GPU tests compare with.

Per query: a work list of ``L`` entries sorted by PQ distance (ties by id: a total order, so the
GPU's batched merge and this sequential insertion keep the same list), each flagged once expanded;
a blocked Bloom filter (the hash of ``index/search.cu``) as the visited set, so a node's PQ distance
is computed once (a step's neighbours are tested against the filter as it was before the step, then
marked: ``_bloom_step``, as the GPU's concurrent inserts see it); every expansion is logged with its
PQ distance. The search stops when every
entry is expanded or after ``max_iters`` expansions. Search width W (``width``, CAGRA's term): each
iteration takes the W best unexpanded entries at once and only then inserts all their neighbours,
exactly what one GPU iteration does (gather W rows, one distance pass over W*R neighbours, one
merge); W = 1 is BANG's walk. Re-ranking (4.9): the ``rerank`` best logged
nodes by PQ distance get exact distances from the full-precision vectors, the ``k`` best are kept.
"""

import numba
import numpy as np

from ..._core.metrics import prepare_vectors
from ..._core.prefetch import cache_hint

__all__ = ["search_pq_cpu", "rerank_cpu", "gather_rows", "gather_walk", "bloom_words_for", "bloom_expansions",
           "walk_expansions", "bits_view", "exact_distances", "exact_topk"]


# Random row reads (a miss per 64-byte line) requested ahead of their use, so that the core keeps
# several misses in flight (``_core.prefetch``; a hint only, no result depends on it): the CPU walk
# requests a step's fresh codes before scoring them, :func:`_gather_rows` the row this many ids ahead.
# NOTES.md, "Prefetch in the host gathers".
_prefetch = cache_hint()
GATHER_AHEAD_ROWS = 8


@numba.njit(cache=True, inline="always")
def _prefetch_row(a, r):
    """Request every 64-byte line of row ``r`` of the C-contiguous 2-D array ``a``."""
    step = max(1, 64 // a.itemsize)
    for c in range(0, a.shape[1], step):
        _prefetch(a, r, c)
    if a.shape[1] > 0:
        _prefetch(a, r, a.shape[1] - 1)  # a row not aligned to a line ends in one more


def walk_expansions(L, W):
    """Expansions that cover nearly every query's walk at work-list size ``L`` and search width
    ``W``: ``L + 2 W + 16`` (3M x 96, L = 64, W = 4: 68.6 on average). The stash's slots and the
    Bloom filter are sized from it."""
    return int(L) + 2 * int(W) + 16


def bloom_expansions(L, W):
    """Expansions a query's Bloom filter is sized for: twice :func:`walk_expansions` (the longest
    walk of 500 queries on each of the seven suite sets, beams 16-128, stayed below it). Longer
    walks see a higher false-positive rate, which only skips unvisited neighbours, never returns a
    wrong id."""
    return 2 * walk_expansions(L, W)


def bloom_words_for(max_iters, R, s, *, L, W):
    """32-bit words of a query's Bloom filter (4.4; blocked: a node's 3 bits in one word): a power
    of two >= half the ids of ``min(max_iters, bloom_expansions(L, W))`` expansions plus the seeds,
    in [1024, 2^17] (the hash keeps word and bit fields apart below 2^17). Until the thirty-eighth
    session it was sized for ``max_iters`` (default ``8 L``): 4-8x larger for the same recall on
    the suite sets (within 0.0008 on one, equal on six: ``benchmarks/bang_bloom_cpu.py``), and the
    largest part of the GPU walk's search state per query."""
    expansions = min(int(max_iters), bloom_expansions(L, W))
    need = max(1024, (expansions * R + s) // 2)
    w = 1
    while w < need:
        w *= 2
    return int(min(w, 1 << 17))


@numba.njit(cache=True, inline="always")
def _bloom_slot(wmask, node):
    """(word, bits) of ``node`` in a filter of ``wmask + 1`` words (the hash of ``index/search.cu``)."""
    h = np.uint64(node) & np.uint64(0xFFFFFFFF)
    h ^= h >> np.uint64(16)
    h = (h * np.uint64(0x85EBCA6B)) & np.uint64(0xFFFFFFFF)
    h ^= h >> np.uint64(13)
    h = (h * np.uint64(0xC2B2AE35)) & np.uint64(0xFFFFFFFF)
    h ^= h >> np.uint64(16)
    bits = ((np.uint64(1) << ((h >> np.uint64(17)) & np.uint64(31)))
            | (np.uint64(1) << ((h >> np.uint64(22)) & np.uint64(31)))
            | (np.uint64(1) << (h >> np.uint64(27))))
    return np.int64(h & np.uint64(wmask)), bits


@numba.njit(cache=True, inline="always")
def _bloom_insert(words, base, wmask, node):
    w, bits = _bloom_slot(wmask, node)
    old = np.uint64(words[base + w])
    words[base + w] = np.uint32(old | bits)
    return (old & bits) != bits


@numba.njit(cache=True, inline="always")
def _bloom_contains(words, base, wmask, node):
    w, bits = _bloom_slot(wmask, node)
    return (np.uint64(words[base + w]) & bits) == bits


@numba.njit(cache=True)
def _bloom_step(words, wmask, buf, n, hset, hgen, gen, hword, hbits):
    """One step's visited test, as ``bang_distances`` does it: of the ids ``buf[:n]`` (-1 = none),
    keep in ``buf[:k]`` (first occurrences, in order) the distinct ones the filter did not hold
    BEFORE the step, then mark them; returns k. Testing first and marking after makes the outcome
    independent of the order of the step's ids (the GPU's inserts are concurrent). Repeats are
    found with an open-addressing set (``hset`` ids, ``hgen`` the step that wrote each slot, a
    power of two >= 2n slots; ``gen`` this step's number, so the set needs no clearing); ``hword``,
    ``hbits`` (n int64 / uint64): scratch."""
    hmask = hset.shape[0] - 1
    k = 0
    for i in range(n):
        v = buf[i]
        if v < 0:
            continue
        w, bits = _bloom_slot(wmask, v)
        if (np.uint64(words[w]) & bits) == bits:
            continue
        h = (np.uint64(v) * np.uint64(0x9E3779B1)) & np.uint64(0xFFFFFFFF)
        j = np.int64((h ^ (h >> np.uint64(15))) & np.uint64(hmask))
        fresh = False
        while True:
            if hgen[j] != gen:
                hgen[j] = gen
                hset[j] = v
                fresh = True
                break
            if hset[j] == v:
                break
            j = (j + 1) & hmask
        if fresh:
            buf[k] = v
            hword[k] = w  # kept for the marking pass: the hash once per id
            hbits[k] = bits
            k += 1
    for i in range(k):
        words[hword[i]] = np.uint32(np.uint64(words[hword[i]]) | hbits[i])
    return k


@numba.njit(cache=True)
def step_set(n):
    """``(hset, hgen, hword, hbits)`` for :func:`_bloom_step` over steps of at most ``n`` ids."""
    size = 1
    while size < 2 * max(1, n):
        size *= 2
    return np.zeros(size, np.int32), np.full(size, -1, np.int32), np.empty(n, np.int64), np.empty(n, np.uint64)


@numba.njit(cache=True, inline="always")
def _pq_dist(codes, node, T, q, m):
    acc = np.float32(0.0)
    for j in range(m):
        acc += T[q, j, codes[node, j]]
    return acc


@numba.njit(cache=True, inline="always")
def _insert(ids, ds, fl, size, L, node, d):
    """Insert (d, node) into the sorted list (order by distance, then id); returns the new size."""
    if size == L and (d > ds[L - 1] or (d == ds[L - 1] and node > ids[L - 1])):
        return size
    pos = size if size < L else L - 1
    while pos > 0 and (ds[pos - 1] > d or (ds[pos - 1] == d and ids[pos - 1] > node)):
        if pos < L:
            ids[pos], ds[pos], fl[pos] = ids[pos - 1], ds[pos - 1], fl[pos - 1]
        pos -= 1
    ids[pos], ds[pos], fl[pos] = node, d, 0
    return min(size + 1, L)


@numba.njit(parallel=True, cache=True)
def _search(graph, codes, T, seeds, L, width, max_iters, bloom_words, log_ids, log_d, n_exp, n_iter):
    nq = T.shape[0]
    m = codes.shape[1]
    R = graph.shape[1]
    wmask = bloom_words - 1
    for q in numba.prange(nq):
        ids = np.full(L, -1, np.int32)
        ds = np.full(L, np.inf, np.float32)
        fl = np.zeros(L, np.uint8)
        words = np.zeros(bloom_words, np.uint32)
        picked = np.empty(width, np.int32)
        nbuf = max(width * R, seeds.shape[1])
        buf = np.empty(nbuf, np.int32)
        hset, hgen, hword, hbits = step_set(nbuf)
        size = 0
        for t in range(seeds.shape[1]):
            buf[t] = seeds[q, t]
        for i in range(_bloom_step(words, wmask, buf, seeds.shape[1], hset, hgen, 0, hword, hbits)):
            size = _insert(ids, ds, fl, size, L, buf[i], _pq_dist(codes, buf[i], T, q, m))
        ne = 0
        it = 0
        while ne < max_iters:
            # one iteration: the `width` best unexpanded entries are all taken BEFORE any of their
            # neighbours is inserted (the GPU expands them together), in list order, so the log
            # and the list match the GPU's batched merge
            npick = 0
            i = 0
            while i < size and npick < width and ne < max_iters:
                if not fl[i]:
                    fl[i] = 1
                    picked[npick] = ids[i]
                    log_ids[q, ne] = ids[i]
                    log_d[q, ne] = ds[i]
                    ne += 1
                    npick += 1
                i += 1
            if npick == 0:
                break
            it += 1
            for p in range(npick):
                _prefetch_row(graph, picked[p])
            nn = 0
            for p in range(npick):
                node = picked[p]
                for r in range(R):
                    buf[nn] = graph[node, r]
                    nn += 1
            # the order of insertion does not matter: the list's order is total
            nf = _bloom_step(words, wmask, buf, nn, hset, hgen, it, hword, hbits)
            for i in range(nf):  # every fresh node's code requested before the first is scored
                _prefetch(codes, buf[i], 0)
            for i in range(nf):
                size = _insert(ids, ds, fl, size, L, buf[i], _pq_dist(codes, buf[i], T, q, m))
        n_exp[q] = ne
        n_iter[q] = it


def search_pq_cpu(graph, codes, tables, seeds, *, L, max_iters, width=1, return_iterations=False):
    """Expansion logs ``(ids (nq, max_iters) int32, PQ distances float32, counts (nq,) int32)``
    (and the iterations per query, int32, with ``return_iterations``).

    ``width`` (W, the search width): each iteration expands the W best unexpanded work-list
    entries of a query together; W = 1 is the one-candidate walk of BANG."""
    nq = tables.shape[0]
    log_ids = np.full((nq, max_iters), -1, np.int32)
    log_d = np.full((nq, max_iters), np.inf, np.float32)
    n_exp = np.zeros(nq, np.int32)
    n_iter = np.zeros(nq, np.int32)
    words = bloom_words_for(max_iters, graph.shape[1], seeds.shape[1], L=L, W=width)
    _search(np.asarray(graph), np.asarray(codes), tables, np.ascontiguousarray(seeds, dtype=np.int32), int(L),
            int(width), int(max_iters), words, log_ids, log_d, n_exp, n_iter)
    if return_iterations:
        return log_ids, log_d, n_exp, n_iter
    return log_ids, log_d, n_exp


@numba.njit(parallel=True, cache=True)
def _gather_rows(src, ids, out, fill):
    n = ids.shape[0]
    for i in numba.prange(n):
        if i + GATHER_AHEAD_ROWS < n and ids[i + GATHER_AHEAD_ROWS] >= 0:
            _prefetch_row(src, ids[i + GATHER_AHEAD_ROWS])
        r = ids[i]
        if r >= 0:
            for j in range(src.shape[1]):
                out[i, j] = src[r, j]
        else:
            for j in range(src.shape[1]):
                out[i, j] = fill


@numba.njit(parallel=True, cache=True)
def gather_walk(graph, data, cand, width, slots, count, nbr_out, vec_out, dst, stash, off):
    """One host step of the GPU walk for a batch of ``nb = count.shape[0]`` queries: the graph rows
    of each query's ``width`` candidates (``cand`` (nb * width,) int32, valid ids first, -1 after)
    into ``nbr_out`` (nb * width, R) (-1 rows for -1 candidates). ``count[q]``: expansions of query
    q logged so far (the GPU's ``n_exp``: every selection comes through here); it is advanced.

    With ``stash``: the full vectors of the candidates whose log position ``count[q] + c`` is below
    ``slots`` are gathered too, packed query by query into ``vec_out`` rows ``0 .. n_kept - 1``,
    each with its re-rank slot ``q * slots + position`` in ``dst``; ``off`` (nb + 1) is scratch.
    Returns ``(valid candidates, n_kept)`` (no valid candidate: the batch's walk is over).

    The packing offsets come from one serial pass over the candidate ids (nb * width int32), then
    ONE parallel loop gathers each query's graph rows and vectors together: a parallel region costs
    its dispatch every walk step, and a query's rows and vectors are independent misses the core
    can overlap. (Requesting the next queries' rows first, as the CPU walk requests its codes, did
    not pay on the GPU machine's 16 threads: NOTES.md, "Prefetch in the host gathers".)"""
    nb = count.shape[0]
    R = graph.shape[1]
    d = data.shape[1]
    total = 0
    off[0] = 0
    for q in range(nb):
        nv = 0
        for c in range(width):
            if cand[q * width + c] >= 0:
                nv += 1
        total += nv
        off[q + 1] = off[q] + (min(nv, max(0, slots - count[q])) if stash else 0)
    for q in numba.prange(nb):
        base = count[q]
        o = off[q]
        kept = off[q + 1] - o
        nv = 0
        for c in range(width):
            i = q * width + c
            node = cand[i]
            if node >= 0:
                nv += 1
                for j in range(R):
                    nbr_out[i, j] = graph[node, j]
                if c < kept:  # valid candidates come first: the c-th is at log position base + c
                    for j in range(d):
                        vec_out[o + c, j] = data[node, j]
                    dst[o + c] = q * slots + base + c
            else:
                for j in range(R):
                    nbr_out[i, j] = -1
        count[q] = base + nv
    return total, off[nb]


def bits_view(a):
    """``a`` as Numba can copy it: float16 rows (which Numba cannot type) as their uint16 bits; the
    gathers only move rows, so a bit copy is the copy. Other dtypes unchanged."""
    return a.view(np.uint16) if a.dtype == np.float16 else a


def gather_rows(src, ids, out=None, fill=0):
    """``out[i] = src[ids[i]]`` (``fill`` where ``ids[i] < 0``: 0 is +0.0 in every dtype) by parallel
    host threads; ``src`` may be a memory map (only the rows asked for are read), ``out`` a pinned
    buffer."""
    ids = np.ascontiguousarray(ids.reshape(-1))
    if out is None:
        out = np.empty((ids.shape[0], src.shape[1]), src.dtype)
    _gather_rows(bits_view(np.asarray(src)), ids, bits_view(out.reshape(ids.shape[0], src.shape[1])), fill)
    return out


def top_logged(log_ids, log_d, rerank):
    """The ``rerank`` best logged nodes of each query by PQ distance (-1 padded), host arrays."""
    rr = min(int(rerank), log_ids.shape[1])
    order = np.argsort(log_d, axis=1, kind="stable")[:, :rr]
    return np.take_along_axis(log_ids, order, axis=1)


def exact_distances(Qp, Xc, metric):
    """Exact internal distances (nq, c) of prepared queries ``Qp`` (nq, d) to their candidates'
    prepared vectors ``Xc`` (nq, c, d) (numpy or cupy); the GPU re-rank's selection kernel takes
    them from here, so both selections see the same bits."""
    from ..._core.backend import get_array_module

    xp = get_array_module(Xc)
    if metric == "ip":
        return -xp.einsum("qcd,qd->qc", Xc, Qp)
    diff = Xc - Qp[:, None, :]
    return xp.einsum("qcd,qcd->qc", diff, diff)


def exact_topk(Qp, Xc, cand, k, metric):
    """Exact internal distances of prepared queries ``Qp`` (nq, d) to their candidates' prepared
    vectors ``Xc`` (nq, c, d) (numpy or cupy); the ``k`` best, ``inf``/-1 where no candidate."""
    from ..._core.backend import get_array_module

    xp = get_array_module(Xc)
    dist = xp.where(cand >= 0, exact_distances(Qp, Xc, metric), xp.float32(np.inf)).astype(xp.float32)
    kk = min(k, cand.shape[1])
    order = xp.argsort(dist, axis=1)[:, :kk]
    d = xp.take_along_axis(dist, order, axis=1)
    i = xp.take_along_axis(cand.astype(xp.int64), order, axis=1)
    i = xp.where(xp.isfinite(d), i, -1)
    if kk < k:
        pad = k - kk
        d = xp.concatenate([d, xp.full((d.shape[0], pad), np.inf, xp.float32)], axis=1)
        i = xp.concatenate([i, xp.full((i.shape[0], pad), -1, xp.int64)], axis=1)
    return d, i


#: Bytes of prepared candidate rows :func:`rerank_cpu` holds at once: the rows, their differences
#: to the query and the products stay in the caches (one block of 2,048 queries was 262 MB at L =
#: 256, d = 128, and the exact distances took 0.65 s of a 1.4 s search of 2,000 queries).
RERANK_CPU_BLOCK_BYTES = 4 << 20


def rerank_cpu(data, Qp, cand, k, *, metric, user_metric, scale, chunk=None):
    """Exact re-ranking on the host: gathers the candidates' rows of ``data`` (storage dtype, any
    array or memory map), prepares them like the index and keeps the ``k`` best of each query.
    ``chunk``: queries per block (default: :data:`RERANK_CPU_BLOCK_BYTES` of rows; every query's
    result is computed alone, so the block size changes no bit)."""
    nq = cand.shape[0]
    if chunk is None:
        # at least 16 queries a block: past ~4,000 dimensions one query's rows alone exceed the
        # bytes, and a block per query would cost more in Python calls than in memory traffic
        chunk = max(16, RERANK_CPU_BLOCK_BYTES // max(1, 4 * cand.shape[1] * data.shape[1]))
    D = np.empty((nq, k), np.float32)
    I = np.empty((nq, k), np.int64)
    for s in range(0, nq, chunk):
        c = cand[s:s + chunk]
        rows = gather_rows(data, c)
        Xc = prepare_vectors(rows, user_metric, scale).reshape(c.shape[0], c.shape[1], -1)
        D[s:s + chunk], I[s:s + chunk] = exact_topk(Qp[s:s + chunk], Xc, c, k, metric)
    return D, I
