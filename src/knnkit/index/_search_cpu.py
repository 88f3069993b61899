"""CPU graph search: best-first beam search with the GGNN slack stop (Groh et al., section 4.1).

This is the reference the GPU search (``_search_gpu.py``) follows. Semantics, shared by both:

* Distances are the internal ones: ``'l2'`` squared Euclidean, ``'ip'`` negative dot product.
* One sorted *candidate list* of ``beam`` entries (index, distance, expanded flag) per query.
  It starts with the query's seeds (``-1`` entries skipped, duplicates once). Each step takes the
  nearest not yet expanded entry, marks it expanded, computes the distance of each of its graph
  neighbours not yet seen (a visited set holds every node whose distance was computed, so no node
  enters the list twice) and inserts those closer than the list's last entry (ties: the older
  entry stays first). The result is the list's first ``k`` entries.
* Stop when no unexpanded entry is left, after ``max_iters`` expansions, or -- the GGNN slack
  criterion, only when ``tau`` is finite and the list holds at least ``k`` entries -- when the
  next entry to expand is farther than ``d_best_k + xi`` with ``xi = tau * min(d_best_1, nn1_max)``.
  The criterion is evaluated on a non-negative *Euclidean-like* scale ``c(d)``:

  - ``'l2'``: ``c(d) = sqrt(max(d, 0))`` -- the Euclidean distance, as in the paper;
  - ``'ip'``: ``c(d) = sqrt(max(d + |q| * M, 0))`` with ``M = max_i |x_i|``. ``d + |q| M >= 0``
    by Cauchy-Schwarz; for unit vectors (cosine) it is ``1 - cos = |q - x|^2 / 2``, so the
    criterion is again Euclidean (scaled by 1/sqrt(2), which ``tau`` absorbs).

  ``nn1_max`` is the paper's global ``d_nn1+``: the largest distance, on the same scale, of a data
  point to its nearest neighbour, computed at build time (``inf`` when unknown) -- it caps the
  slack of queries far from the data. ``tau=inf`` turns the criterion off (plain beam search).
* Fewer than ``k`` reachable points: the remaining slots hold index ``-1`` and distance ``+inf``.
"""

import threading

import numpy as np
import numba

from .._core.jit import Family, chunks, parallel_for
from .._core.prefetch import cache_hint

# one announcement line for the family's first cold compile (seconds: measured on two cores)
_family = Family("index", "the graph index", seconds=3)
njit = _family.njit
kernel = _family.kernel

__all__ = ["search_cpu", "select_seeds_cpu", "cell_radii"]


_prefetch = None


def _select_prefetch():
    """The prefetch the search kernel compiles with (``knnkit._core.prefetch``): the neighbour
    vectors of an expanded node are requested before their distances are computed, so their cache
    misses overlap instead of stalling one after another (+18% single-thread QPS at 100k x 128)."""
    global _prefetch
    if _prefetch is None:
        _prefetch = cache_hint()


@njit(inline="always", fastmath=True)
def _dist(q, X, v, is_ip):
    x = X[v]
    acc = np.float32(0.0)
    if is_ip:
        for t in range(q.shape[0]):
            acc += q[t] * x[t]
        return -acc
    for t in range(q.shape[0]):
        diff = q[t] - x[t]
        acc += diff * diff
    return acc


@njit(inline="always")
def _insert(cd, ci, ce, size, beam, dv, v):
    """Insert (dv, v) into the sorted list; return (new size, position) (position == beam: not kept)."""
    lo = 0
    hi = size
    while lo < hi:  # upper bound: the older entry stays first among equals
        mid = (lo + hi) >> 1
        if cd[mid] <= dv:
            lo = mid + 1
        else:
            hi = mid
    if lo >= beam:
        return size, beam
    last = size if size < beam else beam - 1
    j = last
    while j > lo:
        cd[j] = cd[j - 1]
        ci[j] = ci[j - 1]
        ce[j] = ce[j - 1]
        j -= 1
    cd[lo] = dv
    ci[lo] = v
    ce[lo] = 0
    if size < beam:
        size += 1
    return size, lo


@njit(inline="always")
def _merge_batch(cd, ci, ce, size, beam, bd, bi, m):
    """Merge an expansion's batch (``bd``/``bi``, ``m`` entries in the order met) into the sorted list
    in one backward pass; returns (new size, position of the first batch entry kept, ``beam`` if
    none). The same list as :func:`_insert` of each entry in turn (upper bound: an entry goes
    after every listed one at its distance, batch entries in their order among equals), without
    shifting the list's tail once per entry: at beam 128 one walk inserts ~1,000 entries."""
    for a in range(1, m):  # stable insertion sort of the batch (m <= R)
        x = bd[a]
        y = bi[a]
        b = a - 1
        while b >= 0 and bd[b] > x:
            bd[b + 1] = bd[b]
            bi[b + 1] = bi[b]
            b -= 1
        bd[b + 1] = x
        bi[b + 1] = y
    i = size - 1
    j = m - 1
    w = size + m - 1
    first = beam
    while j >= 0:  # from the back: the later of the two tails goes to w (a listed entry first among equals)
        if i >= 0 and cd[i] > bd[j]:
            if w < beam:
                cd[w] = cd[i]
                ci[w] = ci[i]
                ce[w] = ce[i]
            i -= 1
        else:
            if w < beam:
                cd[w] = bd[j]
                ci[w] = bi[j]
                ce[w] = 0
                first = w
            j -= 1
        w -= 1
    return min(beam, size + m), first


@njit(cache=True)
def _insert_call(cd, ci, ce, size, beam, dv, v):
    """:func:`_insert` as a plain call: one copy for the search's two insert sites (compile time)."""
    return _insert(cd, ci, ce, size, beam, dv, v)


@njit(cache=True, fastmath=True)
def _crit(d, shift):
    x = d + shift
    return np.sqrt(x) if x > 0 else np.float32(0.0)


# Visited marks (uint16 epoch stamps, one per point) kept between calls: allocating and clearing n
# of them cost every call O(n) (47 us at 1M points, 1.3 ms at 10M: the whole of a single-query
# search), where a stamp row only needs clearing every 65535 queries. A row is checked out by one
# chunk at a time (any index: stamps of another index are older epochs); rows beyond the byte cap
# are allocated per call as before.
_SCRATCH_LOCK = threading.Lock()
_SCRATCH_FREE = []  # [[marks uint16 (>= n,), last epoch]]
SCRATCH_MAX_BYTES = 64 << 20


def _take_scratch(n):
    with _SCRATCH_LOCK:
        best = -1
        for j, (row, _e) in enumerate(_SCRATCH_FREE):
            if row.shape[0] >= n and (best < 0 or row.shape[0] < _SCRATCH_FREE[best][0].shape[0]):
                best = j
        if best >= 0:
            return _SCRATCH_FREE.pop(best)
    return [np.zeros(n, np.uint16), 0]


def _give_scratch(slot):
    with _SCRATCH_LOCK:
        held = sum(row.nbytes for row, _e in _SCRATCH_FREE)
        if held + slot[0].nbytes <= SCRATCH_MAX_BYTES:
            _SCRATCH_FREE.append(slot)


def _search_kernel(X, graph, Q, seeds, k, beam, tau, max_iters, is_ip, xnorm_max, nn1_max, n_chunks,
                   out_d, out_i, stats):
    """All queries, ``n_chunks`` contiguous query ranges handed to Numba's thread count of threads."""
    ranges = chunks(Q.shape[0], n_chunks)

    def task(c):
        slot = _take_scratch(X.shape[0])
        slot[1] = _search_chunk(X, graph, Q, seeds, k, beam, tau, max_iters, is_ip, xnorm_max, nn1_max,
                                *ranges[c], out_d, out_i, stats, slot[0], slot[1])
        _give_scratch(slot)

    parallel_for(task, len(ranges))


@kernel(fastmath=True)
def _search_chunk(X, graph, Q, seeds, k, beam, tau, max_iters, is_ip, xnorm_max, nn1_max, lo, hi,
                  out_d, out_i, stats, mark, epoch):
    """Queries ``lo .. hi - 1`` (one task of :func:`_search_kernel`); ``mark`` (at least n stamps,
    each at most ``epoch``) is the visited set, stamped with one new epoch per query. Returns the
    last epoch used."""
    n = X.shape[0]
    dim = X.shape[1]
    R = graph.shape[1]
    use_tau = tau < np.inf
    cd = np.empty(beam, np.float32)
    ci = np.empty(beam, np.int64)
    ce = np.empty(beam, np.uint8)
    nb = np.empty(R, np.int64)
    bd = np.empty(R, np.float32)
    bi = np.empty(R, np.int64)
    for qi in range(lo, hi):
        epoch += 1
        if epoch >= 65535:
            for v in range(mark.shape[0]):
                mark[v] = 0
            epoch = 1
        q = Q[qi]
        shift = np.float32(0.0)
        if is_ip:
            qn = np.float32(0.0)
            for t in range(q.shape[0]):
                qn += q[t] * q[t]
            shift = np.float32(np.sqrt(qn) * xnorm_max)
        size = 0
        ndist = 0
        for s in range(seeds.shape[1]):
            v = seeds[qi, s]
            if v < 0 or v >= n:
                continue
            if mark[v] == epoch:
                continue
            mark[v] = epoch
            dv = _dist(q, X, v, is_ip)
            ndist += 1
            size, pos = _insert_call(cd, ci, ce, size, beam, dv, np.int64(v))
        cur = 0
        it = 0
        while it < max_iters:
            while cur < size and ce[cur] != 0:
                cur += 1
            if cur >= size:
                break
            if use_tau and cur >= k:
                # entries before k are always expanded first; the slack test matters past k
                xi = tau * min(_crit(cd[0], shift), nn1_max)
                if _crit(cd[cur], shift) > _crit(cd[k - 1], shift) + xi:
                    break
            ce[cur] = 1
            node = ci[cur]
            it += 1
            newcur = cur + 1
            # pass 1: unseen neighbours, their vectors prefetched (one request per cache line)
            cnt = 0
            for j in range(R):
                v = graph[node, j]
                if v < 0:
                    continue
                if mark[v] == epoch:
                    continue
                mark[v] = epoch
                nb[cnt] = v
                cnt += 1
                for off in range(0, dim, 16):
                    _prefetch(X, v, off)
            # pass 2: their distances; those that beat the list's worst go to a batch
            m = 0
            for j in range(cnt):
                v = nb[j]
                dv = _dist(q, X, v, is_ip)
                ndist += 1
                if size == beam and dv >= cd[beam - 1]:
                    continue
                bd[m] = dv
                bi[m] = v
                m += 1
            if m > 0:
                size, first = _merge_batch(cd, ci, ce, size, beam, bd, bi, m)
                if first < newcur:
                    newcur = first
            cur = newcur
        stats[qi, 0] = it
        stats[qi, 1] = ndist
        m = min(k, size)
        for j in range(m):
            out_d[qi, j] = cd[j]
            out_i[qi, j] = ci[j]
        for j in range(m, k):
            out_d[qi, j] = np.inf
            out_i[qi, j] = -1
    return epoch


def _seeds_kernel(Q, cells, radii, offs, C, M, s, probes, min_scan, bounded, is_ip, n_chunks, out):
    """All queries of :func:`select_seeds_cpu`, ``n_chunks`` contiguous ranges on the thread pool."""
    ranges = chunks(Q.shape[0], n_chunks)
    parallel_for(lambda c: _seeds_chunk(Q, cells, radii, offs, C, M, s, probes, min_scan, bounded, is_ip,
                                        *ranges[c], out), len(ranges))


#: relative slack of the cells' lower bounds: the kernel sums in float32 with fastmath, so a bound
#: is lowered by this much before it may skip a cell (a few ulps of a 1,000-term sum)
_BOUND_SLACK = np.float32(1e-4)


@kernel(fastmath=True)
def _seeds_chunk(Q, cells, radii, offs, C, M, s, probes, min_scan, bounded, is_ip, lo, hi, out):
    """Queries ``lo .. hi - 1`` of :func:`select_seeds_cpu`."""
    m = cells.shape[0]
    dcell = np.empty(m, np.float32)
    done = np.empty(m, np.uint8)
    bd = np.empty(s, np.float32)
    bi = np.empty(s, np.int32)
    for qi in range(lo, hi):
        q = Q[qi]
        qn = np.float32(0.0)
        if bounded and is_ip:
            for t in range(q.shape[0]):
                qn += q[t] * q[t]
            qn = np.sqrt(qn)
        for j in range(m):
            dv = _dist(q, cells, j, is_ip)
            if bounded:
                # the least key any entry of cell j can have (triangle inequality; Cauchy-Schwarz
                # for the inner product), lowered by the rounding slack
                if is_ip:
                    dv = dv - qn * radii[j]
                    dv -= _BOUND_SLACK * abs(dv) + _BOUND_SLACK * qn * radii[j]
                else:
                    gap = np.sqrt(max(dv, np.float32(0.0))) - radii[j]
                    dv = gap * gap * (np.float32(1.0) - _BOUND_SLACK) if gap > 0 else np.float32(0.0)
            dcell[j] = dv
            done[j] = 0
        size = 0
        probed = 0
        scanned = 0
        while probed < m:
            # the nearest cell not probed yet (ties: the lower index)
            b = -1
            for j in range(m):
                if done[j] == 0 and (b < 0 or dcell[j] < dcell[b]):
                    b = j
            if bounded:
                # every cell left bounds its entries below the s-th nearest seen: exact
                if size == s and not dcell[b] < bd[s - 1]:
                    break
            elif probed >= probes and scanned >= min_scan and not (size > 0 and bd[0] > dcell[b]):
                break
            done[b] = 1
            probed += 1
            for e in range(offs[b], offs[b + 1]):
                dv = _dist(q, C, e, is_ip)
                scanned += 1
                if size == s and not dv < bd[s - 1]:
                    continue
                # sorted insert; among equals the entry scanned first stays first
                if size < s:
                    p = size
                    size += 1
                else:
                    p = s - 1
                while p > 0 and bd[p - 1] > dv:
                    bd[p] = bd[p - 1]
                    bi[p] = bi[p - 1]
                    p -= 1
                bd[p] = dv
                bi[p] = M[e]
        for j in range(size):
            out[qi, j] = bi[j]
        for j in range(size, s):
            out[qi, j] = -1


def cell_radii(cells, offsets, centroids):
    """float32 (m,): the largest Euclidean distance from each cell centre to its entries (the
    bound of :func:`select_seeds_cpu`'s exact mode), rounded up."""
    cells = np.asarray(cells, np.float64)
    C = np.asarray(centroids, np.float64)
    offsets = np.asarray(offsets, np.int64)
    out = np.zeros(cells.shape[0], np.float32)
    for j in range(cells.shape[0]):
        a, b = int(offsets[j]), int(offsets[j + 1])
        if b > a:
            r = float(np.sqrt(((C[a:b] - cells[j]) ** 2).sum(axis=1).max()))
            out[j] = np.nextafter(np.float32(r * (1 + 1e-6)), np.float32(np.inf))
    return out


def select_seeds_cpu(queries, cells, offsets, centroids, medoids, s, metric, *, radii=None, probes=2,
                     min_scan=None):
    """Medoid ids of the ``s`` nearest entry centroids of each query, two-level.

    The entry centroids are grouped into cells (``offsets``: cell ``j`` holds rows
    ``offsets[j] .. offsets[j + 1] - 1`` of ``centroids``).

    With ``radii`` (each cell's largest distance from its centre to an entry, :func:`cell_radii`)
    the scan is exact: a query visits the cells in the order of the least key any of their entries
    can have (the triangle inequality for squared L2, Cauchy-Schwarz for the inner product, lowered
    by a rounding slack) and stops when that bound reaches its ``s``-th nearest entry so far. The
    result is then that of scanning every entry, as the GPU does
    (:func:`._search_gpu.select_seeds_gpu`), where the bounds prune nothing at worst.

    Without ``radii`` (the approximate scan of earlier versions, kept for comparison): cells in the
    order of their centres' keys until ``probes`` cells and ``min_scan`` entries were seen, then
    on while the next centre is nearer than the nearest entry seen. It missed the nearest entries of
    queries in clusters without an entry of their own (Zipf-sized clusters, 100k x 32: recall at
    beam 64 0.975 against 0.987 with exact seeds, 8 of 500 queries at recall 0).

    Parameters
    ----------
    queries : ndarray, float32 (nq, d)
        Prepared queries.
    cells : ndarray, float32 (m, d)
        Cell centres, ``m >= 1``.
    offsets : ndarray, int64 (m + 1,)
        Cell boundaries in ``centroids`` (ascending, ``offsets[0] == 0``).
    centroids : ndarray, float32 (c, d)
        Entry centroids ordered by cell.
    medoids : ndarray, int32 (c,)
        Their medoid ids, same order.
    s : int
        Seeds per query (``>= 1``).
    metric : {"l2", "ip"}
        Internal metric.
    radii : ndarray, float32 (m,), optional
        Cell radii: the exact scan.
    probes : int
        Without ``radii``: cells probed at least (``>= 1``).
    min_scan : int, optional
        Without ``radii``: entries scanned at least (default ``4 * s``).

    Returns
    -------
    ndarray, int32 (nq, s)
        Medoid ids, nearest centroid first, ``-1`` padded.

    Examples
    --------
    >>> import numpy as np
    >>> C = np.array([[0, 0], [1, 0], [9, 9], [10, 9]], np.float32)
    >>> cells = np.array([[0.5, 0], [9.5, 9]], np.float32)
    >>> select_seeds_cpu(np.array([[9, 8]], np.float32), cells, np.array([0, 2, 4]), C,
    ...                  np.array([10, 11, 12, 13], np.int32), 2, "l2", probes=1, min_scan=1).tolist()
    [[12, 13]]
    >>> offs = np.array([0, 2, 4])
    >>> select_seeds_cpu(np.array([[3, 1]], np.float32), cells, offs, C, np.array([10, 11, 12, 13], np.int32), 3,
    ...                  "l2", radii=cell_radii(cells, offs, C)).tolist()
    [[11, 10, 12]]
    """
    s = int(s)
    probes = int(probes)
    if s < 1 or probes < 1:
        raise ValueError(f"s and probes must be >= 1, got s={s}, probes={probes}")
    if metric not in ("l2", "ip"):
        raise ValueError(f"metric must be 'l2' or 'ip', got {metric!r}")
    min_scan = 4 * s if min_scan is None else int(min_scan)
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    cells = np.ascontiguousarray(cells, dtype=np.float32)
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    centroids = np.ascontiguousarray(centroids, dtype=np.float32)
    medoids = np.ascontiguousarray(medoids, dtype=np.int32)
    if offsets.shape[0] != cells.shape[0] + 1 or offsets[0] != 0 or offsets[-1] != centroids.shape[0]:
        raise ValueError("offsets must hold m + 1 cell boundaries from 0 to the number of centroids")
    bounded = radii is not None
    radii = (np.ascontiguousarray(radii, dtype=np.float32) if bounded else np.zeros(cells.shape[0], np.float32))
    if radii.shape != (cells.shape[0],) or not (radii >= 0).all():
        raise ValueError(f"radii must hold one non-negative radius per cell ({cells.shape[0]}), got shape {radii.shape}")
    nq = queries.shape[0]
    out = np.empty((nq, s), np.int32)
    if nq == 0:
        return out
    if centroids.shape[0] == 0 or cells.shape[0] == 0:
        out.fill(-1)
        return out
    n_chunks = max(1, min(nq, numba.get_num_threads() * 4, (nq + 63) // 64))
    _seeds_kernel(queries, cells, radii, offsets, centroids, medoids, s, probes, min_scan, bounded, metric == "ip",
                  n_chunks, out)
    return out


def search_cpu(X, graph, queries, k, *, seeds, beam, tau, max_iters, metric, xnorm_max=None, nn1_max=None,
               return_stats=False):
    """Search ``graph`` for the ``k`` nearest points of ``X`` to each query (CPU, Numba).

    Parameters
    ----------
    X : ndarray, float32 (n, d)
        Prepared data vectors (unit-normalised for cosine).
    graph : ndarray, int32 (n, R)
        Fixed out-degree graph, ``-1`` for unused slots.
    queries : ndarray, float32 (nq, d)
        Prepared queries.
    k : int
        Neighbours per query.
    seeds : ndarray, int32 (nq, s)
        Start nodes per query (``-1`` = none).
    beam : int
        Candidate-list size, ``>= k``.
    tau : float
        GGNN slack (``inf`` disables the slack stop); see the module docstring.
    max_iters : int
        Cap on expansions per query.
    metric : {"l2", "ip"}
        Internal metric.
    xnorm_max : float, optional
        ``max_i |x_i|`` for the ``'ip'`` criterion (computed when omitted).
    nn1_max : float, optional
        GGNN's ``d_nn1+`` on the criterion scale (``inf`` when omitted).
    return_stats : bool
        Also return int32 (nq, 2): expansions and distance evaluations per query.

    Returns
    -------
    distances : ndarray, float32 (nq, k)
        Internal distances, ascending; ``+inf`` where fewer than ``k`` points were reached.
    indices : ndarray, int64 (nq, k)
        Point indices, ``-1`` in padded slots.

    Examples
    --------
    >>> import numpy as np
    >>> X = np.eye(3, dtype=np.float32)
    >>> g = np.array([[1, 2], [0, 2], [0, 1]], dtype=np.int32)
    >>> d, i = search_cpu(X, g, X[:1], 2, seeds=np.array([[2]], np.int32), beam=4, tau=np.inf,
    ...                   max_iters=10, metric="l2")
    >>> i.tolist()
    [[0, 2]]
    """
    X = np.ascontiguousarray(X, dtype=np.float32)
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    graph = np.ascontiguousarray(graph, dtype=np.int32)
    seeds = np.ascontiguousarray(seeds, dtype=np.int32)
    if seeds.ndim == 1:
        seeds = seeds.reshape(-1, 1)
    nq = queries.shape[0]
    k = int(k)
    beam = max(int(beam), k)
    tau = np.inf if tau is None else float(tau)
    max_iters = int(max_iters) if max_iters is not None else 2 ** 31 - 1
    is_ip = metric == "ip"
    if is_ip and xnorm_max is None:
        xnorm_max = float(np.sqrt(np.einsum("ij,ij->i", X, X).max()))
    xnorm_max = float(xnorm_max or 0.0)
    out_d = np.empty((nq, k), np.float32)
    out_i = np.empty((nq, k), np.int64)
    stats = np.zeros((nq, 2), np.int32)
    if nq == 0:
        return (out_d, out_i, stats) if return_stats else (out_d, out_i)
    # more chunks than threads balances queries of uneven length; each chunk owns n bytes*2 scratch
    n_chunks = max(1, min(nq, numba.get_num_threads() * 4))
    _select_prefetch()
    _search_kernel(X, graph, queries, seeds, k, beam, np.float32(tau), max_iters, is_ip,
                   np.float32(xnorm_max), np.float32(np.inf if nn1_max is None else nn1_max), n_chunks,
                   out_d, out_i, stats)
    return (out_d, out_i, stats) if return_stats else (out_d, out_i)
