"""CPU graph diversification: RobustPrune (Vamana / DiskANN), reverse-edge insertion, and the
GGNN symmetric-link diversification (Groh et al., section 5.2).

RobustPrune, shared with the GPU version (``_prune_gpu.py``): the candidates of node ``u`` are
visited in ascending distance order; candidate ``c`` is kept when for every already kept ``p``

    alpha * d(p, c) > d(u, c)

on a non-negative *Euclidean* scale. Internally ``'l2'`` distances are squared, so the test is
``alpha**2 * d2(p, c) > d2(u, c)`` -- exactly Vamana's rule on Euclidean distances. For ``'ip'``
(negative dot product) the distances are shifted by ``S = max_i |x_i|**2`` before the same squared
test: ``S - <a, b> >= 0``, and for unit vectors (cosine) it equals ``|a - b|**2 / 2``, i.e. the
Euclidean rule again. Self loops, ``-1`` and repeated candidates are dropped. With ``fill=True``
(the default used by the index) slots left free after pruning are filled with the nearest pruned
candidates: a fixed out-degree graph costs the same to traverse either way, and the extra short
edges raise recall.
"""

import numpy as np
from numba import prange

from .._core.jit import chunks, num_threads, parallel_for
from ..exact._cpu import _offer_root
from ..exact._sort_cpu import sort_pairs
from ._search_cpu import _dist, kernel, njit

__all__ = ["prune_cpu", "add_reverse_edges", "ggnn_diversify", "pair_distances", "sorted_rows",
           "changed_without", "two_hop_lists", "joined_lists"]


@njit(inline="always")
def _contains(a, m, v):
    """True when ``v`` is among ``a[:m]`` (lists here are a few dozen entries: a scan is fastest)."""
    for j in range(m):
        if a[j] == v:
            return True
    return False


@njit(inline="always", fastmath=True)
def _pd(X, a, b, is_ip):
    # the search's distance kernel, with row a as the query
    return _dist(X[a], X, b, is_ip)


@njit(parallel=True, cache=True, fastmath=True)
def _pair_distances(X, src, idx, is_ip, out):
    n, C = idx.shape
    for r in prange(n):
        u = src[r]
        for j in range(C):
            v = idx[r, j]
            out[r, j] = _pd(X, u, v, is_ip) if v >= 0 else np.inf


def pair_distances(X, idx, metric, rows=None):
    """Internal distances ``d(X[rows[r]], X[idx[r, j]])`` (``+inf`` where ``idx < 0``)."""
    idx = np.ascontiguousarray(idx)
    src = np.arange(idx.shape[0], dtype=np.int64) if rows is None else np.asarray(rows, np.int64)
    out = np.empty(idx.shape, np.float32)
    _pair_distances(X, src, idx, metric == "ip", out)
    return out


@njit(cache=True, fastmath=True)
def _prune_one(X, u, cidx, cdist, R, alpha2, is_ip, shift, fill, out_row, kept, pruned):
    """RobustPrune of one node; ``cidx``/``cdist`` sorted ascending. Writes ``out_row``."""
    nk = 0
    npr = 0
    C = cidx.shape[0]
    prev = -1
    for t in range(C):
        c = cidx[t]
        # a repeated id sits next to its first copy: both callers pass lists sorted by (distance,
        # id) or free of repeats, so one comparison replaces the scans of kept and pruned (those were
        # quadratic in a hub's thousands of reverse candidates: skewed-norm data, 100k, 3.7 s)
        if c < 0 or c == u or c == prev:
            prev = c
            continue
        prev = c
        duc = cdist[t] + shift
        ok = True
        for j in range(nk):
            dpc = _pd(X, kept[j], c, is_ip) + shift
            if alpha2 * dpc <= duc:
                ok = False
                break
        if ok:
            kept[nk] = c
            nk += 1
            if nk == R:
                break
        elif npr < pruned.shape[0]:
            pruned[npr] = c
            npr += 1
    if fill:
        j = 0
        while nk < R and j < npr:
            kept[nk] = pruned[j]
            nk += 1
            j += 1
    for j in range(nk):
        out_row[j] = kept[j]
    for j in range(nk, R):
        out_row[j] = -1


def _prune_all(X, cand_idx, cand_dist, node_ids, R, alpha2, is_ip, shift, fill, out):
    parts = chunks(cand_idx.shape[0], 4 * num_threads())
    parallel_for(lambda c: _prune_rows(X, cand_idx, cand_dist, node_ids, R, alpha2, is_ip, shift, fill, out,
                                       parts[c][0], parts[c][1]), len(parts))


@kernel(fastmath=True)
def _prune_rows(X, cand_idx, cand_dist, node_ids, R, alpha2, is_ip, shift, fill, out, lo, hi):
    C = cand_idx.shape[1]
    kept = np.empty(R, np.int64)
    pruned = np.empty(C, np.int64)
    for r in range(lo, hi):
        _prune_one(X, node_ids[r], cand_idx[r], cand_dist[r], R, alpha2, is_ip, shift, fill, out[r], kept, pruned)


@njit(parallel=True, cache=True)
def _rows_sorted(d, idx):
    """True when every row is ascending by (distance, index), as ``np.lexsort((idx, d))`` orders it
    (NaN distances: False, the lexsort decides)."""
    n, C = d.shape
    bad = 0
    for r in prange(n):
        for j in range(1, C):
            a, b = d[r, j - 1], d[r, j]
            if not (a < b or (a == b and idx[r, j - 1] <= idx[r, j])):
                bad += 1
                break
    return bad == 0


def sorted_rows(idx, dist):
    """Copies of ``(idx, dist)`` (int64 / float32, ``(n, C)``) with each row ascending by (distance,
    index): the order of ``np.lexsort((idx, dist), axis=1)`` (NaN distances last), row-parallel.
    The NumPy lexsort and its two gathers ran on one core: 1.3 s for 100k x 144 (the CPU denser
    tier's joined candidate lists, sorted again for its hold-out graph)."""
    n, C = idx.shape
    out_i = np.empty((n, C), np.int64)
    out_d = np.empty((n, C), np.float32)
    parts = chunks(n, 4 * num_threads())
    parallel_for(lambda c: _sorted_rows_chunk(idx, dist, out_i, out_d, parts[c][0], parts[c][1]), len(parts))
    return out_i, out_d


@kernel()
def _sorted_rows_chunk(idx, dist, out_i, out_d, lo, hi):
    C = idx.shape[1]
    key = np.empty(C, np.float32)
    val = np.empty(C, np.int64)
    for r in range(lo, hi):
        for j in range(C):
            key[j] = dist[r, j]
            val[j] = idx[r, j]
        sort_pairs(key, val)
        for j in range(C):
            out_d[r, j] = key[j]
            out_i[r, j] = val[j]


@njit(cache=True)
def mark_row_differences(a, b, mark):
    """``mark[v] = True`` for every id ``v >= 0`` in exactly one of the rows ``a[r]`` and ``b[r]``
    (int arrays of one shape), for each ``r``: the points whose in-links change when lists ``a``
    become ``b``. Rows are a few dozen ids: a scan per id is fastest."""
    m, R = a.shape
    for r in range(m):
        for j in range(R):
            v = a[r, j]
            if v >= 0 and not _contains(b[r], R, v):
                mark[v] = True
            w = b[r, j]
            if w >= 0 and not _contains(a[r], R, w):
                mark[w] = True


def changed_without(cand, cand_dist, rows):
    """The rows of the candidate lists ``(cand, cand_dist)`` (int64 / float32 ``(n, C)``) that change
    when the points ``rows`` are taken out (their own lists emptied, every entry naming one of
    them dropped), and those rows as they become: ``(changed int64 (m,), ids (m, C), dists (m,
    C))``, each row's remaining entries in their order followed by ``-1`` / ``+inf``; row-parallel.
    The NumPy masks over the whole lists took 0.3-0.4 s of the CPU denser tier's hold-out graph
    (100k x 144) on one core. Rows sorted by (distance, id) stay sorted, so RobustPrune need not
    sort them again (:func:`prune_cpu` sorts rows that are not; its result is the same either way)."""
    cand = np.ascontiguousarray(cand, dtype=np.int64)
    cand_dist = np.ascontiguousarray(cand_dist, dtype=np.float32)
    n, C = cand.shape
    gone = np.zeros(n, np.bool_)
    gone[np.asarray(rows, np.int64)] = True
    hit = np.empty(n, np.bool_)
    parts = chunks(n, 4 * num_threads())
    parallel_for(lambda c: _hit_rows_chunk(cand, gone, hit, parts[c][0], parts[c][1]), len(parts))
    changed = np.flatnonzero(hit)
    hc = np.empty((changed.size, C), np.int64)
    hd = np.empty((changed.size, C), np.float32)
    parts = chunks(changed.size, 4 * num_threads())
    parallel_for(lambda c: _without_rows_chunk(cand, cand_dist, gone, changed, hc, hd, parts[c][0], parts[c][1]),
                 len(parts))
    return changed, hc, hd


@kernel()
def _without_rows_chunk(cand, cand_dist, gone, changed, hc, hd, lo, hi):
    C = cand.shape[1]
    for r in range(lo, hi):
        u = changed[r]
        m = 0
        if not gone[u]:
            for j in range(C):
                v = cand[u, j]
                if v >= 0 and not gone[v]:
                    hc[r, m] = v
                    hd[r, m] = cand_dist[u, j]
                    m += 1
        for j in range(m, C):
            hc[r, j] = -1
            hd[r, j] = np.inf


@kernel()
def _hit_rows_chunk(cand, gone, hit, lo, hi):
    C = cand.shape[1]
    for r in range(lo, hi):
        g = gone[r]
        h = False
        for j in range(C):
            v = cand[r, j]
            h |= v >= 0 and (g or gone[v])
        hit[r] = h


def joined_lists(a_ids, a_dist, b_ids, b_dist):
    """Row-wise union of two candidate lists with their distances (int64 / float32, ``(n, Ka)``
    and ``(n, Kb)``, ``-1`` / ``+inf`` = none, each free of repeats): ``(ids (n, Ka + Kb), dists)``,
    each id once per row (``b``'s distance where both hold it), sorted by (distance, id), the rest
    ``-1`` / ``+inf``; row-parallel. The denser tier's walked lists joined with the low tier's:
    their distances are known, so the rebuild need not compute them again (1.3-1.5 s for 100k x 144
    candidates at d 128) nor sort the rows."""
    n = a_ids.shape[0]
    out_i = np.empty((n, a_ids.shape[1] + b_ids.shape[1]), np.int64)
    out_d = np.empty(out_i.shape, np.float32)
    args = (np.ascontiguousarray(a_ids, np.int64), np.ascontiguousarray(a_dist, np.float32),
            np.ascontiguousarray(b_ids, np.int64), np.ascontiguousarray(b_dist, np.float32))
    parts = chunks(n, 4 * num_threads())
    parallel_for(lambda c: _joined_rows(*args, out_i, out_d, parts[c][0], parts[c][1]), len(parts))
    return out_i, out_d


@kernel()
def _joined_rows(a_ids, a_dist, b_ids, b_dist, out_i, out_d, lo, hi):
    Ka = a_ids.shape[1]
    Kb = b_ids.shape[1]
    C = Ka + Kb
    key = np.empty(C, np.float32)
    val = np.empty(C, np.int64)
    for r in range(lo, hi):
        m = 0
        for j in range(Kb):
            v = b_ids[r, j]
            if v >= 0:
                val[m] = v
                key[m] = b_dist[r, j]
                m += 1
        mb = m
        for j in range(Ka):
            v = a_ids[r, j]
            if v >= 0 and not _contains(val, mb, v):
                val[m] = v
                key[m] = a_dist[r, j]
                m += 1
        for t in range(m, C):
            val[t] = -1
            key[t] = np.inf
        sort_pairs(key[:m], val[:m])
        for t in range(C):
            out_i[r, t] = val[t]
            out_d[r, t] = key[t]


def _shift(X, metric):
    if metric != "ip":
        return 0.0
    return float(np.einsum("ij,ij->i", X, X).max())


def prune_cpu(X, cand_idx, cand_dist, R, alpha, metric, *, fill=True, node_ids=None):
    """RobustPrune every node's candidate list down to ``R`` out-edges (CPU, all nodes in parallel).

    Parameters
    ----------
    X : ndarray, float32 (n, d)
        Prepared vectors.
    cand_idx : ndarray, int (n, C)
        Candidates per node (``-1`` = none); any order.
    cand_dist : ndarray, float32 (n, C)
        Internal distance node -> candidate (``+inf`` for ``-1``).
    R : int
        Out-degree.
    alpha : float
        Pruning slack (>= 1; 1 gives the relative neighbourhood graph rule).
    metric : {"l2", "ip"}
        Internal metric (see the module docstring for the rule on each).
    fill : bool
        Fill free slots with the nearest pruned candidates.
    node_ids : ndarray, optional
        Node id of each candidate row (default ``arange(n)``; used when inserting new points).

    Returns
    -------
    graph : ndarray, int32 (n, R), ``-1`` padded.

    Examples
    --------
    >>> import numpy as np
    >>> X = np.array([[0.], [1.], [2.]], np.float32)
    >>> ci = np.array([[1, 2], [0, 2], [1, 0]]); cd = np.array([[1, 4], [1, 1], [1, 4]], np.float32)
    >>> prune_cpu(X, ci, cd, 2, 1.0, "l2", fill=False).tolist()
    [[1, -1], [0, 2], [1, -1]]
    """
    X = np.ascontiguousarray(X, dtype=np.float32)
    cand_idx = np.ascontiguousarray(cand_idx, dtype=np.int64)
    cand_dist = np.ascontiguousarray(cand_dist, dtype=np.float32)
    # (distance, index) order, as the GPU version: ties resolve the same way on both. NN-Descent's
    # and the exact search's lists come sorted so: the row-wise lexsort (0.2-0.3 s at 100k x 64)
    # only runs when some row is not
    if not _rows_sorted(cand_dist, cand_idx):
        cand_idx, cand_dist = sorted_rows(cand_idx, cand_dist)
    rows = cand_idx.shape[0]
    node_ids = np.arange(rows, dtype=np.int64) if node_ids is None else np.asarray(node_ids, np.int64)
    out = np.empty((rows, int(R)), np.int32)
    _prune_all(X, cand_idx, cand_dist, node_ids, int(R), np.float32(alpha) ** 2, metric == "ip",
               np.float32(_shift(X, metric)), bool(fill), out)
    return out


@njit(cache=True)
def _reverse_csr(graph, n_rows, offset):
    """CSR of reverse edges: for each target v, the sources u with v in graph[u]."""
    m, R = graph.shape
    counts = np.zeros(n_rows + 1, np.int64)
    for u in range(m):
        for j in range(R):
            v = graph[u, j]
            if v >= 0:
                counts[v + 1] += 1
    for v in range(n_rows):
        counts[v + 1] += counts[v]
    fill = np.empty(n_rows, np.int64)
    for v in range(n_rows):
        fill[v] = counts[v]
    rev = np.empty(counts[-1], np.int64)
    for u in range(m):
        for j in range(R):
            v = graph[u, j]
            if v >= 0:
                rev[fill[v]] = u + offset
                fill[v] += 1
    return counts, rev


def _merge_reverse(X, graph, counts, rev, rows, R, alpha2, is_ip, shift, fill, out):
    """For node rows[r]: union of its list and its reverse edges, re-pruned when over R."""
    parts = chunks(rows.shape[0], 4 * num_threads())
    parallel_for(lambda c: _merge_reverse_rows(X, graph, counts, rev, rows, R, alpha2, is_ip, shift, fill, out,
                                               parts[c][0], parts[c][1]), len(parts))


@kernel(fastmath=True)
def _merge_reverse_rows(X, graph, counts, rev, rows, R, alpha2, is_ip, shift, fill, out, lo, hi):
    """Rows ``lo .. hi - 1`` of :func:`_merge_reverse`."""
    for r in range(lo, hi):
        u = rows[r]
        nrev = counts[r + 1] - counts[r]
        cap = R + nrev
        ci = np.empty(cap, np.int64)
        m = 0
        for j in range(R):
            v = graph[u, j]
            if v >= 0:
                ci[m] = v
                m += 1
        own = m
        last = -1
        for t in range(counts[r], counts[r + 1]):
            v = rev[t]
            # the sources come in ascending order (a source listing u twice is adjacent), so a
            # reverse edge repeats only the one before it or one of the own list's R ids: checking
            # those keeps the list the same as a scan of everything before it, without its
            # quadratic cost on hubs
            if v == u or v == last:
                continue
            last = v
            if not _contains(ci, own, v):
                ci[m] = v
                m += 1
        if m <= R:
            # no overflow: keep the list and append the new reverse edges
            for j in range(m):
                out[r, j] = ci[j]
            for j in range(m, R):
                out[r, j] = -1
            continue
        cdv = np.empty(m, np.float32)
        for j in range(m):
            cdv[j] = _pd(X, u, ci[j], is_ip)
        # stable order by distance (ci holds distinct ids; ties are rare here): by (distance, position)
        pos = np.empty(m, np.int64)
        for j in range(m):
            pos[j] = j
        sort_pairs(cdv, pos)
        cs = np.empty(m, np.int64)
        ds = np.empty(m, np.float32)
        for j in range(m):
            cs[j] = ci[pos[j]]
            ds[j] = cdv[j]
        kept = np.empty(R, np.int64)
        pruned = np.empty(m, np.int64)
        _prune_one(X, u, cs, ds, R, alpha2, is_ip, shift, fill, out[r], kept, pruned)


def add_reverse_edges(X, graph, R, alpha, metric, *, fill=True, rows=None, new_graph_rows=None,
                      row_offset=0):
    """Add the reverse of every edge; lists that overflow ``R`` are re-pruned with RobustPrune.

    ``graph`` rows are nodes ``0..n-1``. For incremental inserts, ``new_graph_rows`` (m, R)
    holds the out-lists of new nodes ``row_offset..row_offset+m-1`` and only the reverse edges
    of those lists are added to ``graph`` (which must already have ``n`` rows, including the new
    ones). Returns the updated graph (int32, a new array).
    """
    X = np.ascontiguousarray(X, dtype=np.float32)
    graph = np.ascontiguousarray(graph, dtype=np.int32)
    n = graph.shape[0]
    src = graph if new_graph_rows is None else np.ascontiguousarray(new_graph_rows, np.int32)
    offset = 0 if new_graph_rows is None else int(row_offset)
    counts, rev = _reverse_csr(src, n, offset)
    if rows is None:
        rows = np.nonzero(np.diff(counts) > 0)[0].astype(np.int64)
    sub_counts = np.zeros(rows.shape[0] + 1, np.int64)
    sub_counts[1:] = np.cumsum(counts[rows + 1] - counts[rows])
    sub_rev = np.empty(sub_counts[-1], np.int64)
    if rows.shape[0]:
        _gather_rev(counts, rev, rows, sub_counts, sub_rev)
    out_rows = np.empty((rows.shape[0], int(R)), np.int32)
    _merge_reverse(X, graph, sub_counts, sub_rev, rows, int(R), np.float32(alpha) ** 2,
                   metric == "ip", np.float32(_shift(X, metric)), bool(fill), out_rows)
    out = graph.copy()
    out[rows] = out_rows
    return out


@njit(cache=True)
def _gather_rev(counts, rev, rows, sub_counts, sub_rev):
    for r in range(rows.shape[0]):
        v = rows[r]
        a = counts[v]
        b = counts[v + 1]
        o = sub_counts[r]
        for t in range(a, b):
            sub_rev[o + t - a] = rev[t]


@njit(parallel=True, cache=True, fastmath=True)
def _sym_requests(X, knn, k_nn, is_ip, max_visits, req_src, req_dist):
    """GGNN section 5.2: for each node z and each of its k_nn nearest x, look for a path x -> z
    inside the ball around q_m = z + 0.4 (x - z) of radius |q_m - x|, following only k_nn-nearest
    links. Without one, request the reverse link x -> z (req_src[z, i] = x, else -1)."""
    n = knn.shape[0]
    d = X.shape[1]
    for z in prange(n):
        visited = np.empty(max_visits, np.int64)
        qm = np.empty(d, np.float32)
        for i in range(k_nn):
            req_src[z, i] = -1
            req_dist[z, i] = np.inf
            x = knn[z, i]
            if x < 0:
                continue
            direct = False
            for j in range(k_nn):
                if knn[x, j] == z:
                    direct = True
                    break
            if direct:
                continue
            for t in range(d):
                qm[t] = X[z, t] + np.float32(0.4) * (X[x, t] - X[z, t])
            r2 = np.float32(0.0)
            for t in range(d):
                diff = qm[t] - X[x, t]
                r2 += diff * diff
            # breadth-first walk inside the ball, bounded by max_visits
            nv = 1
            visited[0] = x
            head = 0
            found = False
            while head < nv and not found:
                a = visited[head]
                head += 1
                for j in range(k_nn):
                    b = knn[a, j]
                    if b < 0:
                        continue
                    if b == z:
                        found = True
                        break
                    seen = False
                    for t in range(nv):
                        if visited[t] == b:
                            seen = True
                            break
                    if seen or nv >= max_visits:
                        continue
                    db = np.float32(0.0)
                    for t in range(d):
                        diff = qm[t] - X[b, t]
                        db += diff * diff
                    if db <= r2:
                        visited[nv] = b
                        nv += 1
            if not found:
                req_src[z, i] = x
                req_dist[z, i] = _pd(X, x, z, is_ip)


def ggnn_diversify(X, knn_idx, knn_dist, R, metric, *, max_visits=24):
    """GGNN-style fixed-degree graph: ``R - R//2`` nearest neighbours plus up to ``R//2`` reverse
    links (the nearest requested ones), requested when no short path back exists (section 5.2).

    Returns int32 (n, R); free slots are filled with further nearest neighbours, then ``-1``.
    """
    X = np.ascontiguousarray(X, dtype=np.float32)
    knn_idx = np.ascontiguousarray(knn_idx, dtype=np.int64)
    n, K = knn_idx.shape
    k_sym = R // 2
    k_nn = min(R - k_sym, K)
    req_src = np.empty((n, k_nn), np.int64)
    req_dist = np.empty((n, k_nn), np.float32)
    _sym_requests(X, knn_idx, k_nn, metric == "ip", int(max_visits), req_src, req_dist)
    # regroup requests by source x: x gets the link x -> z
    z_of = np.repeat(np.arange(n, dtype=np.int64), k_nn)
    src = req_src.ravel()
    dist = req_dist.ravel()
    ok = src >= 0
    src, z_of, dist = src[ok], z_of[ok], dist[ok]
    order = np.lexsort((dist, src))
    src, z_of = src[order], z_of[order]
    out = np.full((n, R), -1, np.int32)
    out[:, :k_nn] = knn_idx[:, :k_nn]
    _place_sym(out, knn_idx, src, z_of, k_nn, R)
    return out


@njit(cache=True)
def _place_sym(out, knn, src, z_of, k_nn, R):
    n = out.shape[0]
    pos = np.full(n, k_nn, np.int64)
    for t in range(src.shape[0]):
        x = src[t]
        if pos[x] < R:
            z = z_of[t]
            if not _contains(out[x], pos[x], z):
                out[x, pos[x]] = z
                pos[x] += 1
    K = knn.shape[1]
    for x in range(n):
        j = k_nn
        while pos[x] < R and j < K:
            c = knn[x, j]
            j += 1
            if c < 0:
                continue
            if not _contains(out[x], pos[x], c):
                out[x, pos[x]] = c
                pos[x] += 1


@njit(inline="always")
def _offer(hd, hi, K, dv, v):
    """Offer ``(dv, v)`` to the max-heap of the K smallest (pre-filled with ``(inf, -1)``)."""
    if dv < hd[0]:
        _offer_root(hd, hi, dv, v, K)


@kernel(fastmath=True)
def _two_hop_rows(X, graph, first, K, is_ip, out, lo, hi):
    n = X.shape[0]
    R = graph.shape[1]
    stamp = np.empty(n, np.int32)  # stamp[v] == tag of row r: v already offered for it (per task)
    for v in range(n):  # (a loop: a whole-array fill would become a parallel loop in a kernel)
        stamp[v] = 0
    hd = np.empty(K, np.float32)
    hi_ = np.empty(K, np.int64)
    for r in range(lo, hi):
        tag = np.int32(r - lo + 1)
        stamp[r] = tag
        q = X[r]
        for j in range(K):
            hd[j] = np.inf
            hi_[j] = -1
        for j in range(first.shape[1]):
            v = first[r, j]
            if v >= 0 and stamp[v] != tag:
                stamp[v] = tag
                _offer(hd, hi_, K, _dist(q, X, v, is_ip), v)
        for a in range(R):
            u = graph[r, a]
            if u < 0:
                continue
            if stamp[u] != tag:
                stamp[u] = tag
                _offer(hd, hi_, K, _dist(q, X, u, is_ip), u)
            for b in range(R):
                v = graph[u, b]
                if v >= 0 and stamp[v] != tag:
                    stamp[v] = tag
                    _offer(hd, hi_, K, _dist(q, X, v, is_ip), v)
        for j in range(K):
            out[r, j] = hi_[j]


def two_hop_lists(X, graph, first, K, metric):
    """``(n, K)`` int64: each row's ``K`` nearest among its candidate list ``first``, its graph
    neighbours and their graph neighbours (``-1`` where fewer), in no particular order.

    The candidates of a denser graph built from this one (``GraphIndex._denser``): NN-Descent's
    principle (a neighbour's neighbour is likely a neighbour) on the built graph, one exact distance
    per distinct candidate, instead of a walk from the entry points for every row."""
    X = np.ascontiguousarray(X, dtype=np.float32)
    graph = np.ascontiguousarray(graph, dtype=np.int32)
    first = np.ascontiguousarray(first, dtype=np.int64)
    n = X.shape[0]
    out = np.empty((n, int(K)), np.int64)
    parts = chunks(n, 4 * num_threads())
    is_ip = metric == "ip"
    parallel_for(lambda c: _two_hop_rows(X, graph, first, int(K), is_ip, out, parts[c][0], parts[c][1]),
                 len(parts))
    return out
