"""Client, partitions and reductions shared by the distributed facades."""

import numbers

import numpy as np

__all__ = ["dask_modules", "get_client", "partitions", "tree_reduce", "check_parts", "worker_addresses",
           "check_compute", "scatter_to", "homes", "result_arrays"]


def dask_modules():
    """``(dask.array, distributed)``, or an ImportError naming the extra that installs them."""
    try:
        import dask.array as da
        import distributed
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError("knnkit.dask needs dask and distributed: pip install 'knnkit[dask]' "
                          "(and dask-cuda for one worker per GPU)") from e
    return da, distributed


def get_client(client):
    """The given client, or the current default one; a clear error when there is none."""
    _, distributed = dask_modules()
    if client is not None:
        if not isinstance(client, distributed.Client):
            raise TypeError(f"client must be a distributed.Client, got {type(client).__name__}")
        return client
    try:
        return distributed.get_client()
    except ValueError:
        raise ValueError("knnkit.dask needs a dask.distributed Client: pass client=, or create one first "
                         "(distributed.Client(), or dask_cuda.LocalCUDACluster() for one worker per GPU)") from None


def live_workers(client):
    """Sorted addresses of the scheduler's workers, asked of the scheduler now.

    Not ``client.scheduler_info()["workers"]``: from distributed 2026.8 the client's periodic
    refresh caches the identity without its workers, and it can land between the call's own fetch
    and its return, so the call read an empty cluster now and then (a CI run: "the Dask cluster has
    no workers" on a healthy two-worker cluster; 2 of 53,435 calls in a loop on an idle one)."""
    return sorted(client.nthreads())


def worker_addresses(client):
    workers = live_workers(client)
    if not workers:
        raise RuntimeError("the Dask cluster has no workers")
    return workers


def check_parts(value, name, n):
    """``None`` or an int in [1, n]."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not 1 <= int(value) <= n:
        raise ValueError(f"{name} must be in [1, {n}], got {int(value)}")
    return int(value)


def check_compute(compute, dask_input):
    """``compute`` as a bool: None means "gather to the client unless the input was a dask array"."""
    if compute is None:
        return not dask_input
    if not isinstance(compute, bool):
        raise TypeError(f"compute must be None or a bool, got {type(compute).__name__}")
    return compute


def scatter_to(client, arrays, worker):
    """``arrays`` sent from the client straight to ``worker`` in one message, one future each.
    ``direct``: the bytes go to the worker, not to the scheduler, which would receive every byte
    and send it on (twice the serialisation and a second hop)."""
    return client.scatter(list(arrays), workers=[worker], direct=True, hash=False)


def homes(client, futures):
    """The worker holding each future's result (waits for them: where they live decides where
    the work on them runs)."""
    from distributed import wait

    wait(futures)
    who = client.who_has(futures)
    return [(sorted(who.get(f.key, ())) or [None])[0] for f in futures]


def result_arrays(results, rows, cols, dtypes, like=None, prefix="knnkit", fields=None):
    """Dask arrays of the tuple results ``results`` (futures of ``(distances, ids)``, one per row
    block of ``rows``): element ``fields[j]`` (default j) of every result is a block of the j-th
    array. The blocks are ``getitem`` keys on the results, so the arrays carry no task of their
    own before they are computed or persisted, and nothing moves to the client. ``like``: the
    array whose kind of blocks (numpy or cupy) the metadata follows."""
    import operator
    import uuid

    import dask.array as da
    from dask.array.utils import meta_from_array
    from dask.highlevelgraph import HighLevelGraph

    out = []
    for j, dtype in enumerate(dtypes):
        name = f"{prefix}-{j}-{uuid.uuid4().hex}"
        field = j if fields is None else fields[j]
        layer = {(name, b, 0): (operator.getitem, f.key, field) for b, f in enumerate(results)}
        layer.update({f.key: f for f in results})  # the futures keep the results alive
        meta = meta_from_array(np.empty((0, 0)) if like is None else like, ndim=2, dtype=dtype)
        graph = HighLevelGraph.from_collections(name, layer, dependencies=())
        out.append(da.Array(graph, name, chunks=(tuple(int(r) for r in rows), (int(cols),)), meta=meta))
    return tuple(out)


def _is_dask_array(a):
    return type(a).__module__.startswith("dask.array") or hasattr(a, "to_delayed") and hasattr(a, "chunks")


def partitions(client, data, n_parts, name="data"):
    """Row partitions of ``data`` as futures on the workers: ``(parts, shape, dtype, kind)`` where
    ``parts`` is a list of ``(offset, rows, future)``.

    A dask array keeps its row chunks (columns are merged into one chunk) and is computed on the
    workers; numpy / cupy / torch arrays are split into ``n_parts`` equal row blocks scattered one
    per worker, round-robin (the data crosses from the client once)."""
    if _is_dask_array(data):
        if data.ndim != 2:
            raise ValueError(f"{name} must be 2-D, got {data.ndim}-D")
        if any(c != c for c in data.chunks[0]):  # unknown chunk sizes (nan)
            raise ValueError(f"{name} has unknown chunk sizes: call compute_chunk_sizes() first")
        arr = data.rechunk({1: -1})
        blocks = arr.to_delayed().ravel().tolist()
        futures = client.compute(blocks)
        sizes = [int(c) for c in arr.chunks[0]]
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        parts = [(int(o), s, f) for o, s, f in zip(offsets, sizes, futures) if s > 0]
        return parts, tuple(int(v) for v in data.shape), np.dtype(data.dtype), "numpy"
    kind = "numpy"
    if hasattr(data, "__cuda_array_interface__") and type(data).__module__.startswith("cupy"):
        kind = "cupy"
    if type(data).__module__.startswith("torch"):
        data = data.detach().cpu().numpy()
    if kind == "cupy":
        data = data.get()  # workers place it on their own GPU
    a = np.asarray(data)
    if a.ndim != 2:
        raise ValueError(f"{name} must be 2-D, got shape {a.shape}")
    n = a.shape[0]
    if n == 0:
        raise ValueError(f"{name} is empty")
    workers = worker_addresses(client)
    n_parts = min(n_parts or len(workers), n)
    bounds = np.linspace(0, n, n_parts + 1).astype(np.int64)
    futures = {}
    for w, worker in enumerate(workers):  # one message per worker, straight to it
        mine = list(range(w, n_parts, len(workers)))
        if mine:
            sent = scatter_to(client, [np.ascontiguousarray(a[bounds[p]:bounds[p + 1]]) for p in mine], worker)
            futures.update(zip(mine, sent))
    parts = [(int(bounds[p]), int(bounds[p + 1] - bounds[p]), futures[p]) for p in range(n_parts)]
    return parts, a.shape, a.dtype, kind


def tree_reduce(client, items, fn, *args, last=()):
    """Pairwise reduction of futures ``items`` by the task ``fn(a, b, *args)`` (log2 depth); the
    final task gets ``*last`` too (e.g. the dtype of the result)."""
    items = list(items)
    while len(items) > 1:
        extra = tuple(last) if len(items) == 2 else ()
        nxt = [client.submit(fn, items[i], items[i + 1], *args, *extra, pure=False)
               for i in range(0, len(items) - 1, 2)]
        if len(items) % 2:
            nxt.append(items[-1])
        items = nxt
    return items[0]
