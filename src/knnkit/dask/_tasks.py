"""Functions that run ON the Dask workers (module-level, so that workers import them by name).

Each takes and returns host numpy arrays (or a shard's ``GraphIndex``, which stays in its
worker's memory); distances travel in the user metric, ids are global (a partition's offset
added). The client never sees a partition's data: tasks pass futures to each other and Dask
moves the bytes between workers.
"""

import numpy as np

from .._core.backend import as_host
from .._core.metrics import finalize_distances, to_internal

__all__ = ["exact_part", "merge_topk", "part_graph", "globalize", "pair_merge", "merge_running", "build_shard",
           "search_shard", "save_shard", "load_shard", "shard_info", "take", "rows_of"]


def _host(a, dtype=None):
    a = np.asarray(as_host(a))
    return a if dtype is None else a.astype(dtype, copy=False)


def rows_of(X, rows):
    """Rows ``rows`` (local ids) of a partition, host float32."""
    return np.ascontiguousarray(_host(X)[np.asarray(rows, dtype=np.int64)])


def take(pair, i):
    """Element ``i`` of a task's tuple result (a separate tiny task, so halves move separately)."""
    return pair[i]


# --------------------------------------------------------------------------- exact
def exact_part(X, Q, k, metric, device, offset):
    """Exact top-``k`` (capped at the partition's size) of queries ``Q`` among partition ``X``;
    global ids (``offset`` added), user-metric distances, host arrays."""
    from ..api.exact import exact_arrays

    kk = min(int(k), int(X.shape[0]))
    d, i = exact_arrays(X, Q, kk, metric=metric, device=device)
    d = _host(d, np.float32)
    i = _host(i, np.int64)
    return d, np.where(i >= 0, i + int(offset), -1)


def merge_topk(a, b, k, metric):
    """Merge two sorted ``(distances, ids)`` lists of the same queries (disjoint ids) into the top
    ``k``; ties by smaller id, so the result does not depend on the reduction's order."""
    d = np.concatenate([a[0], b[0]], axis=1)
    i = np.concatenate([a[1], b[1]], axis=1)
    key = to_internal(d, metric)  # smaller is better in every metric
    key = np.where(i < 0, np.inf, key)
    order = np.lexsort((i, key), axis=-1)[:, :k]
    return np.take_along_axis(d, order, axis=1), np.take_along_axis(i, order, axis=1)


# --------------------------------------------------------------------------- k-NN graph
def part_graph(X, k, K, metric, device, seed):
    """NN-Descent (or the exact graph, by the single-device rule) lists of one partition, ids local:
    ``(I int32 (n, K'), D float32 user metric)``, ``K' = min(K, n - 1)``."""
    from .._core.prepare import prepare
    from ..graph import GRAPH_METRICS, build_lists, choose_method
    from ..graph.nndescent import NNDescentParams

    n = int(X.shape[0])
    P = prepare(X, metric=metric, device=device, metrics=GRAPH_METRICS)
    method = choose_method("auto", n, P.device, metric)
    # partition graphs without the recall target: the pairwise merges set the final quality (as
    # the out-of-core build does)
    params = NNDescentParams(n_neighbors_internal=max(K, k), target_recall=None) if method.name == "nndescent" else None
    I, D, _ = build_lists(P.X, min(K, n - 1), metric=metric, method=method, params=params, seed=int(seed))
    D = finalize_distances(D, metric, P.scale)
    return _host(I, np.int32), _host(D, np.float32)


def globalize(base, offset, k):
    """A partition's first ``k`` columns with global ids: the start of its running lists."""
    I, D = base
    I = I[:, :k]
    return np.where(I >= 0, I.astype(np.int64) + int(offset), -1), np.ascontiguousarray(D[:, :k])


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

    I, D = merge_lists(a[0], to_internal(a[1], metric), b[0], to_internal(b[1], metric), k)
    return I.astype(np.int64), finalize_distances(np.array(D, dtype=np.float32), metric)


# --------------------------------------------------------------------------- sharded index
def build_shard(X, metric, device, build_kw, seed):
    """The shard's ``GraphIndex`` (built here, kept in this worker's memory)."""
    from ..api.index import GraphIndex

    return GraphIndex.build(X, metric=metric, device=device, random_state=seed, **build_kw)


def shard_info(index):
    return {"n": int(index.n), "dim": int(index.dim), "metric": index.metric, "beam": index.search_params.beam}


def search_shard(index, Q, k, search_kw, offset):
    """Top-``k`` (capped at the shard's size) of ``Q`` in one shard; global ids, host arrays."""
    kk = min(int(k), int(index.n))
    d, i = index.search(Q, kk, **search_kw)
    d = _host(d, np.float32)
    i = _host(i, np.int64)
    return d, np.where(i >= 0, i + int(offset), -1)


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
