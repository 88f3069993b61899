"""RSFK on the CPU (Numba): the twin of ``_gpu.py`` + ``rsfk.cu``.

The tree levels use the same per-position state, the same hash (so the same pivots and projection
signs as the GPU for the same seed, tree and level) and the same partition rule; only the rounding of
the side tests can differ. The leaf update is a plain all-pairs join per leaf into sorted lists (the
atomic / tiles / diagonal variants are a GPU notion: they differ in how warps share the lists, not in
the result, which is the top K of everything offered, ordered by (distance, id)).
"""

import numba
import numpy as np
from numba import prange

from ..._core.jit import Family, chunks, parallel_for
from ...exact._sort_cpu import stable_sort_by_key

# one announcement line for the family's first cold compile (seconds: measured on two cores)
_family = Family("rsfk", "the RSFK forest", seconds=3)
njit = _family.njit
kernel = _family.kernel

__all__ = ["CpuBackend"]

# no 'nnan'/'ninf': +inf marks empty list slots and must compare correctly
_FM = {"reassoc", "contract", "arcp", "nsz"}

_G = np.uint64(0x9E3779B97F4A7C15)
# the splitmix64 finalizer shared with NN-Descent's CPU twin (rsfk.cu's rsfk_mix is the same function)
from ..nndescent._cpu import _mix  # noqa: E402


@njit(cache=True)
def _hash(seed, salt, tree, level, x):
    """rsfk_hash of rsfk.cu (every argument a uint64). A plain call (LLVM inlines it): inlined in
    Numba's IR at each of its call sites it cost half a second of compile."""
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
            # x.(a - b) - ((a + b) / 2).(a - b), the two sums as _split_node forms them (same rounding)
            off = np.float32(0.0)
            for j in range(d):
                off += (X[a, j] - X[b, j]) * (np.float32(0.5) * (X[a, j] + X[b, j]))
            for j in range(d):
                s += X[x, j] * (X[a, j] - X[b, j])
            s -= off
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


# ------------------------------------------------------------------------ whole trees (fast path)
#
# The level kernels above advance every node of a tree by one level per call (three parallel calls
# and a prefix sum per level: the GPU's shape). On a few CPU cores that shape pays the data's full
# sweep per level with poor locality. The functions below grow the same trees node by node instead:
# a node (lo, hi, level) uses the same pivots (hash of seed, tree, level, lo), the same side test,
# the same retry-at-the-next-level rule for a split that leaves a child below ``min_child``, the same
# forced halving past ``force_depth`` and the same stable partition, so the leaves are those of
# ``_engine.build_tree`` on the level kernels (tests/test_rsfk.py checks it). Work: the top of each
# tree breadth first (serial per tree, parallel over trees) until there are enough subtrees to keep
# every core busy, then every subtree depth first (parallel over subtrees), all in one Numba call.

@njit(cache=True, fastmath=_FM)
def _split_node(X, metric, inv_norm, perm, scratch, keys, lo, hi, level, min_child, split, force, seed, tree):
    """Split ``perm[lo:hi]`` in place; returns the first position of the right child, or -1 when the
    sample split is rejected (a child below ``min_child``: the node retries at ``level + 1``)."""
    d = X.shape[1]
    m = hi - lo
    useed, utree, ulevel = np.uint64(seed), np.uint64(tree), np.uint64(level)
    if force:  # past force_depth: random halves by position (as rsfk_partition's mode 1)
        return lo + m // 2
    if split == 1:  # random +-1 projection, stable sort of the node by it, halves at the median
        node = _hash(useed, np.uint64(3), utree, ulevel, np.uint64(lo))
        fkeys = keys.view(np.float32)
        # the node's +-1 direction once (the level kernel rehashes it per point and dimension); the
        # sum adds or subtracts each coordinate exactly as _project does, so the keys are the same
        sign = np.empty(d, np.bool_)
        for j in range(d):
            sign[j] = ((_mix(node + np.uint64(j >> 6)) >> np.uint64(j & 63)) & np.uint64(1)) == np.uint64(1)
        for pos in range(lo, hi):
            x = perm[pos]
            s = np.float32(0.0)
            for j in range(d):
                if sign[j]:
                    s += X[x, j]
                else:
                    s -= X[x, j]
            fkeys[pos] = s
        for pos in range(lo, hi):
            # the driver's _orderable key: the unsigned order of the flipped bits is the float order
            u = keys[pos]
            keys[pos] = u ^ (np.uint32(0xFFFFFFFF) if (u >> np.uint32(31)) == 1 else np.uint32(0x80000000))
        stable_sort_by_key(keys[lo:hi], perm[lo:hi])
        return lo + m // 2
    r1 = _hash(useed, np.uint64(1), utree, ulevel, np.uint64(2 * lo))
    r2 = _hash(useed, np.uint64(1), utree, ulevel, np.uint64(2 * lo + 1))
    pa = np.int64((r1 >> np.uint64(11)) % np.uint64(m))
    pb = np.int64((r2 >> np.uint64(11)) % np.uint64(m - 1))
    if pb >= pa:
        pb += 1
    a = perm[lo + pa]
    b = perm[lo + pb]
    # the hyperplane's normal (and offset) once per node: two flops per dimension and point
    normal = np.empty(d, np.float32)
    off = np.float32(0.0)
    if metric == 0:
        for j in range(d):
            normal[j] = X[a, j] - X[b, j]
        for j in range(d):
            off += (X[a, j] - X[b, j]) * (np.float32(0.5) * (X[a, j] + X[b, j]))
    else:
        ia = inv_norm[a]
        ib = inv_norm[b]
        for j in range(d):
            normal[j] = X[a, j] * ia - X[b, j] * ib
    nright = 0
    for pos in range(lo, hi):
        x = perm[pos]
        s = np.float32(0.0)
        for j in range(d):
            s += X[x, j] * normal[j]
        s -= off
        if s > 0:
            right = 0
        elif s < 0:
            right = 1
        else:  # exact tie: a random side, as _side_sample
            right = np.int32(_hash(useed, np.uint64(2), utree, ulevel, np.uint64(x)) >> np.uint64(63))
        keys[pos] = right
        nright += right
    nleft = m - nright
    if nleft < min_child or nright < min_child:
        return -1
    li = lo
    ri = lo + nleft
    for pos in range(lo, hi):
        if keys[pos]:
            scratch[ri] = perm[pos]
            ri += 1
        else:
            scratch[li] = perm[pos]
            li += 1
    for pos in range(lo, hi):
        perm[pos] = scratch[pos]
    return lo + nleft


@kernel(fastmath=_FM)
def _subtree(X, metric, inv_norm, perm, scratch, keys, head, lo0, hi0, level0, leaf_size, min_child, split,
             force_depth, seed, tree):
    """Grow the subtree of node (lo0, hi0, level0) depth first; marks each leaf's first position in
    ``head`` with its end. Returns the deepest leaf level."""
    stack = np.empty((256, 3), np.int64)
    stack[0, 0] = lo0
    stack[0, 1] = hi0
    stack[0, 2] = level0
    top = 1
    deepest = 0
    while top > 0:
        top -= 1
        lo = stack[top, 0]
        hi = stack[top, 1]
        level = stack[top, 2]
        if hi - lo <= leaf_size:
            head[lo] = hi
            deepest = max(deepest, level)
            continue
        mid = _split_node(X, metric, inv_norm, perm, scratch, keys, lo, hi, level, min_child, split,
                          level >= force_depth, seed, tree)
        if mid < 0:  # rejected: the same node at the next level (new pivots)
            stack[top, 0] = lo
            stack[top, 1] = hi
            stack[top, 2] = level + 1
            top += 1
            continue
        stack[top, 0] = mid
        stack[top, 1] = hi
        stack[top, 2] = level + 1
        stack[top + 1, 0] = lo
        stack[top + 1, 1] = mid
        stack[top + 1, 2] = level + 1
        top += 2
    return deepest


@kernel(fastmath=_FM)
def _grow_top(X, metric, inv_norm, leaf_size, min_child, split, force_depth, seed, tree0, perms, heads,
              scratch, keys, frontier_target, b, fr, nfr, deep):
    """The top of tree ``tree0 + b`` breadth first, into the frontier ``fr[b, :nfr[b]]`` (one task of
    :func:`_grow_trees`)."""
    n = perms.shape[1]
    tree = tree0 + b
    for i in range(n):
        perms[b, i] = i
        heads[b, i] = -1
    # breadth first until the frontier holds frontier_target nodes (each split adds at most one)
    q = np.empty((2 * frontier_target + 4, 3), np.int64)
    q[0, 0] = 0
    q[0, 1] = n
    q[0, 2] = 0
    qh = 0
    qt = 1
    while qh < qt and qt - qh < frontier_target:
        lo = q[qh, 0]
        hi = q[qh, 1]
        level = q[qh, 2]
        qh += 1
        if hi - lo <= leaf_size:
            heads[b, lo] = hi
            deep[b] = max(deep[b], level)
            continue
        mid = _split_node(X, metric, inv_norm, perms[b], scratch[b], keys[b], lo, hi, level, min_child,
                          split, level >= force_depth, seed, tree)
        if qt + 2 > q.shape[0]:  # compact the queue (its head part is consumed)
            for t in range(qt - qh):
                q[t, 0] = q[qh + t, 0]
                q[t, 1] = q[qh + t, 1]
                q[t, 2] = q[qh + t, 2]
            qt -= qh
            qh = 0
        if mid < 0:
            q[qt, 0] = lo
            q[qt, 1] = hi
            q[qt, 2] = level + 1
            qt += 1
        else:
            q[qt, 0] = lo
            q[qt, 1] = mid
            q[qt, 2] = level + 1
            q[qt + 1, 0] = mid
            q[qt + 1, 1] = hi
            q[qt + 1, 2] = level + 1
            qt += 2
    c = 0
    for t in range(qh, qt):
        fr[b, c, 0] = q[t, 0]
        fr[b, c, 1] = q[t, 1]
        fr[b, c, 2] = q[t, 2]
        c += 1
    nfr[b] = c


def _grow_trees(X, metric, inv_norm, leaf_size, min_child, split, force_depth, seed, tree0, perms, heads,
                scratch, keys, levels, frontier_target):
    """Trees ``tree0 .. tree0 + B - 1`` into ``perms[b]`` (points grouped by leaf) and ``heads[b]``
    (``heads[b, lo] = hi`` for each leaf ``perm[lo:hi]``, -1 elsewhere): the tops of the trees in
    parallel over trees, then every frontier subtree in parallel over subtrees."""
    B, n = perms.shape
    fr = np.empty((B, frontier_target + 2, 3), np.int64)
    nfr = np.zeros(B, np.int64)
    deep = np.zeros(B, np.int64)
    parallel_for(lambda b: _grow_top(X, metric, inv_norm, leaf_size, min_child, split, force_depth, seed, tree0,
                                     perms, heads, scratch, keys, frontier_target, b, fr, nfr, deep), B)
    flat = np.array([(b, t) for b in range(B) for t in range(nfr[b])], np.int64).reshape(-1, 2)
    total = flat.shape[0]
    sub_deep = np.zeros(total, np.int64)

    def task(f):   # one subtree per task: they differ in size, tasks balance them
        b, t = int(flat[f, 0]), int(flat[f, 1])
        sub_deep[f] = _subtree(X, metric, inv_norm, perms[b], scratch[b], keys[b], heads[b], fr[b, t, 0], fr[b, t, 1],
                               fr[b, t, 2], leaf_size, min_child, split, force_depth, seed, tree0 + b)

    parallel_for(task, total)
    for f in range(total):
        b = flat[f, 0]
        deep[b] = max(deep[b], sub_deep[f])
    levels[:B] = deep


def _leaf_tiles(X, metric, perm, head, leaf_lo, idx, dist, leaf_size, nchunks):
    """The k-NN set update of one tree with the tiles scheme of w-KNNG reduced to one tile per leaf:
    the leaf's upper-triangle distances into a small block (each pair once), then every row owner
    offers its candidates to its own list. A point is in one leaf per tree, so leaves in parallel
    never touch the same list; the result is the top K by (distance, id) of everything offered, as
    for every GPU variant."""
    parts = chunks(leaf_lo.shape[0], nchunks)
    parallel_for(lambda c: _leaf_chunk(X, metric, perm, head, leaf_lo, idx, dist, leaf_size, parts[c][0], parts[c][1]),
                 len(parts))


@kernel(fastmath=_FM)
def _leaf_chunk(X, metric, perm, head, leaf_lo, idx, dist, leaf_size, leaf0, leaf1):
    """Leaves ``leaf0 .. leaf1 - 1`` of :func:`_leaf_tiles` (one task).

    Each row's offers are merged into its list at once: the leaf's candidates that beat the row's
    worst entry and are not listed yet, sorted by (distance, id), then one merge with the sorted
    list. Same lists as offering them one by one through ``_offer`` (the top K by (distance, id)
    of the distinct ids offered; a listed id is never offered twice, and an id pushed out of a
    list by better ones could not come back), without a K-long shift per accepted offer (leaves
    of ~K points into empty lists accepted nearly every pair: 65 shifts of 64 per row)."""
    K = idx.shape[1]
    n = idx.shape[0]
    block = np.empty((leaf_size, leaf_size), np.float32)
    cd = np.empty(leaf_size, np.float32)
    ci = np.empty(leaf_size, np.int32)
    od = np.empty(K, np.float32)
    oi = np.empty(K, idx.dtype)
    stamp = np.empty(n, np.int32)  # stamp[e] == a: e is in the list of a (row being merged)
    for t in range(n):
        stamp[t] = -1
    for leaf in range(leaf0, leaf1):
        lo = leaf_lo[leaf]
        hi = head[lo]
        m = hi - lo
        for i in range(m):
            a = perm[lo + i]
            block[i, i] = np.inf
            for j in range(i + 1, m):
                dd = _dist(X, a, perm[lo + j], metric)
                block[i, j] = dd
                block[j, i] = dd
        for i in range(m):
            a = perm[lo + i]
            wd = dist[a, K - 1]
            wi = idx[a, K - 1]
            for t in range(K):
                e = idx[a, t]
                if e >= 0:
                    stamp[e] = a
            c = 0
            for j in range(m):
                if j == i:
                    continue
                b = perm[lo + j]
                dd = block[i, j]
                if b == a or stamp[b] == a:
                    continue
                if not (dd < wd or (dd == wd and (wi < 0 or b < wi))):
                    continue
                # insertion into the sorted candidates (distance, id)
                q = c
                while q > 0 and (cd[q - 1] > dd or (cd[q - 1] == dd and ci[q - 1] > b)):
                    cd[q] = cd[q - 1]
                    ci[q] = ci[q - 1]
                    q -= 1
                cd[q] = dd
                ci[q] = b
                c += 1
            if c == 0:
                continue
            p = 0
            q = 0
            for t in range(K):
                take_old = False
                if p < K and idx[a, p] >= 0:
                    if q >= c:
                        take_old = True
                    else:
                        e = idx[a, p]
                        de = dist[a, p]
                        take_old = de < cd[q] or (de == cd[q] and e < ci[q])
                if take_old:
                    od[t] = dist[a, p]
                    oi[t] = idx[a, p]
                    p += 1
                elif q < c:
                    od[t] = cd[q]
                    oi[t] = ci[q]
                    q += 1
                else:
                    od[t] = np.inf
                    oi[t] = -1
            for t in range(K):
                idx[a, t] = oi[t]
                dist[a, t] = od[t]


def _nne_seen(X, metric, idx_old, idx, dist, nchunks):
    """NNE as ``_nne`` (neighbours of neighbours from the snapshot offered to each point's own list;
    the snapshot may be wider than the lists: extra columns are reverse neighbours, -1 skipped),
    computing each distinct candidate of a row once: a per-chunk stamp array marks the ids already
    listed or already offered for the row (a repeat would be refused by ``_offer`` anyway: the list
    only improves)."""
    parts = chunks(idx.shape[0], nchunks)
    parallel_for(lambda c: _nne_rows(X, metric, idx_old, idx, dist, parts[c][0], parts[c][1]), len(parts))


@kernel(fastmath=_FM)
def _nne_rows(X, metric, idx_old, idx, dist, lo, hi):
    """Rows ``lo .. hi - 1`` of :func:`_nne_seen` (one task)."""
    n, K = idx.shape
    W = idx_old.shape[1]
    seen = np.empty(n, np.int32)
    for i in range(n):
        seen[i] = -1
    for i in range(lo, hi):
        seen[i] = i
        for a in range(K):
            j = idx[i, a]
            if j >= 0:
                seen[j] = i
        for a in range(W):
            j = idx_old[i, a]
            if j < 0:
                continue
            for b in range(W):
                cc = idx_old[j, b]
                if cc < 0 or seen[cc] == i:
                    continue
                seen[cc] = i
                dd = _dist(X, i, cc, metric)
                if dd <= dist[i, K - 1]:
                    _offer(idx, dist, i, cc, dd)


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
        heads = np.full(perm.shape[0], -1, np.int32)
        heads[leaf_lo] = leaf_hi
        _leaf_tiles(X, metric, perm, heads, np.asarray(leaf_lo, np.int64), idx, dist, int(leaf_size),
                    64 * numba.get_num_threads())
        return "tiles"

    def nne(self, X, metric, idx, dist, reverse=None):
        """One NNE pass: each point is offered the neighbours of its neighbours in a snapshot of
        ``idx`` (with ``reverse``, an (n, R) array of reverse neighbours padded with -1: of its
        forward and reverse neighbours, both taken from the snapshot extended by ``reverse``)."""
        snap = idx.copy() if reverse is None else np.ascontiguousarray(np.concatenate([idx, reverse], axis=1))
        _nne_seen(X, metric, snap, idx, dist, 16 * numba.get_num_threads())

    # the CPU-only fast path of the forest driver (whole trees per call, several at a time); private
    # so that the twins keep one public surface (tests/test_twins.py)

    def _trees_per_batch(self, n):
        """Trees grown together by :meth:`_build_trees` (one per core; the tree state is ~12n bytes)."""
        return max(1, numba.get_num_threads())

    def _build_trees(self, X, metric, inv_norm, leaf_size, min_child, split, seed, tree0, count, force_depth):
        """Trees ``tree0 .. tree0 + count - 1``: a list of ``(perm, heads, leaf_lo, levels)`` with the
        leaves of ``_engine.build_tree`` (same pivots and rules), ``heads[lo] = hi`` per leaf."""
        n = X.shape[0]
        st = self._tree_state(n, count)
        perms, heads, scratch, keys = (a[:count] for a in st)
        levels = np.zeros(count, np.int64)
        target = 16 * max(1, numba.get_num_threads())
        _grow_trees(X, metric, inv_norm, leaf_size, min_child, 1 if split == "projection" else 0, force_depth,
                    seed, tree0, perms, heads, scratch, keys, levels, target)
        return [(perms[b], heads[b], np.flatnonzero(heads[b] >= 0), int(levels[b])) for b in range(count)]

    def _tree_state(self, n, count):
        # kept between batches of one run (no per-tree reallocation)
        st = getattr(self, "_state", None)
        if st is None or st[0].shape[1] != n or st[0].shape[0] < count:
            st = (np.empty((count, n), np.int32), np.empty((count, n), np.int32),
                  np.empty((count, n), np.int32), np.empty((count, n), np.uint32))
            self._state = st
        return st

    def _leaf_update_heads(self, X, metric, perm, heads, leaf_lo, idx, dist, leaf_size):
        _leaf_tiles(X, metric, perm, heads, leaf_lo, idx, dist, leaf_size, 64 * numba.get_num_threads())
        return "tiles"

    def fill(self, X, metric, idx, dist):
        _fill(X, metric, idx, dist)
