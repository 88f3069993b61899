"""Functions that run ON the Dask workers (module-level, so that workers import them by name).

Each takes and returns host numpy arrays (or a shard's ``GraphIndex``, which stays in its
worker's memory); distances travel in the user metric, ids are global (a partition's offset
added). The client never sees a partition's data: tasks pass futures to each other and Dask
moves the bytes between workers.
"""

import numpy as np

from .._core.backend import as_host
from .._core.metrics import finalize_distances, to_internal, top_direction

__all__ = ["exact_part", "prepare_part", "exact_prepared", "drop_self", "finish_lists",
           "merge_topk", "single_graph", "part_graph", "globalize", "compact", "pair_merge", "merge_running", "build_shard",
           "search_shard", "save_shard", "load_shard", "shard_info", "take", "keep", "as_leaf", "size_of", "rows_of",
           "tree_nodes", "leaf_path",
           "sample_rows", "fit_tree", "route", "select_leaf", "assemble", "leaf_graph", "slab_samples",
           "select_slab", "slab_graph", "slab_for_leaf", "merge_leaf", "search_graph", "cross_search",
           "short_rows", "distances_at", "row_slice", "leaf_rows_in", "place_rows", "absmax_of", "scale_rows",
           "unscale_lists", "nccl_id", "descent_lists",
           "gpu_peer_ready", "abort_descent", "recall_from"]


def _host(a, dtype=None):
    a = np.asarray(as_host(a))
    return a if dtype is None else a.astype(dtype, copy=False)


def _take_rows(X, rows):
    """Rows ``rows`` of ``X`` as host float32, selected where ``X`` lives (a device partition's
    few rows are copied, not the partition)."""
    from .._core.backend import get_array_module

    xp = get_array_module(X)
    return np.ascontiguousarray(_host(X[xp.asarray(np.asarray(rows, dtype=np.int64))], np.float32))


def rows_of(X, rows):
    """Rows ``rows`` (local ids) of a partition, host float32."""
    return _take_rows(X, rows)


def size_of(t):
    """Rows of a task's ``(ids, ...)`` tuple."""
    return int(len(t[0]))


def take(pair, i):
    """Element ``i`` of a task's tuple result (a separate tiny task, so halves move separately)."""
    return pair[i]


def keep(x):
    """``x`` itself, as a new result on the worker this task runs on: pinned to a worker, it makes
    Dask copy ``x`` there as soon as ``x`` exists (the transfer overlaps whatever that worker
    computes meanwhile), and later tasks there find it local."""
    return x


def as_leaf(X, offset):
    """A row partition as a leaf: ``(global ids, rows, positions)`` (positions ``0..m-1``: the
    partition is its own leaf, and its rows are the queries of :func:`cross_search` as they are)."""
    m = int(X.shape[0])
    return np.arange(int(offset), int(offset) + m, dtype=np.int64), X, np.arange(m, dtype=np.int64)


# --------------------------------------------------------------------------- exact
def exact_part(X, Q, k, metric, device, offset, checked=False):
    """Exact top-``k`` (capped at the partition's size) of queries ``Q`` among partition ``X``;
    global ids (``offset`` added), user-metric distances, host arrays. ``checked``: ``X`` and
    ``Q`` were validated already (the recall estimate's rows of a built graph's data): no second
    NaN/Inf scan of the partition."""
    from .._core.prepare import prepare, prepare_queries, rescaled

    kk = min(int(k), int(X.shape[0]))
    P = prepare(X, metric=metric, device=device, check_finite=not checked)
    Qp = prepare_queries(Q, P, check_finite=not checked)  # its scale covers both magnitudes
    d, i = _exact_float64(rescaled(P, Qp.scale), Qp, kk)
    return d, np.where(i >= 0, i + int(offset), -1)


def _exact_float64(P, Qp, k):
    """:func:`~knnkit.api.exact.exact_search` of prepared queries, distances as host float64 in
    the user metric, ids host int64. The lists of several partitions are merged by these
    distances, and each partition may run at its own power-of-two scale (data beyond 2^50 or
    below 2^-50): their float32 user-metric distances overflow to inf or underflow to 0 there
    (1e30-scale data: every squared distance inf), which would leave the merge nothing to rank
    by but the ids. At a scale, the search's float32 distances are therefore taken in the scaled
    units and brought back in float64 (exactly what finalize_distances computes before its cast
    to float32: the same ranks and, once cast, the same bits as one process)."""
    import dataclasses

    from ..api.exact import exact_search

    s = float(Qp.scale)
    if s != 1.0 and P.metric != "cosine":
        d, i, st = exact_search(dataclasses.replace(P, scale=1.0), dataclasses.replace(Qp, scale=1.0), k)
        if not st.get("float64_rows"):  # (rows answered in float64 from the raw rows: units differ)
            d = _host(d, np.float64)
            if P.metric == "euclidean":
                d = d / s
            else:
                d = d / (s * s)
            return d, _host(i, np.int64)
    d, i, _st = exact_search(P, Qp, k)
    return _host(d, np.float64), _host(i, np.int64)


def prepare_part(X, metric, device):
    """A partition validated and placed once for every query block of an exact search (on a GPU
    worker: copied to its device once, not once per block); kept in the worker's memory."""
    from .._core.prepare import prepare

    return prepare(X, metric=metric, device=device)


def _register_prepared_size():
    """Dask's size of a prepared partition: its arrays' bytes (the default, the object's own
    few bytes, would let the scheduler move it to another worker as if it were free)."""
    from dask.sizeof import sizeof

    from .._core.prepare import Prepared

    @sizeof.register(Prepared)
    def _size(P):
        return int(P.X.nbytes) + (0 if P.raw is P.X else int(P.raw.nbytes))


_register_prepared_size()


def exact_prepared(P, Q, k, offset, final=False):
    """Exact top-``k`` (capped at the partition's size) of queries ``Q`` among a prepared
    partition ``P`` (:func:`prepare_part`): ``(distances float64 user metric, global ids int64)``
    on the host (small: the lists move to the merge, whose last step makes them float32; float64:
    see :func:`_exact_float64`). ``final``: the only partition, float32 distances."""
    from .._core.prepare import prepare_queries, rescaled

    kk = min(int(k), P.n)
    Qp = prepare_queries(Q, P)  # its scale covers both magnitudes
    d, i = _exact_float64(rescaled(P, Qp.scale), Qp, kk)
    return (d.astype(np.float32) if final else d), np.where(i >= 0, i + int(offset), -1)


def drop_self(lists, offset, k):
    """Sorted ``k + 1`` lists ``(D, I)`` of the data's rows ``offset, offset + 1, ...`` as ``k``
    lists without each row's own id (its last entry when the id is not there, e.g. k + 1
    duplicates at distance 0)."""
    D, I = lists
    rows = np.arange(int(offset), int(offset) + I.shape[0])[:, None]
    own = I == rows
    drop = np.where(own.any(axis=1), own.argmax(axis=1), I.shape[1] - 1)
    kept = np.ones(I.shape, dtype=bool)
    kept[np.arange(I.shape[0]), drop] = False
    return D[kept].reshape(-1, int(k)), I[kept].reshape(-1, int(k))


def finish_lists(lists, offset, k, drop):
    """A query block's merged lists as returned: without each row's own id (``drop``: the
    all-points search, rows ``offset, offset + 1, ...``; :func:`drop_self`) and with float32
    distances (the partitions' float64 distances only rank the merge)."""
    D, I = drop_self(lists, offset, k) if drop else lists
    return np.ascontiguousarray(_host(D), dtype=np.float32), I


def merge_topk(a, b, k, metric, final=False):
    """Merge two sorted ``(distances, ids)`` lists of the same queries (disjoint ids) into the top
    ``k``; ties by smaller id, so the result does not depend on the reduction's order. On the
    host (lists of a GPU worker's shards are copied; they are k columns). ``final``: the last
    merge, float32 distances (the partitions' float64 ones only rank the merges)."""
    d = np.concatenate([_host(a[0]), _host(b[0])], axis=1)
    i = np.concatenate([_host(a[1]), _host(b[1])], axis=1)
    # ranked by the user-metric distances themselves, in float64 (smaller is better in every
    # metric but the inner product): to_internal's float32 square of euclidean distances
    # overflows from 1.8e19 and underflows below 1e-23, and the ranks then fell to the ids
    key = d.astype(np.float64)
    if metric == "inner_product":
        key = -key
    key = np.where(i < 0, np.inf, key)
    order = np.lexsort((i, key), axis=-1)[:, :k]
    d = np.take_along_axis(d, order, axis=1)
    return (d.astype(np.float32) if final else d), np.take_along_axis(i, order, axis=1)


# --------------------------------------------------------------------------- k-NN graph
def single_graph(k, metric, device, seed, *blocks):
    """The whole graph on this worker, by the single-device engine: exactly what
    ``knnkit.knn_graph(data, k, metric=metric, random_state=seed)`` builds (same method choice,
    parameters, recall target and seed), ``blocks`` being the data's row blocks in order.

    On a GPU the rows are copied to the device first (the NaN scan and the metric transform run
    there, as for a cupy input). Returns ``(I int32 (n, k), D float32 user metric, stats)`` on the
    host; ``stats``: the engine's ``method``, ``iterations``, ``K`` and ``recall_estimate``
    (the engine's own estimate against exact neighbours of sampled rows; 1.0 for an exact method)."""
    from .._core.backend import as_device, resolve_device
    from .._core.prepare import device_scope, prepare
    from ..api._graphops import build_graph
    from ..graph import GRAPH_METRICS

    if len(blocks) == 1:
        X = blocks[0]
    elif all(isinstance(b, np.ndarray) for b in blocks):
        X = np.concatenate(blocks)
    else:  # device blocks (a dask array of cupy arrays) are joined on the device
        import cupy

        X = cupy.concatenate([cupy.asarray(b) for b in blocks])
    kind, dev_id = resolve_device(device)
    if kind == "gpu" and isinstance(X, np.ndarray):
        with device_scope(kind, dev_id):
            X = as_device(X)
    P = prepare(X, metric=metric, device=device, metrics=GRAPH_METRICS)
    del X
    out = build_graph(P, int(k), random_state=int(seed))
    st = out["stats"]
    est = st.extra.get("recall_estimate")
    if est is None and st.method == "brute":
        est = 1.0
    stats = {"engine": st.method, "iterations": int(st.iterations), "K": st.K,
             "recall_estimate": None if est is None else float(est)}
    I = _host(out["indices"]).astype(np.int32, copy=False)
    return I, _host(out["distances"], np.float32), stats


def part_graph(X, k, K, metric, device, seed, final=False, probe=None, probe_k=None):
    """NN-Descent (or the exact graph, by the single-device rule) lists of one partition, ids local:
    ``(I int32 (n, K'), D float32 user metric)``, ``K' = min(K, n - 1)``.

    ``final=False``: lists of length ``K`` without the recall target (GGM merges follow and set the
    quality). ``final=True``: the single-device build as :func:`knnkit.knn_graph` runs it (its
    default internal list length and recall target), ``K`` ignored, ``min(k, n - 1)`` columns.
    ``probe`` (rows of the whole data set, validated): also their exact top ``probe_k`` among this
    partition, on the data the build just prepared (no second copy to the device): a third
    element ``(distances float32 user metric, local ids int64)``."""
    from .._core.prepare import prepare
    from ..graph import GRAPH_METRICS, build_lists, choose_method
    from ..graph.nndescent import NNDescentParams

    n = int(X.shape[0])
    P = prepare(X, metric=metric, device=device, metrics=GRAPH_METRICS)
    method = choose_method("auto", n, P.device, metric)
    if final:
        params = NNDescentParams() if method.name == "nndescent" else None
        cols = min(int(k), n - 1)
    else:
        # partition graphs without the recall target: the pairwise merges set the final quality
        # (as the out-of-core build does)
        params = NNDescentParams(n_neighbors_internal=max(K, k), target_recall=None) \
            if method.name == "nndescent" else None
        cols = min(K, n - 1)
    I, D, _ = build_lists(P.X, cols, metric=metric, method=method, params=params, seed=int(seed))
    # rows with neighbours closer than float32 resolves (values spanning more than ~1e19): the
    # single-process knn_graph answers them in float64; here (lists then merged across partitions)
    # they are refused rather than ranked as ties
    refuse_underflow(D, I, P, "rows of a partition")
    D = finalize_distances(D, metric, P.scale)
    if probe is None:
        return _host(I, np.int32), _host(D, np.float32)
    from .._core.prepare import prepare_queries, rescaled
    from ..api.exact import exact_search

    Qp = prepare_queries(probe, P, check_finite=False)
    pd, pi, _st = exact_search(rescaled(P, Qp.scale), Qp, min(int(probe_k), n))
    return _host(I, np.int32), _host(D, np.float32), (_host(pd, np.float32), _host(pi, np.int64))


class DataRangeError(ValueError):
    """Data whose lists float32 cannot rank (values spanning more than ~1e19): raised by every rank
    of the shared descent alike, and by the driver as is (not as a failed rank)."""


def refuse_underflow(D, I, P, what):
    """Raise :class:`DataRangeError` when lists ``(D internal, I)`` of the prepared data ``P`` hold
    neighbours closer than float32 resolves (:func:`knnkit._core.underflow.underflow_rows`): the
    single-process knn_graph answers such rows in float64; here (lists merged or shared across
    workers) they are refused rather than ranked as ties."""
    from .._core.underflow import underflow_rows

    tiny = underflow_rows(D, I, P.raw, P.raw, P.internal, P.scale)
    if tiny.size:
        raise DataRangeError(f"knnkit.dask.knn_graph: {tiny.size} {what} have neighbours closer than float32 "
                             "resolves (the data's values span more than ~1e19); knnkit.knn_graph in one "
                             "process answers such rows exactly in float64, or center / rescale the data")


#: this worker's NCCL communicators of the shared descent, by (the ranks' addresses, rank): made by
#: the first descent on a set of workers and kept for the next ones (making one takes ~30 ms,
#: destroying one ~0.3 s); one in use at a time (knnkit.dask holds a cluster-wide lock meanwhile)
_COMMS = {}


def gpu_peer_ready(need_bytes, key=None):
    """Why this worker cannot be a rank of the shared descent ('' when it can): a GPU, NCCL
    through CuPy, and ``need_bytes`` free on the GPU. With ``key``: ``(why, whether this worker
    keeps a communicator for key)``."""
    why = _gpu_peer_why(need_bytes)
    return why if key is None else (why, key in _COMMS)


def _gpu_peer_why(need_bytes):
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no GPU"
        free, _total = cupy.cuda.Device().mem_info
    except Exception as e:  # no CuPy, no driver
        return f"no GPU ({type(e).__name__})"
    from .._core.comm import nccl_available

    if not nccl_available():
        return "CuPy cannot load NCCL (install nvidia-nccl for the CUDA of CuPy)"
    if free < int(need_bytes):
        return f"{free / 2**30:.1f} GiB free on its GPU, {int(need_bytes) / 2**30:.1f} GiB needed"
    return ""


def abort_descent(key):
    """Give up this worker's communicator of the shared descent ``key`` (from outside its task,
    while the task may be waiting in a collective for a rank that failed or was lost: its NCCL
    calls then fail and the task raises). True when there was one."""
    peer = _COMMS.pop(key, None)
    if peer is None:
        return False
    peer.abort()
    return True


def nccl_id():
    """A new NCCL unique id, made on the worker that will be rank 0 of the shared descent."""
    from .._core.comm import nccl_unique_id

    return nccl_unique_id()


def recall_from(rows, Dx, Ix, D_rows, k, metric):
    """recall@k of a graph's distances ``D_rows`` at ``rows``, ties forgiven, against the exact
    ``k + 1`` lists ``(Dx, Ix)`` of those rows (each row's own id dropped), all on the host."""
    from .._core.metrics import to_internal

    Dx, _ = drop_self((Dx, Ix - rows[:, None] + np.arange(len(rows))[:, None]), 0, k)
    kth = to_internal(Dx[:, -1], metric)
    kth = kth + 1e-5 * np.abs(kth) + 1e-12
    got = to_internal(D_rows, metric)
    return float(np.mean(got <= kth[:, None]))


def _descent_recall_hits(P, D, lo, hi, order, rows, k, metric):
    """The recall probe of the shared descent, on this rank's share: of the sampled global
    ``rows`` whose lists this rank holds (rows ``lo .. hi - 1`` of the descent's numbering, lists
    ``D`` in the user metric), ``(hits, slots)``: list entries within the exact k-th distance
    (ties forgiven, as knnkit.dask's distributed estimate counts them), from an exact search of
    those rows against all of ``P`` on this GPU."""
    import cupy as cp

    from .._core.prepare import prepare_queries, rescaled
    from ..api.exact import exact_search

    n = int(order.shape[0])
    inv = cp.empty(n, cp.int64)
    inv[order] = cp.arange(n, dtype=cp.int64)
    pos = inv[cp.asarray(np.asarray(rows, dtype=np.int64))]
    pos = pos[(pos >= lo) & (pos < hi)]
    if int(pos.size) == 0:
        return 0, 0
    Qp = prepare_queries(P.raw[pos], P, check_finite=False)
    pd, pi, _st = exact_search(rescaled(P, Qp.scale), Qp, int(k) + 1)
    pos_h = _host(pos)
    slots = int(pos_h.size) * int(k)
    r = recall_from(pos_h, _host(pd), _host(pi, np.int64), _host(D[pos - lo]), int(k), metric)
    return int(round(r * slots)), slots


def descent_lists(uid, key, rank, data_bounds, join_bounds, spans, d, dtype, k, metric, seed, rows, *blocks):
    """Rank ``rank``'s part of one NN-Descent shared by all ranks (``knnkit.dask.knn_graph``,
    ``partition="descent"``; GNND section 4 with the joins shared out, see
    :func:`knnkit.graph.nndescent._gpu.nndescent_gpu`'s ``peer``).

    ``uid``: a new NCCL id from rank 0 (the ranks make a communicator, kept under ``key``), or
    None: every rank reuses the one it keeps under ``key``.

    The descent numbers the rows as the ranks' blocks one after another: ``blocks`` are this
    rank's (possibly none), ``spans[r]`` the global ``(offset, rows)`` of rank r's blocks and
    ``data_bounds[r]`` their rows in that numbering. Every rank copies its blocks to its GPU, the
    ranks broadcast them to each other over NCCL (the data passes through Dask no more), prepare
    the same data, and run the descent with the single-device parameters for ``k``
    (``NNDescentParams``), each joining the nodes ``join_bounds[rank]`` (equal shares, wherever the
    data was). ``rows``: the global rows of the recall estimate (None: none); each rank checks
    those it holds (``stats["recall_hits"]``). Returns the lists of those rows: ``(I int32 global
    ids, D float32 user metric, stats)`` on the host."""
    import time

    import cupy as cp

    from .._core.comm import NcclPeer
    from .._core.metrics import internal_metric
    from .._core.prepare import prepare
    from ..graph import GRAPH_METRICS
    from ..graph.nndescent import NNDescentParams
    from ..graph.nndescent._gpu import nndescent_gpu

    t0 = time.perf_counter()
    lo, hi = join_bounds[rank]
    n = int(data_bounds[-1][1])
    if uid is None:
        peer = _COMMS[key]
        peer.set_bounds(join_bounds)
    else:
        old = _COMMS.pop(key, None)
        if old is not None:
            old.abort()
        peer = NcclPeer(uid, rank, join_bounds)
        _COMMS[key] = peer
    t_init = time.perf_counter() - t0
    try:
        failed = cp.zeros(1, cp.int32)
        try:
            X = cp.empty((n, int(d)), np.dtype(dtype))
            a, b = data_bounds[rank]
            at = a
            for blk in blocks:  # each block copied to the device on its own (no host concatenation)
                X[at:at + blk.shape[0]] = cp.asarray(blk)
                at += blk.shape[0]
            if at != b:
                raise ValueError(f"rank {rank}: blocks of {at - a} rows, {b - a} expected")
        except Exception:
            failed[0] = 1
            raise
        finally:  # every rank learns whether one failed, instead of waiting for it in the broadcasts
            peer.allreduce_sum(failed)
            if int(failed.get()[0]):
                raise RuntimeError("knnkit.dask.knn_graph(partition='descent'): a worker could not place its rows "
                                   "on its GPU")
        for r, (a, b) in enumerate(data_bounds):
            if b > a:
                peer.broadcast(X[a:b], r)
        t_data = time.perf_counter() - t0
        P = prepare(X, metric=metric, device="gpu", metrics=GRAPH_METRICS)
        del X
        im = internal_metric(metric)
        params = NNDescentParams().resolve(k=int(k), n=n, device="gpu", metric=metric)
        order = cp.asarray(np.concatenate([np.arange(o, o + c, dtype=np.int64) for sp in spans for o, c in sp]))
        t1 = time.perf_counter()
        I, D, st = nndescent_gpu(P.X, params.n_neighbors_internal, sample=params.sample, max_iters=params.max_iters,
                                 delta=params.delta, metric=im, seed=int(seed), update=params.update,
                                 reverse=params.reverse, peer=peer)
        cp.cuda.get_current_stream().synchronize()  # (the lists' final sort is the descent's)
        t_descent = time.perf_counter() - t1
        I, D = I[:, :int(k)], D[:, :int(k)]
        # every rank holds the same graph after the last exchange: all refuse alike, no collective
        # is left to wait in
        refuse_underflow(D, I, P, "rows")
        I = cp.where(I >= 0, order[cp.maximum(I, 0)], -1).astype(cp.int32)
        D = finalize_distances(D, metric, P.scale)
        t2 = time.perf_counter()
        hits = None if rows is None else _descent_recall_hits(P, D, lo, hi, order, rows, k, metric)
        t3 = time.perf_counter()
        I, D = _host(I, np.int32), _host(D, np.float32)
        stats = {"iterations": int(st["iterations"]), "updates": [int(u) for u in st["updates"]],
                 "K": int(params.n_neighbors_internal), "sample": int(params.sample), "init_s": t_init,
                 "data_s": t_data - t_init, "prepare_s": t1 - t0 - t_data, "descent_s": t_descent,
                 "lists_s": t2 - t1 - t_descent, "probe_s": t3 - t2, "host_s": time.perf_counter() - t3,
                 "phase_ms": st.get("phase_ms"), "rows_moved": st.get("rows_moved"), "recall_hits": hits,
                 "task_s": time.perf_counter() - t0}
        return I, D, stats
    except BaseException:
        # another rank may be waiting in a collective: give the communicator up (the next descent
        # makes a new one)
        _COMMS.pop(key, None)
        peer.abort()
        raise


def _pad(I, D, k):
    """Lists ``(I, D)`` of fewer than ``k`` columns widened to ``k`` with empty (-1 / inf) slots."""
    c = I.shape[1]
    if c >= int(k):
        return I, D
    Ip = np.full((I.shape[0], int(k)), -1, I.dtype)
    Dp = np.full((D.shape[0], int(k)), np.inf, D.dtype)
    Ip[:, :c] = I
    Dp[:, :c] = D
    return Ip, Dp


def globalize(base, offset, k):
    """A partition's first ``k`` columns with global ids: the start of its running lists, ``k``
    columns even when the partition has ``k`` points or fewer (the other partitions' merges fill
    the empty slots; knn_graph returned lists of ``n_part - 1`` columns before)."""
    I, D = base
    I = I[:, :k]
    return _pad(np.where(I >= 0, I.astype(np.int64) + int(offset), -1), np.ascontiguousarray(D[:, :k]), k)


def compact(lists):
    """A partition's final ``(I, D)`` as the graph's dtypes (int32 ids, float32 distances), on its
    worker: half the id bytes to move to the client and no conversion there."""
    return lists[0].astype(np.int32, copy=False), lists[1].astype(np.float32, copy=False)


def pair_merge(Xi, Xj, base_i, base_j, off_i, off_j, k, K, metric, device, seed):
    """GGM merge (GNND section 5) of partitions i and j: the merged lists of both, global ids,
    user-metric distances: ``((Ii, Di), (Ij, Dj))``."""
    from .._core.prepare import device_scope, prepare
    from ..graph import GRAPH_METRICS
    from ..graph._merge import ggm_merge
    from ..graph.nndescent import NNDescentParams

    ni, nj = int(Xi.shape[0]), int(Xj.shape[0])
    n = ni + nj
    kk = min(int(k), n - 1)
    Pi = prepare(Xi, metric=metric, device=device, metrics=GRAPH_METRICS, check_finite=False)
    Pj = prepare(Xj, metric=metric, device=Pi.device if Pi.device == "cpu" else device, metrics=GRAPH_METRICS,
                 check_finite=False)
    params = NNDescentParams(n_neighbors_internal=max(K, kk), refine_hubs=False).resolve(
        k=kk, n=n, device=Pi.device, metric=metric)
    scale = min(Pi.scale, Pj.scale)
    with device_scope(Pi.device, Pi.device_id):
        I, D, _st, _X = ggm_merge(Pi.raw, Pj.raw, base_i[0], base_i[1], base_j[0], base_j[1], kk, metric=metric,
                                  params=params, seed=int(seed), scale=scale)
        del _X
        D = finalize_distances(D, metric, scale)
    I = _host(I, np.int64)
    D = _host(D, np.float32)
    glob = np.where(I < 0, -1, np.where(I < ni, I + int(off_i), I - ni + int(off_j)))
    return (glob[:ni], D[:ni]), (glob[ni:], D[ni:])


def merge_running(a, b, k, metric):
    """Union of two candidate lists of the same rows (ids may repeat: one neighbour found by
    several merges), top ``k`` by distance, user metric in and out."""
    from ..graph._merge import merge_lists

    aI, aD = _pad(a[0], a[1], k)  # (a pair merge of two small partitions has fewer than k columns)
    I, D = merge_lists(aI, to_internal(aD, metric), b[0], to_internal(b[1], metric), k)
    return I.astype(np.int64), finalize_distances(np.array(D, dtype=np.float32), metric)


# --------------------------------------------------------------------------- spatial tree (knn_graph partition="tree")
# A balanced hyperplane tree over P leaves: internal node (lo, mid, hi, level) sends leaves
# [lo, mid) left and [mid, hi) right; its hyperplane splits at the (mid - lo) / (hi - lo) quantile
# of the projections, so leaves get equal shares of the points (P need not be a power of two).
# A point's "margin" at a node is its signed distance to the node's hyperplane (unit normal).

def tree_nodes(P):
    """Internal nodes of the tree over ``P`` leaves, breadth-first: ``[(lo, mid, hi, level)]``."""
    nodes, level, depth = [], [(0, int(P))], 0
    while level:
        nxt = []
        for lo, hi in level:
            if hi - lo >= 2:
                mid = lo + (hi - lo) // 2
                nodes.append((lo, mid, hi, depth))
                nxt += [(lo, mid), (mid, hi)]
        level, depth = nxt, depth + 1
    return nodes


def leaf_path(nodes, leaf):
    """Internal nodes from the root to ``leaf`` (indices into ``nodes``; position = level)."""
    return [h for h, (lo, _mid, hi, _lvl) in enumerate(nodes) if lo <= leaf < hi]


def _unit_rows(X):
    """Rows scaled to unit length (cosine: the tree and the slabs live on the sphere); zero rows stay."""
    X = np.asarray(X, dtype=np.float32)
    nrm = np.sqrt(np.einsum("ij,ij->i", X, X, dtype=np.float64)).astype(np.float32)
    return X / np.where(nrm > 0, nrm, 1)[:, None]


def sample_rows(X, m, seed, unit):
    """``m`` random rows of a partition (host float32; unit rows when ``unit``)."""
    rows = np.sort(np.random.default_rng(seed).choice(X.shape[0], min(int(m), X.shape[0]), replace=False))
    S = _take_rows(X, rows)
    return _unit_rows(S) if unit else S


def _top_direction(S, rule, rng):
    """Unit normal of a node's hyperplane from its sample rows ``S``: the top principal direction
    (power iteration on the centred rows) or, ``rule="random"``, the direction between two random
    rows (RSFK's rule)."""
    d = S.shape[1]
    if rule == "random" and S.shape[0] >= 2:
        for _ in range(8):  # two distinct rows (duplicates give a zero direction)
            a, b = rng.choice(S.shape[0], 2, replace=False)
            u = (S[a] - S[b]).astype(np.float64)
            if np.linalg.norm(u) > 0:
                return u / np.linalg.norm(u)
    # all rows equal: the random start is as good a direction as any
    return top_direction((S - S.mean(axis=0)).astype(np.float64), rng.standard_normal(d), 30)


def fit_tree(P, rule, seed, *samples):
    """Hyperplanes of the tree over ``P`` leaves from the sample rows: ``(U (P-1, d) float64 unit
    normals, t (P-1,) thresholds)``, node order of :func:`tree_nodes`."""
    S = np.concatenate(samples) if len(samples) > 1 else samples[0]
    nodes = tree_nodes(P)
    U = np.zeros((len(nodes), S.shape[1]))
    t = np.zeros(len(nodes))
    rng = np.random.default_rng(seed)
    members = {(0, int(P)): np.arange(S.shape[0])}
    for h, (lo, mid, hi, _lvl) in enumerate(nodes):
        rows = members.pop((lo, hi))
        Sn = S[rows]
        if Sn.shape[0] == 0:  # an empty sample node: any plane (its leaves will be near empty)
            U[h, 0] = 1.0
            members[(lo, mid)] = members[(mid, hi)] = rows
            continue
        U[h] = _top_direction(Sn, rule, rng)
        p = Sn.astype(np.float64) @ U[h]
        t[h] = np.quantile(p, (mid - lo) / (hi - lo))
        members[(lo, mid)], members[(mid, hi)] = rows[p < t[h]], rows[p >= t[h]]
    return U, t


def route(X, tree, P, unit):
    """Leaf of every row of a partition and its margins along its path: ``(leaf (n,) int32,
    margins (n, depth) float32, NaN past a shallower leaf's path)``."""
    U, t = tree
    X = _host(X, np.float32)
    Xu = _unit_rows(X) if unit else X
    n = X.shape[0]
    nodes = tree_nodes(P)
    depth = max([lvl for *_r, lvl in nodes], default=-1) + 1
    margins = np.full((n, depth), np.nan, np.float32)
    lo = np.zeros(n, np.int64)
    hi = np.full(n, int(P), np.int64)
    for h, (nlo, mid, nhi, lvl) in enumerate(nodes):
        sel = np.flatnonzero((lo == nlo) & (hi == nhi))
        if sel.size == 0:
            continue
        # float32 product (a float64 copy of every row cost seconds at 2M x 96), no row copy at the root
        u = U[h].astype(np.float32)
        m = ((Xu if sel.size == n else Xu[sel]) @ u).astype(np.float64)
        m = (m - t[h]).astype(np.float32)
        margins[sel, lvl] = m
        right = m >= 0
        lo[sel[right]] = mid
        hi[sel[~right]] = mid
    return lo.astype(np.int32), margins


def select_leaf(X, routed, offset, leaf):
    """The rows of one partition that fall in ``leaf``: ``(global ids, rows, margins)``."""
    lf, margins = routed
    sel = np.flatnonzero(lf == leaf)
    X = _host(X, np.float32)
    if sel.size == X.shape[0]:  # the whole partition (one leaf): no copy of its rows
        return sel.astype(np.int64) + int(offset), np.ascontiguousarray(X), margins
    return sel.astype(np.int64) + int(offset), np.ascontiguousarray(X[sel]), margins[sel]


def assemble(*pieces):
    """Concatenate ``(ids, rows, extra...)`` pieces field by field; every piece's length is kept
    last (``sizes``), so a result can be split back per piece. One piece is passed on as it is
    (no copy of its rows)."""
    if len(pieces) == 1:
        return tuple(pieces[0]) + (np.array([len(pieces[0][0])], np.int64),)
    out = tuple(np.concatenate([p[f] for p in pieces]) for f in range(len(pieces[0])))
    return out + (np.array([len(p[0]) for p in pieces], np.int64),)


def _kth_radius(D, k, metric):
    """Per row, the Euclidean radius (unit rows for cosine) that holds its k listed neighbours:
    any true neighbour lies at most this far away (NaN-free; inf for a short list)."""
    Dk = D[:, k - 1].astype(np.float64) if D.shape[1] >= k else np.full(D.shape[0], np.inf)
    if metric == "sqeuclidean":
        r = np.sqrt(np.maximum(Dk, 0))
    elif metric == "cosine":  # |a - b|^2 = 2 (1 - cos) on unit rows
        r = np.sqrt(np.maximum(2 * Dk, 0))
    else:  # euclidean; manhattan: the L1 distance bounds the L2 one
        r = Dk
    return np.where(np.isfinite(r), r, np.inf)


def leaf_graph(leaf, k, metric, device, seed, local=False, probe=None):
    """The single-device graph of one leaf (or slab): ``(I (m, k), D float32 (m, k))``, ``-1`` /
    ``inf`` where the set has at most ``k`` points. Ids are global (int64), or with ``local``
    positions in the leaf (int32: the leaf's own graph, searched by :func:`cross_search`; the
    leaf's ``ids`` turn them into global ids). ``probe``: rows of the data set whose exact
    ``k + 1`` nearest among this leaf come third, ``(distances, global ids int64)`` (the recall
    estimate, computed where the leaf's data already is)."""
    ids, X = leaf[0], leaf[1]
    m = int(ids.shape[0])
    I = np.full((m, int(k)), -1, np.int32 if local else np.int64)
    D = np.full((m, int(k)), np.inf, np.float32)
    pr = None
    if m >= 2:
        out = part_graph(X, k, None, metric, device, seed, final=True, probe=probe, probe_k=int(k) + 1)
        Il, Dl = out[0], out[1]
        c = Il.shape[1]
        I[:, :c] = Il if local else np.where(Il >= 0, ids[np.maximum(Il, 0)], -1)
        D[:, :c] = np.where(Il >= 0, Dl, np.inf)
        if probe is not None:
            pd, pi = out[2]
            pr = (pd, np.where(pi >= 0, ids[np.maximum(pi, 0)], -1))
    elif probe is not None:  # zero or one point
        pd, pi = exact_part(X, probe, int(k) + 1, metric, device, 0, True) if m else \
            (np.zeros((len(probe), 0), np.float32), np.zeros((len(probe), 0), np.int64))
        pr = (pd, np.where(pi >= 0, ids[np.maximum(pi, 0)], -1))
    return (I, D) if probe is None else (I, D, pr)


slab_graph = leaf_graph


def slab_samples(leaf, lists, tree, leaf_index, P, k, metric, rule, cap, seed):
    """What sets the slab widths, for each level of the leaf's path: ``(count, sample)`` with at
    most ``cap`` sampled values (``lists``: the leaf's graph, local ids).

    ``rule="bound"``: the k-th radii of the points that can have a neighbour across that level's
    hyperplane (``|margin| <= radius``). ``rule="projected"``: ``|u . (a - b)|`` over the leaf
    graph's neighbour pairs ``(a, b)`` (``u`` the hyperplane's unit normal), how far apart the
    two ends of a neighbour pair lie across a plane of that direction."""
    ids, X, margins = leaf[0], leaf[1], leaf[2]
    I = lists[0]
    rng = np.random.default_rng(seed)
    out = []
    if rule == "bound":
        r = _kth_radius(lists[1], k, metric)
        for lvl in range(margins.shape[1]):
            m = margins[:, lvl]
            need = r[np.abs(m) <= r]
            cnt = int(need.size)
            if cnt > cap:
                need = rng.choice(need, int(cap), replace=False)
            out.append((cnt, need.astype(np.float64)))
        return out
    U = tree[0]
    path = leaf_path(tree_nodes(P), leaf_index)
    rows = rng.choice(ids.shape[0], min(ids.shape[0], max(1, int(cap) // max(1, k))), replace=False)
    nb = I[rows]  # positions in the leaf (its local lists)
    ok = nb >= 0
    Xu = _unit_rows(X) if metric == "cosine" else X
    a = np.repeat(rows, nb.shape[1])[ok.ravel()]
    b = nb.ravel()[ok.ravel()].astype(np.int64)
    for h in path:  # (a shallower leaf's path is shorter than the margins' columns)
        u = U[h]
        diff = np.abs((Xu[a].astype(np.float64) - Xu[b]) @ u)
        out.append((int(diff.size), diff))
    return out


def select_slab(leaf, lists, level, w, k, metric, rule):
    """The leaf's rows in the slab of its ancestor at ``level``: within ``w`` of the hyperplane
    (``rule="bound"``: or within their own k-th radius of it). ``(global ids, rows, positions in
    the leaf)``."""
    ids, X, margins = leaf[0], leaf[1], leaf[2]
    m = np.abs(margins[:, level]).astype(np.float64)
    keep = m <= w
    if rule == "bound":
        keep |= m <= _kth_radius(lists[1], k, metric)
    sel = np.flatnonzero(keep)
    return ids[sel], X[sel], sel.astype(np.int64)


def slab_for_leaf(slab, lists, j):
    """The slab graph's rows of the ``j``-th piece (one leaf's slab rows): ``(positions in that
    leaf, I, D)``."""
    sizes = slab[-1]
    lo = int(sizes[:j].sum())
    hi = lo + int(sizes[j])
    return slab[2][lo:hi], lists[0][lo:hi], lists[1][lo:hi]


def _to_global(ids, I):
    """Local ids ``I`` (-1: none) of a leaf whose ascending global ids are ``ids``, as int32 global
    ids: an offset for a contiguous range (a row partition), else one int32 gather (numpy's int64
    fancy indexing with a clip took 10x longer at 2M x 10)."""
    I = np.asarray(I)
    I32 = I if I.dtype == np.int32 else I.astype(np.int32)
    if ids.size and int(ids[-1]) - int(ids[0]) == ids.size - 1 and (ids.size < 2 or bool((np.diff(ids) > 0).all())):
        out = I32 + np.int32(ids[0])
    else:
        out = np.take(ids.astype(np.int32), I32)
    out[I32 < 0] = -1
    return out


def merge_leaf(leaf, lists, k, metric, *slab_rows):
    """A leaf's final lists: its own graph's lists (local ids) united with the candidates of its
    rows found by the second stage (``(positions in the leaf, global ids, user-metric distances)``
    per slab graph or cross search, positions distinct within each; duplicate ids kept once), top
    ``k``, sorted by distance: ``(global ids, I int32, D float32)`` (int32 ids: the graph's own
    dtype, half the bytes to move). Each candidate block is inserted into its rows' lists in place
    (one parallel Numba pass per block, no (rows, candidates) temporaries)."""
    from ..graph.nndescent._cpu import merge_rows_at

    I, D = lists[0], lists[1]
    Ii = np.ascontiguousarray(_to_global(leaf[0], I))
    Di = np.ascontiguousarray(np.where(I >= 0, to_internal(D, metric), np.inf), dtype=np.float32)
    for pos, SI, SD in slab_rows:
        if len(pos) == 0:
            continue
        merge_rows_at(Ii, Di, np.ascontiguousarray(pos, dtype=np.int64), np.ascontiguousarray(SI, dtype=np.int32),
                      np.ascontiguousarray(np.where(SI >= 0, to_internal(SD, metric), np.inf), dtype=np.float32))
    Do = finalize_distances(Di, metric)
    return leaf[0], Ii, np.where(Ii >= 0, Do, np.float32(np.inf)).astype(np.float32, copy=False)


# --------------------------------------------------------------------------- data at a scale (knn_graph)
def absmax_of(X):
    """The largest ``|value|`` of a partition as the graph build sees it (float32; 0.0 for
    integer and float16 data, which never need a scale; NaN / Inf: 0.0, refused by the build)."""
    a = np.asarray(as_host(X))
    if a.dtype.kind != "f" or a.dtype == np.float16 or not a.size:
        return 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        m = float(np.abs(a.astype(np.float32, copy=False)).max())
    return m if np.isfinite(m) else 0.0


def scale_rows(X, scale):
    """A partition as float32 multiplied by the power of two ``scale`` (in float64, exact), as
    :func:`knnkit._core.metrics.prepare_vectors` scales data."""
    a = np.asarray(as_host(X), dtype=np.float32)
    return (a.astype(np.float64) * float(scale)).astype(np.float32)


def unscale_lists(lists, fields, scale, metric):
    """``(I, D)`` of a block of lists of data multiplied by ``scale``, ``D`` back in the data's
    units (float32; inf beyond its range, as knnkit.knn_graph returns them)."""
    I, D = lists[fields[0]], lists[fields[1]]
    if metric == "cosine":
        return I, D
    p = 1 if metric in ("euclidean", "manhattan") else 2
    with np.errstate(over="ignore"):
        D = (np.asarray(D, dtype=np.float64) / float(scale) ** p).astype(np.float32)
    return I, D


# --------------------------------------------------------------------------- final lists left on the workers
# knn_graph(compute=False): the final lists stay on the workers as row blocks in the input's row
# order; the checks and the recall estimate read them where they are (a count, or a few rows).

def short_rows(lists, field):
    """Rows of a block's lists (ids at ``lists[field]``) holding an empty (-1) slot: knn_graph's
    check that every list has k neighbours, made where the lists are (an int to the client,
    not the lists)."""
    short = np.asarray(lists[field]) < 0
    return int(short.any(axis=1).sum()) if short.any() else 0  # rows counted only when there are any


def distances_at(lists, field, rows):
    """Rows ``rows`` (positions in the block) of a block's distances ``lists[field]``: the recall
    estimate's sampled rows, the only ones that move to the client."""
    return np.ascontiguousarray(lists[field][np.asarray(rows, dtype=np.int64)])


def row_slice(lists, lo, hi):
    """Rows ``lo:hi`` of a whole graph's ``(I, D, ...)``: ``(I, D)`` views (no copy on this
    worker; one row block of the one-partition build's output)."""
    return lists[0][int(lo):int(hi)], lists[1][int(lo):int(hi)]


def leaf_rows_in(final, lo, hi):
    """The rows of a leaf's final lists (:func:`merge_leaf`'s ``(global ids, I, D)``) whose global
    ids lie in ``[lo, hi)``: ``(positions in that range, I, D)``. A leaf's ids ascend (its pieces
    are assembled in partition order, each piece's rows in order), so the rows are one slice."""
    ids = final[0]
    a, b = np.searchsorted(ids, [int(lo), int(hi)])
    return (ids[a:b] - int(lo)).astype(np.int64), final[1][a:b], final[2][a:b]


def place_rows(rows, k, *pieces):
    """One row block of the graph (``rows`` rows) from the leaves' pieces of it
    (:func:`leaf_rows_in`): ``(I int32 (rows, k), D float32)``. A row no piece holds keeps -1 /
    inf, which knn_graph's short-list check reports."""
    I = np.full((int(rows), int(k)), -1, np.int32)
    D = np.full((int(rows), int(k)), np.inf, np.float32)
    for pos, Il, Dl in pieces:
        I[pos] = Il
        D[pos] = Dl
    return I, D


# --------------------------------------------------------------------------- cross search (the tree's second stage)
# GGNN's multi-GPU all-points search (section 5.5: every point searched in every shard, results
# merged per point), restricted to the points that can have a neighbour across a hyperplane: the
# rows of a leaf within the slab width of an ancestor's hyperplane are searched in the graph of
# every leaf on the other side, on that leaf's worker. Each pair found serves both ends: the query
# row gets its nearest points of the other leaf (forward), and every point of the other leaf gets
# the query rows that found it (reverse), so a neighbour pair is missed only when neither
# direction's search finds it.

#: beam of the cross searches (candidate list; k <= beam)
CROSS_BEAM = 32
#: seeds per query: the nearest of a sample of the target leaf's boundary rows
CROSS_SEEDS = 8
#: boundary rows of the target leaf sampled as seed candidates (all of them when fewer)
CROSS_SEED_SAMPLE = 16384


def _group_topk(xp, owner, other, d, width, n_owner):
    """Per owner row, the ``width`` nearest of the pairs ``(owner, other, d)`` (``owner`` -1: no
    pair): ``(rows (r,) int64 ascending, ids (r, width), d (r, width) float32)``, -1 / inf padded,
    ties by smaller id (an id once per row on the CPU). The CPU inserts the pairs into per-row
    lists in one Numba pass (rows: all ``n_owner``); the GPU sorts them."""
    if xp is np:
        from ..graph.nndescent._cpu import insert_pairs

        ids = np.full((int(n_owner), int(width)), -1, np.int32)
        dist = np.full((int(n_owner), int(width)), np.inf, np.float32)
        insert_pairs(ids, dist, np.ascontiguousarray(owner, dtype=np.int64), np.ascontiguousarray(other, dtype=np.int32),
                     np.ascontiguousarray(d, dtype=np.float32))
        return np.arange(int(n_owner), dtype=np.int64), ids, dist
    ok = owner >= 0
    owner, other, d = owner[ok], other[ok], d[ok]
    if owner.size == 0:
        return (xp.zeros(0, xp.int64), xp.full((0, width), -1, xp.int64), xp.full((0, width), xp.inf, xp.float32))
    order = xp.lexsort(xp.stack([other.astype(xp.float64), d.astype(xp.float64), owner.astype(xp.float64)]))
    owner, other, d = owner[order], other[order], d[order]
    start = xp.searchsorted(owner, owner, side="left")
    rank = xp.arange(owner.size) - start
    keep = rank < width
    owner, other, d, rank = owner[keep], other[keep], d[keep], rank[keep]
    rows = xp.unique(owner)
    r = xp.searchsorted(rows, owner)
    ids = xp.full((rows.size, width), -1, xp.int64)
    dist = xp.full((rows.size, width), xp.inf, xp.float32)
    ids[r, rank] = other
    dist[r, rank] = d
    return rows.astype(xp.int64), ids, dist


def search_graph(xp, I, D, width):
    """The graph a cross search walks: each point's k-NN list plus up to ``width - k`` reverse
    edges (the nearest points that list it), ``-1`` padded, int32 ``(m, width)``. A k-NN graph's
    directed lists alone leave points that no list names unreachable."""
    m, c = I.shape
    if width <= c:
        return xp.ascontiguousarray(I, dtype=xp.int32)
    src = xp.repeat(xp.arange(m, dtype=xp.int64), c)
    rows, rev, _ = _group_topk(xp, I.astype(xp.int64).ravel(), src, D.astype(xp.float32).ravel(), width - c, m)
    G = xp.full((m, width), -1, xp.int32)
    G[:, :c] = I
    G[rows, c:] = rev.astype(xp.int32)
    return G


def cross_search(target, lists, queries, level, w, k, metric, device, seed, beam=CROSS_BEAM, n_seeds=CROSS_SEEDS,
                 sample=CROSS_SEED_SAMPLE):
    """Search a leaf's graph (``target`` a leaf, ``lists`` its graph with local ids) for the ``k``
    nearest of each query row (``queries``: ``(global ids, rows, positions in their leaf)``,
    another leaf's rows near the hyperplane of ``level``).

    The walk: the leaf's lists plus reverse edges (:func:`search_graph`), from the medoids of
    each query's nearest seed candidates (up to ``sample`` of the leaf's rows within ``w`` of
    the hyperplane, ``level`` None: any rows), beam ``beam``, on ``device`` (the GPU kernel or
    its CPU twin). Returns ``(forward, reverse)``, each ``(positions, global ids int32, distances
    float32 user metric)``: the queries' lists (positions in their leaf) and, for every point of
    this leaf that some query found, up to ``k`` of those queries, nearest first (positions in
    this leaf)."""
    from .._core.backend import twin
    from .._core.prepare import device_scope, prepare, prepare_queries, rescaled
    from ..graph import GRAPH_METRICS
    from ..index._entry import EntryPoints

    ids, X = target[0], target[1]
    qids, Q, qpos = queries[0], queries[1], queries[2]
    m, nq, k = int(ids.shape[0]), int(qids.shape[0]), int(k)
    empty = (np.zeros(0, np.int64), np.zeros((0, k), np.int32), np.zeros((0, k), np.float32))
    if nq == 0 or m == 0:
        return empty, empty
    P = prepare(X, metric=metric, device=device, metrics=GRAPH_METRICS, check_finite=False)
    if P.internal not in ("l2", "ip"):
        raise ValueError(f"cross_search: no graph search for metric {metric!r}")
    Qp = prepare_queries(Q, P, check_finite=False)
    P = rescaled(P, Qp.scale)
    kk = min(k, m)
    rng = np.random.default_rng(seed)
    near = np.arange(m) if level is None else np.flatnonzero(np.abs(target[2][:, level]) <= w)
    if near.size == 0:
        near = np.arange(m)
    samp = np.sort(rng.choice(near, min(int(sample), near.size), replace=False)).astype(np.int32)
    with device_scope(P.device, P.device_id):
        xp = np
        if P.device == "gpu":
            import cupy as xp
        G = search_graph(xp, xp.asarray(lists[0]), xp.asarray(lists[1]), 2 * lists[0].shape[1])
        ms = xp.asarray(samp)
        ep = EntryPoints(xp.ascontiguousarray(P.X[ms]), ms, P.internal)
        if xp is np:
            seeds = ep.seeds_for(Qp.X, int(n_seeds))
        else:  # the GPU's seed selection multiplies (queries, sample) at once: blocks of <= 256 MB
            bs = max(1024, (1 << 26) // max(1, samp.size))
            seeds = xp.concatenate([ep.seeds_for(Qp.X[a:a + bs], int(n_seeds)) for a in range(0, nq, bs)])
        xmax = float(xp.sqrt((P.X * P.X).sum(axis=1).max())) if P.internal == "ip" else None
        b = max(int(beam), kk)
        d, i = twin("knnkit.index", P.device).search(P.X, G, Qp.X, kk, seeds=seeds, beam=b, tau=float("inf"),
                                                     max_iters=max(64, 8 * b), metric=P.internal, xnorm_max=xmax)
        del G, seeds
        i = i.astype(xp.int64)
        # reverse: every found point of this leaf gets the queries that found it
        rq = xp.repeat(xp.asarray(qids, dtype=xp.int64), kk)
        rows, rid, rd = _group_topk(xp, i.ravel(), rq, d.ravel(), k, m)
        found = rid[:, 0] >= 0
        rows, rid, rd = rows[found], rid[found], rd[found]
        d = finalize_distances(d, metric, P.scale)
        rd = finalize_distances(rd, metric, P.scale)
        i, d, rows, rid, rd = (_host(a) for a in (i, d, rows, rid, rd))
    fid = np.full((nq, k), -1, np.int32)
    fd = np.full((nq, k), np.inf, np.float32)
    fid[:, :kk] = _to_global(ids, i)
    fd[:, :kk] = np.where(i >= 0, d, np.inf)
    forward = (np.asarray(qpos, np.int64), fid, fd)
    reverse = (rows, np.where(rid >= 0, rid, -1).astype(np.int32), np.where(rid >= 0, rd, np.inf).astype(np.float32))
    return forward, reverse


# --------------------------------------------------------------------------- sharded index
def build_shard(X, metric, device, build_kw, seed):
    """The shard's ``GraphIndex`` (built here, kept in this worker's memory)."""
    from ..api.index import GraphIndex

    return GraphIndex.build(X, metric=metric, device=device, random_state=seed, **build_kw)


def shard_info(index):
    return {"n": int(index.n), "dim": int(index.dim), "metric": index.metric, "beam": index.search_params.beam}


def search_shard(index, Q, k, search_kw, offset, final=False):
    """Top-``k`` (capped at the shard's size) of ``Q`` in one shard; global ids; arrays of the
    queries' kind (cupy queries on a GPU worker: cupy lists, no copy to the host here)."""
    from .._core.backend import get_array_module

    kk = min(int(k), int(index.n))
    d, i = index.search(Q, kk, **search_kw)
    xp = get_array_module(i)
    i = i.astype(xp.int64, copy=False)
    if float(getattr(index._engine, "scale", 1.0)) != 1.0 and index.metric != "cosine":
        # data at a scale (beyond 2^50 or below 2^-50): float32 distances overflow to inf or underflow
        # to 0 and the merge across shards could only rank them by id; the found pairs' distances
        # in float64 instead (the merge's finish_lists returns float32)
        d = _pair_distances64(index.data, Q, i, index.metric)
        d = d.astype(np.float32) if final else d
    else:
        d = d.astype(xp.float32, copy=False)
    return d, xp.where(i >= 0, i + int(offset), -1)


def _pair_distances64(X, Q, I, metric):
    """User-metric distances in float64 (host) between query rows ``Q`` and their neighbours
    ``I`` (local ids, -1: inf) among ``X``."""
    X = np.asarray(as_host(X), dtype=np.float64)
    Q = np.asarray(as_host(Q), dtype=np.float64)
    I = np.asarray(as_host(I))
    V = X[np.maximum(I, 0)]  # (m, k, d)
    if metric == "inner_product":
        d = np.einsum("mkd,md->mk", V, Q)
    else:
        diff = V - Q[:, None, :]
        d = np.einsum("mkd,mkd->mk", diff, diff)
        if metric == "euclidean":
            d = np.sqrt(d)
    return np.where(I >= 0, d, -np.inf if metric == "inner_product" else np.inf)


def save_shard(index, path):
    """Write one shard (the one container format, atomic) and return its SHA-256."""
    import hashlib

    index.save(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def load_shard(path, sha256, device):
    """Read one shard after checking that the file is the one the manifest names."""
    import hashlib

    from ..api.index import GraphIndex

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    if h.hexdigest() != sha256:
        raise ValueError(f"{path}: checksum differs from the manifest's (the shard file was changed or replaced)")
    return GraphIndex.load(path, device=device)
