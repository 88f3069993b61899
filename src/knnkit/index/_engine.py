"""The search-index engine: :class:`SearchGraph` holds a built index's prepared arrays and does
the work behind :class:`knnkit.GraphIndex` (build, search, extend, arrays for saving).

Build: k-NN graph (NN-Descent or exact) -> diversification (RobustPrune + reverse edges, or GGNN
symmetric links) -> k-means entry points. Search: best-first beam search with the GGNN slack
stop, one query per GPU thread block (``_search_gpu``) or per CPU thread (``_search_cpu``).
Inputs are validated by the facade; nothing here checks them again.
"""


import numpy as np

from .._core.config import get_memory_budget, logger
from .._core.backend import as_host, cupy_or_none, get_array_module, twin
from .._core.metrics import internal_metric, prepare_vectors
from ..graph.nndescent import default_update
from ._auto import CPU_SCALE_GAP_EXACT_K, CPU_SCALE_GAP_EXACT_MAX_N, GPU_TOP_TIER, auto_build_params, estimate_intrinsic_dim, scale_gap
from ._build import _without, candidate_graph, diversify, diversify_without, exact_knn_cpu, nn1_max
from ._entry import EntryPoints, build_entry_points
from ._prune_cpu import _rows_sorted, add_reverse_edges, pair_distances, prune_cpu, sorted_rows
from ._search_cpu import search_cpu

__all__ = ["SearchGraph", "default_n_entry"]

MAX_K = 1024
_SEARCH_KEYS = ("beam", "tau", "max_iters", "n_seeds")


def default_n_entry(n):
    # sqrt(n), up to 4096: enough centroids to cover a few thousand separated clusters
    return int(max(1, min(4096, round(np.sqrt(n)))))


def _default_intermediate_degree(R):
    return 2 * R if R < 64 else max(R + 32, (3 * R) // 2)


def _resolve_auto_params(X, bp, random_state, top_tier=True, *, lids=None, device=None):
    """Fill ``graph_degree``, ``intermediate_degree`` and ``alpha`` left as None (in place) from
    the estimated intrinsic dimension of ``X`` (see ``_auto.py``; ``top_tier``: the GPU's densest
    tier is allowed). Returns True when the estimate shows clusters of few points
    (:func:`._auto.scale_gap`, on the unrounded estimates), else False (also when none was made).
    ``lids``: the estimates ``(at 5, at 20 neighbours)`` when made already (``X`` is then not
    read); ``device``: the tier of that device (default: where ``X`` lives)."""
    if bp["graph_degree"] is not None and bp["alpha"] is not None:
        if bp["intermediate_degree"] is None:
            bp["intermediate_degree"] = _default_intermediate_degree(bp["graph_degree"])
        return False
    if lids is None:
        lid_small, lid = estimate_intrinsic_dim(X, random_state=random_state, scales=(5, 20))
    else:
        lid_small, lid = lids
    if device is None:
        device = "cpu" if get_array_module(X) is np else "gpu"
    R, K, alpha = auto_build_params(lid, lid_small, device=device, top_tier=top_tier)
    bp["intrinsic_dim"] = round(lid, 2) if np.isfinite(lid) else None
    bp["intrinsic_dim_5nn"] = round(lid_small, 2) if np.isfinite(lid_small) else None
    if bp["graph_degree"] is None:
        bp["graph_degree"] = R
        if bp["intermediate_degree"] is None:
            bp["intermediate_degree"] = K
    elif bp["intermediate_degree"] is None:
        bp["intermediate_degree"] = _default_intermediate_degree(bp["graph_degree"])
    bp["intermediate_degree"] = max(bp["intermediate_degree"], bp["graph_degree"])
    if bp["alpha"] is None:
        bp["alpha"] = alpha
    logger.info("GraphIndex: estimated intrinsic dimension %.1f -> graph_degree=%d, intermediate_degree=%d, "
                "alpha=%.2f", lid, bp["graph_degree"], bp["intermediate_degree"], bp["alpha"])
    return bool(scale_gap(lid, lid_small))


def merged_candidates(*lists):
    """Row-wise union of candidate id lists (each ``(n, K_i)``, ``-1`` = none): ``(n, sum K_i)``,
    each id once per row, the rest ``-1`` (the order does not matter: RobustPrune sorts by
    distance)."""
    ids = np.sort(np.concatenate(lists, axis=1), axis=1)
    repeat = np.zeros(ids.shape, dtype=bool)
    repeat[:, 1:] = ids[:, 1:] == ids[:, :-1]
    ids[repeat] = -1
    return ids


def host_bytes(n, d, itemsize, R):
    """Bytes a device-placed index needs on the GPU: vectors plus graph (what ``"auto"`` compares
    with the memory budget)."""
    return int(n) * int(d) * int(itemsize) + int(n) * int(R) * 4


def _top_tier_fits(a):
    """Whether vectors plus a graph of the GPU's top-tier degree fit the memory budget (the
    quantity ``placement="auto"`` compares with it, :func:`host_bytes`, assuming degree 64 when
    none is given: a top-tier graph that does not fit falls back to 64)."""
    need = host_bytes(a.shape[0], a.shape[1], np.dtype(a.dtype).itemsize, GPU_TOP_TIER[0])
    budget = get_memory_budget()
    if budget and need > budget:
        logger.info("GraphIndex: a degree-%d graph and the vectors need %d bytes, over the memory budget %d: "
                    "the top tier is not used", GPU_TOP_TIER[0], need, budget)
        return False
    return True


#: The hold-out graph from the build's own first prune and result, redoing only the rows the held-out
#: points change (:func:`._build.diversify_without`; same graph). Off: a whole second diversification
#: of the reduced lists (the A/B and the tests' reference).
HOLDOUT_PARTIAL = True

#: The calibration's hold-out graph (one more diversification: 9-15 % of the CPU build of the
#: suite's sets it is made for; 20 % on tight clusters / manifold and ~50 % on skin and duplicates,
#: which do not get it) is built for RobustPrune slack up to this, i.e. where the automatic
#: parameters saw high-dimensional neighbourhoods (LID >= 28, or clusters smaller than the degree):
#: there cutting the held-out rows out of the finished graph read 0.03-0.07 low at small beams
#: (uniform 128-d / 960-d). Elsewhere the cut curve (conservative) stays: within 0.003 of the
#: hold-out curve on SIFT-like, Fashion-MNIST and skin, but 0.01-0.04 low on uniform 32-d (LID 23.5).
HOLDOUT_MAX_ALPHA = 1.0


def _pad(g, width):
    """``g`` widened to ``width`` columns with -1 (tiny n: the requested width is kept)."""
    xp = get_array_module(g)
    if g.shape[1] >= width:
        return g
    return xp.concatenate([g, xp.full((g.shape[0], width - g.shape[1]), -1, xp.int32)], axis=1)


def _entry_structure(X, bp, im, random_state):
    """The search's entry structure: coarse k-means medoids (default) or the GGNN layer hierarchy
    (``IndexParams(entry="hierarchy")``, :mod:`._hierarchy`)."""
    if bp.get("entry", "kmeans") == "hierarchy":
        from ._hierarchy import build_hierarchy

        return build_hierarchy(X, im, random_state=random_state)
    return build_entry_points(X, bp["n_entry"], im, random_state=random_state)


def _connect(X, g, entry, im):
    """Connectivity guarantee (issue "quality on unseen data", item 1): a door into every weakly
    connected component of the search graph (its medoid joins the k-means entry points), links
    between neighbouring components in both directions, and every point reachable from the
    entries. Tight, well-separated clusters otherwise leave whole clusters unreachable (1M x 128,
    1000 clusters: recall 0.905 at every beam)."""
    from ._connect import (combine_entry_points, components, entry_points_per_component, gpu_kernels_on,
                           repair_connectivity, short_edge_components)

    xp = get_array_module(g)
    if xp is not np and gpu_kernels_on():
        labels, c = components(g)  # the kernels of connect.cu: device labels, no host copy
    else:
        labels, c = components(as_host(g))  # Numba union-find on the host: faster than propagation on the GPU
    own = (labels, c)
    if isinstance(entry, EntryPoints):
        # clusters joined only by stray long links are one component here; their short-edge
        # components still tell them apart (1M x 128, 10,000 tight clusters: one component on the
        # GPU, 999 entries, recall 0.82 at any beam; the CPU graph had 9,994 components and 1.0).
        # Used whenever they are more than the graph's own: k-means does not give every cluster an
        # entry even with as many entries as clusters (1M x 128, 1,000 clusters in 336 graph
        # components: 1,314 entries, 0.947; one per short-edge component: 1.0)
        soft, cs = short_edge_components(X, g, im, components_of=own)
        if cs > c:
            logger.info("GraphIndex: %d components without long edges (%d with them): one entry each", cs, c)
            labels, c = soft, cs
    labels = xp.asarray(labels)
    if c > 1 and isinstance(entry, EntryPoints):  # a hierarchy's bottom layer is its own door set
        med, cen = entry_points_per_component(labels, X, metric=im)
        entry = combine_entry_points(entry, med, cen)
    g, conn = repair_connectivity(X, g, metric=im, entry_ids=entry.medoids, copy=False, components_of=own)
    conn = {k: (float(v) if isinstance(v, (float, np.floating)) else int(v) if isinstance(v, (int, np.integer))
                else v) for k, v in conn.items()}
    conn["entry_points"] = int(len(entry))
    logger.info("GraphIndex: connectivity %s", conn)
    return g, entry, conn


#: fp16 traversal is kept while the vectors' float16 rounding error is at most this fraction of the
#: distance from a point to its graph neighbours. Measured (H200, 200k-1M points, recall@10 of the
#: fp16 walk against the fp32 walk at beams 16-128, ``benchmarks/fp16_traversal_offsets.py``):
#: equal up to 0.08 (16-d Gaussian + 100); from 0.3 on, losses at small beams (uniform 2-D 1M
#: + 1: 0.985 against 1.0 at beam 16; 16-d + 1000, ratio 0.76: 0.77 against 0.93); beyond ~4 the
#: walk is lost (2-D + 100: 0.32 against 1.0). Gaussian and SIFT-like uint8 data read ~0.002.
FP16_ROUNDING_MAX = 0.1


def _fp16_resolves(X, graph, metric="l2", sample=1024):
    """Whether float16 copies of the rows of ``X`` (a device array) still order the distances the
    walk compares, judged on the search ``graph``'s edges.

    Rounding a component to float16 moves it by up to ``|x| * 2**-11``; the largest such move
    seen in each dimension (on up to 65,536 rows), summed over the dimensions, is the error ``e``
    a vector can carry. For ``"l2"`` it is compared with the median length of the graph's edges
    from ``sample`` rows spread over the index (the distances the walk must tell apart), so data
    far from the origin, or dense low-dimensional data, keep the float32 walk. For ``"ip"`` the
    walk compares scores ``-q.x``, which the error moves by ``|q| e``; it is compared with the
    median score gap ``q.q - q.x`` from a row ``q`` to its graph neighbours. On unit vectors
    (cosine) that gap is half the squared edge, so vectors sharing a main direction (cosine
    similarities near 1) keep the float32 walk although their edges are long against ``e``.
    """
    cp = cupy_or_none()
    n = X.shape[0]
    step = max(1, n // 65536)
    some = X[::step].astype(cp.float32)
    worst = cp.abs(some - some.astype(cp.float16).astype(cp.float32)).max(axis=0)
    err = float(cp.sqrt(cp.sum(worst * worst)))  # 0 for integer data below 2048 (uint8, int8)
    if err == 0.0:
        return True
    graph = cp.asarray(graph)
    sample = int(min(sample, max(16, (1 << 24) // max(1, graph.shape[1] * X.shape[1]))))  # <= 64 MiB
    rows = cp.arange(0, n, max(1, n // sample))[:sample]
    nbrs = graph[rows]
    ok = nbrs >= 0
    if not bool(ok.any()):
        return True
    q = X[rows].astype(cp.float32)
    nb = X[cp.where(ok, nbrs, 0)].astype(cp.float32)
    if metric == "ip":
        gap = cp.abs(cp.sum(q * q, axis=1)[:, None] - cp.einsum("id,ijd->ij", q, nb))[ok]
        err = err * float(cp.median(cp.sqrt(cp.sum(q * q, axis=1))))
    else:
        diff = nb - q[:, None, :]
        gap = cp.sqrt(cp.sum(diff * diff, axis=2))[ok]
    gap = gap[gap > 0]  # exact duplicates tell nothing about the scale
    if gap.size == 0:
        return True
    return err <= FP16_ROUNDING_MAX * float(cp.median(gap))


class _StageBar:
    """Steps of a progress bar over named build stages; the bar's postfix names the next stage."""

    def __init__(self, bar, stages):
        self.bar = bar
        self.stages = list(stages)
        if bar is not None:
            bar.total = (bar.total or 0) + len(self.stages)
            bar.set_postfix_str(self.stages[0] if self.stages else "", refresh=False)
            bar.refresh()

    def done(self, name):
        if self.bar is None:
            return
        nxt = self.stages.index(name) + 1 if name in self.stages else len(self.stages)
        self.bar.set_postfix_str(self.stages[nxt] if nxt < len(self.stages) else "", refresh=False)
        self.bar.update()

class SearchGraph:
    """A built search index's arrays and the operations on them (the engine behind
    :class:`knnkit.GraphIndex`).

    Attributes
    ----------
    metric : str
        User metric; ``_imetric`` the internal one.
    build_params : dict
        Resolved build parameters (saved with the index).
    device : {"cpu", "gpu"}
        Where the arrays live.
    nn1_max : float
        GGNN's ``d_nn1+`` on the slack criterion's scale.
    scale : float
        Power-of-two factor of the prepared vectors (:func:`knnkit._core.metrics.safe_scale`).
    """

    def __init__(self, data, graph, entry, *, metric, build_params, device="cpu", nn1_max=None, scale=1.0):
        self.metric = metric
        self._imetric = internal_metric(metric)
        self._data = data
        self._graph = graph
        self._entry = entry
        self.build_params = dict(build_params)
        self.device = device
        self.scale = float(scale)
        self._X = prepare_vectors(data, metric, self.scale)
        self._host = None  # host copies when a GPU index is searched on the CPU
        self._xnorm_max = None
        self._gpu = None  # device copies when a CPU index is searched on the GPU
        self._x16_cache = None  # [prepared vectors, fit float16, fp16 resolves them, float16 copy or None]
        self.nn1_max = float("inf") if nn1_max is None else float(nn1_max)
        self.deleted = None  # host bool (n,) tombstones, or None (see _delete.py)
        self.consolidated = True  # False while deleted points still carry links (bridges)
        self._holdout = None  # (rows, graph) for the calibration, dropped once it ran (_calibrate.py)
        # set by build(): candidate lists built on distinct rows, and the candidate ids kept for a
        # denser rebuild (GraphIndex._denser) until the build is done
        self.merged_copies = False
        self.first_candidates = None
        self.first_candidate_dist = None
        self.first_entry = None
        if device == "cpu" and isinstance(entry, EntryPoints):
            entry._cpu_cells()  # the seed cells now, not in the first search (0.01-0.15 s)

    # ------------------------------------------------------------------ properties
    @property
    def n(self):
        return int(self._data.shape[0])

    @property
    def dim(self):
        return int(self._data.shape[1])

    @property
    def dtype(self):
        return np.dtype(self._data.dtype)

    @property
    def graph_degree(self):
        return int(self._graph.shape[1])

    @property
    def graph(self):
        """The search graph, int32 (n, R), ``-1`` in unused slots (a host numpy copy)."""
        return np.array(as_host(self._graph), copy=True)

    @property
    def data(self):
        """The indexed vectors in their storage dtype (numpy or cupy, where the index lives)."""
        return self._data

    @property
    def entry_points(self):
        """Medoid ids of the coarse k-means centroids used as search seeds (host int32)."""
        return np.array(as_host(self._entry.medoids), copy=True)

    def __len__(self):
        return self.n

    @classmethod
    def build(cls, a, metric, bp, random_state, scale=1.0, bar=None, candidates=None, holdout=False, top_tier=True,
              keep_candidates=False, entry=None):
        """Build on validated data ``a`` (storage dtype, on its device); ``bp`` the build
        parameters (None entries chosen from the data, in place). Returns the engine; its
        ``build_timings`` holds seconds per phase. ``bar`` (a :func:`knnkit._core.config.progress`
        bar) gets this build's stages added to its total and one step per finished stage.
        ``candidates``: precomputed candidate lists ``(ids (n, K), distances (n, K) or None)`` on the
        host (the out-of-core graph of a host-placed index, a CPU denser rebuild; None: computed
        here); ``a`` must then be host data.
        ``holdout``: also build the calibration's hold-out graph (CPU, RobustPrune; see
        :func:`._calibrate.holdout_graph`), kept on the engine as ``_holdout`` until calibrated.
        ``top_tier``: automatic parameters may take the GPU's densest tier (False for a host-placed
        index, whose walk fetches every expanded list over PCIe). ``keep_candidates``: a CPU build
        keeps its candidate ids as ``first_candidates`` (None where copies were merged or on the
        GPU) for a denser rebuild to start from (see ``GraphIndex._denser``); drop them after, with
        ``first_entry``, the k-means entry points as made before the connectivity repair. ``entry``:
        such entry points of the same data, ``n_entry`` and seed (a CPU denser rebuild), used
        instead of running the k-means again."""
        import time

        from ._build import build_graph_gpu, candidates_on_distinct, link_copies

        xp = get_array_module(a)
        dev = "cpu" if xp is np else "gpu"
        im = internal_metric(metric)
        t_start = time.perf_counter()
        X = prepare_vectors(a, metric, scale)
        n = a.shape[0]
        if top_tier and dev == "gpu" and bp["graph_degree"] is None:
            top_tier = _top_tier_fits(a)
        k_auto = bp["graph_degree"] is None and bp["intermediate_degree"] is None
        few_point_clusters = _resolve_auto_params(X, bp, random_state, top_tier=top_tier)
        timings = {"prepare_auto": time.perf_counter() - t_start}
        algo = bp["build_algo"] if n > 4096 else "brute"
        if algo == "nndescent" and dev == "cpu" and n <= CPU_SCALE_GAP_EXACT_MAX_N and few_point_clusters:
            # clusters of few points: exact lists cost less than the slow descent there (_auto.py),
            # and being exact, fewer of them do
            algo = "brute"
            if k_auto:
                bp["intermediate_degree"] = max(bp["graph_degree"], CPU_SCALE_GAP_EXACT_K)
        R = min(bp["graph_degree"], n - 1)
        K = min(bp["intermediate_degree"], n - 1)
        logger.info("GraphIndex: %s candidate graph (n=%d, K=%d) on %s", algo, n, K, dev)
        if candidates is not None:
            if dev != "cpu":
                raise ValueError("precomputed candidates need host data")
            K = int(candidates[0].shape[1])
        gpu_prune = dev == "gpu" and bp["diversify"] == "prune"
        held = None  # (rows, hold-out graph before the repair, graph before the repair)
        stages = ((["candidates", "nn1_max", "prune", "reverse"] if gpu_prune else ["candidates", "diversify"])
                  + ["entry points"] + (["connect"] if bp.get("repair", True) else []))
        stage = _StageBar(bar, stages)
        t0 = time.perf_counter()
        if gpu_prune:
            # all on the device: candidates with their distances, prune, reverse edges (_build.py)
            # NN-Descent runs on the internal metric ('ip' for cosine's unit rows), but its update
            # rule is the one of the user's metric (default_update: cosine has no hubs)
            cand_stats = {}
            g, nn1 = build_graph_gpu(X, R, K, im, alpha=bp["alpha"], build_algo=algo,
                                     random_state=random_state, timings=timings,
                                     knn_params={"update": default_update("gpu", metric)}, on_stage=stage.done,
                                     stats=cand_stats, intrinsic_dim=bp.get("intrinsic_dim"))
            # how the candidates were made (NN-Descent, or exact after a stalled descent)
            bp["candidates"] = {k: cand_stats[k] for k in ("method", "iterations", "K", "stalled",
                                                           "candidate_recall_estimate") if cand_stats.get(k) is not None}
            if cand_stats.get("reverse"):  # hub re-prunes of the reverse-edge stage, and the two passes' times
                bp["reverse_edges"] = {k: (round(v, 4) if isinstance(v, float) else v)
                                       for k, v in cand_stats["reverse"].items()}
        else:
            if candidates is not None:
                cand = np.ascontiguousarray(candidates[0], dtype=np.int64)
                cand_dist = (pair_distances(np.ascontiguousarray(X), cand, im) if candidates[1] is None
                             else np.ascontiguousarray(candidates[1], dtype=np.float32))
                if not _rows_sorted(cand_dist, cand):
                    # by (distance, id) once here, as RobustPrune would for each call: the hold-out
                    # graph's rows (changed_without keeps their order) then need no second sort
                    cand, cand_dist = sorted_rows(cand, cand_dist)
                cycle = None
            else:
                cstats = {}
                cand, cand_dist, cycle = candidates_on_distinct(
                    X, K, im, random_state,
                    lambda Xs, k: candidate_graph(Xs, k, im, build_algo=algo if Xs.shape[0] > 4096 else "brute",
                                                  device=dev, random_state=random_state, user_metric=metric,
                                                  stats=cstats, intrinsic_dim=bp.get("intrinsic_dim")))
                bp["candidates"] = cstats
                cand, cand_dist = as_host(cand), as_host(cand_dist)
            nn1 = nn1_max(np.ascontiguousarray(as_host(X)), cand_dist, im)
            timings["candidates"] = time.perf_counter() - t0
            stage.done("candidates")
            logger.info("GraphIndex: diversify (%s) to R=%d", bp["diversify"], R)
            want_holdout = (holdout and dev == "cpu" and bp["diversify"] == "prune"
                            and bp["alpha"] <= HOLDOUT_MAX_ALPHA)
            first = {} if want_holdout else None
            g = diversify(X, cand, R, im, alpha=bp["alpha"], method=bp["diversify"], device=dev,
                          cand_dist=cand_dist, first_out=first)
            g = xp.asarray(g) if xp is not np else g
            g_div = g.copy() if want_holdout and cycle is not None else g  # (link_copies writes in place)
            g = link_copies(g, cycle)
            stage.done("diversify")
            timings["graph"] = time.perf_counter() - t0
            timings["diversify"] = timings["graph"] - timings["candidates"]
            if want_holdout:
                from ._calibrate import holdout_rows

                rows = holdout_rows(n)
                if rows is not None:
                    t_h = time.perf_counter()
                    if HOLDOUT_PARTIAL:
                        gh = diversify_without(X, cand, cand_dist, rows, first["graph"], g_div, R, im,
                                               alpha=bp["alpha"])
                    else:
                        hc, hd = _without(cand, cand_dist, rows)
                        gh = diversify(X, hc, R, im, alpha=bp["alpha"], method="prune", device=dev, cand_dist=hd)
                        del hc, hd
                    del g_div
                    # with the graph before the connectivity repair (g is repaired in place below)
                    held = (rows, _pad(link_copies(gh, cycle), bp["graph_degree"]),
                            _pad(g, bp["graph_degree"]).copy())
                    timings["holdout_graph"] = time.perf_counter() - t_h
        if g.shape[1] < bp["graph_degree"]:  # tiny n: keep the requested width, -1 padded
            g = _pad(g, bp["graph_degree"])
        t1 = time.perf_counter()
        # (k-means medoids depend on the data, n_entry and the seed only, not on the graph)
        entry = entry if isinstance(entry, EntryPoints) else _entry_structure(X, bp, im, random_state)
        first_entry = entry if keep_candidates and dev == "cpu" and isinstance(entry, EntryPoints) else None
        if dev == "gpu":
            xp.cuda.get_current_stream().synchronize()
        timings["entry_points"] = time.perf_counter() - t1
        stage.done("entry points")
        if bp.get("repair", True):
            g, entry, bp["connectivity"] = _connect(X, g, entry, im)
            if dev == "gpu":
                xp.cuda.get_current_stream().synchronize()
            timings["connectivity"] = time.perf_counter() - t1 - timings["entry_points"]
            stage.done("connect")
        logger.info("GraphIndex: build phases (s): %s", {k: round(v, 3) for k, v in timings.items()})
        engine = cls(a, g, entry, metric=metric, build_params=bp, device=dev, nn1_max=nn1, scale=scale)
        # candidate lists on the distinct rows, copies linked after (a search of this graph for each
        # row's own neighbours would list its copies: see own_neighbour_lists)
        engine.merged_copies = dev == "cpu" and candidates is None and cycle is not None
        engine.first_candidates = (cand if keep_candidates and dev == "cpu" and candidates is None and cycle is None
                                   else None)
        engine.first_candidate_dist = cand_dist if engine.first_candidates is not None else None
        engine.first_entry = first_entry if engine.first_candidates is not None else None
        if held is not None:
            from ._calibrate import holdout_graph

            rows, gh, before = held
            engine._holdout = (rows, holdout_graph(g, before, gh, rows))
        engine.build_timings = timings  # seconds per phase of this build (not saved with the index)
        return engine

    def own_neighbour_lists(self, K, *, beam, tau, max_iters, n_seeds, batch=65536, with_distances=False):
        """``(n, K)`` int64 ids: each data row's ``K`` nearest other rows as this graph's CPU walk
        finds them (``-1`` where fewer come back), for candidate lists of a denser graph built
        from this one (Vamana's search-based candidates; see :func:`merged_candidates`). A row's
        list is the walk's ``K + 1`` results in their order, less the row itself (put in its place:
        the last result) or less the last result when the row is not among them. Not for data
        whose copies were merged (``merged_copies``): the lists would be full of a row's copies.
        ``with_distances``: also the walk's internal distances of those ids, float32 ``(n, K)``."""
        n = self.n
        ids = np.empty((n, K), np.int64)
        dists = np.empty((n, K), np.float32) if with_distances else None
        # rows walked grouped by their nearest entry centroid: consecutive walks then read nearby
        # graph rows and vectors (each walk's result is independent of the order; 100k x 32 uniform,
        # beam 128: 6.5 -> 6.2 s)
        _X, _g, entry = self._host_arrays()
        if isinstance(entry, EntryPoints) and n > batch // 16:
            near = entry.seeds_for(prepare_vectors(np.ascontiguousarray(as_host(self._data)), self.metric,
                                                   self.scale), 1)[:, 0]
            order = np.argsort(near, kind="stable")
        else:
            order = np.arange(n, dtype=np.int64)
        for s in range(0, n, batch):
            rows = order[s:s + batch]
            d, i = self.search(self._data[rows], K + 1, beam=beam, tau=tau, max_iters=max_iters,
                               n_seeds=n_seeds, device="cpu")
            i = as_host(i)
            # the row itself out (it may be missing or not first: equal distances); the other K kept
            out = i[:, :K].copy()
            r, c = np.nonzero(out == rows[:, None])
            out[r, c] = i[r, K]
            ids[rows] = out
            if with_distances:
                d = np.asarray(as_host(d), np.float32)
                od = d[:, :K].copy()
                od[r, c] = d[r, K]
                dists[rows] = od
        return (ids, dists) if with_distances else ids

    # ------------------------------------------------------------------ search
    def _host_arrays(self):
        if self.device == "cpu":
            return self._X, self._graph, self._entry
        if self._host is None:
            self._host = (as_host(self._X), as_host(self._graph), self._entry.to(np))
        return self._host

    def _xmax(self):
        if self._xnorm_max is None:
            X = self._X
            self._xnorm_max = float(np.sqrt(float((X * X).sum(axis=1).max())))
        return self._xnorm_max

    def search(self, q, k, *, beam, tau, max_iters, n_seeds, device, batch_size=None, traversal="auto"):
        """Search prepared-device-agnostic queries ``q`` (validated, any supported dtype) with
        resolved parameters; returns INTERNAL distances and int64 ids (numpy or cupy by ``device``)."""
        dev = device
        nq = q.shape[0]
        if dev == "gpu":
            return self._search_gpu(q, k, beam, tau, max_iters, n_seeds, batch_size, traversal)
        X, graph, entry = self._host_arrays()
        qh = prepare_vectors(np.ascontiguousarray(as_host(q)), self.metric, self.scale)
        bs = int(batch_size) if batch_size else max(1, nq)
        d = np.empty((nq, k), np.float32)
        i = np.empty((nq, k), np.int64)
        xmax = self._xmax() if self._imetric == "ip" else None
        for s in range(0, nq, bs):
            qb = qh[s:s + bs]
            seeds = entry.seeds_for(qb, n_seeds)  # Numba on the CPU, no BLAS (_search_cpu.select_seeds_cpu)
            d[s:s + bs], i[s:s + bs] = twin(__package__, "cpu").search(
                X, graph, qb, k, seeds=seeds, beam=beam, tau=tau, max_iters=max_iters, metric=self._imetric,
                xnorm_max=xmax, nn1_max=self.nn1_max)
        return d, i

    def _search_gpu(self, q, k, beam, tau, max_iters, n_seeds, batch_size, traversal="auto"):
        cp = cupy_or_none()
        if cp is None:
            raise RuntimeError("GPU search asked for but no CUDA GPU is usable")
        search_gpu = twin(__package__, "gpu").search

        if self.device != "gpu":  # a CPU index searched on the GPU: move it once
            self._to_gpu_cache()
            X, graph, entry = self._gpu
            data = None
        else:
            X, graph, entry = self._X, self._graph, self._entry
            data = self._data
        # float16 storage: traversing the stored half vectors is lossless (they are exactly the
        # float32 values) and halves the bytes read; cosine data is renormalised, so not there
        X16 = data if (data is not None and self.dtype == np.float16 and self.metric != "cosine") else None
        if X16 is None and traversal != "fp32":
            X16 = self._fp16_copy(X, graph, required=traversal == "fp16")
        qd = prepare_vectors(cp.asarray(q), self.metric, self.scale)
        xmax = self._xmax() if self._imetric == "ip" else None
        nq = qd.shape[0]
        bs = int(batch_size) if batch_size else max(1, nq)
        parts = []
        for s in range(0, nq, bs):
            qb = qd[s:s + bs]
            seeds = entry.seeds_for(qb, n_seeds)
            parts.append(search_gpu(X, graph, qb, k, seeds=seeds, beam=beam, tau=tau, max_iters=max_iters,
                                    metric=self._imetric, X_fp16=X16, xnorm_max=xmax, nn1_max=self.nn1_max))
        if len(parts) == 1:  # one batch: no output copies (two launches saved on small batches)
            return parts[0]
        return cp.concatenate([p[0] for p in parts]), cp.concatenate([p[1] for p in parts])

    def _fp16_copy(self, X, graph, required):
        """Cached float16 copy of the prepared vectors for fp16 traversal, or None where the fp32
        walk is taken: the components exceed float16's range, or (unless ``required``) the float16
        rounding is large against the distances the walk compares (:func:`_fp16_resolves`)."""
        cp = cupy_or_none()
        cache = self._x16_cache
        if cache is None or cache[0] is not X:
            fits = float(cp.abs(X).max()) < 60000.0
            cache = self._x16_cache = [X, fits, fits and _fp16_resolves(X, graph, self._imetric), None]
        _X, fits, resolves, x16 = cache
        if not fits:
            if required:
                raise ValueError("traversal='fp16': vector components exceed the float16 range")
            return None
        if not (resolves or required):
            # far from the origin against their spread (every coordinate + 1e4 on unit data): fp16's
            # ulp there is larger than the distances the walk must order, so the walk would steer by
            # noise; the fp32 walk reads twice the bytes but keeps the recall per beam
            logger.debug("fp16 traversal off: the vectors' float16 rounding is large against their spread")
            return None
        if x16 is None:  # made on first use only (not where the walk reads float32)
            x16 = cache[3] = X.astype(cp.float16)
        return x16

    def _to_gpu_cache(self):
        if self._gpu is None:
            cp = cupy_or_none()
            self._gpu = (cp.asarray(self._X), cp.asarray(self._graph), self._entry.to(cp))

    # ------------------------------------------------------------------ extend
    def extend(self, a, *, batch_size=None, beam=None):
        """Insert the rows of ``a`` (host numpy, the index's storage dtype, validated) in place."""
        X, graph, _entry = self._host_arrays()
        X = np.asarray(X)
        graph = np.asarray(graph)
        data = np.asarray(as_host(self._data))
        bp = self.build_params
        R = self.graph_degree
        K = bp["intermediate_degree"]
        alpha = bp["alpha"]
        im = self._imetric
        beam = int(beam) if beam else 2 * K
        bs = int(batch_size) if batch_size else max(1024, data.shape[0] // 2)
        Xn_all = prepare_vectors(a, self.metric, self.scale)
        nn1 = self.nn1_max if np.isfinite(self.nn1_max) else 0.0
        for s in range(0, a.shape[0], bs):
            Xn = np.ascontiguousarray(Xn_all[s:s + bs])
            m = Xn.shape[0]
            n0 = X.shape[0]
            kk = min(K, n0)
            entry = build_entry_points(X, default_n_entry(n0), im, random_state=0) if s else _entry
            seeds = entry.seeds_for(Xn, 8)
            d_old, i_old = search_cpu(X, graph, Xn, kk, seeds=seeds, beam=max(beam, kk), tau=np.inf,
                                      max_iters=8 * beam, metric=im)
            if m > 1:
                kn = min(K, m - 1)
                d_new, i_new = exact_knn_cpu(Xn, Xn, kn, im, exclude_self=True)
                cand_i = np.concatenate([i_old, i_new + n0], axis=1)
                cand_d = np.concatenate([d_old, d_new], axis=1)
            else:
                cand_i, cand_d = i_old, d_old
            X = np.concatenate([X, Xn], axis=0)
            xmax = float(np.sqrt(np.einsum("ij,ij->i", X, X).max())) if im == "ip" else None
            nn1 = max(nn1, nn1_max(Xn, cand_d, im, xnorm_max=xmax))
            rows = prune_cpu(X, cand_i, cand_d, R, alpha, im, node_ids=np.arange(n0, n0 + m))
            graph = np.concatenate([graph, rows], axis=0)
            graph = add_reverse_edges(X, graph, R, alpha, im, new_graph_rows=rows, row_offset=n0)
        data = np.concatenate([data, a], axis=0)
        seed = bp.get("random_state")
        entry = _entry_structure(X, bp, im, seed if isinstance(seed, int) else 0)
        if bp.get("repair", True):
            graph, entry, bp["connectivity"] = _connect(X, graph, entry, im)
        bp["n_extended"] = int(bp.get("n_extended", 0)) + int(a.shape[0])
        if self.device == "gpu":
            cp = cupy_or_none()
            self._data, self._X, self._graph = cp.asarray(data), cp.asarray(X), cp.asarray(graph)
            self._entry = entry.to(cp)
        else:
            self._data, self._X, self._graph, self._entry = data, X, graph, entry
        self._host = None
        self._gpu = None
        self._x16_cache = None
        self._xnorm_max = None
        self.nn1_max = nn1
        if self.deleted is not None:
            # the new points are live; the rebuilt entry structure and the repair may have used
            # deleted points again: consolidate once more so that they carry no links
            self.deleted = np.concatenate([self.deleted, np.zeros(a.shape[0], bool)])
            if self.n_deleted:
                self.consolidated = False
                self.compact()
        return self

    # ------------------------------------------------------------------ deletes
    @property
    def n_deleted(self):
        return 0 if self.deleted is None else int(self.deleted.sum())

    def mark_deleted(self, ids):
        """Tombstone the (validated, host int64) ``ids``; returns how many were newly deleted."""
        if self.deleted is None:
            self.deleted = np.zeros(self.n, bool)
        ids = np.unique(ids)
        new = int((~self.deleted[ids]).sum())
        self.deleted[ids] = True
        if new:
            self.consolidated = False
        return new

    def compact(self):
        """Consolidate the graph around the deleted points (:func:`._delete.consolidate`)."""
        from ._delete import consolidate

        if self.n_deleted == 0 or self.consolidated:
            return {}
        X, graph, entry = self._host_arrays()
        seed = self.build_params.get("random_state")
        n_live = self.n - self.n_deleted
        g, entry, st = consolidate(np.asarray(X), np.asarray(graph), entry, self.deleted, R=self.graph_degree,
                                   alpha=self.build_params.get("alpha") or 1.2, metric=self._imetric,
                                   n_entry=min(self.build_params.get("n_entry") or default_n_entry(n_live), n_live),
                                   random_state=seed if isinstance(seed, int) else 0)
        if self.device == "gpu":
            cp = cupy_or_none()
            self._graph, self._entry = cp.asarray(g), entry.to(cp)
        else:
            self._graph, self._entry = g, entry
        self._host = None
        self._gpu = None
        self.consolidated = True
        self.build_params["compaction"] = st
        return st

    # ------------------------------------------------------------------ persistence
    def to_arrays(self):
        """``(meta, arrays)`` for the container file (host numpy arrays)."""
        meta = {"metric": self.metric, "dtype": self.dtype.name, "n": self.n, "dim": self.dim,
                "graph_degree": self.graph_degree, "build_params": self.build_params,
                "entry_metric": self._entry.metric, "scale": self.scale,
                "nn1_max": self.nn1_max if np.isfinite(self.nn1_max) else None}
        entry = self._entry
        hier = not isinstance(entry, EntryPoints)
        # a hierarchy saves its top layer as the flat entry set too (any reader can search with it)
        cent = entry.vectors[-1] if hier else entry.centroids
        med = entry.ids[-1] if hier else entry.medoids
        arrays = {
            "data": as_host(self._data),
            "graph": as_host(self._graph).astype(np.int32, copy=False),
            "entry_centroids": as_host(cent).astype(np.float32, copy=False),
            "entry_medoids": as_host(med).astype(np.int32, copy=False),
        }
        if hier:
            arrays.update({k: as_host(v) for k, v in entry.to_arrays().items()})
            meta["entry"] = "hierarchy"
        if self.n_deleted:
            arrays["deleted_ids"] = np.flatnonzero(self.deleted).astype(np.int64)
            meta["consolidated"] = bool(self.consolidated)
        return meta, arrays

    @classmethod
    def from_arrays(cls, meta, arrays, device, dev_id=None):
        """The engine of a loaded file (content already validated)."""
        metric = meta["metric"]
        entry = EntryPoints(arrays["entry_centroids"], arrays["entry_medoids"],
                            meta.get("entry_metric", internal_metric(metric)))
        kw = dict(metric=metric, build_params=meta.get("build_params", {}), nn1_max=meta.get("nn1_max"),
                  scale=meta.get("scale", 1.0))
        if device == "gpu":
            cp = cupy_or_none()
            with cp.cuda.Device(dev_id if dev_id is not None else cp.cuda.Device().id):
                eng = cls(cp.asarray(arrays["data"]), cp.asarray(arrays["graph"]), entry.to(cp), device="gpu", **kw)
        else:
            eng = cls(np.asarray(arrays["data"]), np.asarray(arrays["graph"]), entry, device="cpu", **kw)
        if meta.get("entry") == "hierarchy":
            from ._hierarchy import HierarchicalEntry

            eng._entry = HierarchicalEntry.from_arrays(arrays, eng._imetric, X=eng._X)
        if "deleted_ids" in arrays:
            ids = np.asarray(arrays["deleted_ids"], dtype=np.int64)
            if ids.size and (ids.min() < 0 or ids.max() >= eng.n):
                raise ValueError("the file's deleted ids are out of range")
            eng.deleted = np.zeros(eng.n, bool)
            eng.deleted[ids] = True
            eng.consolidated = bool(meta.get("consolidated", False))
        return eng
