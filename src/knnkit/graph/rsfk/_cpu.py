"""RSFK on the CPU (Numba): the twin of ``_gpu.py`` + ``rsfk.cu``.

The tree levels use the same per-position state, the same hash (so the same pivots and projection
signs as the GPU for the same seed, tree and level) and the same partition rule; only the rounding of
the side tests can differ. The leaf update is a plain all-pairs join per leaf into sorted lists (the
atomic / tiles / diagonal variants are a GPU notion: they differ in how warps share the lists, not in
the result, which is the top K of everything offered, ordered by (distance, id)).
"""

import numpy as np
from numba import njit, prange

__all__ = ["CpuBackend"]

# no 'nnan'/'ninf': +inf marks empty list slots and must compare correctly
_FM = {"reassoc", "contract", "arcp", "nsz"}

_G = np.uint64(0x9E3779B97F4A7C15)
# the splitmix64 finalizer shared with NN-Descent's CPU twin (rsfk.cu's rsfk_mix is the same function)
from ..nndescent._cpu import _mix  # noqa: E402


@njit(cache=True, inline="always")
def _hash(seed, salt, tree, level, x):
    """rsfk_hash of rsfk.cu (every argument a uint64)."""
    h = _mix(seed + _G)
    h = _mix(h + salt + _G)
    h = _mix(h + tree + _G)
    h = _mix(h + level + _G)
    return _mix(h + x + _G)


@njit(cache=True, fastmath=_FM, inline="always")
def _dist(X, a, b, metric):
    acc = np.float32(0.0)
    if metric == 0:
        for j in range(X.shape[1]):
            t = X[a, j] - X[b, j]
            acc += t * t
        return acc
    for j in range(X.shape[1]):
        acc += X[a, j] * X[b, j]
    return -acc


@njit(cache=True, inline="always")
def _offer(idx, dist, a, b, d):
    """Insert (b, d) into the sorted list of a (order (distance, id), -1 last, no duplicate id);
    rsfk_warp_offer of rsfk.cu. Returns 1 when the list changed."""
    K = idx.shape[1]
    if b < 0 or b == a:  # never self (as rsfk_warp_offer)
        return 0
    wd = dist[a, K - 1]
    wi = idx[a, K - 1]
    if not (d < wd or (d == wd and (wi < 0 or b < wi))):
        return 0
    pos = 0
    for j in range(K):
        e = idx[a, j]
        if e == b:
            return 0
        if e >= 0 and (dist[a, j] < d or (dist[a, j] == d and e < b)):
            pos += 1
    for j in range(K - 1, pos, -1):
        idx[a, j] = idx[a, j - 1]
        dist[a, j] = dist[a, j - 1]
    idx[a, pos] = b
    dist[a, pos] = d
    return 1


# ------------------------------------------------------------------------------------------ trees

@njit(parallel=True, cache=True, fastmath=_FM)
def _side_sample(X, metric, inv_norm, perm, seg_lo, seg_hi, leaf_size, seed, tree, level, side):
    n, d = X.shape
    useed, utree, ulevel = np.uint64(seed), np.uint64(tree), np.uint64(level)
    for pos in prange(n):
        lo = seg_lo[pos]
        m = seg_hi[pos] - lo
        if m <= leaf_size:
            side[pos] = 0
            continue
        r1 = _hash(useed, np.uint64(1), utree, ulevel, np.uint64(2 * lo))
        r2 = _hash(useed, np.uint64(1), utree, ulevel, np.uint64(2 * lo + 1))
        pa = np.int64((r1 >> np.uint64(11)) % np.uint64(m))
        pb = np.int64((r2 >> np.uint64(11)) % np.uint64(m - 1))
        if pb >= pa:
            pb += 1
        a = perm[lo + pa]
        b = perm[lo + pb]
        x = perm[pos]
        s = np.float32(0.0)
        if metric == 0:
            for j in range(d):
                s += (X[x, j] - np.float32(0.5) * (X[a, j] + X[b, j])) * (X[a, j] - X[b, j])
        else:
            ia = inv_norm[a]
            ib = inv_norm[b]
            for j in range(d):
                s += X[x, j] * (X[a, j] * ia - X[b, j] * ib)
        if s > 0:
            side[pos] = 0
        elif s < 0:
            side[pos] = 1
        else:  # exact tie (duplicates of a pivot, identical pivots): a random side
            side[pos] = np.int32(_hash(useed, np.uint64(2), utree, ulevel, np.uint64(x)) >> np.uint64(63))


@njit(parallel=True, cache=True, fastmath=_FM)
def _project(X, perm, seg_lo, seg_hi, leaf_size, seed, tree, level, proj):
    n, d = X.shape
    for pos in prange(n):
        lo = seg_lo[pos]
        if seg_hi[pos] - lo <= leaf_size:
            proj[pos] = 0.0
            continue
        node = _hash(np.uint64(seed), np.uint64(3), np.uint64(tree), np.uint64(level), np.uint64(lo))
        x = perm[pos]
        s = np.float32(0.0)
        for j in range(d):
            bits = _mix(node + np.uint64(j >> 6))
            if (bits >> np.uint64(j & 63)) & np.uint64(1):
                s += X[x, j]
            else:
                s -= X[x, j]
        proj[pos] = s


@njit(parallel=True, cache=True)
def _partition(perm, seg_lo, seg_hi, side, cum_right, leaf_size, min_child, mode, force_balanced,
               out_perm, out_lo, out_hi):
    """rsfk_partition of rsfk.cu (one iteration per position)."""
    for pos in prange(perm.shape[0]):
        _partition_one(pos, perm, seg_lo, seg_hi, side, cum_right, leaf_size, min_child, mode, force_balanced,
                       out_perm, out_lo, out_hi)


@njit(cache=True)
def _partition_one(pos, perm, seg_lo, seg_hi, side, cum_right, leaf_size, min_child, mode, force_balanced,
                   out_perm, out_lo, out_hi):
    # a function of its own: written inline in the prange body, Numba (0.6x) mis-handled the
    # branch-assigned locals and wrote wrong node bounds (the same code run as py_func was right)
    lo = np.int64(seg_lo[pos])
    hi = np.int64(seg_hi[pos])
    m = hi - lo
    dest = np.int64(pos)
    nlo = lo
    nhi = hi
    if m > leaf_size:
        if mode == 1 or force_balanced:
            mid = lo + m // 2
            if pos < mid:
                nhi = mid
            else:
                nlo = mid
        else:
            nright = np.int64(cum_right[hi] - cum_right[lo])
            nleft = m - nright
            if nleft >= min_child and nright >= min_child:
                r = np.int64(cum_right[pos] - cum_right[lo])
                if side[pos]:
                    dest = lo + nleft + r
                    nlo = lo + nleft
                else:
                    dest = pos - r
                    nhi = lo + nleft
    out_perm[dest] = perm[pos]
    out_lo[dest] = nlo
    out_hi[dest] = nhi


# ------------------------------------------------------------------------------- leaves and passes

@njit(parallel=True, cache=True, fastmath=_FM)
def _leaf_join(X, metric, perm, leaf_lo, leaf_hi, idx, dist):
    """All pairs of every leaf offered to both lists; a point is in one leaf per tree, so the leaves
    are independent and the parallel offers never touch the same list."""
    K = idx.shape[1]
    for leaf in prange(leaf_lo.shape[0]):
        lo = leaf_lo[leaf]
        hi = leaf_hi[leaf]
        for i in range(lo, hi):
            a = perm[i]
            for j in range(i + 1, hi):
                b = perm[j]
                d = _dist(X, a, b, metric)
                if d <= dist[a, K - 1]:
                    _offer(idx, dist, a, b, d)
                if d <= dist[b, K - 1]:
                    _offer(idx, dist, b, a, d)


@njit(parallel=True, cache=True, fastmath=_FM)
def _nne(X, metric, idx_old, idx, dist, rows):
    """Neighbours of neighbours (from the snapshot ``idx_old``) offered to the lists of ``rows``."""
    K = idx.shape[1]
    for t in prange(rows.shape[0]):
        i = rows[t]
        for a in range(K):
            j = idx_old[i, a]
            if j < 0:
                break
            for b in range(K):
                c = idx_old[j, b]
                if c < 0 or c == i:
                    continue
                known = False
                for q in range(K):
                    if idx[i, q] == c:
                        known = True
                        break
                if known:
                    continue
                _offer(idx, dist, i, c, _dist(X, i, c, metric))


@njit(parallel=True, cache=True, fastmath=_FM)
def _fill(X, metric, idx, dist):
    n = X.shape[0]
    K = idx.shape[1]
    tries = min(n - 1, 2 * K)
    for i in prange(n):
        t = 1
        while t <= tries and idx[i, K - 1] < 0:
            c = (i + t) % n
            _offer(idx, dist, i, c, _dist(X, i, c, metric))
            t += 1


class CpuBackend:
    """The array operations the forest driver needs, on the host."""

    xp = np
    name = "cpu"

    def sync(self):
        pass

    def inv_norms(self, X):
        nrm = np.sqrt(np.einsum("ij,ij->i", X, X, dtype=np.float64))
        return (1.0 / np.maximum(nrm, 1e-30)).astype(np.float32)

    def side_sample(self, X, metric, inv_norm, perm, lo, hi, leaf_size, seed, tree, level, side):
        _side_sample(X, metric, inv_norm, perm, lo, hi, leaf_size, seed, tree, level, side)

    def project(self, X, perm, lo, hi, leaf_size, seed, tree, level, proj):
        _project(X, perm, lo, hi, leaf_size, seed, tree, level, proj)

    def argsort(self, key):
        return np.argsort(key, kind="stable")

    def partition(self, perm, lo, hi, side, cum, leaf_size, min_child, mode, force, out_perm, out_lo, out_hi):
        _partition(perm, lo, hi, side, cum, leaf_size, min_child, mode, bool(force), out_perm, out_lo, out_hi)

    def new_lists(self, n, K):
        return np.full((n, K), -1, np.int32), np.full((n, K), np.inf, np.float32)

    def leaf_update(self, X, metric, perm, leaf_lo, leaf_hi, idx, dist, variant, leaf_size):
        # variant: the CPU has one (the GPU variants give the same lists)
        _leaf_join(X, metric, perm, leaf_lo, leaf_hi, idx, dist)
        return "join"

    def nne(self, X, metric, idx, dist):
        _nne(X, metric, idx.copy(), idx, dist, np.arange(X.shape[0], dtype=np.int64))

    def fill(self, X, metric, idx, dist):
        _fill(X, metric, idx, dist)
