"""knnkit on a Dask cluster: exact k-NN, k-NN graphs (GGM across workers) and the sharded search
index (GGNN section 5.5: sharding and replication).

The pattern is cuML's distributed nearest neighbours: the data stays in row partitions on the
workers; queries are broadcast; each worker answers for its partitions with the single-device
engine; sorted top-k lists are merged by a tree of small tasks. Dask schedules everything and
moves bytes between workers; knnkit has no scheduler of its own.
"""

import numpy as np

from .._core.config import logger
from .._core.validation import METRICS, check_k, check_metric
from ..graph import GRAPH_METRICS
from ._tasks import exact_part, globalize, merge_running, merge_topk, pair_merge, part_graph, rows_of, take
from ._common import check_parts, get_client, partitions, tree_reduce, worker_addresses

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


def _query_blocks(client, queries, dim, query_block, targets=None):
    """Queries as ``[(offset, rows, future)]`` blocks of at most ``query_block`` rows: a dask array's
    blocks are computed on the workers; an in-memory array is scattered to every worker."""
    from ._common import _is_dask_array

    if _is_dask_array(queries):
        if queries.ndim != 2 or queries.shape[1] != dim:
            raise ValueError(f"queries must be 2-D with dimension {dim}, got shape {queries.shape}")
        arr = queries.rechunk({0: query_block, 1: -1})
        futures = client.compute(arr.to_delayed().ravel().tolist())
        offsets = np.concatenate([[0], np.cumsum(arr.chunks[0])[:-1]]).astype(np.int64)
        return [(int(o), int(r), f) for o, r, f in zip(offsets, arr.chunks[0], futures)], int(queries.shape[0]), "numpy"
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
    blocks = []
    for b, lo in enumerate(range(0, Q.shape[0], query_block)):
        blk = np.ascontiguousarray(Q[lo:lo + query_block])
        if targets is None:  # every worker needs every block
            fut = client.scatter(blk, broadcast=True, hash=False)
        else:  # the block goes to the worker that serves it (others fetch it from there if needed)
            fut = client.scatter(blk, workers=[targets[b % len(targets)]], hash=False)
        blocks.append((lo, blk.shape[0], fut))
    return blocks, Q.shape[0], kind


def knn(data, queries=None, k=10, *, metric="sqeuclidean", device="auto", client=None, n_parts=None,
        query_block=1 << 20):
    """Exact k nearest neighbours on a Dask cluster (equal to :func:`knnkit.knn`).

    Parameters
    ----------
    data : dask.array or array-like, shape (n, d)
        A dask array keeps its row chunks (computed on the workers); numpy / cupy / torch arrays
        are split into ``n_parts`` row blocks scattered over the workers.
    queries : dask.array or array-like, shape (m, d), optional
        Broadcast to every worker in blocks of ``query_block`` rows. ``None``: the all-points
        graph of ``data``, each point excluding itself (as :func:`knnkit.knn`).
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

    Returns
    -------
    distances, indices : (m, k) numpy arrays (cupy when the queries were cupy), sorted best
        first; ties by smaller index.

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
    parts, shape, _dtype, kind = partitions(client, data, check_parts(n_parts, "n_parts", 1 << 31))
    n, dim = shape
    all_points = queries is None
    k = check_k(k, n, self_excluded=all_points)
    if all_points:
        # each partition is a query block too; k + 1 lists, then each point's own id is dropped
        qblocks, m, kind_q = [(o, r, f) for o, r, f in parts], n, kind
        kq = k + 1
    else:
        qblocks, m, kind_q = _query_blocks(client, queries, dim, query_block)
        kq = k
    results = []
    for qo, _qr, qf in qblocks:
        lists = [client.submit(exact_part, xf, qf, kq, metric, device, xo, pure=False)
                 for xo, _xr, xf in parts]
        merged = tree_reduce(client, lists, merge_topk, kq, metric)
        results.append((qo, merged))
    out = client.gather([f for _o, f in results])
    D = np.concatenate([o[0] for o in out]) if len(out) > 1 else out[0][0]
    I = np.concatenate([o[1] for o in out]) if len(out) > 1 else out[0][1]
    if all_points:
        D, I = _drop_self(D, I, k)
    return _output(D, kind_q), _output(I, kind_q)


#: Rows whose exact neighbours estimate a distributed graph's recall (as knnkit.knn_graph's probe).
ESTIMATE_ROWS = 1000


def _estimate_recall(client, parts, I, D, k, metric, device, seed):
    """recall@k of the lists (I, D) on ESTIMATE_ROWS sampled rows, ties forgiven: exact neighbours
    of those rows by the distributed exact search (k + 1, self dropped)."""
    from .._core.metrics import to_internal

    n = I.shape[0]
    rows = np.sort(np.random.default_rng(seed ^ 0x5AFE).choice(n, ESTIMATE_ROWS, replace=False))
    pieces = []
    for o, r, f in parts:
        sel = rows[(rows >= o) & (rows < o + r)] - o
        if sel.size:
            pieces.append(client.submit(rows_of, f, sel, pure=False))
    S = np.concatenate(client.gather(pieces))
    qf = client.scatter(S, broadcast=True, hash=False)
    lists = [client.submit(exact_part, f, qf, k + 1, metric, device, o, pure=False) for o, _r, f in parts]
    Dx, Ix = client.gather(tree_reduce(client, lists, merge_topk, k + 1, metric))
    Dx, _ = _drop_self(Dx, Ix - rows[:, None] + np.arange(len(rows))[:, None], k)
    kth = to_internal(Dx[:, -1], metric)
    kth = kth + 1e-5 * np.abs(kth) + 1e-12
    got = to_internal(D[rows], metric)
    return float(np.mean(got <= kth[:, None]))


def _drop_self(D, I, k):
    """Rows of k + 1 sorted lists of the points themselves: each row without its own id (its last
    entry when the id is not there, e.g. k + 1 duplicates at distance 0)."""
    rows = np.arange(I.shape[0])[:, None]
    own = I == rows
    drop = np.where(own.any(axis=1), own.argmax(axis=1), I.shape[1] - 1)
    keep = np.ones(I.shape, dtype=bool)
    keep[np.arange(I.shape[0]), drop] = False
    return D[keep].reshape(-1, k), I[keep].reshape(-1, k)


def knn_graph(data, k=10, *, metric="sqeuclidean", device="auto", client=None, n_parts=None,
              n_neighbors_internal=None, random_state=0):
    """Approximate k-NN graph on a Dask cluster: one NN-Descent graph per row partition on its
    worker, then GGM (GNND section 5) merges every pair of partitions, the pairs running in
    parallel on the workers; each point's lists from all its merges are united at the end.

    Parameters
    ----------
    data : dask.array or array-like, shape (n, d)
    k : int, default 10
        Neighbours per point, self excluded; ``1 <= k <= n - 1``.
    metric : {"sqeuclidean", "euclidean", "inner_product", "cosine"}
    device : {"auto", "cpu", "gpu"}
    client : distributed.Client, optional
    n_parts : int, optional
        Partitions of an in-memory ``data`` (default: one per worker). Every pair is merged once:
        ``n_parts * (n_parts - 1) / 2`` merges.
    n_neighbors_internal : int, optional
        List length of the partition graphs and merges (default: knnkit.knn_graph's rule).
    random_state : int, default 0

    Returns
    -------
    KnnGraph
        ``indices`` (n, k) int32 global ids, ``distances`` in the user metric; ``stats`` records
        the partitions and merges.

    Examples
    --------
    >>> import numpy as np, knnkit.dask
    >>> from distributed import Client, LocalCluster
    >>> with LocalCluster(n_workers=2, threads_per_worker=1, processes=False) as cluster, Client(cluster) as c:
    ...     X = np.random.default_rng(0).random((3000, 8), dtype=np.float32)
    ...     g = knnkit.dask.knn_graph(X, k=5, client=c, device="cpu")
    >>> g.indices.shape
    (3000, 5)
    """
    from .._core.stats import BuildStats
    from ..api.knngraph import KnnGraph
    from ..graph.nndescent import default_parameters

    client = get_client(client)
    metric = check_metric(metric, GRAPH_METRICS)
    device = _check_device(device)
    parts, shape, _dtype, kind = partitions(client, data, check_parts(n_parts, "n_parts", 1 << 31))
    n = shape[0]
    if n >= 2 ** 31 - 1:
        raise ValueError("knnkit.dask.knn_graph: more than 2**31 - 2 points do not fit int32 ids")
    k = check_k(k, n, self_excluded=True)
    if len(parts) > 1 and min(r for _o, r, _f in parts) < 2:
        raise ValueError("every partition needs at least 2 points; use fewer partitions")
    K = default_parameters(k, n, device="gpu" if device == "gpu" else "cpu")[0] if n_neighbors_internal is None \
        else check_k(n_neighbors_internal, n, self_excluded=True, name="n_neighbors_internal")
    # merges need longer lists than one device's graph: the partition graphs keep no recall loop
    # (20k x 96 on 2 partitions: K = 16 -> recall 0.950, 24 -> 0.999, single device 0.999)
    K = max(K, 2 * k + 4) if n_neighbors_internal is None else K
    K = min(max(K, k), n - 1)
    seed = int(random_state)
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
    finals = [tree_reduce(client, ps, merge_running, k, metric) for ps in pieces]
    out = client.gather(finals)
    I = np.concatenate([o[0] for o in out]).astype(np.int32)
    D = np.concatenate([o[1] for o in out]).astype(np.float32)
    if (I < 0).any():
        raise RuntimeError("knnkit.dask.knn_graph: some lists are short of k neighbours (internal error)")
    stats = {"method": "dask-ggm", "partitions": len(parts), "merges": n_merges, "n_neighbors_internal": int(K),
             "workers": len(worker_addresses(client))}
    if n > 2 * ESTIMATE_ROWS and metric != "manhattan":
        est = _estimate_recall(client, parts, I, D, k, metric, device, seed)
        stats["recall_estimate"] = round(est, 5)
        if est < 0.985:
            logger.warning("knnkit.dask.knn_graph: estimated recall@%d is %.3f; pass a larger n_neighbors_internal "
                           "(now %d)", k, est, K)
    return KnnGraph(_output(I, kind), _output(D, kind), metric=metric, stats=BuildStats.from_dict(stats))
