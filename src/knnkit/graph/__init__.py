"""k-NN graph construction engines: NN-Descent (``nndescent/``: GNND on the GPU, Numba on the
CPU), the exact graph (``_brute.py``), GGM merge (``_merge.py``), inner-product hub refinement
(``_hubs.py``) and the out-of-core build (``_out_of_core.py``).

Paper: Wang, Zhao & Zeng, "Large-Scale Approximate k-NN Graph Construction on GPU" (GNND
section 4, GGM and out-of-memory construction section 5).

:func:`build_lists` is the one entry the facades (and the out-of-core build, and the index
build) use: it picks the method through the registry and runs its engine on prepared arrays.
"""

import os
import time

from .._core.backend import device_of
from .._core.config import logger
from .._core.registry import REGISTRY

__all__ = ["build_lists", "choose_method", "exact_affordable", "BRUTE_AUTO_MAX_N", "GRAPH_METRICS"]

GRAPH_METRICS = ("sqeuclidean", "euclidean", "inner_product", "cosine", "manhattan")

#: ``method="auto"`` uses the exact brute-force graph up to this many points (it is then both
#: exact and about as fast as NN-Descent); NN-Descent above. CPU, 2 cores, d = 64, k = 10: brute /
#: NN-Descent 0.26 / 0.25 s at 5k, 0.52 / 0.26 s at 10k, 1.99 / 0.49 s at 20k (recall 0.999 with
#: the recall target), so the CPU crossover is 5k (it was 20k). GPU (H200, the certified
#: tensor-core exact graph against NN-Descent to its 0.99 target, clustered data,
#: ``benchmarks/results/h200-2026-11-29-s17/crossover/``): 100k x 128 0.040 / 0.082 s, 200k x 32
#: 0.095 / 0.113 s, 200k x 128 0.108 / 0.128 s, 300k x 64 0.198 / 0.174 s: 200k (it was 100k,
#: measured against the float32 GEMM, 2.4x slower).
BRUTE_AUTO_MAX_N = {"cpu": 5_000, "gpu": 200_000}
#: ... and up to this many multiply-adds (n * n * d) when the caller gives ``d`` (the public
#: knn_graph does): the exact graph's cost grows with d, NN-Descent's much less. GPU: Fashion-MNIST
#: 70k x 784 (3.8e12) exact 0.063 s, NN-Descent 0.121 s; 300k x 64 (5.8e12) is past the crossover
#: by size. Where NN-Descent would stall (high intrinsic dimension) its LID verdict still takes the
#: exact graph, for the cost of the estimate. The CPU has its size limit only.
BRUTE_AUTO_MAX_WORK = {"cpu": float("inf"), "gpu": 8e12}


def choose_method(method, n, device, metric, brute_max_n=None, d=None):
    """The registered graph method for ``method`` (``"auto"``: by size, dimension ``d`` when given,
    and device; ``brute_max_n`` overrides the size limit of the exact graph)."""
    if method == "auto":
        limit = BRUTE_AUTO_MAX_N[device] if brute_max_n is None else brute_max_n[device]
        small = n <= limit and (d is None or float(n) * n * d <= BRUTE_AUTO_MAX_WORK[device])
        method = "brute" if small else "nndescent"
    return REGISTRY.get("graph", method, device=device, metric=metric)


def default_params(method):
    """A default parameter object of a registered graph method."""
    return method.params_class()()


#: Rows of the recall estimate; graphs of fewer than twice this many points are not estimated.
ESTIMATE_ROWS = 1000
#: the recall target is checked from this many points on (below 2 * ESTIMATE_ROWS on half the
#: rows): it used to start at 2000 points, and NN-Descent's defaults on 2000 x 960 uniform data
#: returned recall 0.77 unchecked (benchmarks/results/cpu/rsfk_suite_ci.json)
ESTIMATE_MIN_N = 64


def estimate_rows(n):
    """Rows of the recall estimate for ``n`` points."""
    return int(min(ESTIMATE_ROWS, max(1, n // 2)))
#: Extra rounds, and the growth of the internal list per round, when the estimate is below target.
TARGET_ROUNDS = 2
TARGET_GROWTH = 1.5
#: A first descent this far below the target goes straight to the exact graph (when affordable):
#: on data of high intrinsic dimension the descent's recall grows only slowly with the list length
#: (1M x 96 broad clusters on an H100: K = 24 / 64 / 128 -> recall 0.44 / 0.63 / 0.79, and the two
#: continuation rounds end at 0.88 after 2.6 s, where the certified exact graph costs about as much;
#: ``benchmarks/results/h100-2026-11-24/graph_hard_sweep.json``).
EXACT_FALLBACK_GAP = 0.08
#: The exact graph is affordable up to this many multiply-adds (n * n * d): GPU ~ 2M x 100
#: (about 10 s with the fp16 tensor-core GEMM and exact re-check); CPU 1.25e12 per core, about a
#: minute of BLAS (100k x 128 = 1.3e12 took 41-92 s on two loaded cores). The CPU limit was a
#: fixed 2e11 (~45k x 100) until the suite ran at 100k on the CPU: uniform 128-d 100k returned
#: recall 0.58 and uniform 960-d 50k 0.42 (with a warning, no fallback), uniform 32-d 0.984.
EXACT_FALLBACK_MAX_WORK = {"gpu": 4e14, "cpu": 1.25e12 * max(1, os.cpu_count() or 1)}


#: NN-Descent is not started where the data's local intrinsic dimension (Levina-Bickel, 20
#: neighbours of ``LID_SAMPLE`` rows, :func:`._estimate.estimate_intrinsic_dim`) is at least this
#: and the exact graph is affordable: the descent is bound to stall there and the exact graph to
#: follow, so its iterations are time lost (1M x 128 on an H100: ~0.3 s of a 1.5 s knn_graph).
#: Where the descent stalled and where it converged (recall estimate >= 0.99), ``benchmarks/lid_vs_stall.py``:
#: 30k, CPU (``benchmarks/results/cpu/lid_vs_stall_cpu_30000.json``): stalled at LID 23.0-61.2 (uniform
#: 32-128-d, broad clusters 64-128-d), converged at 11.9-45.4 (tight clusters 30.6 / 45.4, broad 32-d
#: 22.0); the verdict there: uniform 96 / 128-d 3.34 / 3.81 s -> 2.31 / 2.81 s;
#: 1M, H100 (``benchmarks/results/h100-2026-11-26-s13/verdict/``): stalled at 25.1-69.1 (uniform and
#: broad 32-128-d), converged at 14.0-44.7 (tight clusters 30.5 / 44.7, clustered 25.0, SIFT-like
#: 20.2). LID alone does not separate the two below ~45 (tight clusters), so there the stall watch
#: decides after a few iterations, as before; above 50 a wrong call costs time (the exact graph),
#: never recall. 1M x 128 broad / uniform: knn_graph 1.53 / 1.43 s -> 1.25 s.
STALL_LID = 50.0


def exact_affordable(n, d, device, max_work=None):
    """Whether the exact graph of ``n`` x ``d`` points is affordable on ``device``
    (``n * n * d <= max_work``, default ``EXACT_FALLBACK_MAX_WORK[device]``)."""
    limit = EXACT_FALLBACK_MAX_WORK[device] if max_work is None else max_work[device]
    return float(n) * float(n) * float(d) <= limit


#: The exact fallback of a graph with a recall target below 1 (GPU): the fp16 tensor-core GEMM keeps
#: ``k + NEAR_EXACT_EXTRA`` candidates per row, re-ranks them with exact distances and skips the
#: certificate (and the float32 recomputation of the rows it rejects); a row can then differ from
#: the exact one only where fp16 rounding moved a neighbour past the last candidate. The recall
#: probe measures the lists, and the certified graph replaces them when they fall short of the
#: target (``stats["exact_fallback"]["lists"]`` says which). None: always the certified graph.
NEAR_EXACT_EXTRA = 8


def _exact_graph(X, k, im, device, near=False):
    """The exact graph (GPU: fp16 tensor-core GEMM with every row whose error bound fails
    recomputed in float32, i.e. exact up to ties). ``near``: the uncertified candidates of
    ``NEAR_EXACT_EXTRA`` instead, for callers that check the recall after (only where
    :func:`_near_allowed`)."""
    from ..exact import ExactParams, knn_lists
    from ._brute import GRAPH_GPU_PRECISION, brute_graph

    if near:
        D, I, _ = knn_lists(X, X, k, metric=im, exclude_self=True,
                            params=ExactParams(precision=GRAPH_GPU_PRECISION), certify=False,
                            candidates=k + NEAR_EXACT_EXTRA)
        return I, D
    precision = GRAPH_GPU_PRECISION if device == "gpu" else "exact"
    I, D, _ = brute_graph(X, k, metric=im, params=ExactParams(precision=precision))
    return I, D


def _near_allowed(device, im, target):
    """Whether the exact fallback may try near-exact lists first (GPU, l2 / ip, a target below 1)."""
    return device == "gpu" and im in ("l2", "ip") and NEAR_EXACT_EXTRA is not None and target < 1.0


def _checked_fallback(X, k, im, device, target, probe, fb):
    """The fallback graph for a recall target: near-exact lists when allowed, measured by
    ``probe``; the certified graph when they fall short. Records in ``fb`` (the
    ``stats["exact_fallback"]`` dict) which lists were kept. Returns ``(I, D, estimate)``."""
    if _near_allowed(device, im, target):
        I, D = _exact_graph(X, k, im, device, near=True)
        est = probe.recall(X, I)
        fb["near_exact_estimate"] = round(est, 5)
        if est >= target:
            fb["lists"] = "near_exact"
            return I, D, est
        logger.info("knn_graph: the near-exact lists estimate %.4f < target %.3f; building the certified "
                    "exact graph", est, target)
    I, D = _exact_graph(X, k, im, device)
    fb["lists"] = "exact"
    return I, D, probe.recall(X, I)


def _reach_target(X, I, D, k, im, metric, method, engine, params, seed, target, stats, probe=None):
    """Estimate the recall; below ``target`` continue the descent from the current lists with
    longer internal lists, up to TARGET_ROUNDS times (the issue: NN-Descent's update threshold
    stops well short of 0.99 on data of high intrinsic dimension). ``probe``: the estimator made
    before the descent (for its stall watch), else made here."""
    import dataclasses

    from ._estimate import RecallProbe

    t0 = time.perf_counter()
    # exact neighbours of the sample once, for every round's estimate
    if probe is None:
        probe = RecallProbe(X, k, im, estimate_rows(int(X.shape[0])), seed)
    est = probe.recall(X, I)
    if (stats.get("exact_fallback") or {}).get("lists") == "near_exact":  # (built before the descent)
        stats["exact_fallback"]["near_exact_estimate"] = round(est, 5)
    rounds = 0
    n = int(X.shape[0])
    device = device_of(X)
    cap = n - 1 if device == "cpu" else min(n - 1, 256)
    K = params.n_neighbors_internal or k
    exact_ok = exact_affordable(n, int(X.shape[1]), device)
    first = est
    if (est < target - EXACT_FALLBACK_GAP or "stalled" in stats) and exact_ok:
        rounds = TARGET_ROUNDS  # no continuation: straight to the exact graph below
    while est < target and rounds < TARGET_ROUNDS and K < cap:
        K = min(cap, int(K * TARGET_GROWTH) + 8)
        more = dataclasses.replace(params, n_neighbors_internal=K, sample=None, max_iters=None).resolve(
            k=k, n=n, device=device_of(X), metric=metric)
        I, D, st = engine(X, k, metric=im, params=more, seed=seed + rounds + 1, init_indices=I)
        rounds += 1
        stats["iterations"] = int(stats.get("iterations", 0)) + int(st.get("iterations", 0))
        stats["K"] = K
        est = probe.recall(X, I)
    if est < target and exact_ok:
        # the descent stalls short of the target on this data: the exact graph meets it (below the
        # target itself, not a tolerance under it: CPU tight clusters of 10 points, 100k x 64, ended
        # at 0.9888 when 0.005 short was accepted as the estimate's noise)
        logger.info("knn_graph: NN-Descent reached an estimated recall of %.3f (target %.3f); building the "
                    "exact graph instead (%d x %d)", est, target, n, int(X.shape[1]))
        fb = stats.get("exact_fallback") or {}
        # (a certified graph built before the descent that still fell short is kept as it is)
        if fb.get("lists") != "exact":
            if not fb.get("before_descent"):
                fb.update(descent_estimate=round(first, 5), after_rounds=round(est, 5))
            if "stalled" in stats:
                fb["descent_stopped_at_iteration"] = stats["stalled"]["iteration"]
            # a near-exact attempt that already fell short goes straight to the certified graph
            I, D, est = _checked_fallback(X, k, im, device, 1.0 if fb.get("lists") == "near_exact" else target,
                                          probe, fb)
            stats["exact_fallback"] = fb
    elif est < target - 0.005:
        logger.warning("knn_graph: estimated recall %.3f is below the target %.3f (the exact graph of %d x %d "
                       "is past the affordable size); pass a larger n_neighbors_internal or max_iters, "
                       "or method='brute'", est, target, n, int(X.shape[1]))
    stats["recall_estimate"] = round(est, 5)
    stats["target_recall"] = target
    stats["target_rounds"] = rounds
    stats["phase_s"]["target"] = time.perf_counter() - t0
    return I, D, stats


def build_lists(X, k, *, metric, method, params=None, seed=0, stall_below=None, stall_k=None, stall_max_work=None,
                stall_rows=None, intrinsic_dim=None, **engine_kw):
    """k-NN lists of prepared ``X`` (self excluded) by a registered graph method.

    Parameters
    ----------
    X : array (n, d)
        Prepared float32 data (numpy: CPU, cupy: GPU).
    k : int
        Neighbours per point, ``1 <= k <= n - 1``.
    metric : str
        USER metric (parameter objects resolve their defaults from it).
    method : Method
        From :func:`choose_method`.
    params : Params, optional
        The method's parameter object (default: its defaults); resolved here when it has a
        ``resolve`` method.
    stall_below : float, optional
        NN-Descent stops early when its estimated recall, extrapolated to convergence, stays below
        this (``stats["stalled"]``; the caller builds the exact lists). Default: the params'
        ``target_recall`` minus ``EXACT_FALLBACK_GAP`` (the level below which a finished descent
        goes straight to the exact graph). Only where the exact graph is affordable
        (``stall_max_work``: the limits of :func:`exact_affordable`). ``stall_k``: the recall@k
        it watches (default ``k``); ``stall_rows``: the probe's rows (default that of the recall
        estimate, :func:`estimate_rows`). Before the descent, data whose local intrinsic
        dimension is at least ``STALL_LID`` gets the stall verdict at once
        (``stats["stalled"]["before_descent"]``): with a recall target the exact lists are built
        here; without one (the index's candidates) ``I`` and ``D`` are None and the caller builds
        them.
    intrinsic_dim : float, optional
        The local intrinsic dimension of ``X`` at 20 neighbours when the caller has measured it
        (the index build); else it is estimated where the verdict above applies.

    Returns
    -------
    I, D, stats : ids (n, k), internal distances (n, k), dict of statistics. ``I`` and ``D`` are
        None only when ``stats["stalled"]["before_descent"]`` and the params have no recall target.
    """
    from .._core.metrics import internal_metric

    device = device_of(X)
    n = int(X.shape[0])
    params = params if params is not None else default_params(method)
    if hasattr(params, "resolve"):
        params = params.resolve(k=k, n=n, device=device, metric=metric)
    t0 = time.perf_counter()
    engine = method.load_engine()
    im = internal_metric(metric)
    target = getattr(params, "target_recall", None)
    probe = None
    estimable = n >= ESTIMATE_MIN_N and im in ("l2", "ip")  # (exact search serves l2, ip)
    if stall_below is None and target is not None and estimable:
        stall_below = target - EXACT_FALLBACK_GAP
    if (stall_below is not None and method.name == "nndescent" and estimable
            and exact_affordable(n, int(X.shape[1]), device, max_work=stall_max_work)):
        from ._estimate import RecallProbe, StallWatch

        skip = _stall_foreseen(X, seed, intrinsic_dim, stall_below, t0)
        if skip is not None:
            stats = {"method": method.name, "device": device, "iterations": 0, "updates": [], "time_s": [],
                     "stalled": skip, "phase_s": {"intrinsic_dim": skip.pop("_s")}}
            if target is None:
                return None, None, stats  # the caller builds the exact lists (see Returns)
            near = _near_allowed(device, im, target)
            I, D = _exact_graph(X, k, im, device, near=near)
            stats["exact_fallback"] = {"descent_estimate": None, "after_rounds": None, "before_descent": True,
                                       "intrinsic_dim": skip["intrinsic_dim"],
                                       "lists": "near_exact" if near else "exact"}
            stats["phase_s"]["brute"] = time.perf_counter() - t0
            return _target_stats(X, I, D, k, im, metric, method, engine, params, seed, target, stats)
        # made before the descent (the same sample and seed the target check uses after it) so
        # that a descent bound to end far below the target stops early for the exact graph
        probe = RecallProbe(X, min(k, stall_k or k), im, min(n, stall_rows or estimate_rows(n)), seed)
        engine_kw["watch"] = StallWatch(probe, X, stall_below)
    I, D, st = engine(X, k, metric=im, params=params, seed=seed, **engine_kw)
    stats = {"method": method.name, "device": device}
    stats.update(st)
    stats.setdefault("phase_s", {})
    stats["phase_s"].setdefault(method.name if method.name == "brute" else "engine", time.perf_counter() - t0)
    if target is not None and estimable:
        return _target_stats(X, I, D, k, im, metric, method, engine, params, seed, target, stats,
                             probe=probe if probe is not None and probe.K == k and stall_rows is None else None)
    if method.name == "brute":
        stats.update(iterations=0, updates=[], time_s=[])
    return I, D, stats


def _target_stats(X, I, D, k, im, metric, method, engine, params, seed, target, stats, probe=None):
    """:func:`_reach_target`, whose failure keeps the lists (and says so in ``stats``)."""
    try:
        I, D, stats = _reach_target(X, I, D, k, im, metric, method, engine, params, seed, target, stats, probe=probe)
    except Exception as e:  # the estimate is a refinement: a failure must not cost the graph
        logger.warning("knn_graph: the recall estimate failed (%s: %s); the lists are the first descent's",
                       type(e).__name__, e)
        stats["recall_estimate"] = None
        stats["recall_estimate_error"] = f"{type(e).__name__}: {e}"
    if method.name == "brute":
        stats.update(iterations=0, updates=[], time_s=[])
    return I, D, stats


def _stall_foreseen(X, seed, intrinsic_dim, level, t0):
    """The stall verdict given before the descent (``stats["stalled"]`` with ``before_descent``)
    when the local intrinsic dimension (``intrinsic_dim``, else estimated here) is at least
    ``STALL_LID``; None otherwise, or when the estimate fails (the descent and its watch decide)."""
    from ._estimate import estimate_intrinsic_dim

    lid = intrinsic_dim
    if lid is None:
        try:
            lid = estimate_intrinsic_dim(X, random_state=seed)
        except Exception as e:  # a refinement: the stall watch still decides
            logger.warning("knn_graph: the intrinsic-dimension estimate failed (%s: %s)", type(e).__name__, e)
            return None
    if lid is None or not lid >= STALL_LID:  # (nan: too few distinct points)
        return None
    logger.info("knn_graph: local intrinsic dimension %.1f >= %.0f: NN-Descent would stall here; building the "
                "exact lists (%d x %d)", lid, STALL_LID, int(X.shape[0]), int(X.shape[1]))
    return {"iteration": None, "before_descent": True, "intrinsic_dim": round(float(lid), 2), "recall_estimate": None,
            "predicted": None, "level": level, "_s": time.perf_counter() - t0}
