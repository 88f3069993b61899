"""Public graph functions: :func:`knn_graph`, :func:`merge_graphs`, :func:`knn_graph_out_of_core`."""

from __future__ import annotations

import time
from typing import Any, Callable

from .._core.params import check_bool, check_int, merge_params
from .._core.prepare import prepare
from .._core.stats import BuildStats
from .._core.types import ArrayLike, Device, HostArray, Metric, Params, PathLike, Seed
from .._core.validation import check_metric
from ..graph import GRAPH_METRICS
from ..graph.nndescent import NNDescentParams
from ._graphops import build_graph, merge_prepared
from .knngraph import KnnGraph

__all__ = ["umap_knn", "knn_graph", "merge_graphs", "knn_graph_out_of_core", "KnnGraph"]

_NND_SHORTCUTS = ("n_neighbors_internal", "sample", "max_iters", "delta", "update", "refine_hubs", "verbose")


def knn_graph(data: ArrayLike, k: int = 10, *, method: str = "auto", metric: Metric = "sqeuclidean",
              device: Device = "auto", random_state: Seed = None, n_neighbors_internal: int | None = None,
              sample: int | None = None, max_iters: int | None = None, delta: float | None = None,
              init_graph: KnnGraph | ArrayLike | None = None, include_self: bool = False, update: str | None = None,
              refine_hubs: bool | None = None, init: str | None = None, target_recall: float | None = None,
              verbose: bool | None = None, params: Params | None = None) -> KnnGraph:
    """Build the k-nearest-neighbour graph of ``data``.

    NN-Descent (GNND on the GPU, a Numba version on the CPU) for large inputs, exact brute force
    for small ones.

    Parameters
    ----------
    data : array-like, shape (n, d)
        numpy / cupy / torch, float32, float16, uint8, int8 (float64 is converted).
    k : int, default 10
        Neighbours per point (``include_self=True`` counts the point itself).
    method : str, default "auto"
        A registered graph method (``knnkit.methods("graph")``): ``"nndescent"``, ``"brute"``
        (exact; on the GPU the certified tensor-core GEMM, exact up to ties). ``"auto"``: brute
        force when n <= 5 000 on the CPU (on the GPU n <= 200 000 and n * n * d <= 8e12),
        NN-Descent above.
    metric : {"sqeuclidean", "euclidean", "inner_product", "cosine", "manhattan"}
        ``manhattan`` (L1) is NN-Descent only (brute force falls back to a CPU loop).
    device : {"auto", "cpu", "gpu"} or int
    random_state : None, int or numpy Generator
        Same seed, same device, same thread count -> same graph (the CPU path is independent of
        the thread count too).
    n_neighbors_internal : int, optional
        ``K >= k``, the list length NN-Descent works with (default: :func:`default_parameters`,
        ``k + max(6, k // 8)`` on the CPU plus a term growing with log n).
    sample : int, optional
        ``p``, NEW/OLD samples per list and iteration (default ``min(K, max(14 + log2(n / 1e5), K / 4))`` on the CPU).
    max_iters : int, optional
        Iteration cap (default ``2 * ceil(log2 n) + 6``).
    delta : float, optional
        Default 0.001.
        Stop when an iteration changes fewer than ``delta * n * K`` list entries.
    init : {"auto", "random", "rpforest", "rsfk"}, optional
        NN-Descent's initial lists (see :class:`NNDescentParams`); ``"rsfk"`` starts from a
        random-sample forest (RSFK) graph.
    init_graph : KnnGraph or (n, m) int array, optional
        Start from these lists instead of a random graph (missing entries are filled at random).
    target_recall : float in [0, 1] or None, optional
        Recall@k the build drives itself to, estimated on a sample of rows against exact
        neighbours (default 0.99 for NN-Descent, see :class:`NNDescentParams`; ``None`` in a
        parameter object turns the estimate off). A lower target builds faster; exact methods
        meet any target. ``graph.stats`` reports the estimate and what reaching it took. Where
        the descent stalls the exact graph follows; on the GPU, with a target below 1, first as
        near-exact lists (fp16 GEMM, exact re-rank, no certificate) that the estimate must find at
        the target, else the certified graph (``stats.extra["exact_fallback"]["lists"]``).
    include_self : bool, default False
        Put each point itself in column 0 (UMAP / ``kneighbors_graph(include_self=True)``
        convention); its distance is the point's distance to itself (0, or ``|x|^2`` for
        ``inner_product``).
    update : {"basic", "selective"}, optional
        Graph update rule (paper section 4.3). Default: ``"selective"`` on the GPU (fewer
        global-memory writes), ``"basic"`` on the CPU (it converges in fewer iterations, and on the
        CPU distances, not writes, are the cost). ``"inner_product"`` with ``refine_hubs=False``:
        ``"basic"`` on both (see ``default_update``).
    refine_hubs : bool, optional
        ``inner_product`` only. After NN-Descent, replace every list by the exact top-k over the
        points that occur in any approximate top-k list (the "hubs" an unnormalised inner product
        concentrates on; see ``knnkit.graph._hubs``). Default (None): when those are at most
        a quarter of the points and the work is bounded (1M x 128 clustered, GPU: recall@10 0.93
        -> 0.999); ``True`` forces it, ``False`` keeps the NN-Descent lists.
        ``stats["hubs"]`` reports the support size and whether it ran.
    verbose : bool
        Log per-iteration progress at INFO level.
    params : NNDescentParams or ExactParams, optional
        The method's parameter object; the keywords above are shortcuts for its fields
        (``n_neighbors_internal``, ``sample``, ``max_iters``, ``delta``, ``update``,
        ``refine_hubs``, ``init``, ``target_recall``, ``verbose``). Giving a field in both places with different values is an error.

    Returns
    -------
    KnnGraph
        ``indices`` (n, k) int32 (int64 when n >= 2**31), ``distances`` (n, k) float32 in
        ``metric``, on the input's device (see :func:`knnkit.set_output`).

    Examples
    --------
    >>> import numpy as np, knnkit
    >>> X = np.random.default_rng(0).random((2000, 16), dtype=np.float32)
    >>> g = knnkit.knn_graph(X, k=10, method="nndescent", device="cpu", random_state=0)
    >>> truth = knnkit.knn(X, k=10, device="cpu")[1]
    >>> g.recall(truth) > 0.95
    True
    """
    P = prepare(data, metric=metric, device=device, metrics=GRAPH_METRICS)
    shortcuts = dict(n_neighbors_internal=n_neighbors_internal, sample=sample, max_iters=max_iters, delta=delta,
                     update=update, refine_hubs=refine_hubs, init=init, target_recall=target_recall, verbose=verbose)
    return KnnGraph(**build_graph(P, k, method=method, random_state=random_state, init_graph=init_graph,
                                  include_self=include_self, params=params, shortcuts=shortcuts, data=data,
                                  device_arg=device))


def umap_knn(data: ArrayLike, n_neighbors: int = 15, *, metric: Metric = "euclidean", method: str = "auto",
             device: Device = "auto", random_state: Seed = None) -> tuple[HostArray, HostArray]:
    """Nearest neighbours in the form ``umap.UMAP(precomputed_knn=...)`` takes.

    Parameters
    ----------
    data : array-like (n, d)
    n_neighbors : int, default 15
        UMAP's ``n_neighbors``: columns per row, the point itself (distance 0) first.
    metric : {"euclidean", "cosine"}
        The metric the UMAP model is given (distances are returned in it).
    method, device, random_state
        As in :func:`knn_graph` (the graph is built with ``include_self=True``).

    Returns
    -------
    knn_indices : int64 (n, n_neighbors)
    knn_dists : float32 (n, n_neighbors)

    Examples
    --------
    >>> import numpy as np, knnkit
    >>> X = np.random.default_rng(0).random((500, 8), dtype=np.float32)
    >>> ind, dist = knnkit.umap_knn(X, 10, device="cpu", random_state=0)
    >>> ind.shape, bool((ind[:, 0] == np.arange(500)).all())
    ((500, 10), True)

    With umap-learn: ``umap.UMAP(n_neighbors=10, precomputed_knn=(ind, dist, None)).fit(X)``.
    """
    if metric not in ("euclidean", "cosine"):
        raise ValueError(f"metric must be 'euclidean' or 'cosine' (UMAP metrics knnkit computes), got {metric!r}")
    P = prepare(data, metric="sqeuclidean" if metric == "euclidean" else metric, device=device, metrics=GRAPH_METRICS)
    g = KnnGraph(**build_graph(P, n_neighbors, method=method, random_state=random_state, include_self=True,
                               data=data, device_arg=device))
    return g.to_umap()


def merge_graphs(data1: ArrayLike, g1: KnnGraph, data2: ArrayLike, g2: KnnGraph, *, k: int | None = None,
                 device: Device = "auto", random_state: Seed = None, n_neighbors_internal: int | None = None,
                 sample: int | None = None, max_iters: int | None = None, delta: float | None = None,
                 update: str | None = None, verbose: bool | None = None,
                 params: NNDescentParams | None = None) -> KnnGraph:
    """Merge the k-NN graphs of two point sets into the graph of their union (GGM).

    Parameters
    ----------
    data1, data2 : (n1, d), (n2, d) arrays
        The two point sets (disjoint).
    g1, g2 : KnnGraph
        Their graphs (same metric), e.g. from :func:`knn_graph`.
    k : int, optional
        Neighbours in the result (default ``min(g1.k, g2.k)``, at most ``n1 + n2 - 1``).
    device, random_state, n_neighbors_internal, sample, max_iters, delta, update, verbose
        As in :func:`knn_graph`; they drive the cross-subset NN-Descent refinement.
    params : NNDescentParams, optional
        The same as one object (the keywords above are shortcuts for its fields).

    Returns
    -------
    KnnGraph
        Over ``concat(data1, data2)``: ids ``0..n1-1`` are ``data1``, ``n1..`` are ``data2``.

    Examples
    --------
    >>> import numpy as np, knnkit
    >>> rng = np.random.default_rng(0)
    >>> a, b = rng.random((500, 8), dtype=np.float32), rng.random((400, 8), dtype=np.float32)
    >>> ga = knnkit.knn_graph(a, k=10, device="cpu"); gb = knnkit.knn_graph(b, k=10, device="cpu")
    >>> g = knnkit.merge_graphs(a, ga, b, gb, device="cpu", random_state=0)
    >>> g.indices.shape
    (900, 10)
    """
    t0 = time.perf_counter()
    if not isinstance(g1, KnnGraph) or not isinstance(g2, KnnGraph):
        raise TypeError("g1 and g2 must be KnnGraph objects")
    g1.require_in_memory("merge_graphs (g1)")
    g2.require_in_memory("merge_graphs (g2)")
    if g1.metric != g2.metric:
        raise ValueError(f"graphs use different metrics: {g1.metric!r} and {g2.metric!r}")
    metric = check_metric(g1.metric, GRAPH_METRICS)
    P1 = prepare(data1, metric=metric, device=device, name="data1", metrics=GRAPH_METRICS)
    P2 = prepare(data2, metric=metric, device=P1.device_id if P1.device_id is not None else P1.device,
                 name="data2", metrics=GRAPH_METRICS)
    prm = merge_params(NNDescentParams, params, n_neighbors_internal=n_neighbors_internal, sample=sample,
                       max_iters=max_iters, delta=delta, update=update, verbose=verbose)
    return KnnGraph(**merge_prepared(P1, g1, P2, g2, k=k, random_state=random_state, params=prm, device_arg=device,
                                     t0=t0))


def knn_graph_out_of_core(path: PathLike, k: int = 10, *, workdir: PathLike, shard_size: int | None = None,
                          memory_budget: int | None = None, metric: Metric = "sqeuclidean", device: Device = "auto",
                          random_state: Seed = None, n_neighbors_internal: int | None = None,
                          return_graph: bool | str = "auto", verbose: bool = False,
                          _fault_hook: Callable[..., Any] | None = None) -> KnnGraph | dict[str, str]:
    """k-NN graph of a vector file larger than memory: shards, per-shard graphs, pairwise GGM merges.

    Parameters
    ----------
    path : str or os.PathLike
        ``.fbin``, ``.u8bin``, ``.i8bin``, ``.fvecs``, ``.bvecs`` or ``.npy`` file (memory-mapped).
    k : int
        Neighbours per point (self excluded).
    workdir : str or os.PathLike
        Folder for shard graphs, running lists, the manifest and the outputs. Reusing it resumes an
        interrupted run; a folder made for another file or other parameters is refused. Its disk
        must hold about ``8 n (K' + 2 k)`` bytes at the peak (``K'``: ``n_neighbors_internal``);
        this is checked before any work (``OSError`` ENOSPC with the numbers).
    shard_size : int, optional
        Points per shard (default: as many as fit ``memory_budget`` with two shards in a merge
        plus one being prefetched). Shards are made equal in size.
    memory_budget : int, optional
        Bytes one step may use (default: a quarter of the RAM on the CPU, the knnkit GPU budget on
        the GPU). The host holds the vectors, shard graphs and running lists of the shards the
        current step and the next read; the other shards' running lists wait on disk
        (``stats["running_lists_held_max"]``; the manifest records each step's resident set).
    metric : {"sqeuclidean", "euclidean", "inner_product", "cosine", "manhattan"}
    device : {"auto", "cpu", "gpu"} or int
    random_state : None or int
        Stored in the manifest, so that a resumed run continues with the same seed.
    n_neighbors_internal : int, optional
        List length of the shard graphs (default as in :func:`knn_graph`).
    return_graph : {"auto", True, False}
        ``"auto"``: a :class:`KnnGraph` when the output is under 2 GiB, else a dict of paths
        ``{"indices", "distances", "manifest"}``; ``True``/``False`` force one or the other.
    verbose : bool

    Returns
    -------
    KnnGraph or dict
        The graph (global ids, user metric) or the paths of ``knn_indices.ibin`` /
        ``knn_distances.fbin`` / ``manifest.json``.

    Examples
    --------
    >>> import numpy as np, os, tempfile, knnkit
    >>> d = tempfile.mkdtemp()
    >>> knnkit.io.write(os.path.join(d, "x.fbin"), np.random.default_rng(0).random((3000, 8)))
    >>> g = knnkit.knn_graph_out_of_core(os.path.join(d, "x.fbin"), k=5, workdir=os.path.join(d, "w"),
    ...                                  shard_size=1000, device="cpu", random_state=0)
    >>> g.indices.shape
    (3000, 5)
    """
    from ..graph._out_of_core import build_out_of_core

    check_metric(metric, GRAPH_METRICS)
    shard_size = check_int(shard_size, "shard_size", minimum=1, allow_none=True)
    memory_budget = check_int(memory_budget, "memory_budget", minimum=1, allow_none=True)
    if not (return_graph == "auto" or isinstance(return_graph, bool)):
        raise ValueError(f"return_graph must be 'auto', True or False, got {return_graph!r}")
    verbose = check_bool(verbose, "verbose")
    out = build_out_of_core(path, k, workdir=workdir, shard_size=shard_size, memory_budget=memory_budget,
                            metric=metric, device=device, random_state=random_state,
                            n_neighbors_internal=n_neighbors_internal, return_graph=return_graph, verbose=verbose,
                            _fault_hook=_fault_hook)
    if out[0] == "paths":
        return out[1]
    _, I, D, stats = out
    return KnnGraph(I, D, metric=metric, stats=BuildStats.from_dict(stats))
