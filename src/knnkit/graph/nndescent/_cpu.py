"""NN-Descent on the CPU (Numba), with the GNND semantics of Wang, Zhao & Zeng,
"Large-Scale Approximate k-NN Graph Construction on GPU", section 4.

This is the no-GPU path of :func:`knnkit.knn_graph` and the reference the GPU kernels are
tested against, so it follows the same contract as ``nndescent_gpu``:

* every list holds ``K`` neighbours sorted ascending (ties: smaller id first), no self, no
  duplicates; ``-1`` / ``inf`` only when a list cannot be filled (n - 1 < K);
* per iteration each node samples its first ``p`` NEW and first ``p`` OLD neighbours
  (section 4.1: "the first p objects"); sampled NEW ones become OLD; reverse neighbours are
  appended up to ``2p`` per list (a uniform reservoir sample, standing in for the GPU's
  racing atomic appends);
* the local join compares NEW-NEW and NEW-OLD pairs of each node; ``update="basic"`` offers
  every compared pair to both lists (classic NN-Descent), ``update="selective"`` offers only
  the nearest NEW and nearest OLD object of each NEW sample and the nearest NEW object of
  each OLD sample (Algorithm 2);
* ``split=s`` (graph merge, section 5.1) compares only cross pairs (one id < s, other >= s);
* stop after ``max_iters`` or when an iteration makes fewer than ``delta * n * K`` updates.

How the CPU version is organised (why, mostly for speed on few cores): nodes are processed
in blocks. Within a block the join runs in parallel and only *reads* the graph, writing the
candidate updates into a per-node buffer; the buffer is then applied in parallel with each
thread owning the lists ``v % n_threads == t``. So there are no locks, and the result does
not depend on the number of threads or on scheduling: a run is repeatable from ``seed``.
Random numbers come from a counter-based hash (splitmix64) of (seed, node, iteration) for
the same reason.
"""

import time

import numba
import numpy as np
from numba import prange

from ..._core.config import finish, logger, progress
from ..._core.jit import Family, chunks, num_threads, parallel_for
from ..._core.prefetch import cache_hint

# one announcement line for the family's first cold compile (seconds: measured on two cores)
_family = Family("nndescent", "NN-Descent", seconds=2)
njit = _family.njit
kernel = _family.kernel

__all__ = [
    "nndescent_cpu",
    "exact_graph_cpu",
    "METRIC_CODES",
    "pairwise_distances",
    "row_distances",
    "merge_rows",
]

METRIC_CODES = {"l2": 0, "ip": 1, "l1": 2}

# Reassociation lets LLVM vectorise the distance loops; no 'nnan'/'ninf' because inf marks
# empty list slots and must compare correctly.
_FM = {"reassoc", "contract", "arcp", "nsz"}

_U1 = np.uint64(0x9E3779B97F4A7C15)
_U2 = np.uint64(0xBF58476D1CE4E5B9)
_U3 = np.uint64(0x94D049BB133111EB)


# The counter-based hash helpers are plain calls (LLVM inlines them): inlined in Numba's IR at each
# call site they cost compile time at every kernel that draws random numbers.
@njit(cache=True)
def _mix(x):
    x = (x ^ (x >> np.uint64(30))) * _U2
    x = (x ^ (x >> np.uint64(27))) * _U3
    return x ^ (x >> np.uint64(31))


@njit(cache=True)
def _seed3(seed, a, b):
    return _mix(_mix(_mix(np.uint64(seed) + _U1) + np.uint64(a) + _U1) + np.uint64(b))


@njit(cache=True)
def _next(state):
    state = state + _U1
    return state, _mix(state)


@njit(cache=True)
def _below(r, m):
    """Uniform-ish integer in [0, m) from a 64-bit random word."""
    return np.int64((r >> np.uint64(11)) % np.uint64(m))


# llvm.prefetch where this LLVM compiles it, else a no-op (knnkit._core.prefetch); chosen before
# any kernel below compiles
_prefetch = cache_hint()


@njit(cache=True, inline="always")
def _prefetch_samples(X, ind, dist, new_c, new_n, old_c, old_n, s):
    """Prefetch what the join of node ``s`` reads of each sample: its vector, its list's worst
    distance and its id list. The samples are scattered rows (in DRAM or L3 when their node's join
    starts); issued one node ahead, the misses overlap with the current node's distances instead of
    stalling them. Measured on one block of the join (cold caches), tight_c10000 K 96: 61 -> 48 ms,
    uniform_d32 K 48: 46 -> 42 ms."""
    dim = X.shape[1]
    K = ind.shape[1]
    nn = new_n[s]
    for q in range(nn + old_n[s]):
        v = new_c[s, q] if q < nn else old_c[s, q - nn]
        for k in range(0, dim, 16):   # 16 float32 / int32 per 64-byte line
            _prefetch(X, v, k)
        _prefetch(dist, v, K - 1)
        for k in range(0, K, 16):
            _prefetch(ind, v, k)


@njit(cache=True, fastmath=_FM)
def _dist(X, a, b, metric):
    d = X.shape[1]
    acc = np.float32(0.0)
    if metric == 0:
        for i in range(d):
            t = X[a, i] - X[b, i]
            acc += t * t
    elif metric == 1:
        for i in range(d):
            acc += X[a, i] * X[b, i]
        acc = -acc
    else:
        for i in range(d):
            acc += abs(X[a, i] - X[b, i])
    return acc


@njit(cache=True, fastmath=_FM)
def _dist2(X, a, b0, b1, metric):
    """``(_dist(X, a, b0, metric), _dist(X, a, b1, metric))`` in one pass: ``a``'s row is loaded once
    for both and the two sums overlap. The values equal ``_dist``'s up to the order of the sum
    (``reassoc``: LLVM picks the vector width and interleave): bit-identical where it vectorises one
    reduction and two alike (the AVX-512 machines of earlier sessions), a few ulps apart where it
    does not (AMD EPYC without AVX-512, twenty-sixth session); each sum does not depend on the other
    pair. ``tests/test_nndescent_cpu_join.py`` checks both. (Four at once were 1.2x, but LLVM
    lowered the interleave there too.)"""
    d = X.shape[1]
    c0 = np.float32(0.0)
    c1 = np.float32(0.0)
    if metric == 0:
        for i in range(d):
            xa = X[a, i]
            t0 = xa - X[b0, i]
            t1 = xa - X[b1, i]
            c0 += t0 * t0
            c1 += t1 * t1
    elif metric == 1:
        for i in range(d):
            xa = X[a, i]
            c0 += xa * X[b0, i]
            c1 += xa * X[b1, i]
        c0 = -c0
        c1 = -c1
    else:
        for i in range(d):
            xa = X[a, i]
            c0 += abs(xa - X[b0, i])
            c1 += abs(xa - X[b1, i])
    return c0, c1


@njit(cache=True)
def _dist_row(X, a, ids, lo, hi, out, metric):
    """``out[j] = _dist(X, a, ids[j], metric)`` for ``j`` in ``lo .. hi - 1`` (two at a time)."""
    j = lo
    while j + 1 < hi:
        out[j], out[j + 1] = _dist2(X, a, ids[j], ids[j + 1], metric)
        j += 2
    if j < hi:
        out[j] = _dist(X, a, ids[j], metric)


@njit(cache=True, inline="always")
def _listed(ind, a, b):
    """Whether ``b`` is in the list of ``a``. No early exit: LLVM vectorises the branch-free count,
    and the early exit saved little (on tight clusters, 100k x 64 with K 64, almost every offered
    pair passes the distance test and is already listed: 65M offers, 6 inserts in the last round;
    the early-exit scan made the apply step twice the cost of the join)."""
    # compared and counted in int32 (ids fit; ``b`` arrives as int64): an int64 compare would widen
    # each id and fill half as many vector lanes
    bb = np.int32(b)
    hit = np.int32(0)
    for j in range(ind.shape[1]):
        hit += np.int32(ind[a, j] == bb)
    return hit > 0


@njit(cache=True, inline="always")
def _insert(ind, dist, flag, a, b, d):
    """Insert (b, d) into the sorted list of a; 1 when the list changed."""
    K = ind.shape[1]
    w = dist[a, K - 1]
    # ties with the worst entry: the smaller id wins, so results do not depend on order
    if not (d < w or (d == w and (ind[a, K - 1] < 0 or b < ind[a, K - 1]))):
        return 0
    if _listed(ind, a, b):
        return 0
    pos = K - 1
    while pos > 0 and (dist[a, pos - 1] > d or (dist[a, pos - 1] == d and
                                                 (ind[a, pos - 1] > b or ind[a, pos - 1] < 0))):
        ind[a, pos] = ind[a, pos - 1]
        dist[a, pos] = dist[a, pos - 1]
        flag[a, pos] = flag[a, pos - 1]
        pos -= 1
    ind[a, pos] = b
    dist[a, pos] = d
    flag[a, pos] = 1
    return 1


@njit(cache=True)
def _insert_call(ind, dist, flag, a, b, d):
    """:func:`_insert` as a plain call (int64 ids): the kernels with several insert sites call this
    one copy instead of inlining ``_insert`` in Numba's IR at each (compile time)."""
    return _insert(ind, dist, flag, a, b, d)


# ----------------------------------------------------------------------------- initialisation

def _init_lists(X, metric, ind, dist, flag, init_ind, init_dist, have_dist, seed, split):
    """Lists from a (possibly partial, unsorted, duplicated) init graph, topped up with random
    ids; all entries NEW (Algorithm 1 lines 1-5). With ``split`` (graph merge) only the
    cross-subset entries start NEW, same-subset ones OLD (section 5.1: the sub-graphs are
    already refined; "the last k/2 objects of each list are marked as NEW")."""
    parts = chunks(ind.shape[0], 4 * num_threads())
    parallel_for(lambda c: _init_rows(X, metric, ind, dist, flag, init_ind, init_dist, have_dist, seed, split,
                                      parts[c][0], parts[c][1]), len(parts))


@kernel()
def _init_rows(X, metric, ind, dist, flag, init_ind, init_dist, have_dist, seed, split, lo, hi):
    """Rows ``lo .. hi - 1`` of :func:`_init_lists`."""
    n, K = ind.shape
    K0 = init_ind.shape[1]
    for s in range(lo, hi):
        for j in range(K):
            ind[s, j] = -1
            dist[s, j] = np.inf
            flag[s, j] = 1
        top = 0  # entries 0 .. top - 1 filled, the rest (-1, inf)
        for j in range(K0):
            v = np.int64(init_ind[s, j])
            if v < 0 or v >= n or v == s:
                continue
            if have_dist:
                d = init_dist[s, j]
                if not (d <= np.inf):  # NaN from a broken input: recompute
                    d = _dist(X, s, v, metric)
            else:
                d = _dist(X, s, v, metric)
            if (top < K and d < np.inf and (top == 0 or dist[s, top - 1] < d
                                             or (dist[s, top - 1] == d and ind[s, top - 1] < v))):
                # a sorted init list (the forest's): _insert would shift the (-1, inf) tail and
                # put it at `top`; placed there directly (the duplicate test stays)
                if not _listed(ind, s, v):
                    ind[s, top] = v
                    dist[s, top] = d
                    flag[s, top] = 1
                    top += 1
            else:
                top = min(K, top + _insert_call(ind, dist, flag, s, v, d))
        # top up with random distinct ids (n - 1 >= K is guaranteed by the caller; otherwise
        # the list keeps -1 tails)
        filled = 0
        for j in range(K):
            if ind[s, j] >= 0:
                filled += 1
        if filled < K and n - 1 > filled:
            st = _seed3(seed, s, 0xABCDEF)
            tries = 0
            while filled < K and tries < 8 * K + 64:
                st, r = _next(st)
                v = _below(r, n)
                tries += 1
                if v == s:
                    continue
                filled += _insert_call(ind, dist, flag, s, v, _dist(X, s, v, metric))
            if filled < K:  # unlucky or nearly full: deterministic sweep
                v = 0
                while filled < K and v < n:
                    if v != s:
                        filled += _insert_call(ind, dist, flag, s, v, _dist(X, s, v, metric))
                    v += 1
        for j in range(K):
            if split > 0 and (ind[s, j] < split) == (s < split):
                flag[s, j] = 0
            else:
                flag[s, j] = 1


@njit(parallel=True, cache=True)
def renumber_lists(ids, dd, order, inv):
    """``(inv[ids[order]], dd[order])`` with -1 kept: lists of the points taken in ``order``, in
    the new numbering ``inv`` (``inv[order] = arange(n)``). ``dd`` may be None. What NumPy did
    with a gather, a where and two int64 temporaries of size n x K, row-parallel."""
    n, K = ids.shape
    out = np.empty((n, K), np.int32)
    od = np.empty((n, K), np.float32) if dd is not None else np.empty((0, K), np.float32)
    for r in prange(n):
        o = order[r]
        for j in range(K):
            v = ids[o, j]
            out[r, j] = inv[v] if v >= 0 else -1
            if dd is not None:
                od[r, j] = dd[o, j]
    return out, od


# ----------------------------------------------------------------------------- sampling (4.1)

def _sample_forward(ind, flag, p, new_c, new_n, old_c, old_n):
    parts = chunks(ind.shape[0], 4 * num_threads())
    parallel_for(lambda c: _sample_forward_rows(ind, flag, p, new_c, new_n, old_c, old_n, parts[c][0], parts[c][1]),
                 len(parts))


@kernel()
def _sample_forward_rows(ind, flag, p, new_c, new_n, old_c, old_n, lo, hi):
    K = ind.shape[1]
    for s in range(lo, hi):
        cn = 0
        co = 0
        for j in range(K):
            v = ind[s, j]
            if v < 0:
                continue
            if flag[s, j] != 0:
                if cn < p:
                    new_c[s, cn] = v
                    cn += 1
                    flag[s, j] = 0  # "mark all sampled neighbours as OLD"
            elif co < p:
                old_c[s, co] = v
                co += 1
        new_n[s] = cn
        old_n[s] = co


@njit(cache=True)
def _sample_reverse(c, cnt, fwd, seed, it, salt):
    """Append reverse neighbours to each list up to its capacity, as a uniform reservoir
    sample over all reverse candidates (serial: n * p random touches, small next to the join)."""
    n, P = c.shape
    seen = np.zeros(n, np.int32)
    st = _seed3(seed, it, salt)
    for s in range(n):
        for j in range(fwd[s]):
            v = c[s, j]
            seen[v] += 1
            if cnt[v] < P:
                c[v, cnt[v]] = s
                cnt[v] += 1
            else:
                room = P - fwd[v]
                if room > 0:
                    st, r = _next(st)
                    q = _below(r, seen[v])
                    if q < room:
                        c[v, fwd[v] + q] = s


# ----------------------------------------------------------------------------- local join (4.2)

def _join_block(X, metric, s0, s1, new_c, new_n, old_c, old_n, ind, dist, split, selective,
                cap, upd_a, upd_b, upd_d, upd_cnt, nchunks):
    """Cross-match NEW-NEW and NEW-OLD samples of nodes s0..s1-1; write candidate updates
    (target, neighbour, distance) into the block buffer. Reads the graph only."""
    nb = s1 - s0
    chunk = (nb + nchunks - 1) // nchunks

    def task(c):
        lo = s0 + c * chunk
        hi = min(s1, lo + chunk)
        if lo < hi:
            if selective:
                _join_rows_selective(X, metric, s0, new_c, new_n, old_c, old_n, dist, split, cap, upd_a, upd_b,
                                     upd_d, upd_cnt, lo, hi)
            else:
                _join_rows_basic(X, metric, s0, new_c, new_n, old_c, old_n, ind, dist, split, cap, upd_a, upd_b,
                                 upd_d, upd_cnt, lo, hi)

    parallel_for(task, nchunks)


@njit(cache=True, inline="always")
def _distinct(s, new_c, new_n, old_c, old_n, nn, oo):
    """Node ``s``'s distinct NEW samples into ``nn``, its OLD samples that are not also NEW into
    ``oo``; returns their counts."""
    # distinct NEW samples; OLD samples that are not also NEW
    cn = 0
    for i in range(new_n[s]):
        v = new_c[s, i]
        dup = False
        for j in range(cn):
            if nn[j] == v:
                dup = True
                break
        if not dup:
            nn[cn] = v
            cn += 1
    co = 0
    for i in range(old_n[s]):
        v = old_c[s, i]
        dup = False
        for j in range(cn):
            if nn[j] == v:
                dup = True
                break
        if not dup:
            for j in range(co):
                if oo[j] == v:
                    dup = True
                    break
        if not dup:
            oo[co] = v
            co += 1
    return cn, co


@njit(cache=True, inline="always")
def _offer_is_void(ind, dist, x, other, d):
    """True when offering ``other`` at distance ``d`` to the list of ``x`` cannot change it in this
    block's apply: ``d`` above the list's current worst (which only decreases), or ``other``
    already listed (:func:`_insert` rejects a listed id; once pushed out by nearer entries it
    sits behind the new worst in (distance, id) order, and the worst only improves)."""
    return d > dist[x, ind.shape[1] - 1] or _listed(ind, x, other)


@njit(cache=True, inline="always")
def _offers_of_row(ind, dist, a, wa, ids, ds, lo, hi, upd_a, upd_b, upd_d, at):
    """The offers (a, ids[j], ds[j]) for j in lo .. hi - 1 that could enter a's list (whose worst
    distance is ``wa``) or b's, and are not void in both, written to the update buffer from slot
    ``at`` in that order; returns the next free slot."""
    K = dist.shape[1]
    for j in range(lo, hi):
        b = ids[j]
        d = ds[j]
        if ((d < wa or d < dist[b, K - 1])
                and not (_offer_is_void(ind, dist, a, b, d) and _offer_is_void(ind, dist, b, a, d))):
            upd_a[at] = a
            upd_b[at] = b
            upd_d[at] = d
            at += 1
    return at


@kernel(fastmath=_FM)
def _join_rows_basic(X, metric, s0, new_c, new_n, old_c, old_n, ind, dist, split, cap, upd_a, upd_b, upd_d,
                     upd_cnt, lo, hi):
    """Nodes ``lo .. hi - 1`` of :func:`_join_block`, ``update="basic"`` (a function per update rule:
    a run compiles only the one it uses).

    A pair is not buffered when it is void for both lists (:func:`_offer_is_void`). On tight
    clusters nearly every joined pair already links both ways (100k x 64 in 1,000 clusters, K 64:
    65M buffered offers in the last round, 6 inserts); the test here runs while ``a``'s row is
    hot in cache, where the apply step met each offer with two cold rows and a serial owner scan."""
    K = dist.shape[1]
    P = new_c.shape[1]
    nn = np.empty(P, np.int64)   # int64 ids: one specialisation of _dist for the whole module
    oo = np.empty(P, np.int64)
    dn = np.empty(P, np.float32)  # one NEW sample's distances to the other NEW / the OLD samples
    do = np.empty(P, np.float32)
    for s in range(lo, hi):
        if s + 1 < hi:
            _prefetch_samples(X, ind, dist, new_c, new_n, old_c, old_n, s + 1)
        cn, co = _distinct(s, new_c, new_n, old_c, old_n, nn, oo)
        base = (s - s0) * cap
        m = 0
        for i in range(cn):
            a = nn[i]
            if split == 0:
                # a's distances to the later NEW and to the OLD samples first, then the offers in
                # the same pair order: the offer tests branch on each distance (about a third pass
                # on tight clusters, unpredictably); interleaved, every mispredicted branch also
                # discarded the distance work issued past it
                _dist_row(X, a, nn, i + 1, cn, dn, metric)
                _dist_row(X, a, oo, 0, co, do, metric)
                wa = dist[a, K - 1]
                m = _offers_of_row(ind, dist, a, wa, nn, dn, i + 1, cn, upd_a, upd_b, upd_d, base + m) - base
                m = _offers_of_row(ind, dist, a, wa, oo, do, 0, co, upd_a, upd_b, upd_d, base + m) - base
                continue
            sa = a < split
            for j in range(i + 1, cn):
                b = nn[j]
                if split > 0 and (b < split) == sa:
                    continue
                d = _dist(X, a, b, metric)
                if ((d < dist[a, K - 1] or d < dist[b, K - 1])
                        and not (_offer_is_void(ind, dist, a, b, d) and _offer_is_void(ind, dist, b, a, d))):
                    upd_a[base + m] = a
                    upd_b[base + m] = b
                    upd_d[base + m] = d
                    m += 1
            for j in range(co):
                b = oo[j]
                if split > 0 and (b < split) == sa:
                    continue
                d = _dist(X, a, b, metric)
                if ((d < dist[a, K - 1] or d < dist[b, K - 1])
                        and not (_offer_is_void(ind, dist, a, b, d) and _offer_is_void(ind, dist, b, a, d))):
                    upd_a[base + m] = a
                    upd_b[base + m] = b
                    upd_d[base + m] = d
                    m += 1
        upd_cnt[s - s0] = m


@kernel(fastmath=_FM)
def _join_rows_selective(X, metric, s0, new_c, new_n, old_c, old_n, dist, split, cap, upd_a, upd_b, upd_d,
                         upd_cnt, lo, hi):
    """Nodes ``lo .. hi - 1`` of :func:`_join_block`, ``update="selective"``."""
    K = dist.shape[1]
    P = new_c.shape[1]
    nn = np.empty(P, np.int64)
    oo = np.empty(P, np.int64)
    bnd = np.empty(P, np.float32)  # nearest other NEW, per NEW sample
    bni = np.empty(P, np.int64)
    bod = np.empty(P, np.float32)  # nearest OLD, per NEW sample
    boi = np.empty(P, np.int64)
    bxd = np.empty(P, np.float32)  # nearest NEW, per OLD sample
    bxi = np.empty(P, np.int64)
    for s in range(lo, hi):
        cn, co = _distinct(s, new_c, new_n, old_c, old_n, nn, oo)
        base = (s - s0) * cap
        m = 0
        for i in range(cn):
            bnd[i] = np.inf
            bni[i] = -1
            bod[i] = np.inf
            boi[i] = -1
        for j in range(co):
            bxd[j] = np.inf
            bxi[j] = -1
        for i in range(cn):
            a = nn[i]
            sa = a < split
            for j in range(i + 1, cn):
                b = nn[j]
                if split > 0 and (b < split) == sa:
                    continue
                d = _dist(X, a, b, metric)
                if d < bnd[i]:
                    bnd[i] = d
                    bni[i] = b
                if d < bnd[j]:
                    bnd[j] = d
                    bni[j] = a
            for j in range(co):
                b = oo[j]
                if split > 0 and (b < split) == sa:
                    continue
                d = _dist(X, a, b, metric)
                if d < bod[i]:
                    bod[i] = d
                    boi[i] = b
                if d < bxd[j]:
                    bxd[j] = d
                    bxi[j] = a
        for i in range(cn):
            a = nn[i]
            if bni[i] >= 0 and bnd[i] < dist[a, K - 1]:
                upd_a[base + m] = a
                upd_b[base + m] = bni[i]
                upd_d[base + m] = bnd[i]
                m += 1
            if boi[i] >= 0 and bod[i] < dist[a, K - 1]:
                upd_a[base + m] = a
                upd_b[base + m] = boi[i]
                upd_d[base + m] = bod[i]
                m += 1
        for j in range(co):
            a = oo[j]
            if bxi[j] >= 0 and bxd[j] < dist[a, K - 1]:
                upd_a[base + m] = a
                upd_b[base + m] = bxi[j]
                upd_d[base + m] = bxd[j]
                m += 1
        upd_cnt[s - s0] = m


def _apply_block(nb, cap, upd_a, upd_b, upd_d, upd_cnt, ind, dist, flag, symmetric, T):
    """Apply the block's candidate updates (4.3); thread t owns the lists v % T == t."""
    return int(sum(parallel_for(lambda t: _apply_owner(nb, cap, upd_a, upd_b, upd_d, upd_cnt, ind, dist, flag,
                                                       symmetric, T, t), T, threads=T)))


@kernel()
def _apply_owner(nb, cap, upd_a, upd_b, upd_d, upd_cnt, ind, dist, flag, symmetric, T, t):
    """The updates of the lists ``v % T == t`` (their order in the buffer kept); the count applied."""
    c = 0
    # owner test by a mask when T is a power of two (two threads): the same owners as ``% T``
    # without an integer division per offer and thread
    mask = T - 1 if (T & (T - 1)) == 0 else -1
    for r in range(nb):
        base = r * cap
        for e in range(upd_cnt[r]):
            a = upd_a[base + e]
            b = upd_b[base + e]
            d = upd_d[base + e]
            if (a & mask if mask >= 0 else a % T) == t:
                c += _insert(ind, dist, flag, a, b, d)
            if symmetric and (b & mask if mask >= 0 else b % T) == t:
                c += _insert(ind, dist, flag, b, a, d)
    return c


# ----------------------------------------------------------------------------- helpers

@njit(parallel=True, cache=True, fastmath=_FM)
def row_distances(X, rows, cols, metric):
    """Distances between rows[i] and each cols[i, j] (-1 -> inf); internal metric code."""
    n, K = cols.shape
    out = np.empty((n, K), np.float32)
    for i in prange(n):
        a = rows[i]
        for j in range(K):
            b = cols[i, j]
            out[i, j] = _dist(X, a, b, metric) if b >= 0 else np.inf
    return out


@njit(parallel=True, cache=True, fastmath=_FM)
def _exact_small(X, metric, ind, dist):
    n, K = ind.shape
    for s in prange(n):
        for v in range(n):
            if v != s:
                d = _dist(X, s, v, metric)
                _insert_plain(ind, dist, s, v, d)


def exact_graph_cpu(X, k, metric="l2"):
    """Exact k-NN lists (self excluded) by an O(n^2) loop; for tiny inputs and metrics the
    BLAS brute force does not cover (l1)."""
    n = X.shape[0]
    ind = np.full((n, k), -1, np.int32)
    dist = np.full((n, k), np.inf, np.float32)
    _exact_small(np.ascontiguousarray(X, dtype=np.float32), METRIC_CODES[metric], ind, dist)
    return ind, dist


@njit(cache=True, inline="always")
def _insert_plain(ind, dist, a, b, d):
    K = ind.shape[1]
    if not (d < dist[a, K - 1] or (d == dist[a, K - 1] and (ind[a, K - 1] < 0 or b < ind[a, K - 1]))):
        return 0
    for j in range(K):
        if ind[a, j] == b:
            return 0
    pos = K - 1
    while pos > 0 and (dist[a, pos - 1] > d or (dist[a, pos - 1] == d and
                                                 (ind[a, pos - 1] > b or ind[a, pos - 1] < 0))):
        ind[a, pos] = ind[a, pos - 1]
        dist[a, pos] = dist[a, pos - 1]
        pos -= 1
    ind[a, pos] = b
    dist[a, pos] = d
    return 1


@njit(parallel=True, cache=True)
def merge_rows(ind, dist, add_ind, add_dist):
    """Merge candidate rows (add_ind, add_dist; -1 ignored) into sorted lists, in place."""
    n = ind.shape[0]
    K2 = add_ind.shape[1]
    for s in prange(n):
        for j in range(K2):
            v = add_ind[s, j]
            if v >= 0:
                _insert_plain(ind, dist, s, v, add_dist[s, j])


@njit(parallel=True, cache=True)
def merge_rows_at(ind, dist, rows, add_ind, add_dist):
    """Merge candidate row ``s`` (add_ind, add_dist; -1 ignored) into the sorted list
    ``rows[s]``, in place; ``rows`` must not repeat (rows run in parallel)."""
    for s in prange(rows.shape[0]):
        a = rows[s]
        for j in range(add_ind.shape[1]):
            v = add_ind[s, j]
            if v >= 0:
                _insert_plain(ind, dist, a, v, add_dist[s, j])


@njit(cache=True)
def insert_pairs(ind, dist, owner, other, d):
    """Insert the pairs ``(owner[j], other[j], d[j])`` (``owner`` -1: none) into the sorted lists
    ``ind[owner]`` / ``dist[owner]``, in place, in order (one pass, no sort of the pairs): each list
    keeps its nearest, ties by smaller id, an id once."""
    for j in range(owner.shape[0]):
        a = owner[j]
        if a >= 0:
            _insert_plain(ind, dist, a, other[j], d[j])


def pairwise_distances(X, rows, cols, metric="l2"):
    """Internal-metric distances between X[rows[i]] and X[cols[i, j]] (helper for merges)."""
    return row_distances(X, np.ascontiguousarray(rows, dtype=np.int64),
                         np.ascontiguousarray(cols, dtype=np.int64), METRIC_CODES[metric])


# ----------------------------------------------------------------------------- driver

def _block_plan(n, P, selective, entries=1 << 22):
    """Rows per block and buffer slots per row so that the update buffer stays ~50 MB."""
    cap = 3 * P if selective else P * (P - 1) // 2 + P * P
    cap = max(cap, 1)
    rows = max(256, entries // cap)
    return min(n, rows), cap


def nndescent_cpu(X, K, *, sample, max_iters, delta, metric, init_indices=None, init_distances=None,
                  split=None, seed=0, update="selective", callback=None):
    """NN-Descent k-NN graph on the CPU (GNND semantics, see the module docstring).

    Parameters
    ----------
    X : numpy.ndarray, float32 (n, d), C-contiguous
        Vectors already prepared for the internal metric (``knnkit._metrics.prepare_vectors``).
    K : int
        List length.
    sample : int
        ``p``: NEW and OLD samples per list and iteration (reverse samples fill up to ``2p``).
    max_iters : int
    delta : float
        Stop when an iteration updates fewer than ``delta * n * K`` entries.
    metric : {"l2", "ip", "l1"}
        Internal metric (smaller is nearer).
    init_indices, init_distances : (n, K0) arrays, optional
        Starting graph (``-1`` = empty); missing distances are computed, short lists are
        topped up with random ids.
    split : int, optional
        Compare only pairs with one id below ``split`` and one at or above (graph merge).
        The init graph's cross-subset entries start NEW, same-subset entries OLD.
    seed : int
    update : {"selective", "basic"}
    callback : callable, optional
        ``callback(iteration, indices, distances)`` after every iteration; a true return value
        stops the descent after this iteration (``stats["stopped_by_callback"]``). (Used by the
        benchmark to trace recall per iteration). The arrays are live: copy to keep them.

    Returns
    -------
    indices : int32 (n, K), distances : float32 (n, K), stats : dict
        ``stats = dict(iterations=int, updates=[...], time_s=[...])``.

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).random((500, 8), dtype=np.float32)
    >>> I, D, st = nndescent_cpu(X, 10, sample=8, max_iters=10, delta=0.001, metric="l2")
    >>> I.shape, bool((I != np.arange(500)[:, None]).all())
    ((500, 10), True)
    """
    if update not in ("selective", "basic"):
        raise ValueError(f"update must be 'selective' or 'basic', got {update!r}")
    if metric not in METRIC_CODES:
        raise ValueError(f"internal metric must be one of {tuple(METRIC_CODES)}, got {metric!r}")
    X = np.ascontiguousarray(X, dtype=np.float32)
    n = X.shape[0]
    K = int(K)
    if K < 1:
        raise ValueError("K must be >= 1")
    mcode = METRIC_CODES[metric]
    seed = int(seed) & 0x7FFFFFFFFFFFFFFF
    split = 0 if split is None else int(split)
    ind = np.empty((n, K), np.int32)
    dist = np.empty((n, K), np.float32)
    flag = np.empty((n, K), np.uint8)
    stats = {"iterations": 0, "updates": [], "time_s": []}

    # Tiny inputs (or a list as long as the data): exact, nothing to descend.
    if split == 0 and (n - 1 <= K or n <= 2 * K + 2):
        ind.fill(-1)
        dist.fill(np.inf)
        _exact_small(X, mcode, ind, dist)
        return ind, dist, stats

    if init_indices is None:
        init_ind = np.full((n, 0), -1, np.int32)
        init_dist = np.zeros((n, 0), np.float32)
        have = False
    else:
        init_ind = np.ascontiguousarray(init_indices, dtype=np.int32)
        if init_ind.shape[0] != n:
            raise ValueError(f"init graph has {init_ind.shape[0]} rows, data has {n}")
        have = init_distances is not None
        init_dist = (np.ascontiguousarray(init_distances, dtype=np.float32) if have
                     else np.zeros((n, init_ind.shape[1]), np.float32))
    t0 = time.perf_counter()
    _init_lists(X, mcode, ind, dist, flag, init_ind, init_dist, have, seed, split)
    stats["init_s"] = time.perf_counter() - t0

    p = max(1, min(int(sample), K))
    P = 2 * p
    new_c = np.empty((n, P), np.int32)
    old_c = np.empty((n, P), np.int32)
    new_n = np.empty(n, np.int32)
    old_n = np.empty(n, np.int32)
    selective = update == "selective"
    rows, cap = _block_plan(n, P, selective)
    upd_a = np.empty(rows * cap, np.int32)
    upd_b = np.empty(rows * cap, np.int32)
    upd_d = np.empty(rows * cap, np.float32)
    upd_cnt = np.empty(rows, np.int32)
    T = numba.get_num_threads()
    nchunks = 4 * T
    threshold = delta * n * K
    bar = progress(total=int(max_iters), desc="NN-Descent (CPU)", unit="iter")
    for it in range(int(max_iters)):
        t0 = time.perf_counter()
        _sample_forward(ind, flag, p, new_c, new_n, old_c, old_n)
        fwd_n = new_n.copy()
        fwd_o = old_n.copy()
        _sample_reverse(new_c, new_n, fwd_n, seed, it, 1)
        _sample_reverse(old_c, old_n, fwd_o, seed, it, 2)
        total = 0
        for s0 in range(0, n, rows):
            s1 = min(n, s0 + rows)
            _join_block(X, mcode, s0, s1, new_c, new_n, old_c, old_n, ind, dist, split, selective,
                        cap, upd_a, upd_b, upd_d, upd_cnt, nchunks)
            total += int(_apply_block(s1 - s0, cap, upd_a, upd_b, upd_d, upd_cnt, ind, dist, flag,
                                      not selective, T))
        stats["iterations"] = it + 1
        stats["updates"].append(total)
        stats["time_s"].append(time.perf_counter() - t0)
        if callback is not None and callback(it, ind, dist):
            stats["stopped_by_callback"] = it
            break
        logger.debug("nndescent_cpu iteration %d: %d updates in %.3f s", it, total, stats["time_s"][-1])
        bar.update()
        bar.set_postfix(updates=total, refresh=False)
        if total < threshold:
            break
    finish(bar)  # converged before max_iters: the bar ends full
    bar.close()
    return ind, dist, stats


# ----------------------------------------------------------------------------- the twin entry


def nndescent(X, K, *, sample, max_iters, delta, metric, init_indices=None, init_distances=None, split=None,
              seed=0, update="selective", reverse="random", callback=None):
    """CPU twin of :func:`knnkit.graph.nndescent._gpu.nndescent` (same signature): see
    :func:`nndescent_cpu`. Reverse neighbours are always sampled uniformly here (the GPU's
    ``"random"``); the paper's first-come rule (``"atomic"``) is a GPU-only ablation."""
    if reverse != "random":
        raise ValueError(f"reverse={reverse!r} is a GPU-only ablation; the CPU samples reverse neighbours uniformly")
    return nndescent_cpu(X, K, sample=sample, max_iters=max_iters, delta=delta, metric=metric,
                         init_indices=init_indices, init_distances=init_distances, split=split, seed=seed,
                         update=update, callback=callback)
