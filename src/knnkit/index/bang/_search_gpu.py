"""GPU host-placement search (BANG sections 3.2, 4.3, 4.6, 4.9): the graph stays in host memory.

Each iteration of a query batch: the GPU's chosen candidate ids (W per query, the search width)
go to pinned host memory (D2H), host threads gather the candidates' neighbour rows from the host
graph (a Numba parallel gather, ``_search_cpu._gather_rows``) into a pinned buffer, the rows go
back (H2D, async), and ``bang_distances`` / ``bang_merge`` (``bang.cu``) compute the PQ distances
of the W*R neighbours, filter visited nodes and merge into the work lists. With prefetch (4.6)
``bang_distances`` already picks the next W candidates and their copy to the host is queued before
the merge, so the host gathers while the GPU merges; without, the merge kernel picks them.
Pipelining: the queries are split into batches, each with its own CUDA stream, buffers, event and
prebuilt kernel arguments; the host serves whichever batch's candidates have arrived (round-robin
when none has), so one batch's gather overlaps the other batches' kernels and copies. Re-ranking
(4.9): the best logged candidates' full-precision rows are gathered on the host, copied in, and
their exact distances computed on the GPU.

Timers (``last_stats``): seconds the host spent waiting for candidates, gathering rows, queueing
copies and launches, and in total; iterations of the longest batch.
"""

import time

import numpy as np

from ..._core.config import logger
from ..._core.cuda import get_kernel, kernel_path
from ..._core.metrics import prepare_vectors
from ._pq import pq_tables, table_bytes
from ._search_cpu import _gather_rows, bloom_words_for, exact_topk, gather_rows

__all__ = ["search_host_gpu", "last_stats", "MAX_WIDTH"]

_KERNEL = kernel_path(__file__, "bang.cu")
_NT = 128  # threads per block
_SMEM_STATIC = 48 * 1024
_SMEM_MAX = 200 * 1024  # opt-in dynamic shared memory we allow ourselves (H100/H200: 227 KB)
_H2D, _D2H = 1, 2  # cudaMemcpyKind
MAX_WIDTH = 64  # BANG_MAX_W of bang.cu (shared scratch of the candidate selection)
_stats = {}


def last_stats():
    """Timers and counters of the last GPU host-placement search (a copy)."""
    return dict(_stats)


def _kernel(name):
    return get_kernel(_KERNEL, name)


def _pinned(shape, dtype):
    import cupyx

    return cupyx.empty_pinned(shape, dtype=dtype)


class _Batch:
    """One pipelined query batch: its stream, device state, pinned host buffers and the kernel
    arguments (built once: an iteration only launches, it allocates nothing)."""

    def __init__(self, cp, T, seeds, *, L, R, W, max_iters, codes, use_smem, GS, prefetch):
        self.cp = cp
        nq = T.shape[0]
        self.nq, self.L, self.R, self.W, self.max_iters = nq, L, R, W, max_iters
        self.prefetch = prefetch
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.event = cp.cuda.Event(disable_timing=True)
        self.T = T
        self.seeds = cp.ascontiguousarray(seeds, dtype=cp.int32)
        with self.stream:
            self.wl_ids = cp.full((nq, L), -1, cp.int32)
            self.wl_d = cp.full((nq, L), np.inf, cp.float32)
            self.wl_x = cp.zeros((nq, L), cp.uint8)
            self.bloom_words = bloom_words_for(max_iters, R, seeds.shape[1])
            self.bloom = cp.zeros((nq, self.bloom_words), cp.uint32)
            self.cap = max(W * R, seeds.shape[1])
            self.new_ids = cp.empty((nq, self.cap), cp.int32)
            self.new_d = cp.empty((nq, self.cap), cp.float32)
            self.new_x = cp.zeros((nq, self.cap), cp.uint8)
            self.n_new = cp.zeros(nq, cp.int32)
            self.cand = cp.full((nq, W), -1, cp.int32)
            self.log_ids = cp.full((nq, max_iters), -1, cp.int32)
            self.log_d = cp.full((nq, max_iters), np.inf, cp.float32)
            self.n_exp = cp.zeros(nq, cp.int32)
            self.nbr_dev = cp.empty((nq, W * R), cp.int32)
        # the host's view of the W candidates of each query, and the W rows it gathers for them
        self.cand_host = _pinned((nq, W), np.int32)
        self.nbr_host = _pinned((nq, W * R), np.int32)
        self.cand_flat = self.cand_host.reshape(nq * W)
        self.nbr_rows = self.nbr_host.reshape(nq * W, R)
        self.done = False
        self.iters = 0
        i32 = np.int32
        m, ksub = codes.shape[1], T.shape[2]
        self.k_dist, self.k_merge = _kernel("bang_distances"), _kernel("bang_merge")
        self.smem_dist = m * ksub * 4 if use_smem else 0
        self.smem_merge = 17 * self.cap + 9 * L
        _merge_smem_opt_in(self.k_merge, self.smem_merge)

        def dist_args(nbrs, width):
            return (nbrs, i32(width), codes, i32(m), T, i32(ksub), i32(1 if use_smem else 0), self.bloom,
                    i32(self.bloom_words), self.wl_ids, self.wl_d, self.wl_x, i32(L), self.new_ids, self.new_d,
                    self.new_x, self.n_new, i32(self.cap), i32(1 if prefetch else 0), i32(W), self.cand,
                    self.log_ids, self.log_d, self.n_exp, i32(max_iters), i32(GS), i32(nq))

        self.args_seed = dist_args(self.seeds, self.seeds.shape[1])  # iteration 0: the seeds are the rows
        self.args_dist = dist_args(self.nbr_dev, W * R)
        self.args_merge = (self.wl_ids, self.wl_d, self.wl_x, i32(L), self.new_ids, self.new_d, self.new_x,
                           self.n_new, i32(self.cap), i32(0 if prefetch else 1), i32(W), self.cand, self.log_ids,
                           self.log_d, self.n_exp, i32(max_iters), i32(nq))
        self.grid, self.block = (nq,), (_NT,)
        self.cand_args = (self.cand_host.ctypes.data, self.cand.data.ptr, self.cand.nbytes, _D2H)
        self.nbr_args = (self.nbr_dev.data.ptr, self.nbr_host.ctypes.data, self.nbr_host.nbytes, _H2D)

    def step(self, first=False):
        """Queue one iteration on this batch's stream: (rows H2D,) distances, candidate copy and
        merge. With prefetch (4.6) the candidates are chosen by the distance kernel and leave
        before the merge; without, the merge kernel chooses them and the copy follows it. The
        event marks the candidates' arrival in ``cand_host``."""
        memcpy, sp = self.cp.cuda.runtime.memcpyAsync, self.stream.ptr
        with self.stream:
            if not first:
                memcpy(*self.nbr_args, sp)
            self.k_dist(self.grid, self.block, self.args_seed if first else self.args_dist,
                        shared_mem=self.smem_dist)
            if self.prefetch:
                memcpy(*self.cand_args, sp)
                self.event.record(self.stream)
                self.k_merge(self.grid, self.block, self.args_merge, shared_mem=self.smem_merge)
            else:
                self.k_merge(self.grid, self.block, self.args_merge, shared_mem=self.smem_merge)
                memcpy(*self.cand_args, sp)
                self.event.record(self.stream)
        self.iters += 1


def _table_fits_shared(tbytes):
    """Whether one query's PQ table (``tbytes``) goes to shared memory; raises the kernel's dynamic
    shared-memory limit when it does. The kernel's own static shared variables count against the
    same per-block limit: a table of exactly 48 KB needs the opt-in too (a launch with 48 KB of
    dynamic memory and a few static bytes is refused by the driver as an invalid argument)."""
    import cupy as cp

    kern = _kernel("bang_distances")
    static = int(kern.attributes.get("shared_size_bytes", 0))
    optin = int(cp.cuda.Device().attributes.get("MaxSharedMemoryPerBlockOptin", _SMEM_STATIC))
    if tbytes > _SMEM_MAX or tbytes + static > optin:
        return False
    if tbytes + static > _SMEM_STATIC and kern.max_dynamic_shared_size_bytes < tbytes:
        kern.max_dynamic_shared_size_bytes = tbytes
    return True


def _merge_smem_opt_in(kern, nbytes):
    """``bang_merge`` keeps W*R new entries (17 B each) and the list (9 B per slot) in shared
    memory: past 48 KB (W*R beyond ~2500, e.g. W = 64 with R = 64) the launch needs the opt-in."""
    import cupy as cp

    if nbytes + int(kern.attributes.get("shared_size_bytes", 0)) <= _SMEM_STATIC:
        return
    optin = int(cp.cuda.Device().attributes.get("MaxSharedMemoryPerBlockOptin", _SMEM_STATIC))
    if nbytes + int(kern.attributes.get("shared_size_bytes", 0)) > optin:
        raise ValueError(f"search_width x graph degree too large for the merge's shared memory ({nbytes} bytes); "
                         f"lower search_width")
    if kern.max_dynamic_shared_size_bytes < nbytes:
        kern.max_dynamic_shared_size_bytes = nbytes


def _group_size(m):
    for gs in (1, 2, 4, 8, 16):
        if m <= 4 * gs:
            return gs
    return 32


def search_host_gpu(engine, Q, k, *, codes, codebook, entry, L, max_iters, n_seeds, rerank, prefetch,
                    pipeline_batch=None, width=1):
    """Search prepared cupy queries ``Q`` over a :class:`HostIndex` (host graph, GPU ``codes``);
    INTERNAL distances (nq, k) float32 and int64 ids, cupy. ``width``: the search width W (work-list
    entries expanded per query per iteration, <= :data:`MAX_WIDTH`)."""
    import cupy as cp

    W = int(width)
    if not 1 <= W <= MAX_WIDTH:
        raise ValueError(f"search_width must be in [1, {MAX_WIDTH}] on the GPU, got {W}")
    t_start = time.perf_counter()
    nq = Q.shape[0]
    graph = np.asarray(engine._graph)
    R = graph.shape[1]
    m = codes.shape[1]
    ksub = codebook.shape[1]
    tbytes = table_bytes(m, ksub)
    use_smem = _table_fits_shared(tbytes)
    GS = _group_size(m)
    pb = int(pipeline_batch) if pipeline_batch else max(1, -(-nq // 2))
    batches = []
    for s in range(0, nq, pb):
        Qb = Q[s:s + pb]
        T = pq_tables(Qb, codebook, engine._imetric)
        seeds = entry.seeds_for(Qb, n_seeds)
        batches.append(_Batch(cp, T, seeds, L=L, R=R, W=W, max_iters=max_iters, codes=codes, use_smem=use_smem,
                              GS=GS, prefetch=prefetch))
    cp.cuda.get_current_stream().synchronize()  # tables and seeds made on the current stream
    for b in batches:  # iteration 0: the seeds are the first "neighbour list"
        b.step(first=True)
    t_wait = t_gather = t_launch = 0.0
    n_polled = 0
    active = list(batches)
    while active:
        # serve a batch whose candidates have arrived, else wait for the one served longest ago
        # (round-robin when all are busy): one batch's gather overlaps the others' GPU work
        t0 = time.perf_counter()
        pick = 0
        for j, b in enumerate(active):
            if b.event.done:
                pick = j
                n_polled += j > 0
                break
        b = active.pop(pick)
        b.event.synchronize()
        t1 = time.perf_counter()
        t_wait += t1 - t0
        if b.cand_flat.max() < 0:  # no query of the batch has a candidate left
            b.done = True
            continue
        # the candidates' rows; -1 rows for finished queries (the kernel skips those queries)
        _gather_rows(graph, b.cand_flat, b.nbr_rows, -1)
        t2 = time.perf_counter()
        t_gather += t2 - t1
        b.step()
        t_launch += time.perf_counter() - t2
        active.append(b)
    t_walk = time.perf_counter() - t_start
    D_parts, I_parts = [], []
    s = 0
    for b in batches:  # 4.9: exact distances of the best logged candidates
        with b.stream:
            order = cp.argsort(b.log_d, axis=1)[:, :rerank]
            cand = cp.take_along_axis(b.log_ids, order, axis=1)
            cand_h = _pinned(cand.shape, np.int32)
            cand.get(out=cand_h)
        rows = gather_rows(engine._data, cand_h)
        Xc = prepare_vectors(cp.asarray(rows), engine.metric, engine.scale).reshape(cand.shape[0], cand.shape[1], -1)
        d, i = exact_topk(Q[s:s + b.nq], Xc, cand, k, engine._imetric)
        s += b.nq
        D_parts.append(d)
        I_parts.append(i)
    cp.cuda.Device().synchronize()
    _stats.clear()
    _stats.update(total_s=time.perf_counter() - t_start, walk_s=t_walk, host_wait_s=t_wait, host_gather_s=t_gather,
                  host_launch_s=t_launch, iterations=max(b.iters for b in batches), batches=len(batches),
                  table_in_smem=bool(use_smem), search_width=W, out_of_turn=n_polled,
                  expansions_mean=float(np.mean([float(b.n_exp.mean()) for b in batches])))
    logger.debug("BANG GPU search: %s", _stats)
    if len(D_parts) == 1:
        return D_parts[0], I_parts[0]
    return cp.concatenate(D_parts), cp.concatenate(I_parts)
