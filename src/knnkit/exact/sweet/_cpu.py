"""Sweet KNN on the CPU (NumPy + Numba): the twin of the GPU engine, same phases and semantics.

Phases (paper section II-C / III): landmarks by repeated random sampling, assignment of every
point to its nearest landmark by a blocked GEMM, exact (float64) point-to-centre distances, data
clusters stored contiguously with members in descending distance to their centre; level 1
(Algorithm 1): per query cluster an upper bound ``UB`` on the k-th neighbour distance of every
member from the two-landmark bound pooled over all data clusters, then the candidate data
clusters whose group lower bound does not exceed ``UB``, ordered by centre distance; level 2
(Algorithm 2): per query, the one-landmark bound ``|d(q, c) - d(t, c)|`` against the current
bound ``theta``, where the descending member order lets one binary search skip the members
that are too far "outside" and one break skip those too far "inside".

Full filter: ``theta`` shrinks to the k-th distance found so far (bounded max-heap per worker).
Partial filter: ``theta`` stays at ``UB``; survivors are counted, written out, then k-selected.
Parallelism: ``parts`` workers per query split its candidate clusters round-robin (``parts=1``
is query parallelism); each has its own heap and the heaps are merged by (distance, index).

Reported distances are ``float32(sum((float64(q) - float64(x))^2))`` accumulated in index order,
exactly as :func:`knnkit.exact._cpu.knn_cpu` re-computes its winners, so ids agree with the GEMM
path even among float32 ties.
"""

import math
import time

import numpy as np
from numba import get_num_threads, njit, prange

from ..._core.config import logger
from .._cpu import _blas_one_thread
from ._plan import choose_filter, choose_landmarks, default_landmarks, level1_verdict, mean_copies, pruning_rel

__all__ = ["sweet_cpu", "build_cpu"]

_ASSIGN_BLOCK = 16384
_PARTIAL_ENTRIES = 1 << 24  # survivors buffered per query chunk in the partial filter (192 MiB)
_CPU_TABLE_BYTES = 1 << 30


# ----------------------------------------------------------------------------- distances
@njit(inline="always")
def _dist2(a, b):
    """Squared distance in float64, the order and rounding of knn_cpu's refinement."""
    acc = 0.0
    for c in range(a.shape[0]):
        diff = np.float64(a[c]) - np.float64(b[c])
        acc += diff * diff
    return acc


@njit(parallel=True, cache=True)
def _point_centre_dist(P, L, labels, out):
    for i in prange(P.shape[0]):
        out[i] = math.sqrt(_dist2(P[i], L[labels[i]]))


@njit(parallel=True, cache=True)
def _centre_dist(Lq, Lt, out):
    for i in prange(Lq.shape[0]):
        for j in range(Lt.shape[0]):
            out[i, j] = math.sqrt(_dist2(Lq[i], Lt[j]))


@njit(cache=True)
def _spread(L):
    """Sum of the pairwise Euclidean distances of the rows of L (landmark-set quality).

    Serial on purpose: ~1 M pairs take ~3 ms in one thread, while the earlier ``prange`` over
    the triangular rows took 20-50 ms per trial on 2 shared cores (unbalanced static chunks, and
    each parallel region waits for its slowest thread), 0.2-0.45 s of the clusters phase."""
    m, dim = L.shape
    acc = 0.0
    for i in range(m):
        for j in range(i + 1, m):
            s = 0.0
            for c in range(dim):
                diff = np.float64(L[i, c]) - np.float64(L[j, c])
                s += diff * diff
            acc += math.sqrt(s)
    return acc


@njit(parallel=True, cache=True)
def _assign_direct(P, L, labels):
    """Nearest landmark by direct float32 distances: for small d this beats a GEMM of inner
    dimension d, whose output (n x landmarks) costs more memory traffic than the arithmetic.

    The landmarks are visited outward from the point's position along the coordinate of largest
    spread (``|p_c - l_c|^2`` bounds the distance from below), so in low dimension only a thin
    slab of them is evaluated; the winner is the one a full scan picks (ties to the smaller
    landmark index)."""
    m, dim = L.shape
    spread = np.empty(dim)
    for c in range(dim):
        spread[c] = L[:, c].max() - L[:, c].min() if m else 0.0
    axis = int(np.argmax(spread)) if dim else 0
    key = np.empty(m, np.float32)
    for j in range(m):
        key[j] = L[j, axis]
    order = np.argsort(key, kind="mergesort")
    skey = key[order]
    for i in prange(P.shape[0]):
        p = P[i]
        best = np.float32(np.inf)
        arg = order[0] if m else 0
        hi = np.searchsorted(skey, p[axis])
        lo = hi - 1
        while lo >= 0 or hi < m:
            # the side whose next landmark is closer along the axis
            if hi >= m or (lo >= 0 and p[axis] - skey[lo] <= skey[hi] - p[axis]):
                gap = p[axis] - skey[lo]
                j = order[lo]
                lo -= 1
            else:
                gap = skey[hi] - p[axis]
                j = order[hi]
                hi += 1
            if gap * gap > best:
                break  # both sides are at least this far along the axis
            acc = np.float32(0.0)
            lj = L[j]
            for c in range(dim):
                diff = p[c] - lj[c]
                acc += diff * diff
            if acc < best or (acc == best and j < arg):  # ties to the smaller landmark, as argmin
                best = acc
                arg = j
        labels[i] = arg


#: Direct slab-scan assignment up to this dimension, the GEMM above (30k rows, 519 landmarks, 2
#: cores: 16-D direct 0.125 s / GEMM 0.031 s, 12-D 0.072 / 0.031, 8-D 0.053 / 0.037 uniform and
#: 0.019 / 0.029 clustered; same labels).
_DIRECT_ASSIGN_MAX_DIM = 8
_GRID_ASSIGN_MAX_DIM = 3
_CELL_ASSIGN = True  # d <= 3: _assign_cells (else _assign_grid; tests force both)


@njit(parallel=True, cache=True)
def _assign_grid(P, L, labels, cells_per_landmark=2.0):
    """Nearest landmark for d <= 3 through a uniform grid over the points' bounding box
    (``cells_per_landmark`` cells per landmark, 2 chosen from 0.5-16: on clustered 3-D 245k, where
    dense regions crowd many landmarks into a cell, 0.080 s at 0.5 -> 0.055 s (4: 0.053), on
    uniform 3-D 0.038 -> 0.043 s): cells are searched in rings of growing Chebyshev radius around the
    point's cell, and the search stops when every cell of the next ring is farther (at least
    ``r * h``, ``h`` the smallest cell side) than the best landmark found. The 1-D slab of
    ``_assign_direct`` still evaluates ~12 % of the landmarks per point on uniform 3-D data (its
    width is twice the nearest-landmark distance); the rings evaluate a few dozen. The winner is
    the one a full scan picks (ties to the smaller landmark index)."""
    m, dim = L.shape
    n = P.shape[0]
    lo = np.empty(3)
    h = np.ones(3)
    g = np.ones(3, np.int64)
    for c in range(3):
        lo[c] = 0.0
    if n == 0 or m == 0:
        return
    cells_wanted = max(1.0, m * cells_per_landmark)
    per_axis = max(1, int(math.ceil(cells_wanted ** (1.0 / dim))))
    for c in range(dim):
        mn = np.float64(P[:, c].min())
        mx = np.float64(P[:, c].max())
        lo[c] = mn
        g[c] = per_axis
        h[c] = (mx - mn) / per_axis if mx > mn else 1.0
        if mx <= mn:
            g[c] = 1
    hmin = np.inf
    for c in range(dim):
        if g[c] > 1 and h[c] < hmin:
            hmin = h[c]
    if hmin == np.inf:
        hmin = 0.0  # every point in one cell: the ring bound never prunes, ring 0 holds all
    ncell = g[0] * g[1] * g[2]
    cell_of = np.empty(m, np.int64)
    for j in range(m):
        idx = 0
        for c in range(dim):
            t = int((np.float64(L[j, c]) - lo[c]) / h[c])
            t = min(max(t, 0), g[c] - 1)
            idx = idx * g[c] + t
        for c in range(dim, 3):
            idx = idx * g[c]
        cell_of[j] = idx
    start = np.zeros(ncell + 1, np.int64)
    for j in range(m):
        start[cell_of[j] + 1] += 1
    for c in range(ncell):
        start[c + 1] += start[c]
    fill = start[:-1].copy()
    lm = np.empty(m, np.int64)
    for j in range(m):  # ascending landmark index inside each cell
        lm[fill[cell_of[j]]] = j
        fill[cell_of[j]] += 1
    maxr = 0
    for c in range(3):
        maxr = max(maxr, g[c])
    for i in prange(n):
        p = P[i]
        pc = np.zeros(3, np.int64)
        for c in range(dim):
            t = int((np.float64(p[c]) - lo[c]) / h[c])
            pc[c] = min(max(t, 0), g[c] - 1)
        best = np.float32(np.inf)
        arg = 0
        for r in range(maxr + 1):
            if r > 0:
                # every cell of ring r is at least (r - 1) * hmin from the point along some axis
                # (shrunk a little: cell indices come from rounded divisions)
                gap = (r - 1) * hmin * (1.0 - 1e-6)
                if gap * gap > best:
                    break
            for a0 in range(max(0, pc[0] - r), min(g[0], pc[0] + r + 1)):
                for a1 in range(max(0, pc[1] - r), min(g[1], pc[1] + r + 1)):
                    for a2 in range(max(0, pc[2] - r), min(g[2], pc[2] + r + 1)):
                        if max(abs(a0 - pc[0]), abs(a1 - pc[1]), abs(a2 - pc[2])) != r:
                            continue
                        cell = (a0 * g[1] + a1) * g[2] + a2
                        for u in range(start[cell], start[cell + 1]):
                            j = lm[u]
                            lj = L[j]
                            acc = np.float32(0.0)
                            for c in range(dim):
                                diff = p[c] - lj[c]
                                acc += diff * diff
                            if acc < best or (acc == best and j < arg):
                                best = acc
                                arg = j
        labels[i] = arg


@njit(parallel=True, cache=True)
def _assign_cells(P, L, labels, dist, cells_per_landmark=2.0):
    """Nearest landmark for d <= 3 (the winner of a full scan: float32 distance, ties to the smaller
    landmark index) and the exact float64 distance to it (``_point_centre_dist``'s arithmetic), in
    one pass over the points.

    A uniform grid over the points' box (``cells_per_landmark`` cells per landmark, as
    ``_assign_grid``), but the ring search is done once per occupied *cell* instead of once per
    point: a cell with centre ``cc`` and half diagonal ``hd`` keeps the landmarks ``l`` with
    ``|cc - l| <= d0 + 2 hd`` (``d0`` the distance from ``cc`` to its nearest landmark; every other
    landmark is, for every point of the cell, farther than that one), sorted by ``|cc - l|``. A point
    scans its cell's list and stops once ``|cc - l| - |p - cc|``, a lower bound of ``|p - l|``,
    exceeds the best distance found (with a relative slack far above the float32 rounding). The
    per-point ring search evaluated a few dozen landmarks and ~150 cells per point and allocated a
    small array per point (0.04 s quiet, 0.14-0.16 s under load at 245k x 3)."""
    m, dim = L.shape
    n = P.shape[0]
    if n == 0 or m == 0:
        return
    lo = np.zeros(3)
    h = np.ones(3)
    wd = np.zeros(3)  # the cells' true widths (0 on a flat axis, where h = 1 only divides)
    g = np.ones(3, np.int64)
    cells_wanted = max(1.0, m * cells_per_landmark)
    per_axis = max(1, int(math.ceil(cells_wanted ** (1.0 / dim))))
    for c in range(dim):
        mn = np.float64(P[:, c].min())
        mx = np.float64(P[:, c].max())
        lo[c] = mn
        g[c] = per_axis
        h[c] = (mx - mn) / per_axis if mx > mn else 1.0
        wd[c] = (mx - mn) / per_axis
        if mx <= mn:
            g[c] = 1
    hmin = np.inf
    for c in range(dim):
        if g[c] > 1 and h[c] < hmin:
            hmin = h[c]
    if hmin == np.inf:
        hmin = 0.0  # one cell: the ring bound never stops the search, ring 0 holds everything
    ncell = g[0] * g[1] * g[2]
    cell_of = np.empty(m, np.int64)
    for j in range(m):
        idx = 0
        for c in range(3):
            t = 0
            if c < dim:
                t = min(max(int((np.float64(L[j, c]) - lo[c]) / h[c]), 0), g[c] - 1)
            idx = idx * g[c] + t
        cell_of[j] = idx
    start = np.zeros(ncell + 1, np.int64)
    for j in range(m):
        start[cell_of[j] + 1] += 1
    for c in range(ncell):
        start[c + 1] += start[c]
    fill = start[:-1].copy()
    lm = np.empty(m, np.int64)
    for j in range(m):
        lm[fill[cell_of[j]]] = j
        fill[cell_of[j]] += 1
    # the cell of every point (kept for the scan below) and which cells hold points
    pcell = np.empty(n, np.int32)
    for i in prange(n):
        idx = 0
        for c in range(3):
            t = 0
            if c < dim:
                t = min(max(int((np.float64(P[i, c]) - lo[c]) / h[c]), 0), g[c] - 1)
            idx = idx * g[c] + t
        pcell[i] = idx
    used = np.zeros(ncell, np.bool_)
    for i in range(n):
        used[pcell[i]] = True
    maxr = max(g[0], max(g[1], g[2]))
    hd = 0.0
    for c in range(dim):
        hd += 0.25 * wd[c] * wd[c]
    hd = math.sqrt(hd)
    shrink = 1.0 - 1e-6  # cell indices come from rounded divisions
    # per occupied cell: nearest-landmark distance d0 of the centre, then the count within d0 + 2 hd
    d0s = np.full(ncell, np.inf)
    ccount = np.zeros(ncell + 1, np.int64)
    for cell in prange(ncell):
        if not used[cell]:
            continue
        a2 = cell % g[2]
        a1 = (cell // g[2]) % g[1]
        a0 = cell // (g[1] * g[2])
        cc0 = lo[0] + (a0 + 0.5) * wd[0] if dim >= 1 else 0.0
        cc1 = lo[1] + (a1 + 0.5) * wd[1] if dim >= 2 else 0.0
        cc2 = lo[2] + (a2 + 0.5) * wd[2] if dim >= 3 else 0.0
        for phase in range(2):
            lim = d0s[cell] if phase == 0 else (d0s[cell] + 2.0 * hd) * (1.0 + 1e-6) + 1e-6 * hmin
            cnt = 0
            for r in range(maxr + 1):
                # every landmark of ring r is at least (r - 1/2) hmin from the centre along some axis
                if r > 0 and (r - 0.5) * hmin * shrink > lim:
                    break
                for b0 in range(max(0, a0 - r), min(g[0], a0 + r + 1)):
                    for b1 in range(max(0, a1 - r), min(g[1], a1 + r + 1)):
                        for b2 in range(max(0, a2 - r), min(g[2], a2 + r + 1)):
                            if max(abs(b0 - a0), abs(b1 - a1), abs(b2 - a2)) != r:
                                continue
                            oc = (b0 * g[1] + b1) * g[2] + b2
                            for u in range(start[oc], start[oc + 1]):
                                lj = L[lm[u]]
                                e0 = cc0 - np.float64(lj[0]) if dim >= 1 else 0.0
                                e1 = cc1 - np.float64(lj[1]) if dim >= 2 else 0.0
                                e2 = cc2 - np.float64(lj[2]) if dim >= 3 else 0.0
                                key = math.sqrt(e0 * e0 + e1 * e1 + e2 * e2)
                                if phase == 0:
                                    if key < lim:
                                        lim = key
                                elif key <= lim:
                                    cnt += 1
                if phase == 0:
                    d0s[cell] = lim
            if phase == 1:
                ccount[cell + 1] = cnt
    for c in range(ncell):
        ccount[c + 1] += ccount[c]
    cand = np.empty(ccount[ncell], np.int64)
    ckey = np.empty(ccount[ncell], np.float64)
    for cell in prange(ncell):
        if not used[cell]:
            continue
        a2 = cell % g[2]
        a1 = (cell // g[2]) % g[1]
        a0 = cell // (g[1] * g[2])
        cc0 = lo[0] + (a0 + 0.5) * wd[0] if dim >= 1 else 0.0
        cc1 = lo[1] + (a1 + 0.5) * wd[1] if dim >= 2 else 0.0
        cc2 = lo[2] + (a2 + 0.5) * wd[2] if dim >= 3 else 0.0
        lim = (d0s[cell] + 2.0 * hd) * (1.0 + 1e-6) + 1e-6 * hmin
        w = ccount[cell]
        for r in range(maxr + 1):
            if r > 0 and (r - 0.5) * hmin * shrink > lim:
                break
            for b0 in range(max(0, a0 - r), min(g[0], a0 + r + 1)):
                for b1 in range(max(0, a1 - r), min(g[1], a1 + r + 1)):
                    for b2 in range(max(0, a2 - r), min(g[2], a2 + r + 1)):
                        if max(abs(b0 - a0), abs(b1 - a1), abs(b2 - a2)) != r:
                            continue
                        oc = (b0 * g[1] + b1) * g[2] + b2
                        for u in range(start[oc], start[oc + 1]):
                            j = lm[u]
                            lj = L[j]
                            e0 = cc0 - np.float64(lj[0]) if dim >= 1 else 0.0
                            e1 = cc1 - np.float64(lj[1]) if dim >= 2 else 0.0
                            e2 = cc2 - np.float64(lj[2]) if dim >= 3 else 0.0
                            key = math.sqrt(e0 * e0 + e1 * e1 + e2 * e2)
                            if key <= lim:
                                # insertion by key (a few dozen entries)
                                v = w
                                while v > ccount[cell] and ckey[v - 1] > key:
                                    ckey[v] = ckey[v - 1]
                                    cand[v] = cand[v - 1]
                                    v -= 1
                                ckey[v] = key
                                cand[v] = j
                                w += 1
    for i in prange(n):
        p = P[i]
        cell = pcell[i]
        a2 = cell % g[2]
        a1 = (cell // g[2]) % g[1]
        a0 = cell // (g[1] * g[2])
        e = 0.0
        for c in range(dim):
            ac = a0 if c == 0 else (a1 if c == 1 else a2)
            t = np.float64(p[c]) - (lo[c] + (ac + 0.5) * wd[c])
            e += t * t
        e = math.sqrt(e)
        best = np.float32(np.inf)
        arg = 0
        for u in range(ccount[cell], ccount[cell + 1]):
            # |p - l| >= |cc - l| - |p - cc|; the slack covers the float32 distances' rounding
            if (ckey[u] - e) * (1.0 - 1e-9) > math.sqrt(np.float64(best)) * (1.0 + 1e-5):
                break
            j = cand[u]
            lj = L[j]
            acc = np.float32(0.0)
            for c in range(dim):
                diff = p[c] - lj[c]
                acc += diff * diff
            if acc < best or (acc == best and j < arg):
                best = acc
                arg = j
        labels[i] = arg
        dist[i] = math.sqrt(_dist2(p, L[arg]))


def _assign(P, L):
    """Nearest landmark of every row (GEMM ``||l||^2 - 2 p.l`` above ``_DIRECT_ASSIGN_MAX_DIM``,
    a direct slab scan up to it);
    ties or rounding may pick a slightly farther landmark, which costs filtering power but never
    exactness, because the bounds use the exact distance to the landmark actually assigned."""
    if P.shape[1] <= _GRID_ASSIGN_MAX_DIM:
        labels = np.empty(P.shape[0], np.int32)
        _assign_grid(P, L, labels)
        return labels
    if P.shape[1] <= _DIRECT_ASSIGN_MAX_DIM:
        labels = np.empty(P.shape[0], np.int32)
        _assign_direct(P, L, labels)
        return labels
    ln = np.einsum("ij,ij->i", L, L)
    labels = np.empty(P.shape[0], np.int32)
    for s in range(0, P.shape[0], _ASSIGN_BLOCK):
        G = P[s:s + _ASSIGN_BLOCK] @ L.T
        _argmin_rows(G, ln, labels[s:s + _ASSIGN_BLOCK])
    return labels


@njit(parallel=True, cache=True)
def _argmin_rows(G, ln, out):
    """``out[i] = argmin_j (ln[j] - 2 G[i, j])`` (float32, the first of equal values, as
    ``np.argmin`` of the same float32 expression) on all threads, without the temporaries: NumPy's
    expression and argmin took 0.1-0.25 s of a 50k x 670-landmark assignment at 64-D (2 cores)."""
    two = np.float32(2.0)
    for i in prange(G.shape[0]):
        row = G[i]
        best = ln[0] - two * row[0]
        arg = 0
        for j in range(1, row.shape[0]):
            v = ln[j] - two * row[j]
            if v < best:
                best = v
                arg = j
        out[i] = arg


# ----------------------------------------------------------------------------- heaps
# the bounded max-heap of the GEMM path (same (distance, index) order, so ties match it)
from .._cpu import _sift_down as _sift_down_at  # noqa: E402


@njit(inline="always")
def _sift_down(hd, hi, k):
    _sift_down_at(hd, hi, 0, k)


@njit(inline="always")
def _offer(hd, hi, k, d, ix):
    if d < hd[0] or (d == hd[0] and ix < hi[0]):
        hd[0] = d
        hi[0] = ix
        _sift_down(hd, hi, k)
        return True
    return False


@njit(inline="always")
def _offer_sorted(hd, hi, k, d, ix):
    """Insert (d, ix) into the k-best list kept sorted ascending by (distance, index), worst last.

    For k <= ``_SORTED_K_MAX`` the engine keeps this list (the shift of a few entries beats the
    heap's sift-down: 5-6 % of level 2 at k = 20, skin and uniform 3-D; at k = 100 the seeded,
    straight-band level 2 that needs a sorted list pays for the O(k) shifts); the heap stays above."""
    if d < hd[k - 1] or (d == hd[k - 1] and ix < hi[k - 1]):
        u = k - 1
        while u > 0 and (hd[u - 1] > d or (hd[u - 1] == d and hi[u - 1] > ix)):
            hd[u] = hd[u - 1]
            hi[u] = hi[u - 1]
            u -= 1
        hd[u] = d
        hi[u] = ix
        return True
    return False


# (was 32: k = 64 / 100 then took the heap without seeds or straight bands; with them, all points
# on 245k 3-D: uniform k = 100 3.20 -> 2.30 s, clustered 3.26 -> 2.32 s, skin 0.82 -> 0.68 s, k = 64
# 2.11 -> 1.41 s, same ids: a seeded list is full from the start, so its O(k) shifts are rare)
_SORTED_K_MAX = 128
# Straight band scans and seeded lists in level 2 (full filter, sorted k-best lists, one worker per
# query, no merged copies, d <= _SEED_MAX_DIM; seeds for k >= _SEED_MIN_K): queries run in blocks of
# _SEED_BLOCK per thread, in Morton order inside their cluster, and each starts from the previous
# query's k nearest (see _level2). At k = 1 the two seeds are loose (148 -> 195 distances per query
# on uniform 3-D) and level 2 was no faster with them (0.164 vs 0.159 s).
_SEED_MAX_DIM = 3
_SEED_MIN_K = 8
# seeds and straight bands also when rows are merged as copies, from k + 1 = _SEED_MERGED_MIN_K
# (skin all points, same run: k = 100 1.05 -> 0.72 s, k = 20 0.25 -> 0.20 s, k = 8 0.136 -> 0.150 s,
# identical results); tests force it off
_SEED_MERGED = True
_SEED_MERGED_MIN_K = 16
_SEED_BLOCK = 64
_ONE_PATH = True  # k = 1 through _level2_one (tests force it off)
_ONE_OCTANTS = True  # ... over each cluster's octants (_octant_order; tests force it off)
_DIRECT_OCTANTS = True  # the same for k > 1, one worker per query, d <= 3 (tests force it off)
_GATE_CHUNK = 32  # queries of the gate's sample run per chunk (it stops at the first chunk over budget)


@njit(inline="always")
def _offer_copies(hd, hi, k, d, t, sorted_k, dup, uoff, uidx):
    """Offer point ``t`` at distance ``d``; with ``dup`` (``t`` a unique row standing for the
    original rows ``uidx[uoff[t]:uoff[t + 1]]``, ascending) offer each copy, stopping at the
    first one refused: the later copies tie on distance with larger indices. True when anything
    entered the k-best list."""
    if not dup:
        if sorted_k:
            return _offer_sorted(hd, hi, k, d, t)
        return _offer(hd, hi, k, d, t)
    took = False
    for r in range(uoff[t], uoff[t + 1]):
        ok = _offer_sorted(hd, hi, k, d, uidx[r]) if sorted_k else _offer(hd, hi, k, d, uidx[r])
        if not ok:
            break
        took = True
    return took


@njit(cache=True)
def _sorted_row(cd, ci, k, out_d, out_i, dup, uoff, uidx):
    """The k smallest (distance, index) pairs of ``cd/ci`` sorted, written to out (k,); with
    ``dup`` each ``ci`` is a unique row standing for its copies (see ``_offer_copies``)."""
    hd = np.full(k, np.inf, np.float32)
    hi = np.full(k, np.iinfo(np.int64).max, np.int64)
    for t in range(cd.shape[0]):
        if ci[t] >= 0:
            _offer_copies(hd, hi, k, cd[t], ci[t], False, dup, uoff, uidx)
    order = np.argsort(hd, kind="mergesort")
    for t in range(k):
        out_d[t] = hd[order[t]]
        out_i[t] = hi[order[t]]
    for t in range(1, k):  # equal distances by index (argsort is stable on distance only)
        dd = out_d[t]
        ii = out_i[t]
        u = t - 1
        while u >= 0 and out_d[u] == dd and out_i[u] > ii:
            out_d[u + 1] = out_d[u]
            out_i[u + 1] = out_i[u]
            u -= 1
        out_d[u + 1] = dd
        out_i[u + 1] = ii


# ----------------------------------------------------------------------------- level 1
@njit(inline="always")
def _pool(heap, kk, base, small_j, size_j):
    """Offer ``base + small_j[t]`` (ascending) to the float64 max-heap of the kk smallest."""
    for t in range(min(kk, size_j)):
        v = base + small_j[t]
        if v >= heap[0]:
            break  # small[j] is ascending
        heap[0] = v
        pos = 0
        while True:
            c = 2 * pos + 1
            if c >= kk:
                break
            if c + 1 < kk and heap[c + 1] > heap[c]:
                c += 1
            if heap[c] > v:
                heap[pos] = heap[c]
                pos = c
            else:
                break
        heap[pos] = v


@njit(parallel=True, cache=True)
def _level1(D, rq, qsize, Rt, small, tsize, kk, rel, ub, order, ncand):
    """Upper bound ``ub`` per query cluster (k-th smallest of ``rq + D + r_t(i)`` pooled over
    the kk members closest to each data centre) and the candidate count; ``order`` gets the
    candidate data clusters first, by ascending centre distance (ties by index).

    The pooled heap is filled first from the row's nearest data cluster, then every other cluster
    is checked unsorted against it (``_pool`` stops at its first member that does not enter): the
    kk smallest of a multiset do not depend on the order they are offered in, so ``ub`` is the
    same k-th smallest as a scan of the sorted row; the candidates (~100) are sorted on their own.
    A full sort per row cost O(mt log mt) and was most of level 1 (0.08 s of uniform 3-D 245k on
    2 cores); a partition to the 64 nearest then a sort of those (the previous version) still cost
    ~0.02 s of it."""
    mq, mt = D.shape
    for a in prange(mq):
        if qsize[a] == 0:
            ub[a] = 0.0
            ncand[a] = 0
            continue
        row = D[a]
        near = 0
        for j in range(1, mt):
            if row[j] < row[near]:
                near = j
        heap = np.full(kk, np.inf)
        _pool(heap, kk, rq[a] + row[near], small[near], tsize[near])
        for j in range(mt):
            if j == near:
                continue
            base = rq[a] + row[j]
            if base + small[j, 0] < heap[0]:
                _pool(heap, kk, base, small[j], tsize[j])
        u = heap[0]
        ub[a] = u
        cnt = 0
        for j in range(mt):
            if tsize[j] == 0:
                continue
            lb = row[j] - rq[a] - Rt[j]
            # keep unless the group lower bound clearly exceeds UB (slack for rounding)
            if not (lb > u + rel * (u + row[j] + rq[a] + Rt[j])):
                order[a, cnt] = j
                cnt += 1
        cs = order[a, :cnt].copy()
        co = np.argsort(row[cs], kind="mergesort")  # stable: equal distances by index
        for t in range(cnt):
            order[a, t] = cs[co[t]]
        ncand[a] = cnt


# ----------------------------------------------------------------------------- level 2
@njit(cache=True)
def _suffix_min(v, off, out):
    for a in range(off.shape[0] - 1):
        run = np.inf
        for j in range(off[a + 1] - 1, off[a] - 1, -1):
            run = min(run, v[j])
            out[j] = run


@njit(inline="always")
def _first_inside(mdist, beg, end, limit):
    """First position in [beg, end) of the descending ``mdist`` with value <= limit."""
    lo, hi = beg, end
    while lo < hi:
        mid = (lo + hi) >> 1
        if mdist[mid] > limit:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(inline="always")
def _offer_sorted_new(hd, hi, k, d, ix):
    """``_offer_sorted`` for a list that may already hold ``(d, ix)`` (seeded): a pair already
    present is not inserted twice."""
    if d < hd[k - 1] or (d == hd[k - 1] and ix < hi[k - 1]):
        u = k - 1
        while u > 0 and (hd[u - 1] > d or (hd[u - 1] == d and hi[u - 1] > ix)):
            u -= 1
        if u > 0 and hd[u - 1] == d and hi[u - 1] == ix:
            return False
        for v in range(k - 1, u, -1):
            hd[v] = hd[v - 1]
            hi[v] = hi[v - 1]
        hd[u] = d
        hi[u] = ix
        return True
    return False


@njit(inline="always")
def _offer_copies_new(hd, hi, k, d, t, dup, uoff, uidx):
    """``_offer_sorted_new`` of point ``t`` (a seeded list); with ``dup`` each copy of the unique
    row ``t`` in ascending index, a copy already in the list skipped, stopping at the first copy
    the list refuses (the later ones tie on distance with larger indices)."""
    if not dup:
        return _offer_sorted_new(hd, hi, k, d, t)
    took = False
    for r in range(uoff[t], uoff[t + 1]):
        ix = uidx[r]
        if not (d < hd[k - 1] or (d == hd[k - 1] and ix < hi[k - 1])):
            break
        if _offer_sorted_new(hd, hi, k, d, ix):
            took = True
    return took


@njit(inline="always")
def _octant_gap(flip, g0, g1, g2):
    """Squared distance from a query at offsets ``(g0, g1, g2)`` from a cluster's centre to the
    octant ``own ^ flip`` (``own``: the query's own): the sum of its squared offsets on the flipped
    axes. Every member of that octant lies on the other side of the centre on those axes, so at
    least this far (squared) from the query."""
    gap = 0.0
    if flip & 1:
        gap += g0 * g0
    if flip & 2:
        gap += g1 * g1
    if flip & 4:
        gap += g2 * g2
    return gap


@njit(parallel=True, cache=True)
def _level2(Xs, Q, Lt, LtT, members, mdist, ooff, Rt, qseq, qlab, qdist, candv, sufv, ub, coff, cand, k, parts,
            exclude_self, rel, full, count_only, sorted_k, dup, uoff, uidx, heap_d, heap_i, surv_d, surv_i, woff,
            counts, Xo, seeding, straight, direct, XsT, block, octants):
    """One task per (query, part): part ``s`` of query ``qseq[p]`` visits the candidate clusters
    ``s, s + parts, ...``. ``Xs`` holds the data rows in cluster order (``Xs[i] = X[members[i]]``)
    so a cluster's members are read contiguously. Full filter: the task's k-best list (row ``task``
    of heap_*; a sorted array when ``sorted_k``, else a max-heap) shrinks theta. ``dup``: the rows
    are unique rows whose copies are ``uidx[uoff[t]:uoff[t + 1]]`` (see ``_find_duplicates``);
    the k-best lists hold original indices, the partial filter's survivors unique ones.
    Partial filter: ``count_only`` counts survivors into counts[task]; otherwise they are
    written from ``woff[task]`` into the flat ``surv_*`` (heap_* is then a (ntask, 1) dummy).
    ``direct``: one worker per query, the list is the output row ``heap_*[qi]``. ``straight``: once
    a list is full, bands are read straight from the axis-major ``XsT``; ``seeding``: lists start
    from the previous query's (``Xo`` the data rows by index). Tasks run in blocks of ``block``.
    Each cluster is read as 8 segments (``ooff[8 c + o]``, see ``_level2_one``): with ``octants``
    the members grouped by octant around the centre, and an octant the query's ball (radius
    ``thr``) does not reach is passed over; without, one segment per cluster. ``LtT``: the centres
    by axis in float64 (3 rows, zeros below d = 3), read instead of ``Lt`` up to 3-D."""
    ntask = qseq.shape[0] * parts
    # blocks of consecutive tasks per thread: a seeded query reads its predecessor's finished list
    nblk = (ntask + block - 1) // block
    maxsz = 1
    for c in range((ooff.shape[0] - 1) // 8):
        maxsz = max(maxsz, ooff[8 * c + 8] - ooff[8 * c])
    lt_dim = Lt.shape[1]
    for blk in prange(nblk):
        buf = np.empty(maxsz if straight else 1, np.float32)  # the band's distances
        for task in range(blk * block, min(ntask, (blk + 1) * block)):
            p = task // parts
            s = task - p * parts
            qi = qseq[p]
            q = Q[qi]
            cq = qlab[qi]
            ub_c = ub[cq]
            theta = ub_c
            # the partial filter passes a (1, total) buffer: row 0 keeps the typing uniform
            if direct:
                # one worker per query with a sorted list: the row is the answer, written in place
                # (no copy pass, and each thread first-touches the rows it fills)
                hd = heap_d[qi]
                hi = heap_i[qi]
                for r in range(k):
                    hd[r] = np.inf
                    hi[r] = -1
            else:
                hd = heap_d[task]
                hi = heap_i[task]
            w = 0
            if not full and not count_only:
                w = woff[task]
            ndist = 0
            bq = qdist[qi] * (1.0 + rel)
            # 3-D fast path of the member distances: the query's coordinates held once (13 % of
            # level 2 with the early refusal below, uniform 3-D k = 20)
            dim = q.shape[0]
            q0 = np.float64(q[0]) if dim >= 1 else 0.0
            q1 = np.float64(q[1]) if dim >= 2 else 0.0
            q2 = np.float64(q[2]) if dim >= 3 else 0.0
            seeded = seeding and task > blk * block and qlab[qseq[p - 1]] == cq
            if seeded:
                # the list starts from the previous query's k nearest (and that query itself, a
                # data point in the all-points join): k distinct points, so their k-th distance
                # bounds this query's k-th neighbour distance and prunes from the first cluster on.
                # Same block, so the previous query finished in this thread; queries of a cluster
                # run in Morton order, so it is a near one (its seeds' k-th distance is ~1.5x the
                # final one on uniform 3-D k = 20, median)
                pq = qseq[p - 1]
                pi = heap_i[pq] if direct else heap_i[task - 1]
                for r in range(-1, k):
                    t = pi[r] if r >= 0 else (pq if exclude_self else -1)
                    if t < 0 or (exclude_self and t == qi):
                        continue
                    d = np.float32(_dist2(q, Xo[t]))
                    ndist += 1
                    _offer_sorted(hd, hi, k, d, t)
                if hd[k - 1] < np.inf:
                    theta = min(theta, math.sqrt(np.float64(hd[k - 1])))
            for j in range(coff[cq] + s, coff[cq + 1], parts):
                # cluster tests from the table alone, before the centre distance (see build_cpu):
                # measured 116 -> 24 centre distances per query, level 2 -5..-20 % (uniform 3-D)
                lim = theta * (1.0 + rel) + bq
                if sufv[j] > lim:
                    break  # no later candidate of this list can pass
                if candv[j] > lim:
                    continue
                c = cand[j]
                if lt_dim <= 3:
                    # the centres by axis (zero rows below d = 3 add exact zeros: _dist2's sum in
                    # its order); the same differences place the query's octant
                    g0 = q0 - LtT[0, c]
                    g1 = q1 - LtT[1, c]
                    g2 = q2 - LtT[2, c]
                    a2 = (g0 * g0 + g1 * g1) + g2 * g2
                else:
                    g0 = g1 = g2 = 0.0  # (no octants above 3-D)
                    a2 = _dist2(q, Lt[c])
                a = math.sqrt(a2)
                thr = theta + rel * (theta + a + Rt[c])
                if a - Rt[c] > thr:
                    continue  # the farthest member is already too close to the centre
                own = (g0 >= 0.0) * 1 + (g1 >= 0.0) * 2 + (g2 >= 0.0) * 4 if octants else 0
                for flip in _OCTANT_FLIPS:
                    thr = theta + rel * (theta + a + Rt[c])  # theta may have shrunk in the last octant
                    if octants and _octant_gap(flip, g0, g1, g2) > thr * thr:
                        continue
                    beg = ooff[8 * c + (own ^ flip)]
                    end = ooff[8 * c + (own ^ flip) + 1]
                    if beg == end:
                        continue
                    if straight and hd[k - 1] < np.inf:
                        # a full list (seeded, or after the first cluster): theta is near its final
                        # value, so the whole band |a - b| <= thr is read straight between two binary
                        # searches, its distances in one branch-free pass over the coordinates stored by
                        # axis, then the few under the k-th distance offered. The outward scan below
                        # spends its time on per-member side logic and mispredicted exits; this measured
                        # level 2 -18..-31 % (uniform 3-D 245k, k = 20, with seeds), for ~8 % more
                        # distances (theta is not tightened inside a band)
                        cut = hd[k - 1]
                        i0 = _first_inside(mdist, beg, end, a + thr)
                        stop = _first_inside(mdist, i0, end, a - thr)
                        while stop < end and a - mdist[stop] <= thr:
                            stop += 1
                        x0 = XsT[0]
                        x1 = XsT[1]
                        x2 = XsT[2]
                        for u in range(stop - i0):
                            e0 = q0 - np.float64(x0[i0 + u])
                            e1 = q1 - np.float64(x1[i0 + u])
                            e2 = q2 - np.float64(x2[i0 + u])
                            buf[u] = np.float32((e0 * e0 + e1 * e1) + e2 * e2)
                        ndist += stop - i0
                        for u in range(stop - i0):
                            d = buf[u]
                            if d > cut:
                                continue
                            t = members[i0 + u]
                            if exclude_self and t == qi:
                                ndist -= 1
                                continue
                            # seeds are in the list already: a pair met again is not inserted twice
                            if _offer_copies_new(hd, hi, k, d, t, dup, uoff, uidx):
                                cut = hd[k - 1]
                        theta = min(theta, math.sqrt(np.float64(cut)))
                        continue
                    if full:
                        # outward from the members at the query's own centre distance: the one-landmark
                        # bound |a - b| grows on both sides, so the closest candidates come first, theta
                        # shrinks early, and each side stops at its first member past the bound. The sides
                        # alternate (one member above a, one below) instead of always taking the smaller
                        # gap: that choice mispredicted about every other time, and the fixed alternation
                        # measured 5-22 % faster for ~3 % more distances (skin, uniform 3-D, k = 20)
                        up = _first_inside(mdist, beg, end, a) - 1  # members with b > a, toward larger b
                        down = up + 1  # members with b <= a, toward smaller b
                        go_up = True
                        go_down = True
                        while go_up or go_down:
                            for side in range(2):
                                if side == 0:
                                    if not go_up:
                                        continue
                                    if up < beg or mdist[up] - a > thr:
                                        go_up = False
                                        continue
                                    i = up
                                    up -= 1
                                else:
                                    if not go_down:
                                        continue
                                    if down >= end or a - mdist[down] > thr:
                                        go_down = False
                                        continue
                                    i = down
                                    down += 1
                                # the distance first: most candidates are refused on it alone, before
                                # their index is read (the self pair, at distance 0, is never refused
                                # here, so it is still skipped below without being counted)
                                if dim == 3:
                                    e0 = q0 - np.float64(Xs[i, 0])
                                    e1 = q1 - np.float64(Xs[i, 1])
                                    e2 = q2 - np.float64(Xs[i, 2])
                                    d = np.float32((e0 * e0 + e1 * e1) + e2 * e2)  # _dist2's order
                                else:
                                    d = np.float32(_dist2(q, Xs[i]))
                                if d > (hd[k - 1] if sorted_k else hd[0]):
                                    ndist += 1
                                    continue
                                t = members[i]
                                if exclude_self and t == qi:
                                    continue
                                ndist += 1
                                if seeded:  # never reached with a full seeded list; kept for safety
                                    if not _offer_copies_new(hd, hi, k, d, t, dup, uoff, uidx):
                                        continue
                                elif not _offer_copies(hd, hi, k, d, t, sorted_k, dup, uoff, uidx):
                                    continue
                                kth = hd[k - 1] if sorted_k else hd[0]
                                if kth < np.inf:
                                    th = math.sqrt(np.float64(kth))
                                    if th < theta:
                                        theta = th
                                        thr = theta + rel * (theta + a + Rt[c])
                        continue
                    i = _first_inside(mdist, beg, end, a + thr)
                    while i < end:
                        b = mdist[i]
                        if a - b > thr:
                            break  # every later member is closer to the centre: lower bound grows
                        if b - a > thr:
                            i += 1
                            continue
                        t = members[i]
                        i += 1
                        if exclude_self and t == qi:
                            continue
                        if count_only:
                            ndist += 1
                            continue
                        d = np.float32(_dist2(q, Xs[i - 1]))
                        ndist += 1
                        surv_d[w] = d
                        surv_i[w] = t
                        w += 1
            counts[task] = ndist


@njit(parallel=True, cache=True)
def _octant_order(XsT, Lt, moff, members, mdist, o_members, o_mdist, o_XsT, ooff):
    """Each cluster's members regrouped by octant around its centre (bit a of the octant: the
    member's axis-a coordinate >= the centre's, differences in float64), descending centre distance
    inside an octant (a stable pass over the segment, which is already in that order).
    ``ooff[8 c + o]``: where octant ``o`` of cluster ``c`` starts (``ooff[8 mt]`` = n)."""
    dim = Lt.shape[1]
    mt = moff.shape[0] - 1
    for c in prange(mt):
        beg = moff[c]
        end = moff[c + 1]
        l0 = np.float64(Lt[c, 0]) if dim >= 1 else 0.0
        l1 = np.float64(Lt[c, 1]) if dim >= 2 else 0.0
        l2 = np.float64(Lt[c, 2]) if dim >= 3 else 0.0
        cnt = np.zeros(8, np.int64)
        for i in range(beg, end):
            o = ((np.float64(XsT[0, i]) >= l0) * 1 + (np.float64(XsT[1, i]) >= l1) * 2
                 + (np.float64(XsT[2, i]) >= l2) * 4)
            cnt[o] += 1
        fill = np.empty(8, np.int64)
        at = beg
        for o in range(8):
            ooff[8 * c + o] = at
            fill[o] = at
            at += cnt[o]
        for i in range(beg, end):
            o = ((np.float64(XsT[0, i]) >= l0) * 1 + (np.float64(XsT[1, i]) >= l1) * 2
                 + (np.float64(XsT[2, i]) >= l2) * 4)
            t = fill[o]
            fill[o] += 1
            o_members[t] = members[i]
            o_mdist[t] = mdist[i]
            o_XsT[0, t] = XsT[0, i]
            o_XsT[1, t] = XsT[1, i]
            o_XsT[2, t] = XsT[2, i]
    ooff[8 * mt] = moff[mt]


@njit(parallel=True, cache=True)
def _level2_one(XsT, Q, LtT, members, mdist, ooff, Rt, qseq, qlab, qdist, candv, sufv, ub, coff, cand,
                exclude_self, rel, octants, out_d, out_i, counts):
    """Level 2 for k = 1 (full filter, one worker per query, d <= 3, rows not merged as copies): the
    list is one (distance, index) pair in two scalars, and every candidate cluster is scanned
    outward from the query's own centre distance (sides alternating, as ``_level2``'s outward scan)
    with theta tightened at each new best (``_level2`` at k = 1 keeps the pair in a sorted list of
    one: 7-15 % more level-2 time). Coordinates come from the axis-major ``XsT`` (zero rows below
    d = 3 add exact zeros), the centres from the axis-major float64 ``LtT`` (the same).

    ``octants``: members in the order of ``_octant_order`` (segments ``ooff``); in a candidate
    cluster an octant is scanned only when the query's squared distance to it (the sum, over the
    axes on which the octant lies on the other side of the centre, of the query's squared offset
    from the centre: every member of the octant is at least that far) is within ``thr**2``; the
    query's own octant first, then one, two and three axes away. The one-landmark band is a shell
    around the centre; a query near its nearest neighbour only needs the one or two octants its
    ball touches. Without: one segment per cluster (``ooff[8 c]`` its start, the other seven
    empty at its end), the whole shell. Same result either way: the smallest (distance, index)
    pair, ties by the smaller index, ``-1`` / inf when nothing passes."""
    x0 = XsT[0]
    x1 = XsT[1]
    x2 = XsT[2]
    dim = Q.shape[1]
    for p in prange(qseq.shape[0]):
        qi = qseq[p]
        q = Q[qi]
        q0 = np.float64(q[0]) if dim >= 1 else 0.0
        q1 = np.float64(q[1]) if dim >= 2 else 0.0
        q2 = np.float64(q[2]) if dim >= 3 else 0.0
        cq = qlab[qi]
        theta = ub[cq]
        bq = qdist[qi] * (1.0 + rel)
        best = np.float32(np.inf)
        bi = -1
        nd = 0
        for j in range(coff[cq], coff[cq + 1]):
            lim = theta * (1.0 + rel) + bq
            if sufv[j] > lim:
                break
            if candv[j] > lim:
                continue
            c = cand[j]
            # the centre distance from the axis-major centres (zero rows below d = 3 add exact
            # zeros: _dist2's sum in its order)
            g0 = q0 - LtT[0, c]
            g1 = q1 - LtT[1, c]
            g2 = q2 - LtT[2, c]
            a2 = (g0 * g0 + g1 * g1) + g2 * g2
            # the cluster test a - R > theta + rel (theta + a + R) on squares first: the square
            # root only for the clusters that pass it (10 of 25 centre distances, clustered 3-D)
            w = theta * (1.0 + rel) + Rt[c] * (1.0 + rel)
            if w >= 0.0 and a2 * (1.0 - rel) * (1.0 - rel) > w * w * (1.0 + _SQ_SLACK):
                continue
            a = math.sqrt(a2)
            thr = theta + rel * (theta + a + Rt[c])
            if a - Rt[c] > thr:
                continue
            own = (g0 >= 0.0) * 1 + (g1 >= 0.0) * 2 + (g2 >= 0.0) * 4 if octants else 0
            for flip in _OCTANT_FLIPS:
                if octants and _octant_gap(flip, g0, g1, g2) > thr * thr:
                    continue
                o = own ^ flip
                beg = ooff[8 * c + o]
                end = ooff[8 * c + o + 1]
                if beg == end:
                    continue
                up = _first_inside(mdist, beg, end, a) - 1
                down = up + 1
                go_up = True
                go_down = True
                while go_up or go_down:
                    for side in range(2):
                        if side == 0:
                            if not go_up:
                                continue
                            if up < beg or mdist[up] - a > thr:
                                go_up = False
                                continue
                            i = up
                            up -= 1
                        else:
                            if not go_down:
                                continue
                            if down >= end or a - mdist[down] > thr:
                                go_down = False
                                continue
                            i = down
                            down += 1
                        e0 = q0 - np.float64(x0[i])
                        e1 = q1 - np.float64(x1[i])
                        e2 = q2 - np.float64(x2[i])
                        d = np.float32((e0 * e0 + e1 * e1) + e2 * e2)  # _dist2's order
                        nd += 1
                        if d < best or (d == best and members[i] < bi):
                            t = members[i]
                            if exclude_self and t == qi:
                                nd -= 1  # the self pair is not a distance computation
                                continue
                            best = d
                            bi = t
                            th = math.sqrt(np.float64(d))
                            if th < theta:
                                theta = th
                                thr = theta + rel * (theta + a + Rt[c])
        out_d[qi, 0] = best
        out_i[qi, 0] = bi
        counts[p] = nd


#: the octants of a cluster in the order ``_level2_one`` visits them, as flips of the
#: query's own octant: itself, then one, two and three axes away
_OCTANT_FLIPS = np.array([0, 1, 2, 4, 3, 5, 6, 7], np.int64)
#: relative margin of the squared pre-test of ``_level2_one``: it only skips clusters the
#: exact test (on the square root) skips too
_SQ_SLACK = 1e-9


@njit(parallel=True, cache=True)
def _merge_parts(hd, hi, qseq, parts, k, out_d, out_i):
    none = np.empty(1, np.int64)
    for p in prange(qseq.shape[0]):
        r0 = p * parts
        _sorted_row(hd[r0:r0 + parts].ravel(), hi[r0:r0 + parts].ravel(), k, out_d[qseq[p]], out_i[qseq[p]],
                    False, none, none)


@njit(parallel=True, cache=True)
def _select_partial(sd, si, woff, qseq, parts, k, out_d, out_i, dup, uoff, uidx):
    for p in prange(qseq.shape[0]):
        a = woff[p * parts]
        b = woff[(p + 1) * parts]
        _sorted_row(sd[a:b], si[a:b], k, out_d[qseq[p]], out_i[qseq[p]], dup, uoff, uidx)


@njit(parallel=True, cache=True)
def _expand_unique(ud, ui, inv, out_d, out_i):
    """All-points rows from the unique rows' lists: row ``i`` is the (k + 1)-list of its unique
    row ``inv[i]`` (self included, ordered by (distance, index)) without ``i`` itself, or without
    the last entry when ``i`` is not in it (then ``i`` was a tie past the list)."""
    k = out_d.shape[1]
    for i in prange(inv.shape[0]):
        u = inv[i]
        w = 0
        for t in range(k + 1):
            if ui[u, t] == i:
                continue
            if w == k:
                break
            out_d[i, w] = ud[u, t]
            out_i[i, w] = ui[u, t]
            w += 1


_DUP_MIN_COPIES = 1.0


def _find_duplicates(X, rng):
    """Groups of identical rows of ``X`` when they are common enough to pay, else None.

    Returns ``(U, inv, uoff, uidx)``: the unique rows, the unique row of every original row, and
    the original rows of unique row ``t`` as ``uidx[uoff[t]:uoff[t + 1]]`` (ascending). Rows are
    equal when their float32 bit patterns are (so -0.0 and 0.0 stay apart, which is only a missed
    merge). Gate: ``mean_copies`` (equal pairs in a sample, shared with the GPU twin) estimates the
    mean number of other copies a row has; below ``_DUP_MIN_COPIES`` the grouping (one lexsort,
    ~20-60 ms at 245k x 3) is skipped. On skin (245,057 rows, 51,433 distinct) a row has ~172 other
    copies on average, which the engine would otherwise compute distances to one by one."""
    n = X.shape[0]
    if n < 2 or mean_copies(X, rng) < _DUP_MIN_COPIES:
        return None
    bits = X.view(np.uint32)
    order = np.lexsort(bits.T[::-1])  # stable: equal rows in ascending index
    sb = bits[order]
    new = np.ones(n, bool)
    new[1:] = (sb[1:] != sb[:-1]).any(axis=1)
    starts = np.flatnonzero(new)
    if starts.size == n:
        return None
    inv = np.empty(n, np.int64)
    inv[order] = np.cumsum(new) - 1
    uoff = np.append(starts, n).astype(np.int64)
    return np.ascontiguousarray(X[order[starts]]), inv, uoff, order.astype(np.int64)


# ----------------------------------------------------------------------------- driver
# Landmarks for d <= _STRAT_MAX_DIM (CPU only): a random sample of _STRAT_OVERSAMPLE * count rows in
# Morton order, every _STRAT_OVERSAMPLE-th kept (see _stratified_landmarks)
_STRAT_MAX_DIM = 3
_STRAT_OVERSAMPLE = 16


@njit(cache=True)
def _morton_codes(P, rows):
    """Morton codes (first three coordinates, 1024^3 grid over the rows' bounding box) of ``P[rows]``."""
    s = rows.shape[0]
    nd = min(P.shape[1], 3)
    lo = np.zeros(3)
    sc = np.zeros(3)
    for c in range(nd):
        mn = np.inf
        mx = -np.inf
        for t in range(s):
            v = np.float64(P[rows[t], c])
            mn = min(mn, v)
            mx = max(mx, v)
        lo[c] = mn
        sc[c] = 1023.0 / (mx - mn) if mx > mn else 0.0
    code = np.empty(s, np.int64)
    for t in range(s):
        key = 0
        for c in range(nd):
            key |= _spread_bits(int((np.float64(P[rows[t], c]) - lo[c]) * sc[c])) << c
        code[t] = key
    return code


def _stratified_landmarks(P, count, rng):
    """``count`` distinct row indices (ascending) of ``P`` spread evenly along a Morton curve: a random
    sample of ``_STRAT_OVERSAMPLE * count`` rows sorted by Morton code, one row from the middle of
    each run of ``_STRAT_OVERSAMPLE``.

    The sample follows the density like the paper's random draws, but neighbouring landmarks are
    rarely close together or far apart, so the clusters (Voronoi cells) are rounder and their radii
    smaller: fewer candidate clusters per query and fewer distances at level 2 (uniform 3-D 245k
    k = 1: 151 -> 131 per query), and no O(count^2) spread sums of the ``landmark_trials`` draws
    (~30 ms at 1486 landmarks). Only the speed depends on the landmarks, never the results."""
    n = P.shape[0]
    s = min(n, count * _STRAT_OVERSAMPLE)
    pick = np.sort(rng.choice(n, size=s, replace=False)).astype(np.int64)
    o = np.argsort(_morton_codes(P, pick), kind="stable")
    step = s / count  # >= 1, so the positions below are distinct
    pos = np.minimum((np.arange(count) * step + step / 2).astype(np.int64), s - 1)
    return np.sort(pick[o[pos]])


class _Clusters:
    """Landmarks, assignment and per-cluster tables of one point set. ``stratified``: landmarks by
    ``_stratified_landmarks`` (the CPU engine's choice for d <= 3) instead of the paper's sampling
    (``choose_landmarks``, shared with the GPU engine)."""

    def __init__(self, P, count, trials, rng, stratified=False):
        if stratified:
            self.landmark_ids = _stratified_landmarks(P, count, rng)
        else:
            self.landmark_ids = choose_landmarks(P, count, trials, rng,
                                                 spread_fn=_spread if P.shape[1] <= _SPREAD_LOOP_MAX_DIM else _spread_gemm)
        self.L = np.ascontiguousarray(P[self.landmark_ids])
        self.dist = np.empty(P.shape[0], np.float64)
        if P.shape[1] <= _GRID_ASSIGN_MAX_DIM and _CELL_ASSIGN:
            self.labels = np.empty(P.shape[0], np.int32)
            _assign_cells(P, self.L, self.labels, self.dist)
        else:
            self.labels = _assign(P, self.L)
            _point_centre_dist(P, self.L, self.labels, self.dist)
        self.size = np.bincount(self.labels, minlength=count).astype(np.int64)
        self.radius = np.zeros(count, np.float64)
        np.maximum.at(self.radius, self.labels, self.dist)


@njit(parallel=True, cache=True)
def _cluster_order(labels, dist, moff, members, mdist):
    """``members``: the rows grouped by cluster (offsets ``moff``), by descending centre distance
    inside a cluster, equal distances by index (the order of ``np.lexsort((-dist, labels))``):
    a counting pass by label, then one small stable sort per cluster (3x faster than the lexsort
    of all rows, 0.043 s at 245k)."""
    fill = moff[:-1].copy()
    for i in range(labels.shape[0]):  # stable: rows of a cluster in index order
        members[fill[labels[i]]] = i
        fill[labels[i]] += 1
    for c in prange(moff.shape[0] - 1):
        seg = members[moff[c]:moff[c + 1]].copy()
        o = np.argsort(-dist[seg], kind="mergesort")
        for t in range(seg.shape[0]):
            members[moff[c] + t] = seg[o[t]]
            mdist[moff[c] + t] = dist[seg[o[t]]]


@njit(cache=True)
def _by_label(labels, m):
    """Rows grouped by label, by index inside a group (a stable argsort, by counting)."""
    start = np.zeros(m + 1, np.int64)
    for i in range(labels.shape[0]):
        start[labels[i] + 1] += 1
    for c in range(m):
        start[c + 1] += start[c]
    out = np.empty(labels.shape[0], np.int64)
    for i in range(labels.shape[0]):
        out[start[labels[i]]] = i
        start[labels[i]] += 1
    return out


#: Up to this dimension the landmark sets' spread is summed by the serial loop ``_spread``; above
#: it by a float64 GEMM (30k uniform 64-D: 10 trials of 519 landmarks took ~0.1 s in the loop,
#: most of ``method="auto"``'s decision on the CPU).
_SPREAD_LOOP_MAX_DIM = 8


def _spread_gemm(L):
    """``_spread`` through a float64 GEMM (same sum up to float64 rounding)."""
    L = np.asarray(L, np.float64)
    sq = np.einsum("ij,ij->i", L, L)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * (L @ L.T), 0.0)
    np.fill_diagonal(d2, 0.0)
    return float(np.sqrt(d2).sum()) / 2.0


@njit(cache=True)
def _spread_bits(v):
    """The low 10 bits of v spread to every third bit (Morton interleaving)."""
    v &= 0x3FF
    v = (v | (v << 16)) & 0x30000FF
    v = (v | (v << 8)) & 0x300F00F
    v = (v | (v << 4)) & 0x30C30C3
    v = (v | (v << 2)) & 0x9249249
    return v


@njit(parallel=True, cache=True)
def _morton_within(P, qseq, off):
    """Reorder each label group ``qseq[off[c]:off[c + 1]]`` by the Morton code of its rows (first
    three coordinates on a 1024^3 grid over the bounding box; stable), so that consecutive queries
    of a cluster are near each other and the previous query's neighbours seed a tight bound.
    The codes are computed in row order first (sequential reads), then sorted per group."""
    n, dim = P.shape
    nd = min(dim, 3)
    lo = np.zeros(3)
    sc = np.zeros(3)
    for c in range(nd):
        mn = np.float64(P[0, c]) if n else 0.0
        mx = mn
        for i in range(n):
            v = np.float64(P[i, c])
            mn = min(mn, v)
            mx = max(mx, v)
        lo[c] = mn
        sc[c] = 1023.0 / (mx - mn) if mx > mn else 0.0
    code = np.empty(n, np.int64)
    for i in prange(n):
        key = 0
        for c in range(nd):
            key |= _spread_bits(int((np.float64(P[i, c]) - lo[c]) * sc[c])) << c
        code[i] = key
    for g in prange(off.shape[0] - 1):
        seg = qseq[off[g]:off[g + 1]].copy()
        o = np.argsort(code[seg], kind="mergesort")
        for t in range(seg.shape[0]):
            qseq[off[g] + t] = seg[o[t]]


def build_cpu(X, Q, k, params, seed, all_points):
    """Steps 1-2 (clusters and level 1) on the CPU; returns a dict of tables and timings."""
    rng = np.random.default_rng(seed)
    n, m, dim = X.shape[0], Q.shape[0], X.shape[1]
    times = {}
    t0 = time.perf_counter()
    mt = default_landmarks(params.n_landmarks_data, n, 1, 0)
    mq = mt if all_points else default_landmarks(params.n_landmarks_query, m, 1, 0)
    # the cluster-pair tables (D, order) cost ~16 bytes per pair
    while mq * mt * 16 > _CPU_TABLE_BYTES:
        mq, mt = max(1, int(mq * 0.9)), max(1, int(mt * 0.9))
    strat = dim <= _STRAT_MAX_DIM
    data = _Clusters(X, mt, params.landmark_trials, rng, strat)
    query = data if all_points and params.n_landmarks_query in (None, mt) else \
        _Clusters(Q, mq, params.landmark_trials, rng, strat)
    mq = query.L.shape[0]
    # data clusters contiguous, members by descending distance to the centre
    moff = np.zeros(mt + 1, np.int64)
    np.cumsum(data.size, out=moff[1:])
    members = np.empty(n, np.int64)
    mdist = np.empty(n, np.float64)
    _cluster_order(data.labels, data.dist, moff, members, mdist)
    times["clusters"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    kk = k + (1 if all_points else 0)  # the query itself may be among the pooled points
    small = np.full((mt, kk), np.inf)
    for j in range(mt):  # the kk members closest to each centre, ascending (tail of the segment)
        seg = mdist[moff[j]:moff[j + 1]][::-1][:kk]
        small[j, :seg.size] = seg
    D = np.empty((mq, mt), np.float64)
    _centre_dist(query.L, data.L, D)
    rel = pruning_rel(dim)
    ub = np.empty(mq, np.float64)
    cand_order = np.empty((mq, mt), np.int32)
    ncand = np.empty(mq, np.int64)
    _level1(D, query.radius, query.size, data.radius, small, data.size, kk, rel, ub, cand_order, ncand)
    coff = np.zeros(mq + 1, np.int64)
    np.cumsum(ncand, out=coff[1:])
    cand = np.concatenate([cand_order[a, :ncand[a]] for a in range(mq)]) if mq else np.empty(0, np.int32)
    # pairs surviving level 1: every query times the members of its candidate clusters
    csum = np.concatenate([[0], np.cumsum(data.size[cand])])
    per_cluster = csum[coff[1:]] - csum[coff[:-1]]
    level1_pairs = float((query.size * per_cluster).sum())
    # per candidate entry v = D (1 - rel) - R_t (1 + rel), and its minimum over the rest of the
    # list: level 2 skips a candidate without its centre distance when v - bq (1 + rel) exceeds
    # theta (1 + rel) (bq = the query's distance to its own centre, D - bq <= d(q, centre)), and
    # stops the list when the suffix minimum does
    owner = np.repeat(np.arange(mq), ncand)
    candv = D[owner, cand] * (1.0 - rel) - data.radius[cand] * (1.0 + rel)
    sufv = np.empty_like(candv)
    _suffix_min(candv, coff, sufv)
    times["level1"] = time.perf_counter() - t0
    # thread-to-query remapping: queries grouped by cluster (stable, so by index inside one)
    qseq = _by_label(query.labels, query.L.shape[0])
    qoff = np.zeros(mq + 1, np.int64)
    np.cumsum(query.size, out=qoff[1:])
    return dict(qoff=qoff, members=members, mdist=mdist, moff=moff, Rt=data.radius, Lt=data.L, qlab=query.labels,
                ub=ub, coff=coff, cand=cand.astype(np.int64), qseq=qseq, mq=mq, mt=mt, rel=rel,
                qdist=query.dist, candv=candv, sufv=sufv, level1_pairs=level1_pairs, times=times)


def _choose_parts(params, m, mean_cand):
    if params.parallelism == "query":
        return 1
    want = 1
    threads = get_num_threads()
    if params.parallelism == "split":
        want = params.split_factor or max(2, int(math.ceil(8 * threads / max(1, m))))
    elif m < 8 * threads:
        want = params.split_factor or int(math.ceil(8 * threads / max(1, m)))
    # never more workers than candidate clusters to split
    return int(max(1 if params.parallelism != "split" else 2, min(want, 64, max(1, int(mean_cand)))))


def sweet_cpu(X, Q, k, params, seed, all_points, qsel=None, gate=None, enough=None, hopeless=None):
    """Sweet KNN join on the CPU; ``qsel`` restricts level 2 to some query rows (estimates).
    ``gate=(min_saved, sample[, floor])``: the savings check inside the run, as the GPU twin's
    (``method="auto"``): after level 1 the run goes on when level 1 alone saves ``min_saved``,
    returns ``(None, None, stats)`` when it saves less than ``floor``, and otherwise runs level 2
    on ``sample`` random queries first (reusing this run's clusters and level 1) and goes on or
    returns None by what they save (``_plan.level1_verdict``).
    ``enough`` (with ``qsel``): return ``(None, None, stats)`` before level 2 when level 1 alone
    saves at least this fraction of all queries' distance computations (``stats["early"]``), or,
    with ``hopeless``, less than that fraction.

    All-points joins whose rows repeat often (``_find_duplicates``) run on the distinct rows: each
    distinct row's k + 1 nearest original rows (self included) are found once, every copy offered
    to the k-best lists as its own index, and each original row then takes its distinct row's list
    without itself. Same results; the filters and distances work on the distinct rows only.

    Returns ``(dist, idx, stats)`` for the rows ``qsel`` (all rows when None)."""
    # one BLAS thread: the landmark spreads and the assignment above 8-D are GEMMs, and OpenBLAS's
    # workers kept spinning after each into the Numba regions that follow (clusters phase at 50k x
    # 16, 2 cores: median 0.16 -> 0.10 s, min unchanged; the GEMMs are small)
    with _blas_one_thread():
        return _sweet_cpu(X, Q, k, params, seed, all_points, qsel, gate, enough, hopeless, None)


def _sweet_cpu(X, Q, k, params, seed, all_points, qsel, gate, enough, hopeless, tab):
    """:func:`sweet_cpu`; ``tab``: the clusters and level-1 tables when the caller has them (the
    gate's sample run reuses its run's), else None."""
    t_all = time.perf_counter()
    n, dim = X.shape
    t0 = time.perf_counter()
    dup = _find_duplicates(X, np.random.default_rng([seed, 1])) if all_points and qsel is None else None
    t_dup = time.perf_counter() - t0
    none = np.empty(1, np.int64)
    if dup is None:
        Xr, Qr, k_sel, exclude, uoff, uidx = X, Q, k, bool(all_points), none, none
    else:
        # distinct rows, self kept: the k + 1 list of a distinct row serves every copy of it
        Xr, inv, uoff, uidx = dup
        Qr, k_sel, exclude = Xr, k + 1, False
    if tab is None:
        tab = build_cpu(Xr, Qr, k, params, seed, all_points)
    gate_stats = None
    if gate is not None and qsel is None and Qr.shape[0] >= 4 * int(gate[1]):
        min_saved, sample = float(gate[0]), int(gate[1])
        floor = gate[2] if len(gate) > 2 else None
        saved1 = 1.0 - tab["level1_pairs"] / (float(Qr.shape[0]) * Xr.shape[0])
        verdict = level1_verdict(saved1, min_saved, floor)
        gate_stats = {"min_saved": min_saved, "sample": 0, "saved_estimate": saved1, "passed": verdict is not False}
        if verdict is False:
            gate_stats["level1_floor"] = float(floor)
        elif verdict is None:
            sel = np.sort(np.random.default_rng([seed, 7]).choice(Qr.shape[0], size=sample, replace=False))
            # the sample on this run's tables (the distinct rows' when copies were merged: the same
            # join, so the same fraction), in chunks: it fails as soon as its distance computations
            # pass what ``min_saved`` allows the whole sample, so data the filters cannot help (uniform
            # 16-D: 31-60 % saved of the 90 % asked) stop after a chunk or three
            sub_all = all_points and dup is None
            sub_tab = tab if dup is None else build_cpu(Xr, Qr, k, params, seed, False)
            allowed = (1.0 - min_saved) * float(sample) * Xr.shape[0]
            done, spent = 0, 0.0
            for c in range(0, sample, _GATE_CHUNK):
                part = sel[c:c + _GATE_CHUNK]
                _, _, st = _sweet_cpu(Xr, Qr, k, params, seed, sub_all, part, None, None, None, sub_tab)
                done += part.size
                spent += float(st["distance_computations"])
                if spent > allowed:
                    break
            gate_stats.update(sample=done, saved_estimate=1.0 - spent / (float(done) * Xr.shape[0]),
                              passed=spent <= allowed)
        if not gate_stats["passed"]:
            return None, None, dict(device="cpu", gate=gate_stats, n_landmarks_query=tab["mq"],
                                    n_landmarks_data=tab["mt"], times=dict(tab["times"], total=time.perf_counter() - t_all))
    if (enough is not None or hopeless is not None) and qsel is not None:
        saved1 = 1.0 - tab["level1_pairs"] / (float(Qr.shape[0]) * n)
        if level1_verdict(saved1, enough, hopeless) is not None:
            return None, None, dict(device="cpu", early=True, saved_level1=saved1, saved_level2=0.0,
                                    saved_total=saved1, n_landmarks_query=tab["mq"], n_landmarks_data=tab["mt"],
                                    times=dict(tab["times"], total=time.perf_counter() - t_all))
    filt = choose_filter(params, k, dim, merged=dup is not None)
    qseq = tab["qseq"] if qsel is None else tab["qseq"][np.isin(tab["qseq"], qsel)]
    mrows = Qr.shape[0] if qsel is None else int(np.max(qsel)) + 1
    mean_cand = tab["coff"][-1] / max(1, tab["mq"])
    parts = _choose_parts(params, qseq.size, mean_cand)
    out_d = np.empty((mrows, k_sel), np.float32)
    out_i = np.empty((mrows, k_sel), np.int64)
    t0 = time.perf_counter()
    # one worker per query with a sorted list, written in place; for d <= 3 the straight band
    # scans (coordinates by axis, zero rows below d = 3, which add exact zeros) and, from k = 8,
    # seeds from the previous query (Morton order inside each cluster)
    direct = filt == "full" and parts == 1 and k_sel <= _SORTED_K_MAX
    # (merged copies too: their lists hold original indices, so seeds read the original rows and
    # every copy is offered once; skin all points k = 100: see NOTES_sweet.md)
    straight = direct and dim <= _SEED_MAX_DIM and (dup is None or (_SEED_MERGED and k_sel >= _SEED_MERGED_MIN_K))
    seeding = straight and k_sel >= _SEED_MIN_K
    one = straight and k_sel == 1 and _ONE_PATH
    if seeding:
        _morton_within(Qr, tab["qseq"], tab["qoff"])
        qseq = tab["qseq"] if qsel is None else tab["qseq"][np.isin(tab["qseq"], qsel)]
    # data rows in cluster order: level 2 reads each cluster's members contiguously
    Xs = Xr[tab["members"]]
    XsT = np.zeros((3, Xs.shape[0] if straight else 1), np.float32)
    if straight:
        XsT[:dim] = Xs.T
    # one worker per query in <= 3-D: each cluster's members by octant around its centre
    octants = straight and (_ONE_OCTANTS if one else _DIRECT_OCTANTS)
    t_oct = time.perf_counter()
    Xs, XsT, members, mdist, ooff = _segments(Xr, Xs, XsT, tab, octants)
    if octants:
        tab["times"]["octants"] = time.perf_counter() - t_oct
    LtT = np.zeros((3, tab["Lt"].shape[0]), np.float64)  # the centres by axis, up to 3-D
    LtT[:min(dim, 3)] = tab["Lt"][:, :3].T
    args = (Xs, Qr, tab["Lt"], LtT, members, mdist, ooff, tab["Rt"])
    args2 = (tab["qlab"], tab["qdist"], tab["candv"], tab["sufv"], tab["ub"], tab["coff"], tab["cand"], k_sel, parts, exclude, tab["rel"])
    dupargs = (dup is not None, uoff, uidx)
    noseed = (Xr, 0, 0)
    ndist = 0
    if one:
        counts = np.zeros(qseq.size, np.int64)
        _level2_one(XsT, Qr, LtT, members, mdist, ooff, tab["Rt"], qseq, *args2[:7],
                    exclude, tab["rel"], octants, out_d, out_i, counts)
        ndist += int(counts.sum())
    elif direct:
        counts = np.zeros(qseq.size, np.int64)
        _level2(*args, qseq, *args2, True, False, True, *dupargs, out_d, out_i, out_d[0], out_i[0], counts[:1], counts,
                X if dup is not None else Xr, int(seeding), int(straight), 1, XsT, _SEED_BLOCK, octants)
        ndist += int(counts.sum())
    elif filt == "full":
        # query chunks bound the heap memory (k entries per worker)
        chunk = max(1, (1 << 26) // (k_sel * parts))
        for s in range(0, qseq.size, chunk):
            seq = qseq[s:s + chunk]
            ntask = seq.size * parts
            hd = np.full((ntask, k_sel), np.inf, np.float32)
            hi = np.full((ntask, k_sel), -1, np.int64)
            counts = np.zeros(ntask, np.int64)
            _level2(*args, seq, *args2, True, False, k_sel <= _SORTED_K_MAX, *dupargs, hd, hi, hd[0], hi[0],
                    counts[:1], counts, *noseed, 0, XsT, _SEED_BLOCK, False)
            ndist += int(counts.sum())
            _merge_parts(hd, hi, seq, parts, k_sel, out_d, out_i)
    else:
        s = 0
        while s < qseq.size:
            # count first, then take as many queries as fit the survivor buffer
            seq = qseq[s:s + max(1, _PARTIAL_ENTRIES // max(1, Xr.shape[0] // 64))]
            counts = np.zeros(seq.size * parts, np.int64)
            dummy_d = np.empty((counts.size, 1), np.float32)
            dummy_i = np.empty((counts.size, 1), np.int64)
            _level2(*args, seq, *args2, False, True, False, *dupargs, dummy_d, dummy_i, dummy_d[0], dummy_i[0],
                    counts[:1], counts, *noseed, 0, XsT, _SEED_BLOCK, False)
            per_query = counts.reshape(seq.size, parts).sum(1)
            take = max(1, int(np.searchsorted(np.cumsum(per_query), _PARTIAL_ENTRIES, side="right")))
            seq, counts = seq[:take], counts[:take * parts]
            woff = np.zeros(counts.size + 1, np.int64)
            np.cumsum(counts, out=woff[1:])
            sd = np.empty(max(1, int(woff[-1])), np.float32)
            si = np.empty(max(1, int(woff[-1])), np.int64)
            _level2(*args, seq, *args2, False, False, False, *dupargs, dummy_d[:counts.size], dummy_i[:counts.size],
                    sd, si, woff, counts, *noseed, 0, XsT, _SEED_BLOCK, False)
            ndist += int(counts.sum())
            _select_partial(sd, si, woff, seq, parts, k_sel, out_d, out_i, *dupargs)
            s += take
    if dup is not None:
        ud, ui = out_d, out_i
        out_d = np.empty((n, k), np.float32)
        out_i = np.empty((n, k), np.int64)
        _expand_unique(ud, ui, inv, out_d, out_i)
        qseq = np.arange(n)  # every original row was answered
    t_l2 = time.perf_counter() - t0
    pairs = float(qseq.size) * n
    l1_pairs = tab["level1_pairs"] if qsel is None else _level1_pairs_of(tab, qseq, n)
    times = dict(tab["times"], duplicates=t_dup, level2=t_l2, total=time.perf_counter() - t_all)
    stats = dict(device="cpu", filter=filt, parallelism="query" if parts == 1 else "split", parts=parts,
                 n_landmarks_query=tab["mq"], n_landmarks_data=tab["mt"],
                 saved_level1=1.0 - l1_pairs / pairs if pairs else 0.0,
                 saved_level2=(l1_pairs - ndist) / pairs if pairs else 0.0,
                 saved_total=1.0 - ndist / pairs if pairs else 0.0,
                 distance_computations=ndist, mean_candidate_clusters=float(mean_cand),
                 placement="heap per task (CPU)", distinct_rows=int(Xr.shape[0]) if dup is not None else None,
                 times=times)
    if gate_stats is not None:
        stats["gate"] = gate_stats
    logger.debug("sweet cpu: %s", stats)
    if qsel is not None:
        return out_d[qsel], out_i[qsel], stats
    return out_d, out_i, stats


def _segments(Xr, Xs, XsT, tab, octants):
    """Level 2's view of the data clusters: ``(Xs, XsT, members, mdist, ooff)``, each cluster as 8
    segments ``ooff[8 c + o]``. With ``octants`` (one worker per query, <= 3-D: ``XsT`` holds every
    row) the members regrouped by octant around the centre (``_octant_order``); without, the
    cluster order as it is, one segment per cluster (the other seven empty at its end)."""
    moff = tab["moff"]
    mt = moff.shape[0] - 1
    if not octants:
        ooff = np.repeat(moff[1:], 8)
        ooff[::8] = moff[:-1]
        return Xs, XsT, tab["members"], tab["mdist"], np.append(ooff, moff[-1])
    n_rows = XsT.shape[1]
    o_members, o_mdist = np.empty(n_rows, np.int64), np.empty(n_rows, np.float64)
    o_XsT, ooff = np.empty((3, n_rows), np.float32), np.empty(8 * mt + 1, np.int64)
    _octant_order(XsT, tab["Lt"], moff, tab["members"], tab["mdist"], o_members, o_mdist, o_XsT, ooff)
    return Xr[o_members], o_XsT, o_members, o_mdist, ooff


def _level1_pairs_of(tab, qseq, n):
    sizes = np.diff(tab["moff"])
    coff, cand, qlab = tab["coff"], tab["cand"], tab["qlab"]
    tot = 0.0
    for qi in qseq:
        c = qlab[qi]
        tot += float(sizes[cand[coff[c]:coff[c + 1]]].sum())
    return tot
