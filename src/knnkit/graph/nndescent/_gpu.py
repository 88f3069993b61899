"""GPU NN-Descent (GNND, Wang, Zhao & Zeng, section 4) driving the kernels of ``gnnd.cu``.

One iteration is four kernel launches:

1. ``gnnd_sample``  - the first ``p`` NEW and ``p`` OLD entries of every list (sampled NEW become OLD);
2. ``gnnd_reverse_count`` + ``gnnd_reverse`` - reverse samples appended atomically up to ``2p`` per
   list, a uniform sample of each node's reverse neighbours (``reverse="random"``) or the first
   to arrive (``reverse="atomic"``, the paper);
3. ``gnnd_local_join`` - one thread block per node: dedupe its samples, NEW-NEW and NEW-OLD
   distances in shared memory, selective (or basic) update of the lists under spinlocks;
4. a read of the update counter, which is the convergence test.

The graph lives on the GPU as ``idx`` (n, K) int32 with bit 31 = NEW flag and ``dist`` (n, K)
float32. With ``locks="segmented"`` a list is ``ceil(K / 32)`` independently sorted and locked
segments (neighbour ``v`` goes to segment ``v % nseg``); the final pass merges them.

The public entry point is :func:`knnkit.knn_graph`; this module is its GPU engine.
"""

import math
import time

import numpy as np

from ..._core.config import finish, logger, progress
from ..._core.cuda import kernel_path

_KERNEL = kernel_path(__file__, "gnnd.cu")

__all__ = ["nndescent_gpu"]

_DTYPES = {np.dtype(np.float32): "float", np.dtype(np.float16): "f16",
           np.dtype(np.uint8): "unsigned char", np.dtype(np.int8): "signed char"}
_METRICS = {"l2": 0, "ip": 1, "l1": 2}
_MAX_K = 256          # 8 list entries per lane in the one-warp-per-list kernels (4 up to K = 128)
_MAX_SAMPLE = 32      # 2p <= 64 samples of each kind in one thread block
_WARPS = 4            # warps per block of the one-warp-per-list kernels


def _kernels(dtype, metric, maxs, per_lane, group, minblocks, tensor=False):
    from ..._core.cuda import get_module

    t, m = _DTYPES[np.dtype(dtype)], _METRICS[metric]
    e = per_lane
    names = (f"gnnd_prepare<{t}, {m}, {e}>", f"gnnd_local_join<{t}, {m}, {maxs}, {e}, {int(tensor)}>",
             f"gnnd_sample<{e}>", "gnnd_reverse", "gnnd_reverse_count", f"gnnd_col_stats<{t}>")
    opts = ("-lineinfo", f"-DGNND_GROUP={group}") + ((f"-DGNND_MINB={minblocks}",) if minblocks else ())
    mod = get_module(_KERNEL, options=opts, name_expressions=names)
    return [mod.get_function(nm) for nm in names]


def _tensor_transform(X, metric, stats):
    """Column means (l2 only, None otherwise) and a power-of-two scale for the fp16 copies of the
    tensor-core join: ``(x - mu) * scale`` has its largest magnitude near 1024, so an offset common
    to all rows, or values far from 1, do not eat fp16's 11 significant bits (fp16 keeps ~3
    decimal digits of each value, not of the differences between neighbours). Integer inputs
    (|x| <= 255 in fp16 is exact) are left as they are.

    Two passes of ``stats`` = ``gnnd_col_stats`` (partial column sums, then partial max |x - mu|): CuPy's
    column-wise mean / min / max took ~1 s on 10M x 96, 11 % of the whole build (NOTES_gnnd.md)."""
    import cupy as cp

    if X.dtype.kind in "iu":
        return None, 1.0
    n, d = X.shape
    threads = min(256, 32 * -(-d // 32))
    blocks = int(max(1, min(n, 1024)))
    mu = None
    if metric == "l2":
        part = cp.empty((blocks, d), cp.float32)
        stats((blocks,), (threads,), (X, np.int64(n), np.int32(d), _ptr(None), part))
        mu = part.sum(axis=0, dtype=cp.float32) * cp.float32(1.0 / n)
    part = cp.empty(blocks, cp.float32)
    stats((blocks,), (threads,), (X, np.int64(n), np.int32(d), cp.zeros(d, cp.float32) if mu is None else mu, part))
    bound = float(part.max())
    scale = 1.0
    if 0.0 < bound < float("inf"):
        # exponent clamped so that 1 / scale^2 stays a normal float32
        scale = float(2.0 ** min(60, max(-60, round(math.log2(1024.0 / bound)))))
    return (None if mu is None else cp.ascontiguousarray(mu)), scale


def _ptr(a):
    """A kernel argument for an optional array: the array, or a null pointer."""
    return np.uint64(0) if a is None else a


def _allow_smem(kernel, nbytes):
    """Opt the kernel in to more than 48 KiB of dynamic shared memory (MAXS = 64 needs ~67 KiB)."""
    if nbytes <= 48 * 1024:
        return
    try:
        kernel.max_dynamic_shared_size_bytes = nbytes
    except AttributeError:  # a plain cupy.cuda.Function
        from cupy.cuda import driver

        driver.funcSetAttribute(kernel.ptr, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes)


def _join_smem(maxs, tensor=False):
    if tensor:  # D, fp32 norms, fp16 rows of 128 dimensions (stride 68 words)
        return 4 * (maxs * (2 * maxs + 1) + 2 * maxs) + 4 * (2 * maxs * 68)
    return 4 * (2 * maxs * 68 + maxs * (2 * maxs + 1))


def nndescent_gpu(X, K, *, sample, max_iters, delta, metric, init_indices=None, init_distances=None,
                  split=None, seed=0, update="selective", locks="segmented", distance="auto", reverse="random",
                  callback=None, peer=None, sparse_exchange=None, overlap_share=None, _group=8, _minblocks=None):
    """Build an approximate k-NN graph of ``X`` on the GPU with GNND.

    Parameters
    ----------
    X : cupy.ndarray, shape (n, d)
        C-contiguous float32 (float16, uint8 and int8 also work and move fewer bytes), already
        prepared for the metric (unit rows for cosine).
    K : int
        List length, at most 256 and at most n - 1 (longer lists are padded with -1 / inf).
    sample : int
        p: NEW and OLD samples per list per iteration (reverse samples fill up to 2p), 1..32.
    max_iters : int
        Upper bound on the iterations.
    delta : float
        Stop when an iteration makes fewer than ``delta * n * K`` updates.
    metric : {"l2", "ip", "l1"}
        Squared L2, negative inner product, or manhattan.
    init_indices, init_distances : cupy.ndarray, optional
        Initial graph (n, K'); invalid, self or duplicate entries are replaced by random ones,
        missing distances are computed.
    split : int, optional
        Graph merge (GGM, section 5): only pairs with one id < split and the other >= split are
        compared; initial entries across the split are NEW, the others OLD.
    seed : int
        Seed of the random initial graph.
    update : {"selective", "basic"}
        Insert only the nearest NEW / OLD object of each sample (Algorithm 2) or every pair.
    locks : {"segmented", "global"}
        One spinlock per 32-entry segment of a list, or one per list.
    distance : {"auto", "fp32", "tensor"}
        Distances of the local join: fp32 SIMT (exact), or tensor cores (fp16 copies of the sample
        vectors, mma.sync m16n8k16 products with fp32 accumulation, squared L2 as
        ``|a|^2 + |b|^2 - 2 a.b``; "l2" and "ip" only). For the fp16 copies, rows are centred (l2)
        and scaled by a power of two, so an offset or the data's range costs no precision.
        ``"auto"``: tensor for l2 / ip (measured 3-6 % faster end to end at the same recall,
        1M x 128, k = 10 / 32 / 64), fp32 for l1. The returned distances are exact fp32 either way (recomputed at the end);
        fp16 rounding may only swap near-ties. Measurements: NOTES_gnnd.md.
    reverse : {"random", "atomic"}
        Which reverse neighbours fill a node's sample up to ``2p``: a uniform sample of them
        (each kept with probability ``1.25 * room / in-degree``, one extra counting pass), or the
        first whose threads append (section 4.1 as written). With a skewed in-degree first-come
        serves the same nodes at every iteration (NOTES_gnnd.md, "Reverse sampling").
    callback : callable, optional
        ``callback(iteration, idx, dist)`` after every iteration with the raw graph (bit 31 of
        ``idx`` is the NEW flag; rows are sorted per segment only); a true return value stops the
        descent after this iteration (``stats["stopped_by_callback"]``: the iteration).
    peer : object, optional
        One descent on several devices (:class:`knnkit._core.comm.NcclPeer`; ``knnkit.dask``'s
        ``partition="descent"``): every device holds all of ``X`` and the whole graph, samples and
        joins only its own nodes ``peer.lo .. peer.hi - 1`` (``peer.bounds``: every device's), the
        forward samples are all-gathered before the reverse ones are drawn, and after each
        iteration every device sends its copy of the others' rows to their owners
        (``peer.exchange``), the owners merge them into their rows (``gnnd_merge_copies``) and
        share those (``peer.share_rows``); the update counts are summed
        (``peer.allreduce_sum``), so that every device goes on with the same graph and stops at
        the same iteration. Returns the lists of rows ``lo .. hi - 1`` only. Needs
        segments of at most 32 entries (``locks="segmented"``, or ``K <= 32``); no ``callback``.
    overlap_share : bool, optional
        Default ``OVERLAP_SHARE`` (True). With ``peer``: the owners' merged rows go to the other
        devices on a second stream at the start of the next iteration, beside the sampling of
        the own rows, instead of before the iteration ends (the next NCCL call, the forward
        samples' all-gather, waits for it). The last iteration's share is skipped: no device
        reads another's rows after the descent.
    sparse_exchange : bool, optional
        Default ``SPARSE_EXCHANGE`` (True). With ``peer``: only the rows an iteration's joins
        changed travel (to their owners, and back from them once merged;
        ``_merge_changed_rows``), instead of every device's whole
        share of the graph twice per iteration, whenever fewer than ``SPARSE_EXCHANGE_BELOW`` of
        the rows changed (``stats["rows_moved"]``).
    _group, _minblocks : int
        Kernel tuning knobs (lanes per insertion group, 4 or 8; minimum resident blocks per SM
        for the register allocator), see NOTES_gnnd.md.

    Returns
    -------
    indices : cupy.ndarray (n, K) int32
    distances : cupy.ndarray (n, K) float32
        Rows sorted ascending (ties: smaller id), no self, no duplicates.
    stats : dict
        ``iterations``, ``updates`` (per iteration), ``time_s`` (per iteration, seconds).

    Examples
    --------
    >>> import cupy as cp  # doctest: +SKIP
    >>> X = cp.random.rand(10000, 32, dtype=cp.float32)  # doctest: +SKIP
    >>> idx, dist, stats = nndescent_gpu(X, 16, sample=8, max_iters=20, delta=0.001,
    ...                                  metric="l2")  # doctest: +SKIP
    """
    import cupy as cp

    if metric not in _METRICS:
        raise ValueError(f"metric must be one of {tuple(_METRICS)}, got {metric!r}")
    if update not in ("selective", "basic"):
        raise ValueError(f"update must be 'selective' or 'basic', got {update!r}")
    if locks not in ("segmented", "global"):
        raise ValueError(f"locks must be 'segmented' or 'global', got {locks!r}")
    if reverse not in ("random", "atomic"):
        raise ValueError(f"reverse must be 'random' or 'atomic', got {reverse!r}")
    if distance not in ("auto", "fp32", "tensor"):
        raise ValueError(f"distance must be 'auto', 'fp32' or 'tensor', got {distance!r}")
    if distance == "auto":
        distance = "fp32" if metric == "l1" else "tensor"
    if distance == "tensor" and metric == "l1":
        raise ValueError("distance='tensor' needs a product form of the metric: l2 or ip, not l1")
    X = cp.asarray(X)
    if X.ndim != 2 or np.dtype(X.dtype) not in _DTYPES:
        raise TypeError("X must be a 2-D float32, float16, uint8 or int8 array")
    X = cp.ascontiguousarray(X)
    n, d = X.shape
    K_out = int(K)
    if K_out < 1:
        raise ValueError(f"K must be >= 1, got {K}")
    K = min(K_out, n - 1)
    if K > _MAX_K:
        raise ValueError(f"K={K} exceeds the GPU NN-Descent maximum {_MAX_K}")
    p = int(sample)
    if not 1 <= p <= _MAX_SAMPLE:
        raise ValueError(f"sample must be in 1..{_MAX_SAMPLE}, got {sample}")
    if peer is not None:
        if callback is not None:
            raise ValueError("a descent shared between devices (peer) takes no callback")
        if not 0 <= peer.lo < peer.hi <= n:
            raise ValueError(f"peer rows {peer.lo}..{peer.hi} are not within 0..{n}")
    if K < 1:  # n == 1: no neighbours at all
        if peer is not None:
            return (cp.full((peer.hi - peer.lo, K_out), -1, cp.int32),
                    cp.full((peer.hi - peer.lo, K_out), cp.inf, cp.float32), dict(iterations=0, updates=[], time_s=[]))
        return (cp.full((n, K_out), -1, cp.int32), cp.full((n, K_out), cp.inf, cp.float32),
                dict(iterations=0, updates=[], time_s=[]))
    cap = 2 * p
    maxs = 32 if cap <= 32 else 64
    nseg = -(-K // 32) if locks == "segmented" else 1
    if nseg > 1 and n // nseg - 1 <= -(-K // nseg):
        nseg = 1  # segment v % nseg needs a residue class larger than a segment (tiny n only)
    split_arg = -1 if split is None else int(split)
    if split is not None and not 0 < split_arg < n:
        raise ValueError(f"split must be in 1..n-1, got {split}")
    if peer is not None and -(-K // nseg) > 32:
        raise ValueError(f"a descent shared between devices needs segments of <= 32 entries (K={K}, "
                         f"{nseg} segment(s)): locks='segmented'")
    if _group not in (4, 8):
        raise ValueError("_group must be 4 or 8")
    # lists up to 128 keep 4 entries per lane (fewer registers), longer ones 8
    per_lane = 4 if K <= 128 else 8
    tensor = distance == "tensor"
    prepare, join, sample_k, reverse_k, count_k, col_stats = _kernels(X.dtype, metric, maxs, per_lane, _group,
                                                                       _minblocks, tensor)
    tc_mu, tc_scale = _tensor_transform(X, metric, col_stats) if tensor else (None, 1.0)
    smem = _join_smem(maxs, tensor)
    _allow_smem(join, smem)

    g_idx = cp.empty((n, K), cp.int32)
    g_dist = cp.empty((n, K), cp.float32)
    if init_indices is not None:
        ii = cp.ascontiguousarray(cp.asarray(init_indices, dtype=cp.int32))
        if ii.ndim != 2 or ii.shape[0] != n:
            raise ValueError(f"init_indices must have shape (n, K'), got {ii.shape}")
        dd = None
        if init_distances is not None:
            dd = cp.ascontiguousarray(cp.asarray(init_distances, dtype=cp.float32))
            if dd.shape != ii.shape:
                raise ValueError("init_distances must have the shape of init_indices")
        # bring to K columns: truncate, or pad with -1 (filled randomly by the kernel)
        if ii.shape[1] != K:
            k0 = min(K, ii.shape[1])
            i2 = cp.full((n, K), -1, cp.int32)
            i2[:, :k0] = ii[:, :k0]
            ii = i2
            if dd is not None:
                d2 = cp.full((n, K), cp.nan, cp.float32)
                d2[:, :k0] = dd[:, :k0]
                dd = d2
    else:
        ii, dd = None, None

    wblocks = (n + _WARPS - 1) // _WARPS
    list_smem = _WARPS * 2 * K * 4
    prep_smem = _WARPS * 4 * K * 4
    seed64 = np.uint64(int(seed) & 0xFFFFFFFFFFFFFFFF)
    prepare((wblocks,), (32 * _WARPS,),
            (X, np.int32(n), np.int32(d), np.int32(K), np.int32(nseg), _ptr(ii), _ptr(dd), g_idx, g_dist,
             seed64, np.int32(split_arg), np.int32(1), np.int32(0), np.int32(n)), shared_mem=prep_smem)

    locks_arr = cp.zeros(n * nseg, cp.int32)
    new_s = cp.empty((n, maxs), cp.int32)
    old_s = cp.empty((n, maxs), cp.int32)
    cnts = cp.empty((4, n), cp.int32)  # new_cnt, new_fwd, old_cnt, old_fwd
    counter = cp.zeros(1, cp.uint64)
    indeg = cp.empty(2 * n, cp.int32) if reverse == "random" else None
    threshold = delta * n * K
    stats = dict(iterations=0, updates=[], time_s=[])
    join_threads = 128 if maxs == 32 else 256
    lo, hi = (0, n) if peer is None else (int(peer.lo), int(peer.hi))
    dirty = None
    sparse_exchange = SPARSE_EXCHANGE if sparse_exchange is None else bool(sparse_exchange)
    if peer is not None:
        merge_k = _merge_kernel()
        share = max(b - a for a, b in peer.bounds)
        # the other devices' copies of this device's rows (whole shares; one slot per other
        # device: a slot for this device's own would hold n K 8 / size bytes for nothing, 15 GB per
        # GPU at 40M x 96 on two GPUs)
        copies_i = cp.empty((peer.size - 1, share, K), cp.int32)
        copies_d = cp.empty((peer.size - 1, share, K), cp.float32)
        sample_send = cp.empty((share, 2 * p + 4), cp.int32)
        sample_recv = cp.empty((peer.size, share, 2 * p + 4), cp.int32)
        # rows this device's joins changed (the others are equal in every copy but for NEW flags)
        dirty = cp.zeros(n, cp.uint8) if sparse_exchange else None
        row_kernels = (merge_k,) + _row_kernels() if sparse_exchange else None
        moved = []  # rows sent per iteration (sparse exchange), for the stats
    overlap_share = OVERLAP_SHARE if overlap_share is None else bool(overlap_share)
    # the owners' rows to the other devices, run on share_stream at the start of the next iteration
    # (overlap_share) so that it overlaps the sampling of the own rows
    share_stream = cp.cuda.Stream(non_blocking=True) if peer is not None and overlap_share else None
    pending = inflight = None
    ev_merged, ev_shared = cp.cuda.Event(), cp.cuda.Event()
    cp.cuda.get_current_stream().synchronize()
    # advanced after each iteration's update count is read back (that read is the iteration's only sync)
    bar = progress(total=int(max_iters), desc="NN-Descent (GPU)", unit="iter")
    ev = [cp.cuda.Event() for _ in range(7)]
    phase_ms = dict(sample=0.0, reverse=0.0, join=0.0, exchange=0.0, sample_own=0.0, sample_share=0.0)
    for it in range(int(max_iters)):
        t0 = time.perf_counter()
        ev[0].record()
        counter.fill(0)
        if pending is not None:
            # The sampling below reads the own rows and clears NEW flags in them while this share
            # reads them: a receiver may see a flag set or cleared, both of which the owner's row
            # merge accepts (an entry stays NEW only where every copy has it NEW). The share writes
            # other devices' rows only, which nothing reads before the join.
            ev_merged.record()
            share_stream.wait_event(ev_merged)
            with share_stream:
                pending()
                ev_shared.record(share_stream)
            # kept until the current stream has waited for the share: CuPy's pool may hand the
            # buffers of the share to the current stream once they are freed
            inflight, pending = pending, None
        # each device samples its own rows (a row's sampled NEW entries become OLD in its copy only;
        # the merge keeps an entry NEW only where every copy has it NEW)
        sample_k(((hi - lo + _WARPS - 1) // _WARPS,), (32 * _WARPS,),
                 (g_idx[lo:hi], g_dist[lo:hi], np.int32(hi - lo), np.int32(K), np.int32(nseg), np.int32(p),
                  np.int32(maxs), new_s[lo:hi], cnts[0, lo:hi], cnts[1, lo:hi], old_s[lo:hi], cnts[2, lo:hi],
                  cnts[3, lo:hi]), shared_mem=list_smem)
        ev[5].record()
        if inflight is not None:  # (NCCL calls of one communicator run one after the other)
            cp.cuda.get_current_stream().wait_event(ev_shared)
            inflight = None
        if peer is not None:  # every device's forward samples to every device (the reverse ones need all)
            _share_samples(peer, new_s, old_s, cnts, p, sample_send, sample_recv)
        ev[6].record()
        if indeg is not None:
            indeg.fill(0)
            count_k(((n + 255) // 256,), (256,), (np.int32(n), np.int32(maxs), new_s, cnts[1], old_s, cnts[3], indeg,
                                                  np.int32(lo), np.int32(hi)))
        ev[1].record()
        salt = np.uint64((int(seed) * 0x9E3779B97F4A7C15 + it + 1) & 0xFFFFFFFFFFFFFFFF)
        reverse_k(((n + 255) // 256,), (256,),
                  (np.int32(n), np.int32(maxs), np.int32(cap), new_s, cnts[1], cnts[0], old_s, cnts[3], cnts[2],
                   _ptr(indeg), salt, np.int32(lo), np.int32(hi)))
        ev[2].record()
        if dirty is not None:
            dirty.fill(0)
        # blockIdx.x indexes only the samples: the rows lo..hi-1 of them are this device's joins
        join((hi - lo,), (join_threads,),
             (X, np.int32(n), np.int32(d), np.int32(K), np.int32(nseg), np.int32(cap), new_s[lo:hi],
              cnts[0, lo:hi], old_s[lo:hi], cnts[2, lo:hi], g_idx, g_dist, locks_arr, np.int32(split_arg),
              np.int32(update == "basic"), counter, _ptr(tc_mu), np.float32(tc_scale), _ptr(dirty)), shared_mem=smem)
        ev[3].record()
        if peer is not None:
            defer = share_stream is not None
            if dirty is None:
                pending = _merge_copies(peer, merge_k, g_idx, g_dist, copies_i, copies_d, K, nseg, defer=defer)
            else:
                sent, pending = _merge_changed_rows(peer, row_kernels, g_idx, g_dist, dirty, (copies_i, copies_d),
                                                    K, nseg, defer=defer)
                moved.append(sent)
            peer.allreduce_sum(counter)
        ev[4].record()
        upd = int(counter.get()[0])
        dt = time.perf_counter() - t0
        for key, a, b in (("sample", 0, 1), ("reverse", 1, 2), ("join", 2, 3), ("exchange", 3, 4),
                          ("sample_own", 0, 5), ("sample_share", 5, 6)):
            phase_ms[key] += cp.cuda.get_elapsed_time(ev[a], ev[b])
        stats["iterations"] = it + 1
        stats["updates"].append(upd)
        stats["time_s"].append(dt)
        logger.debug("gnnd iteration %d: %d updates, %.4f s", it, upd, dt)
        bar.update()
        bar.set_postfix(updates=upd, refresh=False)
        if callback is not None and callback(it, g_idx, g_dist):
            stats["stopped_by_callback"] = it
            break
        if upd < threshold:
            break
    finish(bar)
    bar.close()
    # the share after the last iteration is not needed (each device returns its own rows); one
    # still on its stream is waited for before any buffer goes back to the pool
    pending = None
    if share_stream is not None:
        share_stream.synchronize()
    stats["overlap_share"] = share_stream is not None

    stats["phase_ms"] = {key: round(v, 2) for key, v in phase_ms.items()}  # GPU time by step, all iterations
    if peer is not None:
        del copies_i, copies_d
        if dirty is not None:
            stats["rows_moved"] = moved  # per iteration: (rows sent to owners, rows shared), summed over devices
    out_idx = cp.empty((hi - lo, K), cp.int32)
    out_dist = cp.empty((hi - lo, K), cp.float32)
    wblocks = (hi - lo + _WARPS - 1) // _WARPS
    # tensor-core distances are those of fp16-rounded vectors: the final lists get fp32 ones (a null
    # distance array makes the kernel compute every distance)
    prepare((wblocks,), (32 * _WARPS,),
            (X, np.int32(n), np.int32(d), np.int32(K), np.int32(1), g_idx[lo:hi],
             _ptr(None if tensor else g_dist[lo:hi]), out_idx, out_dist, seed64,
             np.int32(-1), np.int32(0), np.int32(lo), np.int32(hi - lo)), shared_mem=prep_smem)
    if K < K_out:
        pad_i = cp.full((hi - lo, K_out), -1, cp.int32)
        pad_d = cp.full((hi - lo, K_out), cp.inf, cp.float32)
        pad_i[:, :K], pad_d[:, :K] = out_idx, out_dist
        out_idx, out_dist = pad_i, pad_d
    return out_idx, out_dist, stats


def _merge_kernel():
    from ..._core.cuda import get_kernel

    return get_kernel(_KERNEL, "gnnd_merge_copies", options=("-lineinfo",))


def _share_samples(peer, new_s, old_s, cnts, p, send, recv):
    """All-gather the forward samples of every device's own rows: the first ``p`` NEW and OLD
    samples and the four counts of each row, packed ``(rows, 2p + 4)`` per device."""
    if peer.size == 1:
        return
    m = peer.hi - peer.lo
    send[:m, :p] = new_s[peer.lo:peer.hi, :p]
    send[:m, p:2 * p] = old_s[peer.lo:peer.hi, :p]
    send[:m, 2 * p:] = cnts[:, peer.lo:peer.hi].T
    peer.allgather(send, recv)
    for r, (a, b) in enumerate(peer.bounds):
        if r != peer.rank and b > a:
            new_s[a:b, :p] = recv[r, :b - a, :p]
            old_s[a:b, :p] = recv[r, :b - a, p:2 * p]
            cnts[:, a:b] = recv[r, :b - a, 2 * p:].T


def _merge_copies(peer, merge_k, g_idx, g_dist, copies_i, copies_d, K, nseg, defer=False):
    """After the joins: every device sends the other devices' rows of its copy to their owners,
    each owner merges them into its own rows (``gnnd_merge_copies``), and the owners' rows go
    to every device, so that the next iteration starts from the same graph everywhere.
    ``defer``: that last step is returned as a function to call later (else None, done)."""
    if peer.size == 1:
        return None
    m = peer.hi - peer.lo
    sends_i = [g_idx[a:b] for a, b in peer.bounds]
    sends_d = [g_dist[a:b] for a, b in peer.bounds]
    # rank r's copy lands in slot r, less one past this rank (which has no slot)
    recvs_i = [copies_i[r - (r > peer.rank), :m] if r != peer.rank else None for r in range(peer.size)]
    recvs_d = [copies_d[r - (r > peer.rank), :m] if r != peer.rank else None for r in range(peer.size)]
    peer.exchange([(a, b) for a, b in zip(sends_i, sends_d)], [(a, b) for a, b in zip(recvs_i, recvs_d)])
    own_i, own_d = g_idx[peer.lo:peer.hi], g_dist[peer.lo:peer.hi]
    grid = (int(-(-m * nseg * 32 // 256)),)
    for r in range(peer.size):
        if r != peer.rank and m > 0:
            merge_k(grid, (256,), (own_i, own_d, recvs_i[r], recvs_d[r], own_i, own_d,
                                   np.int64(m), np.int32(K), np.int32(nseg), np.uint64(0)))

    def share():
        peer.share_rows([g_idx, g_dist])

    if defer:
        return share
    share()
    return None


#: The shared descent's default: only the rows an iteration changed travel (``sparse_exchange``).
SPARSE_EXCHANGE = True
#: The shared descent's default: the owners' merged rows travel beside the next sampling
#: (``overlap_share``).
OVERLAP_SHARE = True
#: The shared descent sends only the changed rows while they are fewer than this fraction of all
#: rows (packing them costs a gather and a scatter each way; above it the whole shares travel).
SPARSE_EXCHANGE_BELOW = 0.5


def _row_kernels():
    """(gnnd_pack_rows, gnnd_unpack_rows): the changed rows of the shared descent in and out of
    one buffer ``[ids (m) | idx (m x K) | dist bits (m x K)]``."""
    from ..._core.cuda import get_kernel

    return (get_kernel(_KERNEL, "gnnd_pack_rows", options=("-lineinfo",)),
            get_kernel(_KERNEL, "gnnd_unpack_rows", options=("-lineinfo",)))


def _merge_changed_rows(peer, kernels, g_idx, g_dist, dirty, copies, K, nseg, defer=False):
    """:func:`_merge_copies` for the rows that changed only. Every copy started the iteration
    equal but for NEW flags (a device clears them by sampling in its own rows only; the merge keeps
    NEW only where both copies have it, so a stale NEW in another device's copy never survives);
    a row no join of this device touched (``dirty`` 0) is the owner's row there. So each device
    sends its owners the rows its joins changed, the owners merge them into theirs and send back
    every own row that changed (by their joins or by a merge). When more than
    ``SPARSE_EXCHANGE_BELOW`` of the rows changed (every row, in the first iterations), the whole
    shares travel instead (:func:`_merge_copies` into ``copies``). Returns ``((rows sent to owners,
    rows shared) summed over devices, share)``: ``share`` the last step (the owners' rows to the
    other devices) as a function to call later with ``defer``, else None (done)."""
    import cupy as cp

    if peer.size == 1:
        return (0, 0), None
    merge_k, pack, unpack = kernels
    size, me = peer.size, peer.rank
    lo, hi = peer.lo, peer.hi
    n = g_idx.shape[0]
    changed = [cp.flatnonzero(dirty[a:b]).astype(cp.int32) if r != me else None
               for r, (a, b) in enumerate(peer.bounds)]
    cnt = cp.asarray([0 if r == me else int(c.size) for r, c in enumerate(changed)], dtype=cp.int64)
    every = cp.empty((size, size), cp.int64)
    peer.allgather(cnt, every)
    every = every.get()  # every[s, r]: rows s sends to r
    if int(every.sum()) > SPARSE_EXCHANGE_BELOW * n:
        share = _merge_copies(peer, merge_k, g_idx, g_dist, copies[0], copies[1], K, nseg, defer=defer)
        return (int(sum(b - a for a, b in peer.bounds) * (size - 1)), int(n)), share

    def packed(base, ids):
        m = int(ids.size)
        buf = cp.empty(m * (2 * K + 1), cp.int32)
        if m:
            pack((-(-m * 32 // 256),), (256,), (g_idx, g_dist, np.int64(base), ids, np.int64(m), np.int32(K), buf))
        return buf

    def views(buf, m):
        return buf[:m], buf[m:m + m * K].reshape(m, K), buf[m + m * K:].reshape(m, K).view(cp.float32)

    sends = [packed(a, changed[r]) if r != me else None for r, (a, b) in enumerate(peer.bounds)]
    recvs = [cp.empty(int(every[s, me]) * (2 * K + 1), cp.int32) if s != me else None for s in range(size)]
    peer.exchange(sends, recvs)
    mine = dirty[lo:hi]
    own_i, own_d = g_idx[lo:hi], g_dist[lo:hi]
    for s in range(size):
        m = int(every[s, me])
        if s == me or m == 0:
            continue
        rid, ri, rd = views(recvs[s], m)
        merge_k((int(-(-m * nseg * 32 // 256)),), (256,),
                (own_i, own_d, ri, rd, own_i, own_d, np.int64(m), np.int32(K), np.int32(nseg), rid))
        mine[rid] = 1
    del sends, recvs
    own = cp.flatnonzero(mine).astype(cp.int32)
    counts = cp.empty((size, 1), cp.int64)
    peer.allgather(cp.asarray([int(own.size)], dtype=cp.int64), counts)
    counts = counts.get()[:, 0]
    buf = packed(lo, own)

    def share():
        recvs = [cp.empty(int(counts[s]) * (2 * K + 1), cp.int32) if s != me else None for s in range(size)]
        peer.exchange([buf if r != me else None for r in range(size)], recvs)
        for s, (a, b) in enumerate(peer.bounds):
            m = int(counts[s])
            if s != me and m:
                unpack((-(-m * 32 // 256),), (256,), (recvs[s], np.int64(m), np.int32(K), np.int64(a), g_idx, g_dist))

    sent = (int(every.sum()), int(counts.sum()))
    if defer:
        return sent, share
    share()
    return sent, None


def sort_rows_gpu(X, ids, dists, k, metric, *, sample=16, seed=0, tile=None):
    """The first k of each row of the candidate lists ``ids`` / ``dists`` (tuples of (n, *)
    int32 ids / float32 internal distances, side by side: W columns in all) after dropping
    invalid ids (-1) and repeats and sorting by (distance, id), in one warp-per-row kernel
    (``gnnd_prepare`` with one segment, no flags). Dropped slots are refilled with random points
    whose distances are computed from ``X``: extra candidates with true distances, so a row is the
    top k of a superset of its candidates (among a merge's near neighbours they rarely rank). Returns ``(idx
    (n, k), dist (n, k))``, or None where the kernel
    does not apply (W > 256, or n - 1 <= W) and the caller should sort otherwise.

    Used by the GGM far-half merge (Algorithm 3 line 12): one launch per row tile instead of two
    CuPy segmented sorts over n x W (~100 ms a merge of 660k points, NOTES_gnnd.md). ``sample``
    selects the compiled module that the descent of the same merge used; ``tile`` rows at a time
    (default: under the memory budget)."""
    import cupy as cp

    from ..._core.config import get_memory_budget

    n = ids[0].shape[0]
    W = sum(a.shape[1] for a in ids)
    if W > _MAX_K or n - 1 <= W:
        return None
    X = cp.ascontiguousarray(X)
    maxs = 32 if 2 * int(sample) <= 32 else 64
    per_lane = 4 if W <= 128 else 8
    prepare = _kernels(X.dtype, metric, maxs, per_lane, 8, None, metric != "l1")[0]
    out_i = cp.empty((n, k), cp.int32)
    out_d = cp.empty((n, k), cp.float32)
    # per row: inputs and outputs of W entries (16 W bytes) and a copy of the inputs
    tile = int(tile) if tile else max(1024, get_memory_budget() // (4 * 24 * W))
    seed64 = np.uint64(int(seed) & 0xFFFFFFFFFFFFFFFF)
    for a in range(0, n, tile):
        b = min(n, a + tile)
        ti = cp.empty((b - a, W), cp.int32)
        td = cp.empty((b - a, W), cp.float32)
        prepare(((b - a + _WARPS - 1) // _WARPS,), (32 * _WARPS,),
                (X, np.int32(n), np.int32(X.shape[1]), np.int32(W), np.int32(1),
                 cp.concatenate([x[a:b].astype(cp.int32, copy=False) for x in ids], axis=1),
                 cp.concatenate([x[a:b].astype(cp.float32, copy=False) for x in dists], axis=1),
                 ti, td, seed64, np.int32(-1), np.int32(0), np.int32(a), np.int32(b - a)),
                shared_mem=_WARPS * 4 * W * 4)
        out_i[a:b] = ti[:, :k]
        out_d[a:b] = td[:, :k]
    return out_i, out_d


def nndescent(X, K, *, sample, max_iters, delta, metric, init_indices=None, init_distances=None, split=None,
              seed=0, update="selective", reverse="random", callback=None):
    """GPU twin of :func:`knnkit.graph.nndescent._cpu.nndescent` (same signature): see
    :func:`nndescent_gpu` for the kernels' own options."""
    return nndescent_gpu(X, K, sample=sample, max_iters=max_iters, delta=delta, metric=metric,
                         init_indices=init_indices, init_distances=init_distances, split=split, seed=seed,
                         update=update, reverse=reverse, callback=callback)
