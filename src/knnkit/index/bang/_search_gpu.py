"""GPU host-placement search (BANG sections 3.2, 4.3, 4.6, 4.9): the graph stays in host memory.

Each iteration of a query batch: the GPU's chosen candidate ids go to pinned host memory (D2H),
host threads gather the candidates' neighbour rows from the host graph (a Numba parallel gather,
``_search_cpu.gather_rows``) into a pinned buffer, the rows go back (H2D, async), and
``bang_distances`` / ``bang_merge`` (``bang.cu``) compute PQ distances, filter visited nodes and
merge into the work lists. With prefetch (4.6) ``bang_distances`` already picks the next candidate
and its copy to the host is queued before the merge, so the host gathers while the GPU merges.
Pipelining: the queries are split into batches, each with its own CUDA stream, buffers and event;
the host serves them round-robin, so one batch's gather overlaps the other batches' kernels and
copies. Re-ranking (4.9): the best logged candidates' full-precision rows are gathered on the host,
copied in, and their exact distances computed on the GPU.

Timers (``stats``): seconds the host spent waiting for candidates, gathering rows, and in total.
"""

import time

import numpy as np

from ..._core.config import logger
from ..._core.cuda import get_kernel, kernel_path
from ..._core.metrics import prepare_vectors
from ._pq import pq_tables, table_bytes
from ._search_cpu import bloom_words_for, exact_topk, gather_rows

__all__ = ["search_host_gpu", "last_stats"]

_KERNEL = kernel_path(__file__, "bang.cu")
_NT = 128  # threads per block
_SMEM_STATIC = 48 * 1024
_SMEM_MAX = 200 * 1024  # opt-in dynamic shared memory we allow ourselves (H100/H200: 227 KB)
_H2D, _D2H = 1, 2  # cudaMemcpyKind
_stats = {}


def last_stats():
    """Timers and counters of the last GPU host-placement search (a copy)."""
    return dict(_stats)


def _kernel(name):
    return get_kernel(_KERNEL, name)


def _pinned(shape, dtype):
    import cupyx

    return cupyx.empty_pinned(shape, dtype=dtype)


def _copy_async(cp, dst_ptr, src_ptr, nbytes, kind, stream):
    if nbytes:
        cp.cuda.runtime.memcpyAsync(dst_ptr, src_ptr, nbytes, kind, stream.ptr)


class _Batch:
    """One pipelined query batch: its stream, device state and pinned host buffers."""

    def __init__(self, cp, T, seeds, L, R, max_iters):
        self.cp = cp
        nq = T.shape[0]
        self.nq, self.L, self.R, self.max_iters = nq, L, R, max_iters
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.event = cp.cuda.Event(disable_timing=True)
        self.T = T
        self.seeds = cp.ascontiguousarray(seeds, dtype=cp.int32)
        with self.stream:
            self.wl_ids = cp.full((nq, L), -1, cp.int32)
            self.wl_d = cp.full((nq, L), np.inf, cp.float32)
            self.wl_x = cp.zeros((nq, L), cp.uint8)
            self.W = bloom_words_for(max_iters, R, seeds.shape[1])
            self.bloom = cp.zeros((nq, self.W), cp.uint32)
            self.cap = max(R, seeds.shape[1])
            self.new_ids = cp.empty((nq, self.cap), cp.int32)
            self.new_d = cp.empty((nq, self.cap), cp.float32)
            self.n_new = cp.zeros(nq, cp.int32)
            self.new_taken = cp.full(nq, -1, cp.int32)
            self.cand = cp.full(nq, -1, cp.int32)
            self.log_ids = cp.full((nq, max_iters), -1, cp.int32)
            self.log_d = cp.full((nq, max_iters), np.inf, cp.float32)
            self.n_exp = cp.zeros(nq, cp.int32)
            self.nbr_dev = cp.empty((nq, R), cp.int32)
        self.cand_host = _pinned((nq,), np.int32)
        self.nbr_host = _pinned((nq, R), np.int32)
        self.done = False
        self.iters = 0

    def _distances(self, codes, nbrs, width, select, use_smem, GS):
        m, ksub = codes.shape[1], self.T.shape[2]
        smem = m * ksub * 4 if use_smem else 0
        _kernel("bang_distances")(
            (self.nq,), (_NT,),
            (nbrs, np.int32(width), codes, np.int32(m), self.T, np.int32(ksub), np.int32(use_smem), self.bloom,
             np.int32(self.W), self.wl_ids, self.wl_d, self.wl_x, np.int32(self.L), self.new_ids, self.new_d,
             self.n_new, np.int32(self.cap), np.int32(1 if select else 0), self.new_taken, self.cand, self.log_ids,
             self.log_d, self.n_exp, np.int32(self.max_iters), np.int32(GS), np.int32(self.nq)),
            shared_mem=smem)

    def _merge(self):
        # without prefetch nothing writes new_taken: it stays -1 from the allocation
        smem = 9 * (self.cap + self.L)
        _kernel("bang_merge")(
            (self.nq,), (_NT,),
            (self.wl_ids, self.wl_d, self.wl_x, np.int32(self.L), self.new_ids, self.new_d, self.n_new,
             np.int32(self.cap), self.new_taken, np.int32(self.nq)),
            shared_mem=smem)

    def _select(self):
        _kernel("bang_select")(
            (self.nq,), (_NT,),
            (self.wl_ids, self.wl_d, self.wl_x, np.int32(self.L), self.cand, self.log_ids, self.log_d, self.n_exp,
             np.int32(self.max_iters), np.int32(self.nq)))

    def step(self, codes, nbrs, width, prefetch, use_smem, GS):
        """Queue one iteration: distances (+ selection with prefetch), candidate copy, merge."""
        cp = self.cp
        with self.stream:
            self._distances(codes, nbrs, width, prefetch, use_smem, GS)
            if prefetch:  # 4.6: the candidates leave before the merge
                _copy_async(cp, self.cand_host.ctypes.data, self.cand.data.ptr, self.cand.nbytes, _D2H, self.stream)
                self.event.record(self.stream)
                self._merge()
            else:
                self._merge()
                self._select()
                _copy_async(cp, self.cand_host.ctypes.data, self.cand.data.ptr, self.cand.nbytes, _D2H, self.stream)
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


def _group_size(m):
    for gs in (1, 2, 4, 8, 16):
        if m <= 4 * gs:
            return gs
    return 32


def search_host_gpu(engine, Q, k, *, codes, codebook, entry, L, max_iters, n_seeds, rerank, prefetch,
                    pipeline_batch=None):
    """Search prepared cupy queries ``Q`` over a :class:`HostIndex` (host graph, GPU ``codes``);
    INTERNAL distances (nq, k) float32 and int64 ids, cupy."""
    import cupy as cp

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
        batches.append(_Batch(cp, T, seeds, L, R, max_iters))
    cp.cuda.get_current_stream().synchronize()  # tables and seeds made on the current stream
    for b in batches:  # iteration 0: the seeds are the first "neighbour list"
        b.step(codes, b.seeds, b.seeds.shape[1], prefetch, use_smem, GS)
    t_wait = t_gather = 0.0
    active = list(batches)
    while active:
        still = []
        for b in active:  # round-robin: this batch's gather overlaps the others' GPU work
            t0 = time.perf_counter()
            b.event.synchronize()
            t1 = time.perf_counter()
            t_wait += t1 - t0
            if (b.cand_host < 0).all():
                b.done = True
                continue
            gather_rows(graph, b.cand_host, b.nbr_host, fill=-1)
            t_gather += time.perf_counter() - t1
            with b.stream:
                _copy_async(cp, b.nbr_dev.data.ptr, b.nbr_host.ctypes.data, b.nbr_host.nbytes, _H2D, b.stream)
            b.step(codes, b.nbr_dev, R, prefetch, use_smem, GS)
            still.append(b)
        active = still
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
                  iterations=max(b.iters for b in batches), batches=len(batches), table_in_smem=bool(use_smem),
                  expansions_mean=float(np.mean([float(b.n_exp.mean()) for b in batches])))
    logger.debug("BANG GPU search: %s", _stats)
    if len(D_parts) == 1:
        return D_parts[0], I_parts[0]
    return cp.concatenate(D_parts), cp.concatenate(I_parts)
