"""Sweet KNN on the GPU (CuPy + the kernels of ``sweet.cu``).

Step 1 (clusters): landmarks by repeated random sampling (all trials scored in one kernel, the
winner gathered on the device), assignment by a shared-memory kernel for d <= 32 (a cuBLAS GEMM
above), exact float64 point-to-centre distances stored as float32 rounded *up* (which only loosens
every bound), sizes and radii by atomics, then a counting scatter and a rank inside each cluster put
every cluster's members contiguously in descending distance, equal distances by index (the paper's
two-kernel local-ID scheme does the same job). One host sync in the phase (NOTES_sweet.md, "GPU
clustering phase in a few launches").
Level 1 (Algorithm 1) is one kernel, ``sweet_level1``: a block per query cluster computes its row
of centre distances (float64), orders it, finds UB and writes the candidate clusters into a padded
table (no host sync). Level 2 is ``sweet_level2`` (see the kernel file), with queries in chunks
sized by the memory budget; with one worker per query the kernel sorts its list and writes the
output row itself; otherwise the per-worker lists are merged, and partial-filter survivors
k-selected, by sorting 64-bit keys ``(float bits << 32) | index``, whose order is exactly
(distance, index) for non-negative distances.

Repeated rows (all-points joins whose rows repeat often, as the CPU twin): ``_find_duplicates``
groups identical rows on the device (a 64-bit hash per row, one stable sort, neighbouring rows
compared exactly), level 2 runs on the distinct rows with ``k + 1`` (self included) and offers a
distinct row's copies as their own indices, and ``_expand_unique`` gives every original row its
distinct row's list without itself. Same results as without the merge; see NOTES_sweet.md.
"""

import functools
import math
import time

import numpy as np

from ..._core.config import get_memory_budget, logger
from ..._core.cuda import get_kernel, kernel_path, retry_on_oom
from ._plan import (choose_filter, choose_landmarks, copies_from_pairs, default_landmarks, draw_landmark_sets,
                    dup_sample, level1_verdict, mean_copies_of_sample, pruning_rel)

__all__ = ["sweet_gpu", "level2_kernel_name"]

_KERNEL = kernel_path(__file__, "sweet.cu")
_NAMES = ("sweet_level2<32,0>", "sweet_level2<128,0>", "sweet_level2<0,0>", "sweet_level2<1,1>",
          "sweet_level2<1,2>", "sweet_level1<unsigned short>", "sweet_level1<int>") + \
    tuple(f"{f}<{d}>" for f in ("sweet_spread", "sweet_assign_lowdim") for d in range(4))
_BLOCK = 256
_ASSIGN_ELEMS = 1 << 26          # GEMM tile of the assignment (elements)
_ASSIGN_FUSED_MAX_D = 32         # up to this dimension the fused assignment kernel replaces the GEMM
_SCAN_THREADS = 1024             # sweet_cluster_offsets: one block of this size
_RANK_MAX_MEAN = 4096            # in-cluster rank while sum(size^2) <= this * n, else one sort of all points
_NEAREST_FOR_UB = 64             # data clusters pooled for the level-1 upper bound (any subset is valid)
_L1_THREADS = 256                # sweet_level1's block (its __launch_bounds__)
_L1_SHARED_MAX = 46 << 10        # its dynamic shared memory: under the 48 KiB that needs no opt-in, less its static part
_CACHE_CONFLICT_R = 0.25         # paper section IV-D3: r * max concurrent threads
_SAMPLE_MAX = 4096               # sweet_sample_pairs' shared hash table
_PAD_KEY = np.uint64((0x7F800000 << 32) | 0x7FFFFFFF)


def _k(name):
    return get_kernel(_KERNEL, name, name_expressions=_NAMES)


def level2_kernel_name(filter_kind, k):
    """Kernel instantiation of the level-2 filter: kNearests placement by k (section IV-D2)."""
    if filter_kind == "partial":
        return "sweet_level2<1,2>"
    if k <= 32:
        return "sweet_level2<32,0>"
    if k <= 128:
        return "sweet_level2<128,0>"
    return "sweet_level2<0,0>"


def _grid(n):
    return (int(min(max(1, (n + _BLOCK - 1) // _BLOCK), 1 << 20)),)


def _round_up_f32(cp, d64):
    d32 = d64.astype(cp.float32)
    return cp.where(d32.astype(cp.float64) < d64, cp.nextafter(d32, cp.float32(np.inf)), d32)


def _dim_variant(name, dim):
    """Template instance of a Step-1 kernel: dimensions 1-3 compiled in (registers), else any d <= 32."""
    return f"{name}<{dim if dim <= 3 else 0}>"


def _choose_landmarks(cp, P, count, trials, rng):
    """The landmark rows (``count x dim``) of the best of ``trials`` random sets (paper III-A).

    The sets are the CPU twin's (``draw_landmark_sets``, same host rng draws); for d <= 32 all of
    them are scored in one kernel (float64 sums of pairwise distances, as the CPU twin) and the
    winner is chosen and gathered on the device: one upload, two launches, no sync, where the
    GEMM route below costs ~11 CuPy launches per trial and one sync."""
    n, dim = P.shape
    if dim > _ASSIGN_FUSED_MAX_D or trials > 65535:  # (grid.y holds the trial)
        ids = choose_landmarks(P, count, trials, rng, xp=cp)
        return cp.ascontiguousarray(P[cp.asarray(ids)])
    picks = cp.asarray(draw_landmark_sets(n, count, trials, rng))  # (trials, count) int64
    nblk = (count + _BLOCK - 1) // _BLOCK if trials > 1 else 0
    partial = cp.empty(max(1, trials * nblk), cp.float64)
    if nblk:
        _k(_dim_variant("sweet_spread", dim))((nblk, trials), (_BLOCK,), (P, picks, np.int32(count), np.int32(dim),
                                                                          partial))
    L = cp.empty((count, dim), cp.float32)
    _k("sweet_pick_landmarks")(_grid(count * dim), (_BLOCK,), (P, picks, partial, np.int32(nblk), np.int32(trials),
                                                               np.int32(count), np.int32(dim), L))
    return L


class _Clusters:
    """Landmarks, assignment, and the points ordered by (cluster, descending centre distance).

    ``order`` (int32) lists the members cluster by cluster, ``dist`` their centre distances in that
    order (float32 rounded up, descending inside a cluster, equal distances by ascending index),
    ``off`` the cluster offsets (count + 1), ``size``, ``radius`` (float32) and ``labels`` (int32).
    Launches (d <= 32): one upload, spread, pick, assignment, stats, offsets, then either the
    counting scatter and the in-cluster rank (sum of size^2 up to ``_RANK_MAX_MEAN`` * n) or the
    former stable sort of all points; one host sync (that choice)."""

    def __init__(self, cp, P, count, trials, rng):
        n, dim = P.shape
        self.L = _choose_landmarks(cp, P, count, trials, rng)
        labels = cp.empty(n, cp.int32)
        if dim <= _ASSIGN_FUSED_MAX_D:
            # one pass over the points, landmarks through shared memory (no n x count matrix)
            _k(_dim_variant("sweet_assign_lowdim", dim))(((n + _BLOCK - 1) // _BLOCK,), (_BLOCK,),
                                                         (P, self.L, np.int64(n), np.int32(count), np.int32(dim),
                                                          labels))
        else:
            ln = (self.L * self.L).sum(axis=1)
            step = max(1, _ASSIGN_ELEMS // count)
            for s in range(0, n, step):
                G = P[s:s + step] @ self.L.T
                labels[s:s + step] = cp.argmin(ln[None, :] - 2.0 * G, axis=1)
        d32 = cp.empty(n, cp.float32)
        self.size = cp.zeros(count, cp.int64)
        self.radius = cp.zeros(count, cp.float32)
        _k("sweet_member_stats")(_grid(n), (_BLOCK,), (P, self.L, labels, np.int64(n), np.int32(dim), d32, self.size,
                                                      self.radius))
        self.off = cp.empty(count + 1, cp.int64)
        fill = cp.empty(count, cp.uint64)
        info = cp.empty(1, cp.uint64)
        _k("sweet_cluster_offsets")((1,), (_SCAN_THREADS,), (self.size, np.int32(count), self.off, fill, info))
        self.labels = labels
        if int(info[0]) <= _RANK_MAX_MEAN * n:  # the only sync of the phase
            keys = cp.empty(n, cp.uint64)
            _k("sweet_cluster_bucket")(_grid(n), (_BLOCK,), (labels, d32, np.int64(n), fill, keys))
            self.order = cp.empty(n, cp.int32)
            self.dist = cp.empty(n, cp.float32)
            _k("sweet_cluster_rank")(_grid(n), (_BLOCK,), (keys, labels, self.off, np.int64(n), self.order,
                                                           self.dist))
        else:
            # a few huge clusters (rank work ~ size^2): one stable radix sort of (cluster, ~distance bits)
            key = (labels.astype(cp.uint64) << np.uint64(32)) | \
                (np.uint32(0xFFFFFFFF) - d32.view(cp.uint32)).astype(cp.uint64)
            order = cp.argsort(key)
            self.order = order.astype(cp.int32)
            self.dist = d32[order]


def _device_threads(cp):
    return _threads_of(cp.cuda.Device().id)


@functools.lru_cache(maxsize=None)
def _threads_of(device_id):
    # Device.attributes queries every attribute (dozens of driver calls): once per device
    import cupy as cp

    attrs = cp.cuda.Device(device_id).attributes
    return int(attrs["MultiProcessorCount"]) * int(attrs["MaxThreadsPerMultiProcessor"])


def _level1(cp, data, query, k_eff, rel, budget):
    """UB per query cluster and the candidate lists (Algorithm 1) in one kernel, ``sweet_level1``:
    one block per query cluster computes its row of centre distances (float64), orders it by
    (distance, index), pools the ``k_eff`` members closest to each of the ``_NEAREST_FOR_UB``
    nearest data centres (all clusters where those hold fewer than ``k_eff`` points) for UB and
    writes the candidate clusters in that order. No host sync: the table is padded (row ``cq`` of
    ``cand`` starts at ``cq * mt``, ``ncand[cq]`` entries), sized by its upper bound ``mq * mt``.

    Returns ``(ub, ncand, cand, rowpairs)``; ``rowpairs[cq]`` = points in cq's candidate clusters
    (level-1 pairs per query of cq). Same bounds and lists, in the same order, as the former CuPy
    version (stable argsort of the table, sorted pools), which cost ~55 launches, two Thrust sorts
    and three host syncs (NOTES_sweet.md, "GPU level 1 in fewer launches")."""
    mq, mt = query.L.shape[0], data.L.shape[0]
    dim = data.L.shape[1]
    near = min(mt, _NEAREST_FOR_UB)
    p2 = 1 << max(0, (mt - 1).bit_length())  # the bitonic sort's length
    ub = cp.empty(mq, cp.float64)
    cand = cp.empty(mq * mt, cp.int32)
    ncand = cp.empty(mq, cp.int32)
    rowpairs = cp.empty(mq, cp.int64)
    head = (query.L, data.L, np.int32(mq), np.int32(mt), np.int32(dim))
    tail = (query.radius, query.size, data.radius, data.size, data.off, data.dist, np.int32(k_eff), np.int32(near),
            np.float64(rel), np.int32(p2))
    outs = (ub, cand, ncand, rowpairs)
    smem = (8 * mt + 2 * p2 + 7) // 8 * 8
    if mt <= 65535 and smem <= _L1_SHARED_MAX:
        # row and order in shared memory (mt up to ~4000: n up to ~1.8 M points per side)
        dummy_d, dummy_i = cp.empty(1, cp.float64), cp.empty(1, cp.int32)
        _k("sweet_level1<unsigned short>")((mq,), (_L1_THREADS,), head + (np.int32(0),) + tail +
                                           (dummy_d, dummy_i) + outs, shared_mem=smem)
        return ub, ncand, cand, rowpairs
    # larger tables: the same kernel on global scratch, rows in batches that fit a quarter budget
    batch = int(max(1, min(mq, (budget // 4) // (8 * mt + 4 * p2))))
    Dg = cp.empty(batch * mt, cp.float64)
    Ig = cp.empty(batch * p2, cp.int32)
    for r0 in range(0, mq, batch):
        _k("sweet_level1<int>")((min(batch, mq - r0),), (_L1_THREADS,), head + (np.int32(r0),) + tail + (Dg, Ig) + outs)
    return ub, ncand, cand, rowpairs


def _choose_parts(cp, params, m, mean_cand):
    """Workers per query (section IV-B2). ``mean_cand()`` (mean candidate clusters per query
    cluster) costs a host sync, so it is called only when the answer depends on it: "auto" with
    enough queries to fill the device is one worker whatever it says."""
    if params.parallelism == "query":
        return 1
    target = _CACHE_CONFLICT_R * _device_threads(cp)
    if params.parallelism == "split":
        want = params.split_factor or max(2, int(math.ceil(target / max(1, m))))
        lo = 2
    else:
        want = params.split_factor or (1 if m >= target else int(math.ceil(target / max(1, m))))
        lo = 1
    if lo == 1 and want <= 1:
        return 1
    return int(max(lo, min(want, 64, max(1, int(mean_cand())))))


_DUP_MIN_COPIES = 1.0


def _find_duplicates(X, rng):
    """Groups of identical rows of ``X`` (cupy float32, contiguous) when they are common enough to
    pay, else None: the GPU twin of the CPU's ``_find_duplicates``, same gate (``mean_copies`` on
    the same sample for the same seed) and same contract.

    Returns ``(U, inv, uoff, uidx)``: the distinct rows, the distinct row of every original row
    (int64), and the original rows of distinct row ``t`` as ``uidx[uoff[t]:uoff[t + 1]]``
    (ascending; int32 for the kernel). The distinct rows come in hash order, not in the CPU's
    lexicographic order: that changes the landmark draws (speed) but not the results, which depend
    only on the groups. Rows are equal when their float32 bit patterns are. A hash collision
    between unequal rows is caught by the exact comparison in ``sweet_row_starts``; it can split
    a group in two (both halves stay correct: each offers its own copies, ascending), never merge
    unequal rows."""
    import cupy as cp

    n, dim = X.shape
    if n < 2 or _mean_copies(X, rng) < _DUP_MIN_COPIES:
        return None
    h = cp.empty(n, cp.uint64)
    _k("sweet_row_hash")(_grid(n), (_BLOCK,), (X, np.int64(n), np.int32(dim), h))
    order = cp.argsort(h)  # stable: rows of equal hash in ascending index
    is_new = cp.empty(n, cp.int32)
    _k("sweet_row_starts")(_grid(n), (_BLOCK,), (X, order, h, np.int64(n), np.int32(dim), is_new))
    group = cp.cumsum(is_new, dtype=cp.int64)  # distinct row of sorted position p: group[p] - 1
    nu = int(group[-1])  # sync: the tables' sizes
    if nu == n:
        return None
    inv = cp.empty(n, cp.int64)
    uoff = cp.empty(nu + 1, cp.int64)
    uidx = cp.empty(n, cp.int32)
    U = cp.empty((nu, dim), cp.float32)
    _k("sweet_dup_tables")(_grid(n), (_BLOCK,), (X, order, is_new, group, np.int64(n), np.int32(dim), inv, uoff,
                                                 uidx, U))
    return U, inv, uoff, uidx


def _mean_copies(X, rng):
    """``_plan.mean_copies`` with the counting on the device: the same sample (same rng draws),
    its equal pairs counted by ``sweet_sample_pairs`` (one block), the same estimate from the
    count, so both twins still decide alike. Only the count (8 bytes) comes back, where the host
    version copied the sample (48 KiB at d = 3) and hashed and sorted it (~0.3 ms)."""
    import cupy as cp

    n, dim = X.shape
    pick = dup_sample(n, rng)
    if pick is None:
        return 0.0
    if pick.size > _SAMPLE_MAX:  # (DUP_SAMPLE is 4096: never)
        return mean_copies_of_sample(cp.asnumpy(X[cp.asarray(pick)]), n)
    out = cp.empty(1, cp.uint64)
    _k("sweet_sample_pairs")((1,), (1024,), (X, cp.asarray(pick), np.int32(pick.size), np.int32(dim), out))
    return copies_from_pairs(int(out.get()[0]), pick.size, n)  # the phase's sync


def _expand_unique(ud, ui, inv, out_d, out_i):
    """All-points rows from the distinct rows' lists (kernel ``sweet_expand_unique``): row ``i``
    is the (k + 1)-list of its distinct row ``inv[i]`` (self included, ordered by (distance,
    index)) without ``i`` itself, or without the last entry when ``i`` is not in it."""
    n, k = out_d.shape
    _k("sweet_expand_unique")(_grid(n), (_BLOCK,), (ud, ui, inv, np.int64(n), np.int32(k), out_d, out_i))


def _keys(cp, d, i):
    return (d.view(cp.uint32).astype(cp.uint64) << np.uint64(32)) | i.view(cp.uint32).astype(cp.uint64)


def _decode(cp, keys):
    d = (keys >> np.uint64(32)).astype(cp.uint32).view(cp.float32)
    i = (keys & np.uint64(0xFFFFFFFF)).astype(cp.int64)
    return d, i


def sweet_gpu(X, Q, k, params, seed, all_points, qsel=None, gate=None, enough=None, hopeless=None):
    """Sweet KNN join on the GPU; arrays are cupy float32. See :func:`knnkit.exact.sweet.sweet_knn`.

    ``enough`` (estimates only, with ``qsel``): when level 1 alone saves at least this fraction of
    the distance computations of ALL queries, level 2 is skipped and the stats report that lower
    bound (``stats["early"]``); ``hopeless``: likewise when level 1 saves less than this (the
    estimate then reports level 1's fraction). The gate takes the same shortcuts with its
    ``min_saved`` and its optional third element (``gate=(min_saved, sample, hopeless)``): level 1's
    count over all queries is exact and level 2 only adds to it, so the first shortcut never passes
    a join the sample would have refused; the second is the caller's rule (see
    :data:`knnkit.exact.sweet.SWEET_AUTO_LEVEL1_FLOOR`); both are ``_plan.level1_verdict``.

    ``gate=(min_saved, sample)``: after level 1, level 2 runs first on ``sample`` queries drawn
    at random; when the fraction of their distance computations saved is below ``min_saved`` the
    call returns ``(None, None, stats)`` (``stats["gate"]``) and the caller takes the GEMM path.
    This is :func:`knnkit.exact.sweet.estimate_savings` inside the run itself: a run that passes
    reuses its clusters and level 1 (the separate estimate repeated them: ~20 ms of a 180 ms
    clustered 16-D join, H100).

    Host syncs of a plain all-points call: the repeated-row gate's count, the clusters phase's
    rank-or-sort choice, (merging only) the distinct-row count, and one at the end for the stats.
    Phase times are CUDA events on the stream, read after that last sync, so timing adds none
    (they include any time the device waited for the host inside a phase)."""
    import cupy as cp

    t_all = time.perf_counter()
    marks = {}

    def mark(name):
        ev = cp.cuda.Event()
        ev.record()
        marks[name] = ev

    X = cp.ascontiguousarray(X, dtype=cp.float32)
    Q = X if all_points else cp.ascontiguousarray(Q, dtype=cp.float32)
    n_orig = X.shape[0]
    mark("start")
    dup = _find_duplicates(X, np.random.default_rng([seed, 1])) if all_points and qsel is None else None
    mark("duplicates")
    if dup is None:
        k_sel, exclude, uoff, uidx = k, bool(all_points), cp.zeros(1, cp.int64), cp.zeros(1, cp.int32)
    else:
        # distinct rows, self kept: the k + 1 list of a distinct row serves every copy of it
        X, inv, uoff, uidx = dup
        Q, k_sel, exclude = X, k + 1, False
    n, dim = X.shape
    m = Q.shape[0]
    budget = max(get_memory_budget(), 64 << 20)
    rng = np.random.default_rng(seed)
    mt0 = default_landmarks(params.n_landmarks_data, n, 1, 0)
    mq0 = mt0 if all_points else default_landmarks(params.n_landmarks_query, m, 1, 0)
    # cap by memory: ~ (D, order, masks, level-1 pools) per cluster pair
    mt = default_landmarks(params.n_landmarks_data, n, mq0, budget // 2)
    mq = mt if all_points else default_landmarks(params.n_landmarks_query, m, mt, budget // 2)
    data = _Clusters(cp, X, mt, params.landmark_trials, rng)
    query = data if all_points and params.n_landmarks_query in (None, mt) else \
        _Clusters(cp, Q, mq, params.landmark_trials, rng)
    mq = query.L.shape[0]
    mark("clusters")

    rel = pruning_rel(dim)
    k_eff = k + (1 if all_points else 0)
    ub, ncand, cand, rowpairs = _level1(cp, data, query, k_eff, rel, budget)
    qseq = query.order  # queries grouped by cluster: the thread-to-query remapping
    level1_all = (query.size * rowpairs).sum()
    if qsel is not None:
        keep = cp.zeros(m, bool)
        keep[cp.asarray(qsel)] = True
        qseq = qseq[keep[qseq]]  # (a sync: the selection's size)
        level1_pairs = rowpairs[query.labels[qseq]].sum()
    else:
        level1_pairs = level1_all
    ncand_sum = ncand.sum(dtype=cp.int64)  # read with the stats at the end
    mark("level1")
    if (enough is not None or hopeless is not None) and qsel is not None:
        saved1 = 1.0 - float(level1_all) / (float(m) * n)  # (a sync)
        if level1_verdict(saved1, enough, hopeless) is not None:
            times = {"total": time.perf_counter() - t_all}
            return None, None, dict(device="gpu", early=True, saved_level1=saved1, saved_level2=0.0,
                                    saved_total=saved1, n_landmarks_data=mt, n_landmarks_query=mq, times=times)

    filt = choose_filter(params, k, dim, merged=dup is not None)  # by the requested k, as the CPU twin
    nq_total = int(qseq.size)  # a host-side shape, no sync
    gate_stats = None
    parts = _choose_parts(cp, params, nq_total, lambda: float(ncand_sum) / max(1, mq))
    name = level2_kernel_name(filt, k_sel)
    out_d = cp.empty((m, k_sel), cp.float32)
    out_i = cp.empty((m, k_sel), cp.int64)
    # the data rows in member order: a cluster's rows are contiguous for level 2
    Xs = X[data.order]
    common = (Xs, Q, data.L, np.int32(dim), data.order, data.dist, data.off, data.radius)
    dupargs = (np.int32(dup is not None), uoff, uidx)
    f1, i1, l1, u1, l2 = (cp.empty(1, cp.float32), cp.empty(1, cp.int32), cp.empty(1, cp.int64),
                          cp.empty(1, cp.uint64), cp.empty(2, cp.int64))  # arguments a variant ignores
    ndist = []  # per-chunk device sums, read at the end (no sync per chunk)

    def run_full(chunk):
        ndist.clear()
        direct = parts == 1  # the kernel sorts its list and writes the output row itself
        for c0 in range(0, nq_total, chunk):
            seq = qseq[c0:c0 + chunk]
            nq = int(seq.size)
            ntask = nq * parts
            if direct and name != "sweet_level2<0,0>":
                heap_d, heap_i = f1, i1  # lists in registers/local memory
            else:
                heap_d = cp.empty((k_sel, ntask), cp.float32)
                heap_i = cp.empty((k_sel, ntask), cp.int32)
            theta = f1 if parts == 1 else _round_up_f32(cp, ub[query.labels[seq]])
            counts = cp.empty(ntask, cp.int64)
            _k(name)(_grid(ntask), (_BLOCK,), common + (
                seq, np.int32(nq), query.labels, ub, ncand, np.int64(mt), cand, np.int32(k_sel), np.int32(parts),
                np.int32(exclude), np.float64(rel), theta, heap_d, heap_i, u1, l2, counts) + dupargs +
                (np.int32(direct), out_d, out_i))
            if not direct:
                keys = _keys(cp, heap_d, heap_i).T.reshape(nq, parts * k_sel)
                keys = cp.sort(keys, axis=1)[:, :k_sel]
                d, i = _decode(cp, keys)
                out_d[seq] = d
                out_i[seq] = i
            ndist.append(counts.sum())

    def run_partial(chunk):
        ndist.clear()
        c0 = 0
        while c0 < nq_total:
            seq = qseq[c0:c0 + chunk]
            nq = int(seq.size)
            ntask = nq * parts
            counts = cp.empty(ntask, cp.int64)
            args = common + (seq, np.int32(nq), query.labels, ub, ncand, np.int64(mt), cand, np.int32(k_sel),
                             np.int32(parts), np.int32(exclude), np.float64(rel), f1, f1, i1)
            tail = dupargs + (np.int32(0), f1, l1)
            # counts: the keys each task will write (one per survivor, or per copy worth keeping)
            _k("sweet_level2<1,1>")(_grid(ntask), (_BLOCK,), args + (u1, l2, counts) + tail)
            woff = cp.zeros(ntask + 1, cp.int64)
            woff[1:] = cp.cumsum(counts)
            per_q = counts.reshape(nq, parts).sum(axis=1)
            total, widest = int(woff[-1]), int(per_q.max())  # buffer sizes: syncs of the partial filter
            if (total * 3 + nq * widest * 2) * 8 > budget and chunk > 1:
                chunk = max(1, chunk // 2)  # too many survivors for the buffers: smaller chunk
                continue
            surv = cp.full(max(1, total), _PAD_KEY, cp.uint64)
            work = cp.empty(ntask, cp.int64)  # distances computed (survivors, not copies)
            _k("sweet_level2<1,2>")(_grid(ntask), (_BLOCK,), args + (surv, woff, work) + tail)
            qstart = woff[0:ntask:parts]
            slot = cp.arange(total, dtype=cp.int64)
            row = cp.searchsorted(woff[parts::parts], slot, side="right")  # query of each survivor
            col = slot - qstart[row]
            pad = cp.full((nq, widest), _PAD_KEY, cp.uint64)
            pad[row, col] = surv[:total]
            keys = cp.sort(pad, axis=1)[:, :k_sel]
            d, i = _decode(cp, keys)
            out_d[seq] = d
            out_i[seq] = i
            ndist.append(work.sum())
            c0 += nq

    if filt == "full":
        per_query = parts * k_sel * 8 * 4 + 64
        # one thread per (query, part) and no grid-stride loop: keep a launch under 2^24 threads
        chunk = max(1, min(nq_total, budget // per_query, (1 << 24) // parts))
        if gate is not None and qsel is None and nq_total >= 4 * int(gate[1]):
            min_saved, sample = float(gate[0]), int(gate[1])
            floor = gate[2] if len(gate) > 2 else None
            saved1 = 1.0 - float(level1_all) / (float(nq_total) * n)  # (a sync) level 1 over all queries
            # False: level 1 saves too little for level 2 to make up (uniform 32-D: 0 %; the sample
            # was most of the ~0.1 s the gate cost before giving way); True: level 1 alone saves
            # enough, no sample (clustered 16-D: the sample was most of the ~20 ms the separate
            # estimate added to a ~180 ms join)
            verdict = level1_verdict(saved1, min_saved, floor)
            gate_stats = {"min_saved": min_saved, "sample": 0, "saved_estimate": saved1, "passed": verdict is not False}
            if verdict is False:
                gate_stats["level1_floor"] = float(floor)
            elif verdict is None:
                # the savings on a random sample of queries first (their rows are written again below)
                pick = np.sort(np.random.default_rng([seed, 7]).choice(nq_total, size=sample, replace=False))
                qseq_all, nq_all, parts_all = qseq, nq_total, parts
                qseq, nq_total = qseq_all[cp.asarray(pick)], sample  # (in cluster order: the remapping holds)
                # several threads per query, as the separate estimate ran it: one thread per query
                # left 256 threads scanning alone (uniform 16-D 500k: ~0.5 s before giving way), and
                # the split's counts (a shared bound) are the ones the thresholds were measured with
                parts = _choose_parts(cp, params, sample, lambda: float(ncand_sum) / max(1, mq))
                retry_on_oom(run_full, min(chunk, sample), what="sweet level-2 filter")
                parts = parts_all
                saved = 1.0 - float(cp.stack(ndist).sum()) / (float(sample) * n)
                gate_stats.update(sample=sample, saved_estimate=saved, passed=saved >= min_saved)
                qseq, nq_total = qseq_all, nq_all
            if not gate_stats["passed"]:
                times = {"total": time.perf_counter() - t_all}
                return None, None, dict(device="gpu", gate=gate_stats, times=times, n_landmarks_data=mt,
                                        n_landmarks_query=mq)
        retry_on_oom(run_full, chunk, what="sweet level-2 filter")
    else:
        chunk = max(1, min(nq_total, 1 << 16, (1 << 24) // parts))
        retry_on_oom(run_partial, chunk, what="sweet level-2 partial filter")
    if dup is not None:
        ud, ui = out_d, out_i
        out_d = cp.empty((n_orig, k), cp.float32)
        out_i = cp.empty((n_orig, k), cp.int64)
        _expand_unique(ud, ui, inv, out_d, out_i)
        nq_total = n_orig  # every original row was answered
    mark("level2")
    # the call's last sync: the stats' three counts in one copy
    counts_h = cp.stack([level1_pairs.astype(cp.int64), ncand_sum] +
                        [v.astype(cp.int64) for v in ndist]).get()
    level1_pairs, nd = float(counts_h[0]), int(counts_h[2:].sum())
    mean_cand = float(counts_h[1]) / max(1, mq)
    times = {p: cp.cuda.get_elapsed_time(marks[a], marks[p]) / 1e3
             for a, p in (("start", "duplicates"), ("duplicates", "clusters"), ("clusters", "level1"),
                          ("level1", "level2"))}
    times = {"clusters": times["clusters"], "level1": times["level1"], "level2": times["level2"],
             "duplicates": times["duplicates"], "total": time.perf_counter() - t_all}
    pairs = float(nq_total) * n_orig
    stats = dict(device="gpu", filter=filt, parallelism="query" if parts == 1 else "split", parts=parts,
                 n_landmarks_query=mq, n_landmarks_data=mt,
                 saved_level1=1.0 - level1_pairs / pairs if pairs else 0.0,
                 saved_level2=(level1_pairs - nd) / pairs if pairs else 0.0,
                 saved_total=1.0 - nd / pairs if pairs else 0.0,
                 distance_computations=nd, mean_candidate_clusters=mean_cand,
                 placement={"sweet_level2<32,0>": "registers/local (k<=32)", "sweet_level2<128,0>":
                            "local (k<=128)", "sweet_level2<0,0>": "global (slot-major)"}.get(name, "none (partial)"),
                 distinct_rows=int(n) if dup is not None else None, times=times)
    if gate_stats is not None:
        stats["gate"] = gate_stats
    logger.debug("sweet gpu: %s", stats)
    if qsel is not None:
        sel = cp.asarray(qsel)
        return out_d[sel], out_i[sel], stats
    return out_d, out_i, stats
