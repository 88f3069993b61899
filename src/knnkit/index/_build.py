"""Build orchestration: candidate k-NN graph -> fixed out-degree search graph -> entry points.

Steps (device-agnostic where the array code allows it):

1. a k-NN graph of degree ``intermediate_degree`` (>= R): NN-Descent (the graph engine)
   or exact brute force;
2. diversification to out-degree R, either

   * ``"prune"``: RobustPrune of every node's candidates (Vamana, as BANG's graphs), then the
     reverse of every kept edge is added, re-pruning the lists that overflow R; or
   * ``"ggnn"``: GGNN section 5.2: R/2 nearest neighbours plus up to R/2 reverse links requested
     where a small local search finds no path back;

3. entry points (coarse k-means medoids, :mod:`._entry`).

On the GPU (:func:`build_graph_gpu`) steps 1-2 ("prune") stay on the device: the candidate
distances come with the NN-Descent lists, RobustPrune is ``prune.cu`` and the reverse edges
are ``_reverse_gpu.py``; nothing of size n x K goes through the host.
"""

import time

import numpy as np

from .._core.config import logger
from .._core.backend import as_host, get_array_module, twin
from ..exact import knn_lists
from ..graph import EXACT_FALLBACK_MAX_WORK, build_lists, choose_method, exact_affordable
from ..graph.nndescent import NNDescentParams
from ._prune_cpu import (add_reverse_edges, changed_without, ggnn_diversify, mark_row_differences, pair_distances,
                         prune_cpu)

__all__ = ["exact_knn_cpu", "candidate_graph", "candidate_graph_gpu", "diversify", "nn1_max",
           "build_graph_gpu"]


def nn1_max(X, cand_dist, metric, *, xnorm_max=None):
    """GGNN's ``d_nn1+``: the largest distance of a point to its nearest neighbour, on the slack
    criterion's scale (Euclidean for 'l2'; ``sqrt(d + |x| max|x|)`` for 'ip', see ``_search_cpu``).

    ``X`` holds the rows of ``cand_dist``; ``xnorm_max`` (default: from ``X``) is ``max |x|`` over
    the whole data."""
    if get_array_module(cand_dist) is not np:
        return _nn1_max_gpu(X, cand_dist, metric, xnorm_max)
    d1 = np.min(cand_dist, axis=1).astype(np.float64)
    if metric == "ip":
        xn = np.sqrt(np.einsum("ij,ij->i", X, X)).astype(np.float64)
        d1 = d1 + xn * (xn.max() if xnorm_max is None else float(xnorm_max))
    d1 = d1[np.isfinite(d1)]
    return float(np.sqrt(np.maximum(d1, 0).max())) if d1.size else float("inf")


def _nn1_max_gpu(X, cand_dist, metric, xnorm_max=None, xn2=None):
    import cupy as cp

    d1 = cp.min(cand_dist, axis=1).astype(cp.float64)
    if metric == "ip":
        xn = cp.sqrt((X * X).sum(axis=1) if xn2 is None else xn2).astype(cp.float64)
        d1 = d1 + xn * (xn.max() if xnorm_max is None else float(xnorm_max))
    d1 = d1[cp.isfinite(d1)]
    return float(cp.sqrt(cp.maximum(d1, 0).max())) if d1.size else float("inf")


def exact_knn_cpu(X, Q, k, metric, *, exclude_self=False):
    """Exact internal-metric k-NN of Q in X on the CPU: the exact engine (:func:`knnkit.exact.knn_lists`,
    rows by (distance, id), its rounding certificate).

    Returns ``(dist float32 (nq, k), idx int64 (nq, k))``. With ``exclude_self`` Q must be X and
    each row omits itself (the engine tiles by its own memory budget).

    This was a GEMM expansion |x|^2 - 2 q.x + |q|^2 of its own, with no certificate: data whose
    common offset is large against its spread (every coordinate of 3k x 16 Gaussian data shifted
    by 1e4) cancelled in float32, the candidate lists were almost all wrong (0.05 % equal to the
    exact ones) and so was the search graph built from them: recall 0.64 at beam 64 against 1.0
    for the same data centred (twenty-fourth session).
    """
    X = np.ascontiguousarray(X, dtype=np.float32)
    Q = X if Q is X else np.ascontiguousarray(Q, dtype=np.float32)
    dist, idx, _ = knn_lists(X, Q, int(k), metric=metric, exclude_self=bool(exclude_self))
    return np.asarray(dist, dtype=np.float32), np.asarray(idx, dtype=np.int64)


# ----------------------------------------------------------------------- repeated rows (copies)
# A row with many identical copies fills its whole candidate list with them (skin, 245k RGB
# points of which 51k are distinct, up to thousands of copies each): after pruning such a group
# has almost no links out and few in, and a walk rarely enters it (CPU, skin 244k: recall 0.67
# at beam 64, 0.94 at beam 2048; 41 components each holding copies). So the candidate lists are
# computed on the distinct rows, every copy takes its distinct row's list (mapped to the groups'
# smallest ids, so links point at one member of each group), and after the graph is built each
# copy gets one link to the next copy of its group (a cycle), through which a walk that reached
# any member lists the others. Sweet KNN's grouping (exact/sweet, identical float32 bit patterns,
# gated by the sampled mean number of copies) finds the groups on either device.

def distinct_groups(X, random_state):
    """``(U, inv, uoff, uidx)`` of the identical rows of prepared ``X`` (see
    ``knnkit.exact.sweet._cpu._find_duplicates``), or None when copies are rare."""
    xp = get_array_module(X)
    rng = np.random.default_rng(np.random.SeedSequence([0xC0B1E5, _seed(random_state) & 0xFFFFFFFF]))
    sweet = twin("knnkit.exact.sweet", "cpu" if xp is np else "gpu")
    return sweet._find_duplicates(xp.ascontiguousarray(X, dtype=xp.float32), rng)


def copy_cycle(groups, n):
    """Next copy of every row in its group (ascending ids, the last back to the first); -1 for a
    row without copies. Same array module as the groups."""
    _U, _inv, uoff, uidx = groups
    xp = get_array_module(uoff)
    uidx = uidx.astype(xp.int64)
    size = xp.diff(uoff)
    start = xp.repeat(uoff[:-1], size.astype(xp.int64))     # group start of each sorted position
    end = xp.repeat(uoff[1:], size.astype(xp.int64))
    pos = xp.arange(n, dtype=xp.int64)
    nxt = xp.where(pos + 1 < end, pos + 1, start)
    out = xp.full(n, -1, xp.int64)
    out[uidx] = xp.where(end - start > 1, uidx[nxt], -1)
    return out


def candidates_on_distinct(X, K, metric, random_state, build):
    """``build(Xs, K)`` -> (ids, dist) candidate lists, computed on the distinct rows of ``X`` when
    copies are common; returns ``(ids, dist, cycle)`` in the original ids, ``cycle`` from
    :func:`copy_cycle` or None. Any internal metric: a copy is never among the candidates (the
    cycle links it after the build), and every copy scores alike against any query (inner
    product, 300 points x 100 copies: 46 components and recall 0.895 without it)."""
    n = int(X.shape[0])
    if metric not in ("l2", "ip") or n < 64:
        return (*build(X, K), None)
    groups = distinct_groups(X, random_state)
    if groups is None or int(groups[0].shape[0]) <= K + 1:
        # no copies worth merging, or so few distinct rows that a list cannot hold K of them
        return (*build(X, K), None)
    U, inv, uoff, uidx = groups
    logger.info("GraphIndex: %d rows, %d distinct: candidate lists built on the distinct rows", n, int(U.shape[0]))
    cu, du = build(U, K)
    # expanded where the lists came back (a host build of device data: the host), so only the
    # n-long group tables move, never the (n, K) lists
    xp = get_array_module(cu)
    move = as_host if xp is np else xp.asarray
    rep = move(uidx[uoff[:-1]]).astype(xp.int64)           # smallest original id of each group
    inv = move(inv).astype(xp.int64)
    ids = rep[cu.astype(xp.int64)][inv]
    return ids, du[inv], copy_cycle(groups, n)


def link_copies(g, cycle):
    """The last slot of every row with copies -> its next copy (see :func:`copy_cycle`), in place."""
    if cycle is None:
        return g
    xp = get_array_module(g)
    cycle = xp.asarray(cycle)
    rows = xp.nonzero(cycle >= 0)[0]
    g[rows, g.shape[1] - 1] = cycle[rows].astype(g.dtype)
    return g


def candidate_graph(X, K, metric, *, build_algo="nndescent", device="cpu", random_state=None, intrinsic_dim=None,
                    user_metric=None, stats=None):
    """Candidate lists with their distances, as host numpy arrays: ``(idx int64 (n, K), dist
    float32 (n, K))``, self excluded, ``dist`` in the internal metric.

    ``build_algo="nndescent"`` uses the graph engine (:func:`candidate_lists`) and falls back to
    exact brute force (logged) otherwise; ``"brute"`` is exact. The distances are the ones the
    search computed (converted to the internal metric), not computed again. ``stats`` (a dict)
    receives ``method`` and, where it was estimated, the descent's ``recall_estimate``.
    ``intrinsic_dim``: the data's local intrinsic dimension when measured (see
    :func:`candidate_lists`).
    """
    n = X.shape[0]
    K = min(K, n - 1)
    user = _user_metric_for(metric, user_metric)
    stats = {} if stats is None else stats
    stats["method"] = "brute"
    if build_algo == "nndescent" and n > 4096:
        try:
            # the search graph needs good candidates, not a 0.99-recall K-NN graph: build with the
            # list length K itself instead of knn_graph's longer default (1M x 128 on an H200:
            # 3.5 s with K=128 internal lists for K=64)
            # refine_hubs=False: the hub refinement returns exact inner-product lists made of hubs
            # only, which would cut the search graph's links to everyone else
            # target_recall=None: RobustPrune keeps a few of K candidates; a 0.99 graph costs rounds for nothing
            # delta=0.01 (as candidate_graph_gpu; 0.04 on the CPU) instead of 0.001: the rounds past it refine list
            # tails that RobustPrune drops (100k x 64, 1,000 tight clusters, K 64: the third round
            # joined 65M pairs, ~40 % of the descent, for 6 inserts)
            idx, dist, st = candidate_lists(X, K, user, random_state,
                                            NNDescentParams(n_neighbors_internal=K, refine_hubs=False,
                                                            target_recall=None,
                                                            delta=INDEX_DELTA_CPU if device == "cpu" else INDEX_DELTA),
                                            with_stats=True, stall_below=CANDIDATE_EXACT_BELOW,
                                            intrinsic_dim=intrinsic_dim)
            idx = None if idx is None else _host_array(idx, np.int64)  # None: stall foreseen, no descent
            if idx is not None and idx.shape == (n, K) and st.get("method") == "brute":
                # exact lists (below INDEX_BRUTE_MAX_N): nothing for a recall estimate to decide
                stats["method"] = "brute"
                return idx, _host_array(dist, np.float32)
            est, stalled = _stall_verdict(np.asarray(X, dtype=np.float32), idx, metric, st, random_state)
            if est is not None:
                stats["recall_estimate"] = round(est, 4)
            if not stalled and idx.shape == (n, K):
                stats["method"] = st.get("method") or "nndescent"  # (exact below INDEX_BRUTE_MAX_N)
                return idx, _host_array(dist, np.float32)
            if stalled:
                stats["method"] = "brute (NN-Descent stalled)"
                logger.info("NN-Descent candidates reach an estimated recall@10 of %.3f; building them exactly", est)
                if device != "gpu":
                    # knnkit's exact CPU engine (one BLAS thread per core, Numba selection): 50k x 960,
                    # K 96 on two loaded cores 44 s where the NumPy blocks below took 112 s
                    from ..exact._cpu import knn_cpu

                    Xh = np.ascontiguousarray(as_host(X), dtype=np.float32)
                    d, idx = knn_cpu(Xh, Xh, K, metric, True)
                    return np.ascontiguousarray(idx, dtype=np.int64), np.ascontiguousarray(d, dtype=np.float32)
            else:
                logger.warning("candidate lists have shape %s, expected %s; using brute force", idx.shape, (n, K))
        except Exception as e:  # a failing optional path must not break the index build
            logger.warning("NN-Descent candidates failed (%s); building the candidate graph exactly", e)
    if device == "gpu":
        try:
            import cupy

            d, idx, _ = knn_lists(cupy.asarray(X), cupy.asarray(X), K, metric=metric, exclude_self=True)
            idx = _host_array(idx, np.int64)
            if idx.shape == (n, K):
                return idx, _host_array(d, np.float32)
        except (ImportError, RuntimeError) as e:
            logger.warning("GPU brute force not available (%s); exact candidate graph on the CPU", e)
    Xh = np.ascontiguousarray(as_host(X))
    d, idx = exact_knn_cpu(Xh, Xh, K, metric, exclude_self=True)
    return idx, d


def candidate_graph_gpu(X, K, metric, *, build_algo="nndescent", random_state=None, knn_params=None,
                        stats=None, intrinsic_dim=None):
    """Candidate lists on the GPU with their distances: ``(idx int32 (n, K), dist float32 (n, K))``
    cupy arrays, ``dist`` in the internal metric (``'ip'``: minus the inner product).

    ``X`` is the prepared cupy data (cosine: unit rows, so the inner product ranks the same).
    ``knn_params``: extra fields of :class:`NNDescentParams` (``delta``, ``max_iters``,
    ``sample``); ``stats`` (a dict) receives the NN-Descent statistics.
    """
    import cupy as cp

    n = X.shape[0]
    K = min(K, n - 1)
    user = "inner_product" if metric == "ip" else "sqeuclidean"
    if build_algo == "nndescent" and n > 4096:
        try:
            # list length K itself (see candidate_graph)
            # delta 0.01 instead of knn_graph's 0.001: the last iterations refine list tails that
            # RobustPrune drops anyway (1M x 128 / 1M x 96 on an H200: 13 / 17 iterations instead of
            # 17 / 21, -0.05 s each, search recall at beam 32 / 64 unchanged within +-0.0006)
            params = dict(delta=0.01, refine_hubs=False, target_recall=None)  # see candidate_graph
            params.update(knn_params or {})
            idx, dist, st = candidate_lists(X, K, user, random_state,
                                            NNDescentParams(n_neighbors_internal=K, **params), with_stats=True,
                                            stall_below=CANDIDATE_EXACT_BELOW, intrinsic_dim=intrinsic_dim)
            if stats is not None:
                stats.update({k: st.get(k) for k in ("method", "iterations", "updates", "time_s", "K", "sample",
                                                     "stalled")})
            est, stalled = _stall_verdict(X, idx, metric, st, random_state)
            if stats is not None and est is not None:
                stats["candidate_recall_estimate"] = round(est, 4)
            if not stalled and idx.shape == (n, K) and isinstance(idx, cp.ndarray):
                return (cp.ascontiguousarray(idx, dtype=cp.int32), cp.ascontiguousarray(dist, dtype=cp.float32))
            if stalled:
                logger.info("NN-Descent candidates reach an estimated recall@10 of %.3f; building them exactly", est)
                if stats is not None:
                    stats["method"] = "brute (NN-Descent stalled)"
                from ..exact._gpu import knn_gpu

                # fp16 tensor-core GEMM keeping K candidates per row, re-ranked with exact
                # distances, no certificate: a candidate list only needs to be near-exact (a swap
                # at the K-th place between keys closer than the fp16 rounding changes nothing the
                # pruning can see), and the certified mode's 4K candidates per row made this the
                # slowest step of the build (broad 1M x 128 on an H200: 4.2 s for K = 96)
                dist, idx = knn_gpu(X, X, K, metric, True, precision="fp16_rerank", certify_rows=False)
                if metric == "l2":
                    dist = cp.maximum(dist, 0)
                return cp.ascontiguousarray(idx, dtype=cp.int32), cp.ascontiguousarray(dist, dtype=cp.float32)
            logger.warning("candidate lists have shape %s, expected %s; using brute force", idx.shape, (n, K))
        except Exception as e:  # a failing optional path must not break the index build
            logger.warning("NN-Descent candidates failed (%s); building the candidate graph exactly", e)
    dist, idx, _ = knn_lists(X, X, K, metric=metric, exclude_self=True)
    return cp.ascontiguousarray(idx, dtype=cp.int32), cp.ascontiguousarray(dist, dtype=cp.float32)


#: NN-Descent candidates whose estimated recall@10 is below this are replaced by exact ones where
#: affordable (:func:`knnkit.graph.exact_affordable`): on data of high intrinsic dimension the
#: descent stalls (1M x 96 broad clusters: ~0.7 with 96-long lists) and no pruning or beam makes up
#: for candidates that are not there (calibrated recall 0.92 at beam 512).
CANDIDATE_EXACT_BELOW = 0.9
#: ... and this much exact work (n * n * d) at most, knn_graph's own limit on both devices. The CPU
#: kept a fixed 2e11 until 2026-11-26 ("a search graph from stalled candidates still reaches its
#: recall by beam"): uniform 960-d, 50k, did not -- NN-Descent's 96-long lists had recall@10 0.56,
#: the search graph made from them stopped at 0.989 at beam 2048 where the exact candidates (the
#: GPU index's, and the CPU's now) give 0.996 (hnswlib M 16 / 32, efc 200: 0.943 / 0.993).
CANDIDATE_EXACT_MAX_WORK = EXACT_FALLBACK_MAX_WORK


#: Rows of the candidate recall estimate. The CPU takes fewer: its exact neighbours of the sample
#: are the estimate's cost, paid by every build in the affordable range (100k x 64 tight clusters,
#: float64 certificate fallback: 0.9-1.3 s for 1,000 rows, 0.2 s for 250, of a 5 s build), and the
#: decision is coarse (stalled descents estimated 0.56 / 0.76, the others >= 0.98).
CANDIDATE_PROBE_ROWS = {"cpu": 250, "gpu": 1000}


def _candidates_stalled(X, idx, metric, seed):
    """Estimated recall@10 of candidate lists ``idx`` (prepared ``X``, internal ``metric``) on a
    sample of ``CANDIDATE_PROBE_ROWS`` rows, and whether it is below ``CANDIDATE_EXACT_BELOW`` with the exact
    candidate graph affordable."""
    from ..graph._estimate import RecallProbe

    n, d = int(X.shape[0]), int(X.shape[1])
    xp = get_array_module(X)
    if n < 4000 or metric not in ("l2", "ip") or not exact_affordable(n, d, "cpu" if xp is np else "gpu",
                                                                      max_work=CANDIDATE_EXACT_MAX_WORK):
        return None, False
    try:
        probe = RecallProbe(X, min(10, idx.shape[1]), metric, CANDIDATE_PROBE_ROWS["cpu" if xp is np else "gpu"], seed)
        est = float(probe.recall(X, xp.asarray(idx)))
    except Exception as e:  # the estimate is a refinement; the descent's candidates stay
        logger.warning("candidate recall estimate failed (%s: %s)", type(e).__name__, e)
        return None, False
    return est, est < CANDIDATE_EXACT_BELOW


def _stall_verdict(X, idx, metric, st, random_state):
    """``(estimate, stalled)`` of NN-Descent candidate lists ``idx`` whose descent statistics are
    ``st``: the stall watch's verdict when it stopped the descent, its last estimate when it
    watched to the end (the same probe rows and seed as :func:`_candidates_stalled`, the same
    lists), else :func:`_candidates_stalled`'s own estimate."""
    if "stalled" in st:  # stopped early (or not started): bound to end below CANDIDATE_EXACT_BELOW
        return st["stalled"]["recall_estimate"], True
    last = st.get("watch_recall")
    if last is not None:
        return last, last < CANDIDATE_EXACT_BELOW
    return _candidates_stalled(X, idx, metric, _seed(random_state))


#: NN-Descent's stop rule for the search graph's candidates (fewer than ``delta * n * K`` updates
#: in a round): coarser than knn_graph's 0.001 (see candidate_graph). The GPU's rounds are cheap.
INDEX_DELTA = 0.01
#: ... on the CPU, where a round of the descent costs 0.7-2 s at 100k on two cores: the last round
#: before 0.04 updated 0.2-1.2 % of the list entries. Paired in one process (10 NN-Descent suite
#: sets, 100k, `benchmarks/cpu_index_delta_ab.py`): one round fewer on SIFT-like (21.5 -> 19.7 s),
#: Fashion-MNIST (18.4 -> 16.8 s), tight_c1000 (8.9 -> 7.1 s), two on uniform 32-d (19.2 -> 17.5 s),
#: the others equal; recall@10 of the suite's queries at beam 64 within 0.0006 except SIFT-like
#: (0.9999 -> 0.9979; its calibrated curve unchanged, 0.9946). Unseen generators at 100k (glove-like
#: cosine, bag-of-words, Zipf clusters, Student-t, Poisson, row scales, offset): default-beam recall
#: within 0.0023 (300 queries each) (`benchmarks/results/cpu/index_delta_ab_2026-11-30_s31.txt`).
INDEX_DELTA_CPU = 0.04

#: The search graph's candidates are exact up to these sizes (cheap there, and exact candidates
#: make better search graphs than NN-Descent's; measured before knn_graph's own limit moved).
INDEX_BRUTE_MAX_N = {"cpu": 20_000, "gpu": 100_000}


def _seed(random_state):
    from .._core.random import seed_from

    return seed_from(random_state)


def candidate_lists(X, K, user_metric, random_state, params, with_stats=False, stall_below=None, intrinsic_dim=None):
    """K-NN candidate lists of prepared ``X`` by the graph engine (NN-Descent above the exact
    graph's size threshold, as ``knn_graph(method="auto")``): ids and INTERNAL distances.
    ``stall_below``: stop a descent bound to end below this estimated recall@10 where the exact
    candidate graph is affordable (``CANDIDATE_EXACT_MAX_WORK``); ``stats["stalled"]`` says so. When
    it says so before the descent (``intrinsic_dim``, or its estimate, at least
    :data:`knnkit.graph.STALL_LID`), the lists are None: the caller builds them exactly."""
    from .._core.backend import device_of
    from .._core.random import seed_from

    method = choose_method("auto", int(X.shape[0]), device_of(X), user_metric, brute_max_n=INDEX_BRUTE_MAX_N)
    stall = {} if stall_below is None else dict(stall_below=stall_below, stall_k=10, stall_max_work=CANDIDATE_EXACT_MAX_WORK,
                                                stall_rows=CANDIDATE_PROBE_ROWS[device_of(X)])
    I, D, st = build_lists(X, K, metric=user_metric, method=method,
                           params=params if method.name == "nndescent" else None, seed=seed_from(random_state),
                           intrinsic_dim=intrinsic_dim, **stall)
    if user_metric == "sqeuclidean" and D is not None:  # as knn_graph's result: no negative rounding residue
        xp = get_array_module(D)
        D = xp.maximum(D, 0, out=D)
    return (I, D, st) if with_stats else (I, D)


def build_graph_gpu(X, R, K, metric, *, alpha=1.2, build_algo="nndescent", random_state=None,
                    reverse_cap=None, timings=None, knn_params=None, stats=None, on_stage=None, intrinsic_dim=None):
    """The RobustPrune search graph of ``X`` built entirely on the GPU.

    NN-Descent candidates (K per node, with distances) -> RobustPrune to ``R`` with fill ->
    reverse edges (the nearest ``reverse_cap`` new ones per node, default ``R``) re-pruned to
    ``R``. Same rule as the CPU path (``candidate_graph`` + ``diversify``).

    Parameters
    ----------
    X : cupy.ndarray, float32 (n, d)
        Prepared vectors (``prepare_vectors``).
    R, K : int
        Out-degree and candidate-list length (both ``<= n - 1``).
    metric : {"l2", "ip"}
        Internal metric.
    alpha : float
        RobustPrune slack.
    build_algo : {"nndescent", "brute"}
    random_state : None or int
    reverse_cap : int, optional
    on_stage : callable, optional
        Called with each stage's name ("candidates", "nn1_max", "prune", "reverse") once it is done
        (after the stage's synchronisation, which the timings take anyway).
    timings : dict, optional
        Filled with the seconds of each phase (GPU-synchronised).
    knn_params, stats, intrinsic_dim : optional
        See :func:`candidate_graph_gpu` (``intrinsic_dim``: the data's, when measured; see
        :func:`candidate_lists`).

    Returns
    -------
    graph : cupy.ndarray, int32 (n, R)
    nn1_max : float
        GGNN's ``d_nn1+`` (see :func:`nn1_max`).

    Examples
    --------
    >>> import cupy as cp  # doctest: +SKIP
    >>> X = cp.random.rand(20000, 32, dtype=cp.float32)  # doctest: +SKIP
    >>> g, nn1 = build_graph_gpu(X, 16, 32, "l2")  # doctest: +SKIP
    """
    import cupy as cp

    from ._prune_gpu import prune_gpu
    from ._reverse_gpu import add_reverse_edges_gpu

    timings = {} if timings is None else timings
    t0 = [time.perf_counter()]

    def mark(name):
        cp.cuda.get_current_stream().synchronize()
        t = time.perf_counter()
        timings[name] = timings.get(name, 0.0) + t - t0[0]
        t0[0] = t
        if on_stage is not None:
            on_stage(name)

    n = X.shape[0]
    cand, cand_d, cycle = candidates_on_distinct(
        X, K, metric, random_state,
        lambda Xs, k: candidate_graph_gpu(Xs, k, metric, build_algo=build_algo, random_state=random_state,
                                          knn_params=knn_params, stats=stats, intrinsic_dim=intrinsic_dim))
    cand = cp.ascontiguousarray(cand, dtype=cp.int32)
    cand_d = cp.ascontiguousarray(cand_d, dtype=cp.float32)
    mark("candidates")
    xn2 = (X * X).sum(axis=1) if metric == "ip" else None
    shift = float(xn2.max()) if metric == "ip" else 0.0
    nn1 = _nn1_max_gpu(X, cand_d, metric, xn2=xn2)
    del xn2
    mark("nn1_max")
    if SKIP_PRUNE_WHEN_ALL_KEPT and n > 1 and cand.shape[1] <= R:
        # RobustPrune with fill keeps every candidate of a list no longer than R (distinct ids,
        # never the node itself: NN-Descent's and the exact lists'), so the first prune would
        # only reorder the lists: kept edges, then filled ones. Nothing reads that order: the
        # reverse-edge stage prunes every row again over [list | reverse edges], ranked by distance
        # (and drops ids repeated or equal to the node there). The GPU's top tier (K = R = 128)
        # saved the call: broad 1M x 128 0.17 s of a 2.4 s build.
        g = cand
        gd = cp.where(cand < 0, cp.float32(cp.inf), cand_d)
        if cand.shape[1] < R:
            pad = R - cand.shape[1]
            g = cp.concatenate([g, cp.full((n, pad), -1, cp.int32)], axis=1)
            gd = cp.concatenate([gd, cp.full((n, pad), cp.inf, cp.float32)], axis=1)
    else:
        g, gd = prune_gpu(X, cand, cand_d, R, alpha, metric, shift=shift, return_distances=True)
    del cand, cand_d
    mark("prune")
    if n > 1:
        rst = {}
        g = add_reverse_edges_gpu(X, g, gd, R, alpha, metric, cap=reverse_cap, shift=shift, stats=rst)
        if stats is not None:
            stats["reverse"] = rst
    del gd
    g = link_copies(g, cycle)
    mark("reverse")
    return g, nn1


#: ``build_graph_gpu`` skips its first RobustPrune when no candidate list is longer than R (it
#: would keep them all; the reverse-edge stage prunes every row anyway). Off only for the A/B of
#: ``benchmarks/build_flag_ab.py --flag allkept`` (graphs must be identical).
SKIP_PRUNE_WHEN_ALL_KEPT = True


def _host_array(a, dtype):
    """A host numpy copy of an engine's array (numpy or cupy)."""
    return np.ascontiguousarray(as_host(a)).astype(dtype, copy=False)


def _user_metric_for(internal, user_metric):
    if user_metric is not None:
        # cosine data is already unit-normalised: its inner product ranks the same
        return "inner_product" if user_metric == "cosine" else user_metric
    return "inner_product" if internal == "ip" else "sqeuclidean"


def _prune_dispatch(X, cand_idx, cand_dist, R, alpha, metric, device):
    if device == "gpu":
        try:
            import cupy

            return as_host(twin(__package__, "gpu").prune(cupy.asarray(X), cupy.asarray(cand_idx),
                                                         cupy.asarray(cand_dist), R, alpha, metric))
        except (ImportError, RuntimeError) as e:
            logger.warning("GPU pruning is not available (%s); pruning on the CPU", e)
    return twin(__package__, "cpu").prune(as_host(X), cand_idx, cand_dist, R, alpha, metric)


def diversify(X, cand_idx, R, metric, *, alpha=1.2, method="prune", device="cpu", cand_dist=None, first_out=None):
    """Turn candidate lists (n, K) into a fixed out-degree (n, R) int32 graph (host numpy).

    ``X`` is the prepared float32 data (numpy, or cupy when ``device == "gpu"``). ``first_out``
    (a dict, method "prune"): receives ``"graph"``, the first prune before the reverse edges (what
    :func:`diversify_without` starts from).
    """
    Xh = np.ascontiguousarray(as_host(X))
    cand_idx = np.ascontiguousarray(cand_idx, dtype=np.int64)
    if cand_dist is None:
        cand_dist = pair_distances(Xh, cand_idx, metric)
    if method == "ggnn":
        order = np.argsort(cand_dist, axis=1, kind="stable")
        cand_idx = np.take_along_axis(cand_idx, order, axis=1)
        return ggnn_diversify(Xh, cand_idx, None, R, metric)
    if method != "prune":
        raise ValueError(f"diversify must be 'prune' or 'ggnn', got {method!r}")
    g = _prune_dispatch(X, cand_idx, cand_dist, R, alpha, metric, device)
    if first_out is not None:
        first_out["graph"] = g
    return add_reverse_edges(Xh, g, R, alpha, metric)


def _without(cand, cand_dist, rows):
    """Host candidate lists and distances with the points ``rows`` taken out: their own lists
    emptied and every entry naming one of them dropped (id -1, distance +inf)."""
    out = np.ascontiguousarray(cand, dtype=np.int64).copy()
    dist = np.ascontiguousarray(cand_dist, dtype=np.float32).copy()
    gone = np.zeros(out.shape[0], dtype=bool)
    gone[rows] = True
    drop = (out >= 0) & gone[np.maximum(out, 0)]
    drop[rows] = True
    out[drop] = -1
    dist[drop] = np.inf
    return out, dist


def diversify_without(X, cand_idx, cand_dist, rows, first, final, R, metric, *, alpha=1.2):
    """``diversify(..., method="prune")`` (CPU) of the candidate lists with the points ``rows``
    taken out (:func:`_without`: the calibration's hold-out graph), computed
    from the full build's first prune ``first`` and result ``final`` by redoing only what changes:
    the first prune of the rows whose lists held one of ``rows`` (and ``rows`` themselves), and the
    reverse-edge merge of the rows whose own list or set of in-links changed (the changed rows and
    their old and new out-neighbours). Every other row's inputs are the full build's, in the same
    order, so the result equals ``diversify`` of the reduced lists (checked in the tests)."""
    Xh = np.ascontiguousarray(as_host(X))
    cand_idx = np.ascontiguousarray(cand_idx, dtype=np.int64)
    n = cand_idx.shape[0]
    # the rows _without changes (a held-out row's own list is emptied), as it changes them
    changed, hc, hd = changed_without(cand_idx, cand_dist, rows)
    # of those, only the rows whose first prune KEPT a held-out point (or are held out) prune
    # differently: RobustPrune's decisions depend on the kept candidates alone, so a candidate it
    # rejected (or never reached, or passed over in the fill) leaves the result as it is when it is
    # taken out. 100k x 144 candidates, 500 rows out: ~2/3 of the rows hold one in their candidates,
    # ~1/5 in their first prune
    gone = np.zeros(n, dtype=bool)
    gone[np.asarray(rows, np.int64)] = True
    fc = first[changed]
    need = gone[changed] | ((fc >= 0) & gone[np.maximum(fc, 0)]).any(axis=1)
    changed, hc, hd = changed[need], hc[need], hd[need]
    first_h = first.copy()
    first_h[changed] = prune_cpu(Xh, hc, hd, R, alpha, metric, node_ids=changed)
    # the rows whose merge changes: the changed rows (their own lists) and the points a changed
    # row's list gained or lost (their in-links); a point in both of its lists keeps the same
    # in-link set, whose order (by source id) is the same too. The CPU denser tier's hold-out
    # graph (SIFT-like 100k, 144 candidates, R 48): 36k such rows where the union of the changed
    # rows' lists held 72k
    mark = np.zeros(n, dtype=bool)
    mark[changed] = True
    mark_row_differences(np.ascontiguousarray(first[changed]), np.ascontiguousarray(first_h[changed]), mark)
    touched = np.flatnonzero(mark)
    counts = np.bincount(first_h[first_h >= 0].ravel(), minlength=n)
    merge = touched[counts[touched] > 0]   # rows add_reverse_edges merges (they have in-links)
    keep = touched[counts[touched] == 0]   # rows it leaves as the first prune gave them
    out = np.array(final, dtype=np.int32, copy=True)
    if merge.size:
        out[merge] = add_reverse_edges(Xh, first_h, R, alpha, metric, rows=merge.astype(np.int64))[merge]
    out[keep] = first_h[keep]
    return out
