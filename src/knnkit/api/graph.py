"""Public graph functions: :func:`knn_graph`, :func:`merge_graphs`, :func:`knn_graph_out_of_core`."""

import os
import time

import numpy as np

from .._core.backend import as_device, as_host
from .._core.metrics import finalize_distances, safe_scale, to_internal
from .._core.params import merge_params
from .._core.prepare import device_scope, prepare
from .._core.random import seed_from
from .._core.stats import BuildStats
from .._core.validation import check_k, check_matrix, check_metric
from ..graph import GRAPH_METRICS, build_lists, choose_method
from ..graph.nndescent import NNDescentParams
from .knngraph import KnnGraph, index_dtype_for

__all__ = ["knn_graph", "merge_graphs", "knn_graph_out_of_core", "KnnGraph"]

_NND_SHORTCUTS = ("n_neighbors_internal", "sample", "max_iters", "delta", "update", "refine_hubs", "verbose")


def knn_graph(data, k=10, *, method="auto", metric="sqeuclidean", device="auto", random_state=None,
              n_neighbors_internal=None, sample=None, max_iters=None, delta=None, init_graph=None,
              include_self=False, update=None, refine_hubs=None, init=None, verbose=None, params=None):
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
        (exact). ``"auto"``: brute force when n <= 20 000 on the CPU (100 000 on the GPU),
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
        ``refine_hubs``, ``verbose``). Giving a field in both places with different values is an error.

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
                     update=update, refine_hubs=refine_hubs, init=init, verbose=verbose)
    return _build_graph(P, k, method=method, random_state=random_state, init_graph=init_graph,
                        include_self=include_self, params=params, shortcuts=shortcuts, data=data,
                        device_arg=device)


def _graph_params(method, params, shortcuts):
    """The method's parameter object with the keyword shortcuts merged in."""
    cls = method.params_class()
    if cls is NNDescentParams:
        return merge_params(cls, params, **shortcuts)
    given = [k for k, v in shortcuts.items() if v is not None and k != "verbose"]
    if given:
        raise ValueError(f"{', '.join(given)} apply to method='nndescent', not {method.name!r}")
    return merge_params(cls, params)


def _build_graph(P, k, *, method="auto", random_state=None, init_graph=None, include_self=False, params=None,
                 shortcuts=None, data=None, device_arg="auto"):
    """knn_graph on a prepared input (also KnnGraph.extend's first step)."""
    t_start = time.perf_counter()
    n = P.n
    k = check_k(k, n, self_excluded=not include_self)
    kk = k - 1 if include_self else k  # neighbours to find besides self
    if not isinstance(method, str):
        raise TypeError(f"method must be a string, got {type(method).__name__}")
    m = choose_method(method, n, P.device, P.metric)
    prm = _graph_params(m, params, shortcuts or {})
    seed = seed_from(random_state)
    with device_scope(P.device, P.device_id):
        xp = np if P.device == "cpu" else _cupy()
        engine_kw = {}
        if init_graph is not None:
            if m.name != "nndescent":
                raise ValueError(f"init_graph applies to method='nndescent', not {m.name!r}")
            engine_kw["init_indices"] = _init_lists(init_graph, n, P.device)
        if kk == 0:
            I = xp.zeros((n, 0), np.int32)
            D = xp.zeros((n, 0), np.float32)
            st = {"method": m.name, "device": P.device}
        else:
            I, D, st = build_lists(P.X, kk, metric=P.metric, method=m, params=prm, seed=seed, **engine_kw)
        xp = np if isinstance(I, np.ndarray) else _cupy()
        itype = index_dtype_for(n)
        I = xp.ascontiguousarray(I.astype(itype, copy=False))
        D = xp.ascontiguousarray(D.astype(np.float32, copy=False))
        if include_self:
            # the point itself in column 0, at its internal distance to itself
            self_col = xp.arange(n, dtype=itype)[:, None]
            if P.internal == "ip":
                sd = -(P.X * P.X).sum(axis=1, keepdims=True).astype(np.float32)
            else:
                sd = xp.zeros((n, 1), np.float32)
            I = xp.ascontiguousarray(xp.concatenate([self_col, I], axis=1))
            D = xp.ascontiguousarray(xp.concatenate([sd, D], axis=1))
        if P.metric != "manhattan" or P.scale != 1.0:
            D = finalize_distances(D, P.metric, P.scale)
    st.setdefault("phase_s", {})["total"] = time.perf_counter() - t_start
    return KnnGraph(I, D, metric=P.metric, include_self=include_self, stats=BuildStats.from_dict(st), info=P.info,
                    data=data, params={"device": device_arg, "seed": seed})


def _init_lists(init_graph, n, device):
    gi = init_graph._ind if isinstance(init_graph, KnnGraph) else init_graph
    if isinstance(init_graph, KnnGraph) and init_graph.include_self:
        gi = gi[:, 1:]
    gi, _ = check_matrix(gi, "init_graph", allow_float64=False, check_finite=False, integer=True)
    init_i = as_device(gi) if device == "gpu" else np.asarray(as_host(gi))
    if init_i.shape[0] != n:
        raise ValueError(f"init_graph must have {n} rows, got shape {tuple(init_i.shape)}")
    return init_i.astype(np.int32)


def _cupy():
    from .._core.backend import cupy_or_none

    return cupy_or_none()


def merge_graphs(data1, g1, data2, g2, *, k=None, device="auto", random_state=None, n_neighbors_internal=None,
                 sample=None, max_iters=None, delta=None, update=None, verbose=None, params=None):
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
    if g1.metric != g2.metric:
        raise ValueError(f"graphs use different metrics: {g1.metric!r} and {g2.metric!r}")
    metric = check_metric(g1.metric, GRAPH_METRICS)
    P1 = prepare(data1, metric=metric, device=device, name="data1", metrics=GRAPH_METRICS)
    P2 = prepare(data2, metric=metric, device=P1.device_id if P1.device_id is not None else P1.device,
                 name="data2", metrics=GRAPH_METRICS)
    prm = merge_params(NNDescentParams, params, n_neighbors_internal=n_neighbors_internal, sample=sample,
                       max_iters=max_iters, delta=delta, update=update, verbose=verbose)
    return _merge(P1, g1, P2, g2, k=k, random_state=random_state, params=prm, device_arg=device, t0=t0)


def _merge(P1, g1, P2, g2, *, k=None, random_state=None, params=None, device_arg="auto", t0=None,
           check_content=True):
    """merge_graphs on prepared inputs (also KnnGraph.extend's second step)."""
    from ..graph._merge import ggm_merge

    t0 = time.perf_counter() if t0 is None else t0
    if P1.d != P2.d:
        raise ValueError(f"dimension mismatch: data1 has d={P1.d}, data2 has d={P2.d}")
    n1, n2 = P1.n, P2.n
    if g1.n != n1 or g2.n != n2:
        raise ValueError(f"graph sizes ({g1.n}, {g2.n}) do not match data ({n1}, {n2})")
    n = n1 + n2
    I1, D1 = _neighbour_part(g1)
    I2, D2 = _neighbour_part(g2)
    if check_content:
        _check_graph_matches(P1, I1, D1, "g1", "data1")
        _check_graph_matches(P2, I2, D2, "g2", "data2")
    kin = min(I1.shape[1], I2.shape[1])
    k = kin if k is None else check_k(k, n, self_excluded=True)
    seed = seed_from(random_state)
    # merges never refine hubs (and so use the basic update for raw inner products: default_update)
    params = (params or NNDescentParams()).replace(refine_hubs=False).resolve(k=k, n=n, device=P1.device,
                                                                             metric=P1.metric)
    scale = min(P1.scale, P2.scale)
    with device_scope(P1.device, P1.device_id):
        I, D, st, X = ggm_merge(P1.raw, P2.raw, I1, D1, I2, D2, k, metric=P1.metric, params=params, seed=seed,
                                scale=scale)
        if P1.metric != "manhattan" or scale != 1.0:
            D = finalize_distances(D, P1.metric, scale)
        I = I.astype(index_dtype_for(n), copy=False)
    st["phase_s"]["total"] = time.perf_counter() - t0
    return KnnGraph(I, D, metric=P1.metric, include_self=False, stats=BuildStats.from_dict(st), info=P1.info,
                    data=X, params={"device": device_arg, "seed": seed})


def _neighbour_part(g):
    I, D = g.host_arrays()
    if g.include_self:
        I, D = I[:, 1:], D[:, 1:]
    # ids keep their dtype (int32 below 2**31 points): the GPU path sends them back as int32
    return np.asarray(I), np.asarray(D, dtype=np.float32)


def _check_graph_matches(P, I, D, gname, dname, sample=64):
    """Refuse a graph built on other data: recompute the stored distances of a few sampled rows
    and compare (merging unrelated graphs gave recall 0.005 without a word)."""
    from .._core.metrics import prepare_vectors

    n, k = I.shape
    if k == 0:
        return
    if I.min() < -1 or I.max() >= n:
        raise ValueError(f"{gname} holds neighbour ids outside [0, {n}) for {dname} of {n} points")
    rng = np.random.default_rng(12345)
    rows = rng.choice(n, size=min(sample, n), replace=False)
    cols = I[rows, 0].astype(np.int64)
    ok = cols >= 0
    if not ok.any():
        return
    rows, cols = rows[ok], cols[ok]
    X = prepare_vectors(as_host(P.raw[rows]) if P.device == "gpu" else P.raw[rows], P.metric)
    Y = prepare_vectors(as_host(P.raw[cols]) if P.device == "gpu" else P.raw[cols], P.metric)
    if P.internal == "l1":
        d = np.abs(X.astype(np.float64) - Y).sum(axis=1)
    elif P.internal == "ip":
        d = -(X.astype(np.float64) * Y).sum(axis=1)
    else:
        d = ((X.astype(np.float64) - Y) ** 2).sum(axis=1)
    stored = to_internal(D[rows, 0], P.metric).astype(np.float64)
    tol = 1e-3 * (np.abs(d) + np.abs(stored)) + 1e-5 * max(1.0, float(np.abs(d).max()))
    bad = np.abs(d - stored) > tol
    if bad.mean() > 0.05:
        raise ValueError(f"{gname} does not belong to {dname}: {int(bad.sum())} of {bad.size} sampled stored "
                         f"distances differ from the distances recomputed from {dname}")


def knn_graph_out_of_core(path, k=10, *, workdir, shard_size=None, memory_budget=None, metric="sqeuclidean",
                          device="auto", random_state=None, n_neighbors_internal=None, return_graph="auto",
                          verbose=False, _fault_hook=None):
    """k-NN graph of a vector file larger than memory: shards, per-shard graphs, pairwise GGM merges.

    Parameters
    ----------
    path : str or os.PathLike
        ``.fbin``, ``.u8bin``, ``.i8bin``, ``.fvecs``, ``.bvecs`` or ``.npy`` file (memory-mapped).
    k : int
        Neighbours per point (self excluded).
    workdir : str or os.PathLike
        Folder for shard graphs, running lists, the manifest and the outputs. Reusing it resumes an
        interrupted run; a folder made for another file or other parameters is refused.
    shard_size : int, optional
        Points per shard (default: as many as fit ``memory_budget`` with two shards in a merge
        plus one being prefetched). Shards are made equal in size.
    memory_budget : int, optional
        Bytes one step may use (default: a quarter of the RAM on the CPU, the knnkit GPU budget on
        the GPU).
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
    out = build_out_of_core(path, k, workdir=workdir, shard_size=shard_size, memory_budget=memory_budget,
                            metric=metric, device=device, random_state=random_state,
                            n_neighbors_internal=n_neighbors_internal, return_graph=return_graph, verbose=verbose,
                            _fault_hook=_fault_hook)
    if out[0] == "paths":
        return out[1]
    _, I, D, stats = out
    return KnnGraph(I, D, metric=metric, stats=BuildStats.from_dict(stats))
