"""knnkit on a Dask cluster: exact k-NN, k-NN graphs (partition graphs, then cross searches or
GGM merges across workers) and the sharded search index (GGNN section 5.5: sharding and
replication).

The pattern is cuML's distributed nearest neighbours: the data stays in row partitions on the
workers; queries are broadcast; each worker answers for its partitions with the single-device
engine; sorted top-k lists are merged by a tree of small tasks. Dask schedules everything and
moves bytes between workers; knnkit has no scheduler of its own.
"""

import numbers
import time
from typing import NamedTuple

import numpy as np

from .._core.config import logger
from .._core.random import seed_from
from .._core.underflow import cosine_resolution, warn_unresolved_cosine
from .._core.validation import METRICS, check_k, check_metric
from ..graph import GRAPH_METRICS, STALL_LID
from ._tasks import (absmax_of, as_leaf, assemble, cross_search, distances_at, exact_part, exact_prepared,
                     finish_lists, fit_tree, globalize, keep, leaf_graph, leaf_rows_in, merge_leaf, merge_running,
                     merge_topk, place_rows, prepare_part, pair_merge, part_graph, compact, route, row_slice, rows_of,
                     sample_rows, scale_rows, short_rows, single_graph, slab_samples, select_leaf, select_slab, size_of,
                     slab_for_leaf, take, tree_nodes, unscale_lists, nccl_id, descent_lists, gpu_peer_ready,
                     abort_descent, recall_from, DataRangeError)
from ._common import (_is_dask_array, check_compute, check_parts, get_client, homes, live_workers, partitions,
                      result_arrays, scatter_to, tree_reduce, worker_addresses)

__all__ = ["knn", "knn_graph"]


def _check_device(device):
    if device not in ("auto", "cpu", "gpu"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'gpu' (each worker uses its own GPU), got {device!r}")
    return device


def _output(a, kind):
    if kind == "cupy":
        import cupy

        return cupy.asarray(a)
    return a


def _host_queries(queries, dim):
    """In-memory queries as a host array, with their kind ("numpy" or "cupy": the kind of the
    results returned to the client)."""
    kind = "cupy" if type(queries).__module__.startswith("cupy") else "numpy"
    if kind == "cupy":
        queries = queries.get()
    elif type(queries).__module__.startswith("torch"):
        queries = queries.detach().cpu().numpy()
    Q = np.asarray(queries)
    if Q.ndim != 2 or Q.shape[1] != dim:
        raise ValueError(f"queries must be 2-D with dimension {dim}, got shape {Q.shape}")
    if Q.shape[0] == 0:
        raise ValueError("queries is empty")
    if Q.dtype.kind == "f" and not np.isfinite(Q).all():  # here, not as a worker's error in every task
        raise ValueError("queries contains NaN or Inf values")
    return Q, kind


def _send_blocks(client, Q, query_block, targets):
    """``Q``'s blocks of ``query_block`` rows sent from the client to the workers that need them,
    one message per worker (``targets(b)``: the workers of block b): ``[(offset, rows,
    {worker: future})]``, a separate copy on every worker that searches the block."""
    starts = list(range(0, Q.shape[0], query_block))
    wanted = {}
    for b in range(len(starts)):
        for w in targets(b):
            wanted.setdefault(w, []).append(b)
    copies = [{} for _ in starts]
    for w, bs in wanted.items():
        sent = scatter_to(client, [np.ascontiguousarray(Q[starts[b]:starts[b] + query_block]) for b in bs], w)
        for b, f in zip(bs, sent):
            copies[b][w] = f
    return [(lo, min(query_block, Q.shape[0] - lo), copies[b]) for b, lo in enumerate(starts)]


def _dask_blocks(client, queries, dim, query_block):
    """A dask array's row blocks of at most ``query_block`` rows, computed on the workers:
    ``[(offset, rows, future)]``."""
    if queries.ndim != 2 or queries.shape[1] != dim:
        raise ValueError(f"queries must be 2-D with dimension {dim}, got shape {queries.shape}")
    if any(c != c for c in queries.chunks[0]):
        raise ValueError("queries has unknown chunk sizes: call compute_chunk_sizes() first")
    if queries.shape[0] == 0:
        raise ValueError("queries is empty")
    arr = queries.rechunk({0: query_block, 1: -1})
    futures = client.compute(arr.to_delayed().ravel().tolist())
    offsets = np.concatenate([[0], np.cumsum(arr.chunks[0])[:-1]]).astype(np.int64)
    return [(int(o), int(r), f) for o, r, f in zip(offsets, arr.chunks[0], futures) if r > 0]


def knn(data, queries=None, k=10, *, metric="sqeuclidean", device="auto", client=None, n_parts=None,
        query_block=1 << 20, compute=None):
    """Exact k nearest neighbours on a Dask cluster (equal to :func:`knnkit.knn`).

    Every partition is validated and placed on its worker's device once (one task per
    partition, kept there for all query blocks); each query block is searched in every
    partition on that partition's worker; the per-partition lists are merged on the workers.

    Parameters
    ----------
    data : dask.array or array-like, shape (n, d)
        A dask array keeps its row chunks (computed on the workers); numpy / cupy / torch arrays
        are split into ``n_parts`` row blocks sent to the workers.
    queries : dask.array or array-like, shape (m, d), optional
        A dask array's row blocks (at most ``query_block`` rows) are computed on the workers and
        fetched by the workers that need them; an in-memory array is split into blocks of
        ``query_block`` rows, one copy sent from the client to every worker holding a partition.
        ``None``: the all-points graph of ``data``, each point excluding itself (as
        :func:`knnkit.knn`).
    k : int, default 10
        ``1 <= k <= n`` (``k <= n - 1`` without queries).
    metric : {"sqeuclidean", "euclidean", "inner_product", "cosine"}
    device : {"auto", "cpu", "gpu"}
        Where each worker computes ("auto": its GPU when it has one).
    client : distributed.Client, optional
        Default: the current client.
    n_parts : int, optional
        Row partitions of an in-memory ``data`` (default: one per worker).
    query_block : int, default 1048576
        Queries per task.
    compute : bool, optional
        True: gather the results to the client. False: return dask arrays whose blocks are
        futures on the workers (one block per query block; nothing moves to the client until
        they are computed). Default: dask arrays when the queries (without queries: the data)
        are a dask array, else gathered. A gathered cosine result is checked as
        :func:`knnkit.knn` checks it (a ``RuntimeWarning`` for neighbours closer than float32
        orders); dask arrays are not.

    Returns
    -------
    distances, indices : (m, k) arrays, sorted best first, ties by smaller index (float32 in
        the metric, int64 ids): numpy (cupy when the queries were cupy), or dask arrays.

    Examples
    --------
    >>> import numpy as np, knnkit.dask
    >>> from distributed import Client, LocalCluster
    >>> with LocalCluster(n_workers=2, threads_per_worker=1, processes=False) as cluster, Client(cluster) as c:
    ...     X = np.random.default_rng(0).random((1000, 8), dtype=np.float32)
    ...     d, i = knnkit.dask.knn(X, X[:3], k=2, client=c, device="cpu")
    >>> i[:, 0].tolist()
    [0, 1, 2]
    """
    client = get_client(client)
    metric = check_metric(metric, METRICS)
    device = _check_device(device)
    query_block = check_parts(query_block, "query_block", 1 << 40)
    n_parts = check_parts(n_parts, "n_parts", 1 << 31)
    all_points = queries is None
    dask_queries = _is_dask_array(data if all_points else queries)
    compute = check_compute(compute, dask_queries)
    parts, shape, _dtype, kind = partitions(client, data, n_parts)
    n, dim = shape
    k = check_k(k, n, self_excluded=all_points)
    where = homes(client, [f for _o, _r, f in parts])
    # each partition validated and on its worker's device once, for every query block
    prepared = [client.submit(prepare_part, f, metric, device, pure=False, workers=[w], allow_other_workers=True)
                for (_o, _r, f), w in zip(parts, where)]
    like = None
    if all_points:
        # each partition is a query block too (found where it lives); k + 1 lists, then each
        # point's own id is dropped
        qblocks, kind_q, kq = [(o, r, {w: f}) for (o, r, f), w in zip(parts, where)], kind, k + 1
        like = data._meta if dask_queries else None
    elif dask_queries:
        qblocks = [(o, r, {None: f}) for o, r, f in _dask_blocks(client, queries, dim, query_block)]
        kind_q, kq, like = "numpy", k, queries._meta
    else:
        Q, kind_q = _host_queries(queries, dim)
        hosts = sorted(set(where))
        qblocks, kq = _send_blocks(client, Q, query_block, lambda b: hosts), k
        queries = Q  # (host rows for the cosine check below)
        del Q
    results = []
    for qo, _qr, copies in qblocks:
        lists = []
        for (xo, _xr, _xf), P, w in zip(parts, prepared, where):
            qf = copies.get(w) or next(iter(copies.values()))  # the block's copy on w, else Dask fetches one
            # float64 distances rank the merge (see _tasks._exact_float64); float32 returned
            lists.append(client.submit(exact_prepared, P, qf, kq, xo, len(parts) == 1 and not all_points,
                                       pure=False, workers=[w], allow_other_workers=True))
        merged = tree_reduce(client, lists, merge_topk, kq, metric, last=(not all_points,))
        if all_points:
            merged = client.submit(finish_lists, merged, qo, k, True, pure=False)
        results.append(merged)
    if not compute:
        return result_arrays(results, [r for _o, r, _c in qblocks], k, (np.float32, np.int64), like,
                             prefix="knnkit-knn")
    out = client.gather(results)
    del results, prepared
    D = np.concatenate([o[0] for o in out]) if len(out) > 1 else out[0][0]
    I = np.concatenate([o[1] for o in out]) if len(out) > 1 else out[0][1]
    _warn_unresolved_cosine(client, parts, dim, D, I, None if all_points else queries, metric)
    return _output(D, kind_q), _output(I, kind_q)


#: Rows whose exact neighbours estimate a distributed graph's recall (as knnkit.knn_graph's probe).
ESTIMATE_ROWS = 1000


def _warn_unresolved_cosine(client, parts, dim, D, I, queries, metric, stacklevel=4):
    """:func:`knnkit._core.underflow.warn_unresolved_cosine` for a result gathered on the client: the
    same threshold and the same float64 test of the pairs concerned, with only those pairs' rows
    fetched from the partitions (none in the ordinary case: one comparison of the distances).
    ``D`` cosine distances, ``I`` global ids (host arrays) of ``dim``-dimensional rows; ``queries``:
    the query rows (host or Dask array), or None for all points (the queries are the data's rows)."""
    if metric != "cosine" or not D.size:
        return 0
    low = (D < cosine_resolution(dim)) & (I >= 0)
    if not low.any():
        return 0
    rows = np.unique(np.nonzero(low)[0])
    ids = np.asarray(I[rows][low[rows]], np.int64)
    need = np.unique(ids if queries is not None else np.concatenate([ids, rows.astype(np.int64)]))
    X = _probe(client, parts, need)
    Isub = np.where(low[rows], np.searchsorted(need, np.maximum(I[rows], 0)), -1)
    if queries is None:
        Qsub = X[np.searchsorted(need, rows)]
    elif _is_dask_array(queries):
        Qsub = np.asarray(queries[rows].compute(), np.float32)
    else:
        Qsub = np.asarray(queries[rows], np.float32)
    return warn_unresolved_cosine(np.asarray(D[rows], np.float32) - np.float32(1.0), Isub, X, Qsub, metric,
                                  stacklevel=stacklevel)


def _estimate_rows(n, seed):
    """The ESTIMATE_ROWS rows (sorted global ids) whose exact neighbours estimate the recall."""
    return np.sort(np.random.default_rng(seed ^ 0x5AFE).choice(n, ESTIMATE_ROWS, replace=False))


def _probe(client, parts, rows):
    """The data's rows ``rows`` (sorted global ids) on the client (ESTIMATE_ROWS rows: small). Passed
    to the partition-graph tasks as an argument: a dependency to fetch instead could queue behind
    a partition that is being copied to the same worker, and hold up that worker's build."""
    pieces = []
    for o, r, f in parts:
        sel = rows[(rows >= o) & (rows < o + r)] - o
        if sel.size:
            pieces.append(client.submit(rows_of, f, sel, pure=False))
    return np.ascontiguousarray(np.concatenate(client.gather(pieces)))


def _probe_recall(client, probes, rows, D_rows, k, metric):
    """The recall estimate from the partition graphs' probe lists (futures of ``(I, D, (pD, pI))``:
    each partition's exact ``k + 1`` nearest of the probe rows, computed in its graph's task)."""
    lists = [client.submit(take, f, 2, pure=False) for f in probes]
    Dx, Ix = client.gather(tree_reduce(client, lists, merge_topk, k + 1, metric))
    return recall_from(rows, Dx, Ix, D_rows, k, metric)


def _sample_lid(client, parts, n, metric, device, seed):
    """The data's local intrinsic dimension as :func:`knnkit.graph._estimate.estimate_intrinsic_dim`
    measures it for one process (``LID_SAMPLE`` rows' ``LID_K`` exact nearest neighbours among all
    rows, Euclidean; cosine on unit rows), by the distributed exact search; nan when the estimate
    has too few distinct points."""
    from ..graph._estimate import LID_K, LID_SAMPLE, lid_from_squared_distances

    rows = np.sort(np.random.default_rng(seed ^ 0x5EED11D).choice(n, min(LID_SAMPLE, n), replace=False))
    kk = min(LID_K + 1, n)
    qf = client.scatter(_probe(client, parts, rows), broadcast=True, hash=False)
    lists = [client.submit(exact_part, f, qf, kk, metric, device, o, pure=False) for o, _r, f in parts]
    D, _I = client.gather(tree_reduce(client, lists, merge_topk, kk, metric))
    d2 = np.asarray(D, dtype=np.float64)
    if metric == "euclidean":
        d2 = d2 * d2
    elif metric == "cosine":  # 1 - cos of unit rows is half their squared Euclidean distance
        d2 = 2.0 * d2
    return lid_from_squared_distances(d2, (LID_K,))[0]


def _estimate_recall(client, parts, rows, D_rows, k, metric, device):
    """recall@k of the graph on the sampled rows ``rows`` (its distances there: ``D_rows``), ties
    forgiven: exact neighbours of those rows by the distributed exact search (k + 1, self dropped)."""
    qf = client.scatter(_probe(client, parts, rows), broadcast=True, hash=False)
    # the graph's build validated the data: no second NaN scan of every partition
    lists = [client.submit(exact_part, f, qf, k + 1, metric, device, o, True, pure=False) for o, _r, f in parts]
    Dx, Ix = client.gather(tree_reduce(client, lists, merge_topk, k + 1, metric))
    return recall_from(rows, Dx, Ix, D_rows, k, metric)


class OnWorkers(NamedTuple):
    """A graph's final lists left on the workers in row order: ``blocks`` ``[(offset, rows,
    future)]``, consecutive and covering every row; each future's result is a tuple holding the
    block's ids at ``fields[0]`` and its distances at ``fields[1]`` (a schedule's own per-partition
    result where its rows are the block's, so no task copies them)."""

    blocks: list
    fields: tuple


def _partition_lists(client, parts, finals, fields, compute, phases, t0):
    """The rows schedules' final lists, one future per row partition (its result holds the ids at
    ``fields[0]`` and the distances at ``fields[1]``): ``(I, D)`` gathered in row order
    (``compute``), else :class:`OnWorkers` (each partition's result is its row block as it is).
    The client's seconds go to ``phases`` (``schedule_s`` from ``t0``, ``wait_s``, ``gather_s``,
    ``assemble_s``)."""
    from distributed import wait

    t1 = time.perf_counter()
    wait(finals)
    t2 = time.perf_counter()
    if compute:
        out = client.gather(finals)
        t3 = time.perf_counter()
        ii, dd = fields
        I = np.concatenate([o[ii] for o in out]) if len(out) > 1 else out[0][ii]
        D = np.concatenate([o[dd] for o in out]) if len(out) > 1 else out[0][dd]
        del out
        result = (I, D)
    else:
        t3 = time.perf_counter()
        result = OnWorkers([(o, r, f) for (o, r, _x), f in zip(parts, finals)], fields)
    phases.update(schedule_s=t1 - t0, wait_s=t2 - t1, gather_s=t3 - t2, assemble_s=time.perf_counter() - t3)
    return result


def _short_rows(client, lists):
    """Rows whose list has an empty (-1) slot: counted by numpy for lists on the client, by one
    small task per block for lists on the workers (ints come back, not the lists)."""
    if isinstance(lists, OnWorkers):
        field = lists.fields[0]
        return sum(client.gather([client.submit(short_rows, f, field, pure=False) for _o, _r, f in lists.blocks]))
    short = lists[0] < 0
    return int(short.any(axis=1).sum()) if short.any() else 0  # rows counted only when there are any


def _distances_at(client, lists, rows):
    """The graph's distances at the sorted global ``rows`` (the recall estimate's sample): for lists
    on the workers, only those rows are fetched from the blocks holding them."""
    if not isinstance(lists, OnWorkers):
        return lists[1][rows]
    field = lists.fields[1]
    pieces = []
    for o, r, f in lists.blocks:
        sel = rows[(rows >= o) & (rows < o + r)] - o
        if sel.size:
            pieces.append(client.submit(distances_at, f, field, sel, pure=False))
    return np.concatenate(client.gather(pieces))


#: ``partition`` values of :func:`knn_graph`.
PARTITIONS = ("auto", "rows", "tree", "descent")
#: ``partition="auto"`` shares one descent between GPU workers above this many points (measured
#: 1.56x one process at 4M, 1.59x at 10M on 2 x H200 (1.65x at 10M since the overlapped share); not timed below 4M, where one GPU builds the
#: graph in under a second and the tree is kept)
DESCENT_MIN_N = 1_000_000
#: a shared descent whose recall estimate ends below this warns, or, chosen by ``partition="auto"``,
#: gives way to the tree schedule (``stats["descent_fallback"]``): knnkit.knn_graph's exact fallback
#: has no shared form yet
DESCENT_FALLBACK_RECALL = 0.985
#: metrics of the shared descent (``partition="descent"``): those of the GPU NN-Descent without the
#: inner product's hub refinement
DESCENT_METRICS = ("sqeuclidean", "euclidean", "cosine")
#: metrics whose neighbours lie within their Euclidean distance of a hyperplane (the slab bound);
#: inner_product has no such bound and always uses row partitions and GGM merges.
TREE_METRICS = ("sqeuclidean", "euclidean", "cosine", "manhattan")
#: a warning (and ``stats["slab_fraction"]``) when the slabs hold more than this share of the points:
#: the tree then saves little over one device (uniform high-dimensional data)
SLAB_WARN_FRACTION = 0.5
#: ``second_stage`` values of :func:`knn_graph`
SECOND_STAGES = ("auto", "search", "graph")
#: metrics the cross searches serve (the graph search's l2 / inner-product kernels); inner_product
#: itself is left to GGM merges: a walk of its k-NN graph found 0.87 recall (200k x 32 clustered,
#: two partitions, beam 64)
SEARCH_METRICS = ("sqeuclidean", "euclidean", "cosine")
#: radii sampled per leaf and level to choose a slab width
RADII_SAMPLE = 4096


def _check_choice(value, name, choices):
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, one of {', '.join(map(repr, choices))}; got {type(value).__name__}")
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def _check_quantile(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float in (0, 1], got {type(value).__name__}")
    if not 0.0 < float(value) <= 1.0:
        raise ValueError(f"{name} must be in (0, 1], got {value!r}")
    return float(value)


def _weighted_quantile(pieces, q):
    """The ``q`` quantile of the union of sampled pieces ``[(count, sample)]`` (each sample stands
    for ``count`` values); 0 when there are none."""
    vals = [v for c, v in pieces if c and v.size]
    if not vals:
        return 0.0
    v = np.concatenate(vals)
    w = np.concatenate([np.full(s.size, c / s.size) for c, s in pieces if c and s.size])
    order = np.argsort(v, kind="stable")
    cum = np.cumsum(w[order])
    j = int(np.searchsorted(cum, q * cum[-1] - 1e-9 * cum[-1]))
    return float(v[order][min(j, v.size - 1)])


def _tree_graph(client, parts, n, k, metric, device, P, split, width_rule, quantile, sample, seed, phases,
                stage="search", estimate=False, compute=True):
    """knn_graph(partition="tree"): leaves of a hyperplane tree, each graphed on its worker; then,
    for every splitting hyperplane, its boundary slab: ``stage="search"``, each leaf's slab rows
    searched in the graphs of the leaves across it, on their workers (all in parallel), or
    ``stage="graph"``, one graph of the whole slab on one worker. Each point keeps the k nearest
    of its lists. ``estimate``: the recall estimate's exact lists come from the leaf graphs' tasks
    (``stats["recall_estimate"]``). ``compute``: the leaves' lists gathered and put in row order
    on the client; else the row blocks of ``parts`` are assembled on the workers, each from the
    pieces of every leaf that holds its rows (an exchange between workers). Returns ``(lists,
    stats)``, ``lists`` ``(I, D)`` or :class:`OnWorkers`; client-side seconds are added to
    ``phases``."""
    from distributed import wait

    t0 = time.perf_counter()
    workers = worker_addresses(client)
    rows = _estimate_rows(n, seed) if estimate else None
    probe = _probe(client, parts, rows) if estimate else None
    W = len(workers)
    unit = metric == "cosine"
    nodes = tree_nodes(P)
    home = [workers[L * W // P] for L in range(P)]  # consecutive leaves share a worker: child slabs stay local
    # 1. the tree's hyperplanes from a sample of every partition (fitted on a worker)
    samples = [client.submit(sample_rows, f, max(1, round(sample * r / n)), seed + 31 * p + 5, unit, pure=False)
               for p, (_o, r, f) in enumerate(parts)]
    tree = client.submit(fit_tree, P, split, seed, *samples, pure=False)
    # 2. route every partition's rows (on its worker), assemble the leaves on their home workers
    routed = [client.submit(route, f, tree, P, unit, pure=False) for _o, _r, f in parts]
    leaves, lists = [], []
    for L in range(P):
        pieces = [client.submit(select_leaf, f, rt, o, L, pure=False) for (o, _r, f), rt in zip(parts, routed)]
        leaves.append(client.submit(assemble, *pieces, pure=False, workers=[home[L]], allow_other_workers=True))
        lists.append(client.submit(leaf_graph, leaves[L], k, metric, device, seed + 7919 * L + 1, True, probe,
                                   pure=False, workers=[home[L]], allow_other_workers=True))
    # 3. slab widths: per node, a quantile of what its leaves' graphs say (see knn_graph, slab_width)
    needs = client.gather([client.submit(slab_samples, leaves[L], lists[L], tree, L, P, k, metric, width_rule,
                                         RADII_SAMPLE, seed + 13 * L + 7, pure=False, workers=[home[L]],
                                         allow_other_workers=True) for L in range(P)])
    leaf_sizes = client.gather([client.submit(size_of, lf, pure=False) for lf in leaves])
    rows_of_leaf = [[] for _ in range(P)]
    widths, needy, slabs = [], [], []
    searched = stage == "search"
    n_searches = 0
    for h, (lo, mid, hi, lvl) in enumerate(nodes):
        pieces = [needs[L][lvl] for L in range(lo, hi)]
        cnt = int(sum(c for c, _v in pieces))
        w = _weighted_quantile(pieces, quantile)
        widths.append(w)
        needy.append(cnt)
        if cnt == 0:
            slabs.append([])
            continue
        sel = [client.submit(select_slab, leaves[L], lists[L], lvl, w, k, metric, width_rule, pure=False,
                             workers=[home[L]], allow_other_workers=True) for L in range(lo, hi)]
        slabs.append(sel)
        if searched:
            # each leaf's boundary rows searched in the graph of every leaf across h, on that leaf's
            # worker: forward lists go back to the rows' leaf, reverse candidates stay with the target
            for L in range(lo, hi):
                for O in (range(mid, hi) if L < mid else range(lo, mid)):
                    res = client.submit(cross_search, leaves[O], lists[O], sel[L - lo], lvl, w, k, metric, device,
                                        seed + 104729 * h + 7919 * (L * P + O) + 3, pure=False, workers=[home[O]],
                                        allow_other_workers=True)
                    rows_of_leaf[L].append(client.submit(take, res, 0, pure=False))
                    rows_of_leaf[O].append(client.submit(take, res, 1, pure=False))
                    n_searches += 1
            continue
        slab = client.submit(assemble, *sel, pure=False, workers=[home[lo]], allow_other_workers=True)
        sl = client.submit(leaf_graph, slab, k, metric, device, seed + 104729 * h + 3, pure=False,
                           workers=[home[lo]], allow_other_workers=True)
        for j, L in enumerate(range(lo, hi)):
            rows_of_leaf[L].append(client.submit(slab_for_leaf, slab, sl, j, pure=False))
    finals = [client.submit(merge_leaf, leaves[L], lists[L], k, metric, *rows_of_leaf[L], pure=False,
                            workers=[home[L]], allow_other_workers=True) for L in range(P)]
    slab_sizes = [sum(v) for v in client.gather([[client.submit(size_of, f, pure=False) for f in sel]
                                                 for sel in slabs])]
    t1 = time.perf_counter()
    wait(finals)
    t2 = time.perf_counter()
    if compute:
        out = client.gather(finals)
        t3 = time.perf_counter()
        if len(out) == 1 and out[0][0].shape[0] == n and np.array_equal(out[0][0], np.arange(n)):
            I, D = out[0][1], out[0][2]  # one leaf holding every row in order: no reassembly
        else:
            I = np.full((n, k), -1, np.int32)
            D = np.full((n, k), np.inf, np.float32)
            for ids, Il, Dl in out:
                I[ids] = Il
                D[ids] = Dl
        del out
        result = (I, D)
    else:
        # row block b (the input's partition b, on its worker) takes its rows from every leaf: each
        # leaf cuts its piece where it lives, and only the pieces move, worker to worker
        t3 = time.perf_counter()
        owners = homes(client, [f for _o, _r, f in parts])
        blocks = []
        for (o, r, _f), w in zip(parts, owners):
            pieces = [client.submit(leaf_rows_in, final, o, o + r, pure=False) for final in finals]
            blocks.append((o, r, client.submit(place_rows, r, k, *pieces, pure=False, workers=[w],
                                               allow_other_workers=True)))
        del finals
        wait([f for _o, _r, f in blocks])
        result = OnWorkers(blocks, (0, 1))
    phases.update(schedule_s=t1 - t0, wait_s=t2 - t1, gather_s=t3 - t2, assemble_s=time.perf_counter() - t3)
    est = None
    if estimate:
        t4 = time.perf_counter()
        est = _probe_recall(client, lists, rows, _distances_at(client, result, rows), k, metric)
        phases["estimate_s"] = time.perf_counter() - t4
    frac = float(sum(slab_sizes)) / n
    stats = {"method": "dask-tree", "partitions": P, "split": split, "second_stage": stage,
             "cross_searches": n_searches, "leaf_sizes": [int(v) for v in leaf_sizes],
             "slab_sizes": [int(v) for v in slab_sizes], "slab_widths": [round(float(v), 6) for v in widths],
             "slab_samples": needy, "slab_width": width_rule, "slab_quantile": quantile, "slab_fraction": round(frac, 4),
             "workers": W}
    if est is not None:
        stats["recall_estimate"] = round(est, 5)
    if frac > SLAB_WARN_FRACTION:
        logger.warning("knnkit.dask.knn_graph: the boundary slabs hold %.0f%% of the points (the tree's hyperplanes "
                       "cut through dense regions, e.g. uniform high-dimensional data); %s", 100 * frac,
                       "each of them is searched across its hyperplane" if searched else
                       f"the build does about {1 + frac:.1f}x one device's work")
    return result, stats


def knn_graph(data, k=10, *, metric="sqeuclidean", device="auto", client=None, n_parts=None,
              n_neighbors_internal=None, random_state=0, partition="auto", split="pca", slab_width="projected",
              slab_quantile=0.99, tree_sample=20000, recall_estimate=True, second_stage="auto", compute=None):
    """Approximate k-NN graph on a Dask cluster.

    On GPU workers (one per GPU, NCCL between them through CuPy) the default is one NN-Descent
    shared by all GPUs (``partition="descent"``): every GPU holds all the data (the workers'
    blocks are broadcast between the GPUs over NCCL, not through Dask) and the whole graph; each
    samples and joins an equal share of the nodes (GNND section 4); after every iteration the
    forward samples, then each GPU's copy of the others' rows go to their owners, who merge them
    into their rows and share them, so every GPU goes on from the same graph and all stop at the
    same iteration. It is the single-device descent with the same parameters, so its recall is
    the single device's (measured within 0.0003 at 4M-20M x 96); the recall estimate runs on the
    GPUs (each checks the sampled rows it holds). Measured on 2 x H200 (NVLink; data and lists on
    the GPUs, ``benchmarks/results/dask-h200x2-2026-11-29-s23/``): 10M x 96 in 5.74 s against
    9.46 s in one process (1.65x) and 10.3 s on one worker (1.80x); 20M x 96 13.4 s against
    20.5 s (1.53x, before the owners' rows were shared beside the next sampling;
    ``dask-h200x2-2026-11-29-s19/``). It needs room on every GPU for the data and three copies of the graph; one
    shared descent runs at a time on a cluster (a distributed lock: its tasks must run at once on
    every worker); communicators are kept on the workers for the next call. Unlike
    :func:`knnkit.knn_graph` it has no exact fallback for data on which the descent stalls (high
    intrinsic dimension): the estimate then warns, and ``partition="tree"`` or
    :func:`knnkit.dask.knn` (exact) serve such data. Data whose values span more than ~1e19
    (neighbours closer than float32 resolves) is refused with ``ValueError``, as by the partition
    schedules; :func:`knnkit.knn_graph` in one process answers such rows in float64.

    The partition schedules (``partition="tree"`` or ``"rows"``; CPU workers, inner_product,
    manhattan, GPUs without NCCL, graphs of at most ``DESCENT_MIN_N`` points) work in two stages:
    first every partition's graph, built by the single-device engine on its worker (all
    partitions in parallel); then the *second stage* finds the neighbours a point has in other
    partitions (``second_stage``).

    * ``"tree"`` (spatial partitions): a balanced hyperplane tree over ``n_parts`` leaves (fitted
      on a sample: each node splits its points at the quantile of their projections on the
      sample's top principal direction that gives every leaf an equal share); the leaves are the
      partitions. Only points near a splitting hyperplane h can have a neighbour across it:
      if ``b`` is among ``a``'s true k nearest and the two lie on opposite sides of h, then
      ``|m(a)| + |m(b)| = |u . (a - b)| <= |a - b| <= r(a)``, where ``m`` is the signed
      distance to h and ``r(a)`` the Euclidean distance of ``a``'s k-th neighbour in its leaf
      graph (an upper bound of the true one). The *slab* of h is its points within ``w_h``
      (``slab_width="projected"``, default: ``w_h`` the ``slab_quantile`` quantile of
      ``|u . (a - b)|`` over the leaf graphs' neighbour pairs; ``"bound"``: also every point with
      ``|m| <= r``, and ``w_h`` the quantile of ``r`` over those). Second stage:
      ``"search"`` (GGNN section 5.5's sharded all-points search, restricted to the slabs): every
      leaf's slab rows are searched in the graph of every leaf across h (its k-NN lists plus
      reverse edges, seeds from a sample of that leaf's slab rows), on that leaf's worker, all
      pairs in parallel; each pair found serves both ends (the query row gets its nearest points
      over there; each point found gets the query rows that found it). ``"graph"``: one
      single-device graph of each whole slab, on one worker. Each point keeps the k nearest of
      its lists. Cosine runs on unit rows (``|a - b| = sqrt(2 cosine distance)``); manhattan uses
      ``r`` = the L1 distance (it bounds the L2 one).
    * ``"rows"``: row partitions as they come. Second stage ``"search"``: every partition's rows
      are searched in every other partition's graph, on that partition's worker (each partition
      is copied to the others' workers while their graphs are built), forward and reverse as
      above; ``"graph"``: GGM (GNND section 5) merges of every pair of partitions (the partition
      graphs with ``n_neighbors_internal`` lists), each pair on one worker. GGM's total work grows
      with the partitions (each merge costs about twice a full build): it does not scale, but it
      serves every metric.

    ``"auto"``: ``"descent"`` where it can run (more than ``DESCENT_MIN_N`` points, at least two
    workers, each with a GPU, NCCL and room for the data; sqeuclidean, euclidean or cosine; no
    ``n_parts``, ``second_stage`` or ``n_neighbors_internal`` given), else ``"tree"``, except for
    ``inner_product`` (no distance bound to a hyperplane), which uses ``"rows"``. Data on which
    NN-Descent stalls gives the tree schedule (whose leaves build exact lists) instead of a shared
    descent chosen by ``"auto"``: before the descent when the local intrinsic dimension (500
    sampled rows' exact 20 nearest neighbours, by the distributed exact search) is at least
    :data:`knnkit.graph.STALL_LID`, as :func:`knnkit.knn_graph` decides; after it when its
    recall estimate ends below ``DESCENT_FALLBACK_RECALL`` (``stats["descent_fallback"]``, with
    ``before_descent`` in the first case). ``second_stage="auto"``: ``"search"`` for the tree schedule with
    sqeuclidean, euclidean and cosine; ``"graph"`` otherwise: for the rows schedule (on 2 x H200,
    4M x 96 clustered, its cross searches reached recall 0.986 against the GGM merges' 0.997),
    inner_product (a walk of its k-NN graph found 0.87 recall: 200k x 32 clustered, two
    partitions) and manhattan (no graph search kernel).

    Measured on CPU workers (2 workers, one thread each, 200k x 32 clustered,
    ``benchmarks/results/cpu/dask_second_stage_2026-11-26b.md``): the second stage runs on both
    workers; recall 0.9989 (tree) / 0.9975 (rows), single process 0.9993. On 2 x H200 (4M x 96,
    ``benchmarks/results/dask-h200x2-2026-11-26b/``): tree + search 6.7 s (0.9977), tree + graph
    7.8 s, rows + graph 8.6 s, against 4.8 s on one worker: on GPUs these schedules do not pay
    (host copies and transfers between the stages), hence the shared descent on GPU workers.

    Parameters
    ----------
    data : dask.array or array-like, shape (n, d)
    k : int, default 10
        Neighbours per point, self excluded; ``1 <= k <= n - 1``.
    metric : {"sqeuclidean", "euclidean", "inner_product", "cosine", "manhattan"}
    device : {"auto", "cpu", "gpu"}
    client : distributed.Client, optional
    n_parts : int, optional
        ``"rows"``: row partitions of an in-memory ``data`` (a dask array keeps its chunks);
        ``n_parts * (n_parts - 1)`` cross searches (every ordered pair), or every pair merged
        once: ``n_parts * (n_parts - 1) / 2`` GGM merges. ``"tree"``: leaves of the tree (any
        count; at most ``n // (k + 1)``), whatever the input's chunks; every ordered pair of
        leaves is searched once (at their lowest common node). Default: one per worker.
    n_neighbors_internal : int, optional
        ``"rows"`` with GGM merges only: list length of the partition graphs and merges (default:
        knnkit.knn_graph's rule; given, ``second_stage="auto"`` means GGM). The tree's leaves
        and slabs and the rows' cross searches use the single-device build.
        One partition (``"tree"`` with one leaf, ``"rows"`` with one partition and no
        ``n_neighbors_internal``): nothing to split or merge; one task on one worker runs
        :func:`knnkit.knn_graph`'s build with ``random_state``, so the graph equals the
        single-process one (same thread count), and its recall estimate is the engine's own
        (``stats["single_device"]`` True, ``stats["n_neighbors_internal"]`` None).
    random_state : int, default 0
    partition : {"auto", "descent", "rows", "tree"}, default "auto"
        The schedule, see above. ``"descent"`` where it cannot run raises ``ValueError`` with
        the reason (each worker's).
    split : {"pca", "random"}, default "pca"
        ``"tree"``: each hyperplane's normal, the top principal direction of the node's sample
        rows, or the direction between two random sample rows (RSFK's rule).
    slab_quantile : float in (0, 1], default 0.99
        ``"tree"``: quantile of the radii that sets each slab's width (1: the largest radius;
        every neighbour found by the leaf graphs' bound, the widest slabs).
    tree_sample : int, default 20000
        ``"tree"``: sample rows (over all partitions) the hyperplanes are fitted on.
    second_stage : {"auto", "search", "graph"}, default "auto"
        How the neighbours across partitions are found, see above.
    recall_estimate : bool, default True
        Estimate the graph's recall@k on 1,000 sampled rows (``stats["recall_estimate"]``, a
        warning below 0.985) by an exact search of those rows against every partition, after the
        build (graphs of more than 2,000 points, not manhattan). False skips that search. One
        partition: the engine's own estimate, made during the build, is reported either way.
        The estimate reads only the sampled rows' lists (fetched from the workers when the lists
        stay there).
    compute : bool, optional
        True: the lists are gathered to the client and put in row order there (an in-memory
        :class:`~knnkit.KnnGraph`). False: they stay on the workers, in row order, as dask arrays
        whose row blocks are the input's non-empty row chunks (an in-memory ``data``: its
        partitions, ``n_parts`` for ``"rows"``, one per worker for ``"tree"``); the tree's leaves
        hold a permutation of the rows, so every block is assembled on its partition's worker
        from the pieces of the leaves that hold its rows (moved between workers, never through
        the client). The short-list check and the recall estimate run without gathering them (a
        count per block, the 1,000 sampled rows). Default: False when ``data`` is a dask array,
        else True. The lists are the same either way (same seed). Gathered cosine lists are
        checked as :func:`knnkit.knn_graph` checks them (a ``RuntimeWarning`` for neighbours
        closer than float32 orders); lists left on the workers are not.

    Returns
    -------
    KnnGraph
        ``indices`` (n, k) int32 global ids, ``distances`` in the user metric, each row sorted
        (nearest first): numpy (cupy for cupy ``data``), or with ``compute=False`` dask arrays
        of numpy blocks, a *dask-backed* graph (``g.is_dask``): ``g.compute()`` gathers it;
        ``recall``, ``to_csr``, ``to_umap``, ``save`` and ``extend`` raise ``TypeError`` until
        then. ``stats`` records the schedule: ``"dask-descent"`` (``ranks``, ``rank_rows``,
        ``iterations``, ``updates``, ``n_neighbors_internal``; per rank ``rank_s``: seconds of
        its task's steps (``lists_s``: the lists' final steps, ``host_s``: their copy to the
        host), and ``phase_ms``: GPU milliseconds of the descent's sample, reverse, join and
        exchange steps; ``rows_moved``: per iteration the rows sent to their owners and
        the rows shared back, summed over ranks), ``"dask-tree"`` (``partitions``,
        ``second_stage``, ``cross_searches``, ``leaf_sizes``, ``slab_sizes`` per internal node
        breadth-first, ``slab_widths``, ``slab_fraction`` = slab points / n), ``"dask-rows"``
        (row partitions with cross searches: ``partitions``, ``cross_searches``) or
        ``"dask-ggm"`` (``partitions``, ``merges``); ``phases``: the client's seconds spent on
        the input's partitions (``input_s``), submitting the tasks (``schedule_s``, tree: up to
        the slab widths, which wait for the leaf graphs), waiting for the final lists
        (``wait_s``), moving them to the client (``gather_s``; lists left on the workers: only
        the one-partition build's stats) and putting them in row order (``assemble_s``; left on
        the workers: waiting for the row blocks assembled there), the short-list check
        (``check_s``), the recall estimate (``estimate_s``) and in all (``total_s``).

    Examples
    --------
    >>> import numpy as np, knnkit.dask
    >>> from distributed import Client, LocalCluster
    >>> with LocalCluster(n_workers=2, threads_per_worker=1, processes=False) as cluster, Client(cluster) as c:
    ...     X = np.random.default_rng(0).random((3000, 8), dtype=np.float32)
    ...     g = knnkit.dask.knn_graph(X, k=5, client=c, device="cpu")
    ...     dg = knnkit.dask.knn_graph(X, k=5, client=c, device="cpu", compute=False)  # lists on the workers
    ...     same = bool((dg.compute().indices == g.indices).all())
    >>> g.indices.shape, g.stats.method, dg.is_dask, dg.indices.chunks, same
    ((3000, 5), 'dask-tree', True, ((1500, 1500), (5,)), True)
    """
    from .._core.stats import BuildStats
    from ..api.knngraph import KnnGraph

    t_start = time.perf_counter()
    client = get_client(client)
    metric = check_metric(metric, GRAPH_METRICS)
    device = _check_device(device)
    if not isinstance(recall_estimate, bool):
        raise TypeError(f"recall_estimate must be a bool, got {type(recall_estimate).__name__}")
    partition = _check_choice(partition, "partition", PARTITIONS)
    split = _check_choice(split, "split", ("pca", "random"))
    slab_width = _check_choice(slab_width, "slab_width", ("projected", "bound"))
    slab_quantile = _check_quantile(slab_quantile, "slab_quantile")
    tree_sample = check_parts(tree_sample, "tree_sample", 1 << 31)
    n_parts = check_parts(n_parts, "n_parts", 1 << 31)
    second_stage = _check_choice(second_stage, "second_stage", SECOND_STAGES)
    compute = check_compute(compute, _is_dask_array(data))
    # as knnkit.knn_graph: None (a fresh seed), an int >= 0 or a numpy Generator / RandomState, with
    # a TypeError / ValueError naming random_state for anything else (int() took "7" and 1.5 before);
    # 62 bits, so that the per-partition seeds derived from it stay within int64
    seed = seed_from(random_state) & ((1 << 62) - 1)
    if second_stage == "search" and metric not in SEARCH_METRICS:
        raise ValueError(f"second_stage='search' needs a metric with a graph search ({', '.join(SEARCH_METRICS)}); "
                         f"metric={metric!r} uses second_stage='graph'")
    if partition == "tree" and metric not in TREE_METRICS:
        raise ValueError(f"partition='tree' needs a metric with a distance bound to a hyperplane "
                         f"({', '.join(TREE_METRICS)}); metric={metric!r} uses partition='rows'")
    if partition == "descent":
        if metric not in DESCENT_METRICS:
            raise ValueError(f"partition='descent' serves the metrics {', '.join(DESCENT_METRICS)}, not {metric!r}")
        if device == "cpu":
            raise ValueError("partition='descent' runs on GPU workers (NCCL between them); device='cpu' uses "
                             "partition='tree' or 'rows'")
        if second_stage != "auto" or n_neighbors_internal is not None:
            raise ValueError("partition='descent' has no second stage and takes the single-device list length: "
                             "leave second_stage='auto' and n_neighbors_internal=None")
    descent_auto = (partition == "auto" and device != "cpu" and metric in DESCENT_METRICS
                    and second_stage == "auto" and n_neighbors_internal is None and n_parts is None)
    if partition == "auto" and not descent_auto:
        partition = "tree" if metric in TREE_METRICS else "rows"
    parts, shape, _dtype, kind = partitions(client, data, None if partition == "tree" else n_parts)
    n = shape[0]
    if n >= 2 ** 31 - 1:
        raise ValueError("knnkit.dask.knn_graph: more than 2**31 - 2 points do not fit int32 ids")
    k = check_k(k, n, self_excluded=True)
    if partition == "descent" or (partition == "auto" and n > DESCENT_MIN_N):
        workers = worker_addresses(client)
        why = "the cluster has one worker" if len(workers) < 2 else \
            f"{n} points are too few for {len(workers)} workers" if n < len(workers) * (k + 1) else \
            _descent_possible(client, workers, n, shape[1], np.dtype(_dtype).itemsize, k)
        if why and partition == "descent":
            raise ValueError(f"partition='descent' cannot run here: {why}")
        if why is None:
            partition = "descent"
    auto_descent = descent_auto and partition == "descent"
    skipped = None  # the shared descent left before it ran: data of high intrinsic dimension
    if auto_descent:
        # as knnkit.knn_graph gives its stall verdict before the descent (STALL_LID): NN-Descent
        # stalls on such data and the shared descent would be spent before its recall estimate
        # sent the build to the tree schedule, whose leaves build exact lists
        t = time.perf_counter()
        lid = _sample_lid(client, parts, n, metric, device, seed)
        if lid >= STALL_LID:  # (nan: too few distinct points, the descent goes ahead)
            logger.info("knnkit.dask.knn_graph: local intrinsic dimension %.1f >= %.0f: NN-Descent would stall; "
                        "building with partition='tree' (its leaves build exact lists)", lid, STALL_LID)
            skipped = {"before_descent": True, "intrinsic_dim": round(float(lid), 2),
                       "seconds": round(time.perf_counter() - t, 4)}
            partition = "tree"
    if partition == "auto":  # (data too small for the shared descent, or no GPUs with NCCL)
        partition = "tree"
    if second_stage == "auto":  # n_neighbors_internal is a parameter of the rows' GGM merges
        # rows: the GGM merges (on 2 x H200, 4M x 96 the rows' cross searches reached 0.986 against
        # the merges' 0.997; the tree's searches 0.9977, as its slab graph)
        second_stage = "search" if metric in SEARCH_METRICS and partition == "tree" else "graph"
    # the recall estimate: exact neighbours of sampled rows (graphs of more than 2,000 points, not L1)
    estimate = recall_estimate and n > 2 * ESTIMATE_ROWS and metric != "manhattan"
    phases = {"input_s": time.perf_counter() - t_start}
    if partition == "tree":
        # default: one leaf per worker, as many as hold k + 1 points each (a small data set with a
        # large k was refused for an n_parts the caller had not given)
        P = n_parts or min(len(worker_addresses(client)), max(1, n // (k + 1)))
        if P > max(1, n // (k + 1)):
            raise ValueError(f"n_parts={P} leaves of {n} points leave fewer than k + 1 = {k + 1} points per leaf; "
                             f"use at most {max(1, n // (k + 1))}")
    single = (partition == "tree" and P == 1) or (partition == "rows" and len(parts) == 1
                                                   and n_neighbors_internal is None)
    # (the shared descent prepares all the data on every GPU, as one process does: its own scale)
    scale, parts = (1.0, parts) if single or partition == "descent" else _scaled_parts(client, parts)
    if single:
        # one partition: nothing to split or merge, the single-device build on one worker
        result, stats = _single_graph(client, parts, n, k, metric, device, seed, phases, compute=compute)
        if partition == "tree":
            stats.update(method="dask-tree", split=split, second_stage=None, cross_searches=0, leaf_sizes=[n],
                         slab_sizes=[], slab_widths=[],
                         slab_samples=[], slab_width=slab_width, slab_quantile=slab_quantile, slab_fraction=0.0)
    elif partition == "descent":
        result, stats = _descent_graph(client, parts, n, shape[1], _dtype, k, metric, seed, phases,
                                       estimate=estimate, compute=compute)
        est = stats.get("recall_estimate")
        if est is not None and est < DESCENT_FALLBACK_RECALL:
            if not auto_descent:
                logger.warning("knnkit.dask.knn_graph: estimated recall@%d of the shared descent is %.3f (data on "
                               "which NN-Descent stalls); partition='tree' (its leaf builds fall back to exact "
                               "lists) or knnkit.dask.knn (exact) serve such data", k, est)
            else:
                # as knnkit.knn_graph leaves a stalled descent for exact lists: the tree schedule,
                # whose leaves are single-device builds with that fallback
                logger.warning("knnkit.dask.knn_graph: the shared descent reached recall@%d %.3f; building "
                               "with partition='tree' instead", k, est)
                first = {"recall_estimate": est, "iterations": stats.get("iterations"),
                         "seconds": round(time.perf_counter() - t_start, 4)}
                partition = "tree"
                second_stage = "search" if metric in SEARCH_METRICS else "graph"
                P = min(len(worker_addresses(client)), max(1, n // (k + 1)))
                scale, parts = _scaled_parts(client, parts)
                del result
                result, stats = _tree_graph(client, parts, n, k, metric, device, P, split, slab_width,
                                            slab_quantile, tree_sample, seed, phases, second_stage, estimate,
                                            compute=compute)
                stats["descent_fallback"] = first
    elif partition == "tree":
        result, stats = _tree_graph(client, parts, n, k, metric, device, P, split, slab_width, slab_quantile,
                                    tree_sample, seed, phases, second_stage, estimate, compute=compute)
    elif second_stage == "search":
        result, stats = _rows_search(client, parts, n, k, metric, device, seed, phases, estimate, compute=compute)
    else:
        result, stats = _rows_graph(client, parts, n, k, metric, device, n_neighbors_internal, seed, phases,
                                    compute=compute)
    if skipped is not None:
        stats["descent_fallback"] = skipped
    t = time.perf_counter()
    short = _short_rows(client, result)  # on the workers when the lists are there: a count comes back
    phases["check_s"] = time.perf_counter() - t
    if short:
        raise RuntimeError(f"knnkit.dask.knn_graph: {short} lists are short of k neighbours (internal error)")
    if estimate and stats.get("recall_estimate") is None:
        t = time.perf_counter()
        rows = _estimate_rows(n, seed)
        est = _estimate_recall(client, parts, rows, _distances_at(client, result, rows), k, metric, device)
        phases["estimate_s"] = time.perf_counter() - t
        stats["recall_estimate"] = round(est, 5)
        if est < 0.985:
            logger.warning("knnkit.dask.knn_graph: estimated recall@%d is %.3f%s", k, est,
                           f"; pass a larger n_neighbors_internal (now {stats['n_neighbors_internal'] or 'the default'})"
                           if stats["method"] == "dask-ggm" else "" if partition == "rows"
                           else f"; pass a larger slab_quantile (now {slab_quantile})")
    if scale != 1.0:  # the distances back in the data's units (float64 there, inf beyond float32)
        if isinstance(result, OnWorkers):
            result = OnWorkers([(o, r, client.submit(unscale_lists, f, result.fields, scale, metric, pure=False))
                                for o, r, f in result.blocks], (0, 1))
        else:
            result = unscale_lists(result, (0, 1), scale, metric)
    phases["total_s"] = time.perf_counter() - t_start
    stats["phases"] = {key: round(v, 4) for key, v in phases.items()}
    if isinstance(result, OnWorkers):
        # blocks are getitem keys on the futures (which keep the lists alive on the workers)
        I, D = result_arrays([f for _o, _r, f in result.blocks], [r for _o, r, _f in result.blocks], k,
                             (np.int32, np.float32), prefix="knnkit-graph", fields=result.fields)
        return KnnGraph(I, D, metric=metric, stats=BuildStats.from_dict(stats))
    I, D = result
    _warn_unresolved_cosine(client, parts, shape[1], np.asarray(D), np.asarray(I), None, metric)
    return KnnGraph(_output(I, kind), _output(D, kind), metric=metric, stats=BuildStats.from_dict(stats))


def _scaled_parts(client, parts):
    """``(scale, parts)``: the whole data's power-of-two scale (:func:`_data_scale`) and the
    partitions multiplied by it. Data beyond 2^50 or below 2^-50 gets one scale for every
    partition, as the single process computes at (each partition's own scale gave float32
    distances that overflow or underflow in the merges: 1e30-scale data lost ranks, unsorted
    lists, recall 0.75)."""
    scale = _data_scale(client, parts)
    if scale != 1.0:
        parts = [(o, r, client.submit(scale_rows, f, scale, pure=False)) for o, r, f in parts]
    return scale, parts


def _data_scale(client, parts):
    """The power-of-two scale of the whole data (1.0 for data within [2^-50, 2^50]; see
    :func:`knnkit._core.metrics.safe_scale`): from each partition's largest magnitude."""
    from .._core.metrics import scale_for_max

    return scale_for_max(max(client.gather([client.submit(absmax_of, f, pure=False) for _o, _r, f in parts])))


def _single_graph(client, parts, n, k, metric, device, seed, phases, compute=True):
    """knn_graph with one partition: one task runs :func:`knnkit.knn_graph`'s build on the worker
    holding (most of) the data, with the same seed, so the lists equal the single-process ones.
    The engine's own recall estimate (its ``target_recall`` probe, made during the build) is
    reported; no second, distributed estimate runs. ``compute``: the lists gathered; else left
    on that worker, cut into the row blocks of ``parts`` (views, no copy). ``(lists, stats)``,
    phases as the other schedules."""
    from distributed import wait

    t0 = time.perf_counter()
    fut = client.submit(single_graph, k, metric, device, seed, *[f for _o, _r, f in parts], pure=False)
    t1 = time.perf_counter()
    wait(fut)
    t2 = time.perf_counter()
    if compute:
        I, D, st = fut.result()
        result = (I, D)
        t3 = time.perf_counter()
    else:
        st = client.submit(take, fut, 2, pure=False).result()  # the engine's stats: a small dict
        t3 = time.perf_counter()
        if len(parts) == 1:
            result = OnWorkers([(0, n, fut)], (0, 1))
        else:
            result = OnWorkers([(o, r, client.submit(row_slice, fut, o, o + r, pure=False)) for o, r, _f in parts],
                               (0, 1))
            wait([f for _o, _r, f in result.blocks])
    del fut
    phases.update(schedule_s=t1 - t0, wait_s=t2 - t1, gather_s=t3 - t2, assemble_s=time.perf_counter() - t3)
    stats = {"method": "dask-ggm", "partitions": 1, "merges": 0, "n_neighbors_internal": None,
             "workers": len(worker_addresses(client)), "single_device": True, "engine": st["engine"],
             "iterations": st["iterations"]}
    if st["recall_estimate"] is not None:
        stats["recall_estimate"] = round(st["recall_estimate"], 5)
    return result, stats


def _descent_ranks(client, parts):
    """The shared descent's ranks: every worker, each with the blocks it holds (possibly none),
    in row order. ``(workers, blocks per rank, spans per rank, data bounds, join bounds)``: the
    descent numbers the rows as the ranks' blocks one after another, ``data_bounds[r]`` are rank
    r's blocks in that numbering, ``join_bounds[r]`` the equal share of nodes it joins (see
    :func:`knnkit.dask._tasks.descent_lists`)."""
    where = homes(client, [f for _o, _r, f in parts])
    workers = worker_addresses(client)
    by_rank = [[(o, r, f) for (o, r, f), w in zip(parts, where) if w == wk] for wk in workers]
    spans = [[(int(o), int(r)) for o, r, _f in blocks] for blocks in by_rank]
    cum = np.cumsum([0] + [sum(r for _o, r in sp) for sp in spans])
    data_bounds = [(int(cum[i]), int(cum[i + 1])) for i in range(len(spans))]
    cuts = np.linspace(0, int(cum[-1]), len(workers) + 1).astype(np.int64)
    join_bounds = [(int(cuts[i]), int(cuts[i + 1])) for i in range(len(workers))]
    return workers, by_rank, spans, data_bounds, join_bounds


def _descent_possible(client, workers, n, d, itemsize, k):
    """Why the shared descent cannot run on ``workers`` (None when it can): every one needs a GPU,
    NCCL through CuPy, and room on its GPU for all the data and the copies of the graph."""
    from ..graph.nndescent import default_parameters

    K = default_parameters(k, n, device="gpu")[0]
    need = n * d * max(itemsize, 4) + 3 * n * K * 8 + n * 64
    answers = client.gather([client.submit(gpu_peer_ready, need, workers=[w], allow_other_workers=False,
                                           pure=False) for w in workers])
    bad = [f"{w}: {why}" for w, why in zip(workers, answers) if why]
    return "; ".join(bad) or None


#: the distributed lock held while a shared descent runs: its tasks must run at the same time on
#: every worker (NCCL waits for all ranks), which two descents queued in different orders on the
#: workers would never do
DESCENT_LOCK = "knnkit-shared-descent"


#: seconds between the checks of a running shared descent's ranks (a failed or lost rank)
DESCENT_WATCH_S = 1.0


def _watch_ranks(client, futs, workers, key):
    """Wait for the shared descent's tasks. A rank that fails, or whose worker is lost, would
    leave the others waiting in NCCL for ever: the others' communicators are aborted (their
    tasks then fail) and the error is raised, naming the rank."""
    from distributed import wait

    while True:
        try:
            wait(futs, timeout=DESCENT_WATCH_S)
            bad = [f for f in futs if f.status == "error"]
            if not bad:
                return
        except TimeoutError:
            bad = [f for f in futs if f.status == "error"]
        alive = set(live_workers(client))
        lost = [(r, w) for r, w in enumerate(workers) if w not in alive]
        if not bad and not lost:
            continue
        others = [w for w in workers if w in alive]
        try:
            client.run(abort_descent, key, workers=others)
        except Exception:  # noqa: BLE001 (best effort: the error below is what matters)
            pass
        for f in futs:
            if f.status != "error":
                f.cancel()
        if lost:
            r, w = lost[0]
            raise RuntimeError(f"knnkit.dask.knn_graph(partition='descent'): worker {w} (rank {r} of "
                               f"{len(workers)}) was lost during the shared descent; no graph was returned "
                               "(the other ranks were stopped). Run it again on the remaining workers.")
        r = futs.index(bad[0])
        exc = bad[0].exception()
        if isinstance(exc, DataRangeError):  # the data's fault, raised by every rank alike
            raise exc
        raise RuntimeError(f"knnkit.dask.knn_graph(partition='descent'): rank {r} ({workers[r]}) failed; "
                           "the other ranks were stopped") from exc


def _descent_graph(client, parts, n, d, dtype, k, metric, seed, phases, estimate=False, compute=True):
    """knn_graph(partition="descent"): one NN-Descent shared by the workers' GPUs (see
    :func:`knn_graph`). ``(lists, stats)``, phases as the other schedules."""
    from distributed import wait

    from distributed import Lock

    t0 = time.perf_counter()
    workers, by_rank, spans, data_bounds, join_bounds = _descent_ranks(client, parts)
    key = "|".join(workers)
    rows = _estimate_rows(n, seed) if estimate else None  # checked on the GPUs, where all the data is
    with Lock(DESCENT_LOCK, scheduler_rpc=client.scheduler, loop=client.loop):
        kept = client.gather([client.submit(gpu_peer_ready, 0, key, workers=[w], allow_other_workers=False,
                                            pure=False) for w in workers])
        # the communicator every rank kept from an earlier descent, else a new one
        uid = None if all(has for _why, has in kept) else \
            client.submit(nccl_id, workers=[workers[0]], allow_other_workers=False, pure=False)
        futs = [client.submit(descent_lists, uid, key, r, data_bounds, join_bounds, spans, d, np.dtype(dtype).str, k,
                              metric, seed, rows, *[f for _o, _r, f in by_rank[r]], workers=[workers[r]],
                              allow_other_workers=False, pure=False)
                for r in range(len(workers))]
        t1 = time.perf_counter()
        _watch_ranks(client, futs, workers, key)
        t2 = time.perf_counter()
    # pieces of the result: each block's rows (descent numbering p .. p + c) cut by the ranks' shares
    pieces = []  # (global offset, rows, rank, first row in the rank's lists)
    for r, sp in enumerate(spans):
        p = data_bounds[r][0]
        for o, c in sp:
            for q, (lo, hi) in enumerate(join_bounds):
                a, b = max(p, lo), min(p + c, hi)
                if b > a:
                    pieces.append((o + a - p, b - a, q, a - lo))
            p += c
    pieces.sort()
    st = client.gather([client.submit(take, f, 2, pure=False) for f in futs])
    if compute:
        out = client.gather(futs)
        t3 = time.perf_counter()
        I = np.empty((n, k), np.int32)
        D = np.empty((n, k), np.float32)
        for o, c, r, at in pieces:
            I[o:o + c] = out[r][0][at:at + c]
            D[o:o + c] = out[r][1][at:at + c]
        result = (I, D)
    else:
        t3 = time.perf_counter()
        result = OnWorkers([(o, c, client.submit(row_slice, futs[r], at, at + c, workers=[workers[r]], pure=False))
                            for o, c, r, at in pieces], (0, 1))
        wait([f for _o, _r, f in result.blocks])
    del futs
    phases.update(schedule_s=t1 - t0, wait_s=t2 - t1, gather_s=t3 - t2, assemble_s=time.perf_counter() - t3)
    stats = {"method": "dask-descent", "partitions": len(parts), "ranks": len(workers), "merges": 0,
             "n_neighbors_internal": st[0]["K"], "iterations": st[0]["iterations"],
             "updates": st[0]["updates"], "workers": len(workers),
             "rank_rows": [b - a for a, b in join_bounds],
             "rank_s": [{key: round(v, 4) for key, v in s_.items() if key.endswith("_s")} for s_ in st],
             "phase_ms": [s_.get("phase_ms") for s_ in st], "rows_moved": st[0].get("rows_moved")}
    if estimate:
        hits = sum(s_["recall_hits"][0] for s_ in st)
        slots = sum(s_["recall_hits"][1] for s_ in st)
        stats["recall_estimate"] = round(hits / max(slots, 1), 5)
    return result, stats


def _rows_search(client, parts, n, k, metric, device, seed, phases, estimate=False, compute=True):
    """knn_graph(partition="rows", second_stage="search"): GGNN's sharded all-points search
    (section 5.5). Every partition's graph is built on its worker (the single-device build); every
    partition's rows are searched in every other partition's graph, on that partition's worker
    (all pairs in parallel), and each point keeps the k nearest of its own list, its searches'
    lists and the rows whose searches found it. Each partition is copied to the other partitions'
    workers while their graphs are built (a pinned :func:`keep` task), so the searches find their
    queries there. ``estimate``: the recall estimate's exact lists come from the partition graphs'
    tasks. ``compute``: the lists gathered to the client, else left on the workers (each
    partition's final lists are its row block). ``(lists, stats)``; client-side seconds are added
    to ``phases``."""
    from distributed import wait

    t0 = time.perf_counter()
    if len(parts) > 1 and min(r for _o, r, _f in parts) < 2:
        raise ValueError("every partition needs at least 2 points; use fewer partitions")
    rows = _estimate_rows(n, seed) if estimate else None
    probe = _probe(client, parts, rows) if estimate else None
    futs = [f for _o, _r, f in parts]
    wait(futs)  # (a dask array's blocks are computed first: where they live decides where the work runs)
    who = client.who_has(futs)
    home = [sorted(who[f.key])[0] for f in futs]
    P = len(parts)
    leaves = [client.submit(as_leaf, f, o, pure=False, workers=[home[p]], allow_other_workers=True)
              for p, (o, _r, f) in enumerate(parts)]
    lists = [client.submit(leaf_graph, leaves[p], k, metric, device, seed + 7919 * p + 1, True, probe, pure=False,
                           workers=[home[p]], allow_other_workers=True) for p in range(P)]
    rows_of_part = [[] for _ in range(P)]
    copies = {}
    for j in range(P):
        for i in range(P):
            if i == j:
                continue
            if home[i] != home[j] and (i, home[j]) not in copies:  # partition i's rows fetched by home[j] now
                copies[(i, home[j])] = client.submit(keep, leaves[i], pure=False, workers=[home[j]])
            queries = copies.get((i, home[j]), leaves[i])
            res = client.submit(cross_search, leaves[j], lists[j], queries, None, 0.0, k, metric, device,
                                seed + 104729 * (i * P + j) + 3, pure=False, workers=[home[j]],
                                allow_other_workers=True)
            rows_of_part[i].append(client.submit(take, res, 0, pure=False))
            rows_of_part[j].append(client.submit(take, res, 1, pure=False))
    finals = [client.submit(merge_leaf, leaves[p], lists[p], k, metric, *rows_of_part[p], pure=False,
                            workers=[home[p]], allow_other_workers=True) for p in range(P)]
    # merge_leaf's (ids, I, D) of every partition: its row block
    result = _partition_lists(client, parts, finals, (1, 2), compute, phases, t0)
    stats = {"method": "dask-rows", "partitions": P, "second_stage": "search", "cross_searches": P * (P - 1),
             "merges": 0, "n_neighbors_internal": None, "workers": len(worker_addresses(client))}
    if estimate:
        t4 = time.perf_counter()
        D_rows = _distances_at(client, result, rows)
        stats["recall_estimate"] = round(_probe_recall(client, lists, rows, D_rows, k, metric), 5)
        phases["estimate_s"] = time.perf_counter() - t4
    return result, stats


def _rows_graph(client, parts, n, k, metric, device, n_neighbors_internal, seed, phases, compute=True):
    """knn_graph(partition="rows"): partition graphs, then a GGM merge of every pair. ``compute``:
    the lists gathered to the client, else left on the workers (each partition's final lists are
    its row block). ``(lists, stats)``; client-side seconds are added to ``phases``. (One
    partition with the default ``n_neighbors_internal`` does not come here: :func:`_single_graph`.)"""
    from ..graph.nndescent import default_parameters

    t0 = time.perf_counter()

    if len(parts) > 1 and min(r for _o, r, _f in parts) < 2:
        raise ValueError("every partition needs at least 2 points; use fewer partitions")
    K = default_parameters(k, n, device="gpu" if device == "gpu" else "cpu")[0] if n_neighbors_internal is None \
        else check_k(n_neighbors_internal, n, self_excluded=True, name="n_neighbors_internal")
    # merges need longer lists than one device's graph: the partition graphs keep no recall loop
    # (20k x 96 on 2 partitions: K = 16 -> recall 0.950, 24 -> 0.999, single device 0.999)
    K = max(K, 2 * k + 4) if n_neighbors_internal is None else K
    K = min(max(K, k), n - 1)
    bases = [client.submit(part_graph, f, k, K, metric, device, seed + 7919 * p + 1, pure=False)
             for p, (_o, _r, f) in enumerate(parts)]
    pieces = [[client.submit(globalize, b, o, k, pure=False)] for b, (o, _r, _f) in zip(bases, parts)]
    n_merges = 0
    for i in range(len(parts)):
        for j in range(i + 1, len(parts)):
            oi, _ri, fi = parts[i]
            oj, _rj, fj = parts[j]
            m = client.submit(pair_merge, fi, fj, bases[i], bases[j], oi, oj, k, K, metric, device,
                              seed + 104729 * (i * 65536 + j) + 3, pure=False)
            pieces[i].append(client.submit(take, m, 0, pure=False))
            pieces[j].append(client.submit(take, m, 1, pure=False))
            n_merges += 1
    finals = [client.submit(compact, tree_reduce(client, ps, merge_running, k, metric), pure=False)
              for ps in pieces]
    # compact's (I, D) of every partition: its row block
    result = _partition_lists(client, parts, finals, (0, 1), compute, phases, t0)
    stats = {"method": "dask-ggm", "partitions": len(parts), "second_stage": "graph", "merges": n_merges,
             "n_neighbors_internal": int(K),
             "workers": len(worker_addresses(client))}
    return result, stats
