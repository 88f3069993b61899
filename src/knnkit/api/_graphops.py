"""Graph builds and merges on prepared inputs, shared by the public functions
(:mod:`knnkit.api.graph`) and :meth:`KnnGraph.extend`. They return the constructor arguments of a
:class:`~knnkit.api.knngraph.KnnGraph`, so this module does not depend on the class."""

import dataclasses
import time

import numpy as np

from .._core.backend import as_device, as_host
from .._core.config import logger, verbose_logging
from .._core.metrics import finalize_distances, to_internal
from .._core.params import check_float, merge_params
from .._core.prepare import device_scope
from .._core.random import seed_from
from .._core.stats import BuildStats
from .._core.underflow import EXACT64_MAX_WORK, answer_in_float64, underflow_rows, warn_unresolved_cosine
from .._core.validation import check_k, check_matrix
from ..graph import build_lists, choose_method
from ..graph.nndescent import NNDescentParams

__all__ = ["build_graph", "merge_prepared", "index_dtype_for"]


def index_dtype_for(n):
    """int32 ids while they fit, int64 from 2**31 points on."""
    return np.int32 if n < 2 ** 31 else np.int64


def _graph_params(method, params, shortcuts):
    """The method's parameter object with the keyword shortcuts merged in."""
    cls = method.params_class()
    if cls is NNDescentParams:
        return merge_params(cls, params, **shortcuts)
    shortcuts = dict(shortcuts)
    target = shortcuts.pop("target_recall", None)
    if target is not None:
        if "target_recall" in {f.name for f in dataclasses.fields(cls)}:
            return merge_params(cls, params, target_recall=target)
        # an exact method meets any target; the value is still checked
        check_float(target, "target_recall", minimum=0.0, maximum=1.0, allow_none=True)
    given = [k for k, v in shortcuts.items() if v is not None and k != "verbose"]
    if given:
        raise ValueError(f"{', '.join(given)} apply to method='nndescent', not {method.name!r}")
    return merge_params(cls, params)


def build_graph(P, k, *, method="auto", random_state=None, init_graph=None, include_self=False, params=None,
                 shortcuts=None, data=None, device_arg="auto"):
    """knn_graph on a prepared input (also KnnGraph.extend's first step); returns the KnnGraph's
    constructor arguments."""
    t_start = time.perf_counter()
    n = P.n
    k = check_k(k, n, self_excluded=not include_self)
    kk = k - 1 if include_self else k  # neighbours to find besides self
    if not isinstance(method, str):
        raise TypeError(f"method must be a string, got {type(method).__name__}")
    m = choose_method(method, n, P.device, P.metric, d=P.d)
    prm = _graph_params(m, params, shortcuts or {})
    verbose = bool((shortcuts or {}).get("verbose"))
    if verbose:  # NN-Descent logs its own start and iterations; every method logs start and end here
        verbose_logging()
        if m.name != "nndescent":
            logger.info("knn_graph: %s on %s, n=%d k=%d metric=%s", m.name, P.device, n, k, P.metric)
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
        # rows with neighbours closer than float32 resolves (values spanning more than ~1e19):
        # answered again in float64 below, or refused (knnkit._core.underflow)
        tiny = underflow_rows(D, I, P.raw, P.raw, P.internal, P.scale)
        warn_unresolved_cosine(D, I, P.raw, P.raw, P.metric, stacklevel=4)
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
        if tiny.size:
            D, I = answer_in_float64(D, I, tiny, P.raw, P.raw[xp.asarray(tiny)], kk, P.metric, n_queries=n,
                                     absmax=P.absmax, max_work=EXACT64_MAX_WORK, exclude=tiny,
                                     col0=1 if include_self else 0, stacklevel=4)
            st["float64_rows"] = int(tiny.size)
    st.setdefault("phase_s", {})["total"] = time.perf_counter() - t_start
    if verbose:
        logger.info("knn_graph: %s done in %.3f s", m.name, st["phase_s"]["total"])
    return dict(indices=I, distances=D, metric=P.metric, include_self=include_self, stats=BuildStats.from_dict(st),
                info=P.info, data=data, params={"device": device_arg, "seed": seed})


def _init_lists(init_graph, n, device):
    is_graph = hasattr(init_graph, "host_arrays") and hasattr(init_graph, "include_self")
    if is_graph and hasattr(init_graph, "require_in_memory"):
        init_graph.require_in_memory("init_graph")
    gi = init_graph.host_arrays()[0] if is_graph else init_graph
    if is_graph and init_graph.include_self:
        gi = gi[:, 1:]
    gi, _ = check_matrix(gi, "init_graph", allow_float64=False, check_finite=False, integer=True)
    init_i = as_device(gi) if device == "gpu" else np.asarray(as_host(gi))
    if init_i.shape[0] != n:
        raise ValueError(f"init_graph must have {n} rows, got shape {tuple(init_i.shape)}")
    return init_i.astype(np.int32)


def _cupy():
    from .._core.backend import cupy_or_none

    return cupy_or_none()


def merge_prepared(P1, g1, P2, g2, *, k=None, random_state=None, params=None, device_arg="auto", t0=None,
           check_content=True):
    """merge_graphs on prepared inputs (also KnnGraph.extend's second step); returns the KnnGraph's
    constructor arguments. ``g1``/``g2``: graphs (``n``, ``include_self``, ``host_arrays()``)."""
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
    return dict(indices=I, distances=D, metric=P1.metric, include_self=False, stats=BuildStats.from_dict(st),
                info=P1.info, data=X, params={"device": device_arg, "seed": seed})


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
