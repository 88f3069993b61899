"""Random-projection forest initialisation of the CPU NN-Descent (as PyNNDescent does): a tree's
leaf order renumbers the points so that neighbours sit close in memory, and a few trees give
NN-Descent a far better start than random lists. (RSFK, ``graph/rsfk``, is the forest method of
the papers; measured as an initialisation it is slower on the CPU, see ``NOTES_rsfk.md``.)"""

import numba
import numpy as np
from numba import njit, prange

from ._cpu import METRIC_CODES, _FM, _below, _dist, _insert, _next, _seed3

__all__ = ["rp_order", "rp_forest_init"]


@njit(cache=True, fastmath=_FM)
def _rp_tree(X, metric, leaf_size, seed, tree, perm, leaf_lo, leaf_hi):
    """One random-projection tree: split by the bisecting hyperplane of two random members
    (angular version for inner products) until segments hold <= leaf_size points. Fills
    ``perm`` (points grouped by leaf) and the leaf bounds; returns the number of leaves."""
    n, d = X.shape
    for i in range(n):
        perm[i] = i
    stack_lo = np.empty(128, np.int64)
    stack_hi = np.empty(128, np.int64)
    top = 0
    stack_lo[0] = 0
    stack_hi[0] = n
    top = 1
    nleaves = 0
    normal = np.empty(d, np.float32)
    side = np.empty(n, np.uint8)
    st = _seed3(seed, tree, 0x5EED)
    while top > 0:
        top -= 1
        lo = stack_lo[top]
        hi = stack_hi[top]
        m = hi - lo
        if m <= leaf_size or top >= 126:
            leaf_lo[nleaves] = lo
            leaf_hi[nleaves] = hi
            nleaves += 1
            continue
        st, r = _next(st)
        a = perm[lo + _below(r, m)]
        st, r = _next(st)
        b = perm[lo + _below(r, m - 1)]
        if b == a:
            b = perm[hi - 1]
        off = np.float32(0.0)
        if metric == 1:
            na = np.float32(0.0)
            nb = np.float32(0.0)
            for j in range(d):
                na += X[a, j] * X[a, j]
                nb += X[b, j] * X[b, j]
            na = np.float32(1.0) / np.sqrt(max(na, np.float32(1e-30)))
            nb = np.float32(1.0) / np.sqrt(max(nb, np.float32(1e-30)))
            for j in range(d):
                normal[j] = X[a, j] * na - X[b, j] * nb
        else:
            for j in range(d):
                normal[j] = X[a, j] - X[b, j]
                off += normal[j] * (X[a, j] + X[b, j]) * np.float32(0.5)
        nleft = 0
        for i in range(lo, hi):
            q = perm[i]
            s = np.float32(0.0)
            for j in range(d):
                s += X[q, j] * normal[j]
            s -= off
            if s == 0:
                st, r = _next(st)
                left = (r >> np.uint64(63)) == np.uint64(0)
            else:
                left = s < 0
            side[i - lo] = 1 if left else 0
            nleft += 1 if left else 0
        if nleft == 0 or nleft == m:
            # degenerate (duplicates or a flat direction): split at random into halves
            for i in range(m):
                side[i] = 1 if i < m // 2 else 0
            nleft = m // 2
        # stable partition through a scratch copy of the segment
        tmp = perm[lo:hi].copy()
        li = lo
        ri = lo + nleft
        for i in range(m):
            if side[i]:
                perm[li] = tmp[i]
                li += 1
            else:
                perm[ri] = tmp[i]
                ri += 1
        stack_lo[top] = lo
        stack_hi[top] = lo + nleft
        top += 1
        stack_lo[top] = lo + nleft
        stack_hi[top] = hi
        top += 1
    return nleaves


@njit(parallel=True, cache=True)
def _rp_trees(X, metric, leaf_size, seed, t0, perms, leaf_lo, leaf_hi, nleaves):
    for t in prange(perms.shape[0]):
        nleaves[t] = _rp_tree(X, metric, leaf_size, seed, t0 + t, perms[t], leaf_lo[t], leaf_hi[t])


@njit(parallel=True, cache=True, fastmath=_FM)
def _leaf_join(X, metric, perm, leaf_lo, leaf_hi, nleaves, ind, dist, flag):
    """All pairs inside each leaf of one tree; a point is in one leaf, so leaves are
    independent and the parallel inserts never touch the same list."""
    for l in prange(nleaves):
        lo = leaf_lo[l]
        hi = leaf_hi[l]
        for i in range(lo, hi):
            a = perm[i]
            for j in range(i + 1, hi):
                b = perm[j]
                d = _dist(X, a, b, metric)
                if d < dist[a, ind.shape[1] - 1]:
                    _insert(ind, dist, flag, a, b, d)
                if d < dist[b, ind.shape[1] - 1]:
                    _insert(ind, dist, flag, b, a, d)


def rp_order(X, *, metric="l2", leaf_size=24, seed=0):
    """The leaf order of one random-projection tree: a permutation that puts near points at
    near positions (renumbering the data by it makes NN-Descent's memory accesses local)."""
    X = np.ascontiguousarray(X, dtype=np.float32)
    n = X.shape[0]
    perms = np.empty((1, n), np.int32)
    lo = np.empty((1, n), np.int64)
    hi = np.empty((1, n), np.int64)
    nl = np.empty(1, np.int64)
    _rp_trees(X, METRIC_CODES[metric], int(max(2, leaf_size)), (int(seed) + 17) & 0x7FFFFFFFFFFFFFFF, 0,
              perms, lo, hi, nl)
    return perms[0]


def rp_forest_init(X, K, *, metric="l2", n_trees=None, leaf_size=None, seed=0, return_order=False):
    """Initial lists from a forest of random-projection trees (all pairs within each leaf), as
    PyNNDescent does: far better than random lists, so NN-Descent needs fewer iterations.

    Returns ``(indices int32 (n, K), distances float32 (n, K))`` with ``-1``/``inf`` where a
    list is not full (NN-Descent tops those up at random), and with ``return_order`` the leaf
    order of the first tree (a permutation that puts near points at near positions).
    """
    X = np.ascontiguousarray(X, dtype=np.float32)
    n = X.shape[0]
    if n_trees is None:
        n_trees = max(3, min(8, int(round(2.0 * np.log10(max(n, 10))))))
    if leaf_size is None:
        leaf_size = max(K + 2, 24)
        # bigger leaves already give each point more candidates: fewer trees for the same cost
        n_trees = max(2, int(round(n_trees * 24 / leaf_size)))
    leaf_size = int(min(max(leaf_size, 2), max(n, 2)))
    n_trees = int(n_trees)
    mcode = METRIC_CODES[metric]
    seed = int(seed) & 0x7FFFFFFFFFFFFFFF
    ind = np.full((n, K), -1, np.int32)
    dist = np.full((n, K), np.inf, np.float32)
    flag = np.ones((n, K), np.uint8)
    # trees are built a thread-count batch at a time (in parallel), then joined: memory stays
    # at batch * n * 20 bytes however many trees there are
    batch = max(1, min(n_trees, numba.get_num_threads()))
    perms = np.empty((batch, n), np.int32)
    leaf_lo = np.empty((batch, n), np.int64)  # a leaf holds >= 1 point: at most n leaves
    leaf_hi = np.empty((batch, n), np.int64)
    nleaves = np.empty(batch, np.int64)
    first = None
    for t0 in range(0, n_trees, batch):
        nb = min(batch, n_trees - t0)
        _rp_trees(X, mcode, leaf_size, seed, t0, perms[:nb], leaf_lo[:nb], leaf_hi[:nb], nleaves[:nb])
        if first is None:
            first = perms[0].copy()
        for t in range(nb):
            _leaf_join(X, mcode, perms[t], leaf_lo[t], leaf_hi[t], nleaves[t], ind, dist, flag)
    if return_order:
        return ind, dist, first
    return ind, dist
