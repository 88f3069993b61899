"""Measuring results: recall against exact neighbours, recall of a k-NN graph on a sample of its
nodes, exact ground truth, and a GPU-aware timer.

Examples
--------
>>> import numpy as np
>>> from knnkit.evaluate import recall
>>> recall([[0, 1, 2], [5, 6, 7]], [[2, 1, 0], [5, 8, 9]])
0.6666666666666666
"""

from __future__ import annotations

import time

import numpy as np

from ._core.backend import inspect_array, as_host, cupy_or_none, get_array_module
from ._core.config import logger
from ._core.params import check_bool, check_float, check_int
from ._core.types import ArrayLike, Device, HostArray, Metric, NeighborPair, Seed

__all__ = ["recall", "graph_recall", "ground_truth", "float64_distances", "Timer"]


def _host_ints(a, name):
    """A 2-D int64 numpy copy of an index array from numpy, cupy, torch or nested lists."""
    if isinstance(a, tuple) and len(a) == 2 and all(hasattr(x, "shape") for x in a):
        raise TypeError(f"{name}: got a pair of arrays; pass the indices (the second item of "
                        f"(distances, indices))")
    arr, _ = inspect_array(a)
    arr = np.asarray(as_host(arr))
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2:
        raise ValueError(f"{name} must be a 2-D (queries, k) array, got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integer indices, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def _host_floats(a, name, shape):
    arr, _ = inspect_array(a)
    arr = np.asarray(as_host(arr), dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.shape[0] != shape[0] or arr.shape[1] < shape[1]:
        raise ValueError(f"{name} has shape {arr.shape}, expected ({shape[0]}, >= {shape[1]})")
    return arr


def _first_occurrence(f):
    """Mask of the first occurrence of every id within each row (repeated ids count once)."""
    order = np.argsort(f, axis=1, kind="stable")
    fs = np.take_along_axis(f, order, 1)
    dup_sorted = np.zeros(f.shape, bool)
    dup_sorted[:, 1:] = fs[:, 1:] == fs[:, :-1]
    dup = np.empty_like(dup_sorted)
    np.put_along_axis(dup, order, dup_sorted, 1)
    return ~dup


def recall(found_indices: ArrayLike, true_indices: ArrayLike, k: int | None = None, *,
           found_distances: ArrayLike | None = None, true_distances: ArrayLike | None = None,
           similarity: bool = False, eps: float = 1e-3, average: bool = True) -> float | HostArray:
    """Recall@k: the fraction of the true k nearest neighbours found in the first k results.

    For every query, ``|found[:k] & true[:k]| / k`` (order within the k is ignored), averaged over the
    queries. Negative ids (the ``-1`` padding some searches return) never count as found; negative ids in
    ``true_indices`` are treated as absent and shrink that query's denominator.

    With ``found_distances`` and ``true_distances``, ties are forgiven (the ann-benchmarks rule): a found
    neighbour counts when its distance is within ``eps`` (relative) of the true k-th distance, whatever
    its id. Use it on data with duplicate points or integer distances (uint8 data such as
    Fashion-MNIST), where equally near neighbours may be returned in any order. The found distances are
    trusted as given.

    Parameters
    ----------
    found_indices : (nq, k1) int array
        Neighbour ids returned by the method under test (numpy, cupy or torch).
    true_indices : (nq, k2) int array
        Exact neighbour ids, nearest first (e.g. from :func:`ground_truth`), ``k2 >= k``.
    k : int, optional
        Default: the number of columns of ``found_indices``.
    found_distances, true_distances : (nq, k1), (nq, k2) float arrays, optional
        Give both to count ties as found.
    similarity : bool
        The distances are similarities, larger is nearer (``metric="inner_product"``).
    eps : float
        Relative tolerance of the tie rule (default 1e-3, as ann-benchmarks).
    average : bool
        Return the mean (default) or the per-query recalls as a float64 array.

    Returns
    -------
    float or numpy.ndarray

    Examples
    --------
    >>> from knnkit.evaluate import recall
    >>> recall([[3, 9]], [[3, 4, 5]])     # k = 2: found {3, 9}, true {3, 4}
    0.5
    >>> recall([[3, 9]], [[3, 4, 5]], k=1)
    1.0
    >>> # 9 is as near as the true 2nd neighbour 4: a tie, counted with distances
    >>> recall([[3, 9]], [[3, 4, 5]], found_distances=[[0.5, 2.0]], true_distances=[[0.5, 2.0, 2.0]])
    1.0
    """
    eps = check_float(eps, "eps", minimum=0.0)
    similarity = check_bool(similarity, "similarity")
    average = check_bool(average, "average")
    found = _host_ints(found_indices, "found_indices")
    true = _host_ints(true_indices, "true_indices")
    if found.shape[0] != true.shape[0]:
        raise ValueError(f"found_indices has {found.shape[0]} rows but true_indices has {true.shape[0]}")
    k = found.shape[1] if k is None else check_int(k, "k", minimum=1)
    if found.shape[1] < k or true.shape[1] < k:
        raise ValueError(f"recall@{k} needs at least {k} columns; found_indices has {found.shape[1]}, "
                         f"true_indices has {true.shape[1]}")
    if (found_distances is None) != (true_distances is None):
        raise ValueError("give both found_distances and true_distances (or neither)")
    nq = found.shape[0]
    if nq == 0:
        return float("nan") if average else np.zeros(0)
    f, t = found[:, :k], true[:, :k]
    valid_t = t >= 0
    n_true = valid_t.sum(1)
    if found_distances is not None:
        fd = _host_floats(found_distances, "found_distances", found.shape)[:, :k]
        td = _host_floats(true_distances, "true_distances", true.shape)[:, :k]
        thr = td[np.arange(nq), np.maximum(n_true - 1, 0)]
        slack = eps * np.abs(thr)
        near = fd >= (thr - slack)[:, None] if similarity else fd <= (thr + slack)[:, None]
        hits = (near & (f >= 0) & _first_occurrence(f)).sum(1)
        per_query = np.minimum(hits, n_true) / np.maximum(n_true, 1)
    else:
        # key = row * M + id + 1 keeps rows apart, and sorting each found row makes all found keys one
        # sorted array: a single searchsorted answers every membership test (padding -1 maps to key
        # row * M, which no valid true id can equal)
        m = int(max(f.max(), t.max(), 0)) + 2
        rows = np.arange(nq, dtype=np.int64)[:, None] * m
        fkeys = (rows + np.sort(np.maximum(f, -1), axis=1) + 1).ravel()
        tkeys = rows + t + 1
        pos = np.minimum(np.searchsorted(fkeys, tkeys), fkeys.size - 1)
        hits = (fkeys[pos] == tkeys) & valid_t
        per_query = hits.sum(1) / np.maximum(n_true, 1)
    return float(per_query.mean()) if average else per_query


def _sample_rows(n, sample, random_state):
    sample = check_int(sample, "sample", minimum=1, allow_none=True)
    if sample is None or sample >= n:
        return np.arange(n, dtype=np.int64)
    rng = np.random.default_rng(random_state)
    return np.sort(rng.choice(n, size=int(sample), replace=False)).astype(np.int64)


def _distances_to(arr, rows, cols, metric):
    """float64 distances in the user's metric between ``arr[rows[i]]`` and ``arr[cols[i, j]]`` (on the host)."""
    xp = get_array_module(arr)
    out = np.empty(cols.shape, np.float64)
    step = max(1, (64 << 20) // max(1, 8 * cols.shape[1] * arr.shape[1]))   # bounded temporaries
    for s in range(0, len(rows), step):
        r, c = rows[s:s + step], cols[s:s + step]
        take = (lambda i: arr[i]) if xp is np else (lambda i: arr[xp.asarray(i)])
        q = np.asarray(as_host(take(r)), np.float64)
        nb = np.asarray(as_host(take(c.ravel())), np.float64).reshape(c.shape + (arr.shape[1],))
        if metric == "cosine":
            q /= np.maximum(np.linalg.norm(q, axis=-1, keepdims=True), 1e-30)
            nb /= np.maximum(np.linalg.norm(nb, axis=-1, keepdims=True), 1e-30)
        if metric in ("inner_product", "cosine"):
            dot = np.einsum("id,ijd->ij", q, nb)
            out[s:s + step] = dot if metric == "inner_product" else 1.0 - dot
        else:
            d2 = ((nb - q[:, None, :]) ** 2).sum(-1)
            out[s:s + step] = np.sqrt(d2) if metric == "euclidean" else d2
    return out


def graph_recall(data: ArrayLike, graph_indices: ArrayLike, *, sample: int | None = 1000, metric: str | None = None,
                 random_state: Seed = None, device: Device = "auto", k: int | None = None, ties: bool = False,
                 eps: float = 1e-3) -> float:
    """Recall of a k-NN graph, measured on a random sample of its nodes.

    The exact neighbours of the sampled nodes (themselves excluded, by index) are computed with
    :func:`knnkit.knn` and compared to the graph's rows with :func:`recall`.

    Parameters
    ----------
    data : (n, d) array
        The vectors the graph was built on (numpy, cupy or torch).
    graph_indices : (n, k) int array or KnnGraph
        Neighbour ids of every node; a :class:`knnkit.KnnGraph` (anything with ``.indices``) is accepted
        (one built with ``include_self=True`` is measured without its column of the points themselves).
    sample : int or None
        Number of nodes checked (default 1000; None checks all, at the cost of an exact k-NN graph).
    metric : str, optional
        Distance used for the exact neighbours; default the graph's ``.metric`` if it has one, else
        ``"sqeuclidean"``.
    random_state : None, int or numpy.random.Generator
        Chooses the sample.
    device : {"auto", "cpu", "gpu"} or int
        Where the exact neighbours are computed.
    k : int, optional
        Recall@k over the first k graph neighbours (default: all columns of the graph).
    ties : bool
        Count a graph neighbour as correct when it is as near as the k-th exact neighbour (within
        ``eps``, relative), whatever its id: the fair measure on data with duplicates or integer
        distances (see :func:`recall`). The distances are recomputed here, in float64.
    eps : float
        Relative tolerance of ``ties``.

    Returns
    -------
    float

    Examples
    --------
    >>> import numpy as np, knnkit
    >>> from knnkit.evaluate import graph_recall
    >>> x = np.random.default_rng(0).standard_normal((500, 8)).astype(np.float32)
    >>> _, g = knnkit.knn(x, k=5, device="cpu")      # the exact graph
    >>> graph_recall(x, g, sample=100, random_state=0, device="cpu")
    1.0
    """
    from .api.exact import exact_arrays

    ties = check_bool(ties, "ties")
    eps = check_float(eps, "eps", minimum=0.0)
    if metric is None:
        metric = getattr(graph_indices, "metric", None) or "sqeuclidean"
    with_self = bool(getattr(graph_indices, "include_self", False))
    if hasattr(graph_indices, "indices"):
        graph_indices = graph_indices.indices
    g = _host_ints(graph_indices, "graph_indices")
    if with_self:  # a KnnGraph(include_self=True) holds each point itself in column 0: not a neighbour
        g = g[:, 1:]
    arr, _ = inspect_array(data)
    n = arr.shape[0]
    if g.shape[0] != n:
        raise ValueError(f"the graph has {g.shape[0]} rows but data has {n} points")
    k = g.shape[1] if k is None else check_int(k, "k")
    if not 1 <= k <= min(g.shape[1], n - 1):
        raise ValueError(f"k={k} must be in [1, min(graph columns={g.shape[1]}, n - 1={n - 1})]")
    rows = _sample_rows(n, sample, random_state)
    xp = get_array_module(arr)
    queries = arr[rows if xp is np else xp.asarray(rows)]
    exact_d, exact = exact_arrays(arr, queries, k + 1, metric=metric, device=device)
    exact = _host_ints(exact, "exact")
    # drop each node itself; a row without it (more than k duplicates at distance 0) drops its last
    is_self = exact == rows[:, None]
    no_self = ~is_self.any(1)
    is_self[no_self, -1] = True
    first = np.argmax(is_self, axis=1)               # only the first match is dropped
    keep = np.ones_like(is_self)
    keep[np.arange(len(rows)), first] = False
    exact = exact[keep].reshape(len(rows), k)
    found = g[rows, :k]
    if ties:
        exact_d = _host_floats(exact_d, "exact distances", (len(rows), k + 1))[keep].reshape(len(rows), k)
        ok = (found >= 0) & (found < n) & (found != rows[:, None])   # a node is never its own neighbour
        found = np.where(ok, found, -1)
        found_d = _distances_to(arr, rows, np.where(ok, found, 0), metric)
        r = recall(found, exact, k=k, found_distances=found_d, true_distances=exact_d,
                   similarity=metric == "inner_product", eps=eps)
    else:
        r = recall(found, exact, k=k)
    logger.debug("graph recall@%d on %d sampled nodes: %.4f", k, len(rows), r)
    return r


def ground_truth(data: ArrayLike, queries: ArrayLike | None, k: int, *, metric: Metric = "sqeuclidean",
                 device: Device = "auto") -> NeighborPair:
    """Exact ``(distances, indices)`` of the ``k`` nearest ``data`` rows of every query.

    A thin wrapper on :func:`knnkit.knn` (``queries=None``: every data point, itself excluded).

    Examples
    --------
    >>> import numpy as np
    >>> from knnkit.evaluate import ground_truth
    >>> x = np.arange(10, dtype=np.float32)[:, None]
    >>> ground_truth(x, x[[4]], 3, device="cpu")[1].tolist()
    [[4, 3, 5]]
    """
    from .api.exact import exact_arrays

    return exact_arrays(data, queries, k, metric=metric, device=device)


def float64_distances(data: ArrayLike, queries: ArrayLike, metric: Metric = "sqeuclidean") -> HostArray:
    """All ``(len(queries), len(data))`` distances in the user's metric as knnkit returns them, in
    float64 on the host and independently of knnkit's engines: squared and plain Euclidean from
    coordinate differences (no ``|x|^2 - 2 x.q + |q|^2`` cancellation), cosine from rows normalised
    in float64, inner product as the dot product itself (larger is nearer, as ``knnkit.knn``
    returns it). A reference for checking results on data that defeats float32 shortcuts; memory is
    ``len(queries) * len(data)`` floats.

    Examples
    --------
    >>> import numpy as np
    >>> from knnkit.evaluate import float64_distances
    >>> x = np.array([[1e4, 0.0], [1e4 + 1.0, 0.0]], np.float32)
    >>> float64_distances(x, x[:1]).tolist()
    [[0.0, 1.0]]
    """
    X = np.asarray(as_host(data), np.float64)
    Q = np.asarray(as_host(queries), np.float64)
    if metric == "cosine":
        X = X / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-300)
        Q = Q / np.maximum(np.linalg.norm(Q, axis=1, keepdims=True), 1e-300)
        return 1.0 - Q @ X.T
    if metric == "inner_product":
        return Q @ X.T
    D = np.stack([((q[None, :] - X) ** 2).sum(axis=1) for q in Q]) if len(Q) else np.empty((0, len(X)))
    return np.sqrt(D) if metric == "euclidean" else D


def _synchronize():
    cp = cupy_or_none()
    if cp is not None:
        # the whole device, not only CuPy's current stream: work queued by torch or other streams counts
        cp.cuda.runtime.deviceSynchronize()


class Timer:
    """Context manager measuring wall time, synchronising the GPU on entry and exit.

    Parameters
    ----------
    name : str, optional
        Label used by ``str()`` and in the debug log.
    sync : bool
        Wait for queued GPU work before starting and stopping the clock (default True), so that
        asynchronous kernel launches are timed in full.

    Attributes
    ----------
    elapsed : float or None
        Seconds, set when the block exits.

    Examples
    --------
    >>> from knnkit.evaluate import Timer
    >>> with Timer("sleep") as t:
    ...     _ = sum(range(1000))
    >>> t.elapsed >= 0
    True
    """

    def __init__(self, name: str | None = None, *, sync: bool = True) -> None:
        self.name, self.sync = name, sync
        self.elapsed: float | None = None
        self._start: float = 0.0

    def __enter__(self) -> Timer:
        if self.sync:
            _synchronize()
        self.elapsed = None
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> bool:
        if self.sync:
            _synchronize()
        self.elapsed = time.perf_counter() - self._start
        logger.debug("%s: %.4f s", self.name or "timer", self.elapsed)
        return False

    def __repr__(self) -> str:
        t = "running" if self.elapsed is None else f"{self.elapsed:.4f} s"
        return f"Timer({self.name!r}, {t})"

    def __str__(self) -> str:
        t = "running" if self.elapsed is None else f"{self.elapsed:.3f} s"
        return f"{self.name}: {t}" if self.name else t
