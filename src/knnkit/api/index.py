"""``GraphIndex``: the public face of the graph search index (engine: :mod:`knnkit.index`).

It validates and prepares inputs once, resolves parameter objects, calls the
:class:`~knnkit.index.SearchGraph` engine and converts results to the user's metric and framework.
"""

from __future__ import annotations

import numbers
import time
import warnings
from typing import Any

import numpy as np

from .._core.backend import as_host, get_array_module, resolve_device, wrap_output
from .._core.config import logger, progress
from .._core.metrics import absmax, finalize_distances, fits_scale, internal_metric
from .._core.underflow import answer_in_float64, underflow_rows, warn_unresolved_cosine
from .._core.params import check_int, merge_params
from .._core.persist import read_container, sniff, write_container
from .._core.persist_checks import read_legacy_index, validate_index
from .._core.prepare import check_point_count, device_scope, prepare
from .._core.types import Array, ArrayLike, Device, HostArray, Metric, NeighborPair, PathLike, Seed
from .._core.validation import check_k, check_matrix, check_pair
from ..index import IndexParams, SearchGraph, SearchParams, default_n_entry
from ..index.bang import BANG_SEARCH_KEYS, HostIndex, host_bytes
from ..index._engine import merged_candidates
from ..index import _calibrate as _calibration
from ..index._calibrate import (beam_for, calibrate, exact_is_faster, extend, first_beam_reaching, raised_default_beam,
                                resume)

__all__ = ["GraphIndex"]

MAX_K = 1024
# Filtered search thresholds, per device where the search runs. Measured with
# ``benchmarks/filter_bench.py --mode sweep`` (benchmarks/results/filter/README.md): the walk
# fetches ``ceil(f * k / selectivity)`` candidates and keeps the passing ones; exact search over the
# passing points is used when at most ``EXACT_MAX`` points pass or the walk would fetch more than
# ``FETCH_MAX`` candidates (the walk's cost grows with the fetch, exact search's with the passing count).
#: CPU: at most this many passing points are searched exactly (no graph walk).
FILTER_EXACT_MAX_CPU = 8192
#: CPU: over-fetch factor ``f`` (the smallest measured one reaching the unfiltered default-beam recall).
FILTER_OVERFETCH_CPU = 2.0
#: CPU: a walk that would fetch more candidates than this is replaced by exact search.
FILTER_FETCH_MAX_CPU = 96
#: GPU: the same three, from the H100 sweep (1M x 96, k = 10, 2,000 queries): exact search over
#: the passing points won at 10 % selectivity and below (287-545k QPS; the walk 227k at 10 %, 68k
#: at 2 %), the walk at 20 % and above (f = 2: 398-470k against exact 141-268k); the crossing lies
#: between a fetch of 100 and 201 candidates.
FILTER_EXACT_MAX_GPU = 65536
FILTER_OVERFETCH_GPU = 2.0
FILTER_FETCH_MAX_GPU = 128
#: ``strategy`` values of :meth:`GraphIndex._search_filtered` (an internal knob of the benchmarks).
FILTER_STRATEGIES = ("auto", "exact", "graph")


def filter_thresholds(device: str) -> tuple[int, float, int]:
    """``(exact_max, overfetch, fetch_max)`` of filtered search where it runs on ``device``
    (``"cpu"`` or ``"gpu"``)."""
    if device == "gpu":
        return FILTER_EXACT_MAX_GPU, FILTER_OVERFETCH_GPU, min(FILTER_FETCH_MAX_GPU, MAX_K)
    return FILTER_EXACT_MAX_CPU, FILTER_OVERFETCH_CPU, min(FILTER_FETCH_MAX_CPU, MAX_K)


#: Automatic parameters one tier denser than the low-dimensional tier (see ``GraphIndex._denser``),
#: taken when the low tier's calibrated recall at beam 64 is below ``DENSER_BELOW``.
DENSER = (48, 96, 1.0)
DENSER_BELOW = 0.985
#: Beam of the walk that gives the denser tier its candidate lists on the CPU (each row's own
#: neighbours in the low tier's graph; see ``GraphIndex._denser``): the least that returns the K
#: candidates and the row. Measured against 128 (100k, 2 cores, same run): uniform 32-d walk 12.9 ->
#: 9.5 s, calibrated recall at beam 64 0.974 -> 0.976; SIFT-like 0.9948 at beam 64 both, the same
#: curve to beam 128. Fewer candidates (64) cost SIFT-like 0.9948 -> 0.990 at beam 64 and 0.99 went
#: from beam ~17 to ~60; walks seeded at the row itself found nearly exact lists (overlap 0.99) and
#: read 0.961 there: a walk from the entry points lists what a search passes on its way, which is
#: what makes the row reachable (`benchmarks/results/cpu/denser_walk_2026-11-30_s28.txt`).
DENSER_SEARCH_BEAM = 97
#: Where the denser tier's extra candidates come from on the CPU: ``"walk"`` (each row's own
#: neighbours as the low tier's walk finds them) or ``"two_hop"`` (the nearest of each row's graph
#: neighbours and their neighbours, :func:`knnkit.index._prune_cpu.two_hop_lists`).
DENSER_CANDIDATES = "walk"
#: The denser tier's first step (the low tier's candidates pruned again at the denser degree) is
#: kept when its calibrated recall at beam 64 closes at least this fraction of the gap between the
#: low tier's and DENSER_BELOW (see ``GraphIndex._denser``: 0.70-1.23 where the degree was short,
#: 0.0 on SIFT-like data where the walk was).
REPRUNE_ENOUGH = 0.5
#: ... and tried only when the low tier's calibrated walk gained at least this fraction of its miss
#: at beam 32 by beam 64 (below it the walk, not the degree, is short: step 2 at once).
WALK_FIRST_BELOW = 0.25
#: ... and only when the low tier's walk misses at least this much at beam 16: a walk that finds
#: 0.9 of the neighbours at beam 16 and little more by 64 is trapped, not short of edges. The gain
#: alone is noisy near WALK_FIRST_BELOW: SIFT-like 100k over six seeds read 0.10-0.40 (twice above
#: 0.25, where the re-prune gained nothing and cost ~5 s), with misses at beam 16 of 0.058-0.104;
#: where the re-prune closed the gap (uniform 24-d / 32-d, Gaussian 32-d, broad clusters 32-d) they
#: were 0.26-0.43 (`benchmarks/results/cpu/low_tier_seeds_2026-11-30_s31.txt`).
REPRUNE_MIN_MISS16 = 0.15
_LOW_TIER_DEGREE = 32


def _recall_at(calibration, beam):
    """The calibrated recall at ``beam`` (interpolated linearly between measured beams; the first
    measured recall below the first beam), or None."""
    if not calibration:
        return None
    beams, rec = calibration["beams"], calibration["recall"]
    return float(np.interp(beam, beams, rec))


def _may_be_too_sparse(index):
    """An automatic low-tier graph that :func:`_too_sparse` may send to the denser tier."""
    return index.graph_degree == _LOW_TIER_DEGREE and index.n >= 10_000


def _too_sparse(index):
    """An automatic low-tier graph whose calibrated walk stays short at beam 64."""
    r = _recall_at(index.calibration, 64)
    return _may_be_too_sparse(index) and r is not None and r < DENSER_BELOW


#: The search parameters of a call that gives none (the defaults: built and validated once, not per call).
_DEFAULT_CALL = SearchParams()


class GraphIndex:
    """Graph-based approximate nearest-neighbour index (GPU or CPU).

    Create one with :meth:`GraphIndex.build` or :meth:`GraphIndex.load`.

    Attributes
    ----------
    metric : str
        User metric: "sqeuclidean", "euclidean", "inner_product" or "cosine".
    n, dim : int
        Number of indexed points and their dimension.
    dtype : numpy.dtype
        Storage dtype of the vectors (float32, float16, uint8 or int8); distances are float32.
    graph_degree : int
        Out-degree R of the search graph.
    device : str
        "cpu" or "gpu": where the vectors and the graph live.
    search_params : SearchParams
        Default ``beam``, ``tau``, ``max_iters`` and ``n_seeds`` of :meth:`search`.

    Examples
    --------
    >>> import numpy as np, knnkit
    >>> rng = np.random.default_rng(0)
    >>> data = rng.standard_normal((2000, 16)).astype(np.float32)
    >>> index = knnkit.GraphIndex.build(data, graph_degree=16, device="cpu", random_state=0)
    >>> dist, idx = index.search(data[:5], k=3)
    >>> idx[:, 0].tolist()
    [0, 1, 2, 3, 4]
    """

    def __init__(self, engine: SearchGraph | HostIndex, search_params: SearchParams | None = None) -> None:
        if not isinstance(engine, (SearchGraph, HostIndex)):
            raise TypeError("GraphIndex objects are made by GraphIndex.build or GraphIndex.load")
        self._engine = engine
        self.search_params = search_params if search_params is not None else SearchParams()

    # ------------------------------------------------------------------ properties
    @property
    def metric(self) -> str:
        """User metric."""
        return self._engine.metric

    @property
    def n(self) -> int:
        """Number of indexed points."""
        return self._engine.n

    @property
    def dim(self) -> int:
        """Dimension of the points."""
        return self._engine.dim

    @property
    def dtype(self) -> np.dtype:
        """Storage dtype of the vectors."""
        return self._engine.dtype

    @property
    def graph_degree(self) -> int:
        """Out-degree R of the search graph."""
        return self._engine.graph_degree

    @property
    def device(self) -> str:
        """Where the index lives: 'cpu' or 'gpu'."""
        return self._engine.device

    @property
    def build_params(self) -> dict[str, Any]:
        """Resolved build parameters (dict)."""
        return self._engine.build_params

    @property
    def nn1_max(self) -> float:
        """GGNN's d_nn1+ (slack scale)."""
        return self._engine.nn1_max

    @property
    def graph(self) -> HostArray:
        """The search graph, int32 (n, R), ``-1`` in unused slots (a host numpy copy)."""
        return self._engine.graph

    @property
    def data(self) -> Array:
        """The indexed vectors in their storage dtype (numpy or cupy, where the index lives)."""
        return self._engine.data

    @property
    def entry_points(self) -> HostArray:
        """Medoid ids of the coarse k-means centroids used as search seeds (host int32)."""
        return self._engine.entry_points

    @property
    def build_timings(self) -> dict[str, float]:
        """Seconds per phase of the build that made this object (empty after ``load``)."""
        return dict(getattr(self._engine, "build_timings", {}))

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        bp = ", ".join(f"{k}={self.build_params[k]!r}" for k in
                       ("intermediate_degree", "alpha", "build_algo", "diversify", "n_entry")
                       if k in self.build_params)
        sp = self.search_params
        if isinstance(self._engine, HostIndex):
            bp = f"{self._engine.describe()}, {bp}"
        return (f"GraphIndex(n={self.n}, dim={self.dim}, metric={self.metric!r}, dtype={self.dtype.name}, "
                f"graph_degree={self.graph_degree}, device={self.device!r}, {bp}, "
                f"search=(beam={sp.beam!r}, tau={sp.tau!r}, max_iters={sp.max_iters!r}, n_seeds={sp.n_seeds!r})"
                + (f", n_deleted={self.n_deleted}" if self.n_deleted else "") + ")")

    # ------------------------------------------------------------------ build
    @classmethod
    def build(cls, data: ArrayLike, *, metric: Metric = "sqeuclidean", graph_degree: int | None = None,
              intermediate_degree: int | None = None, alpha: float | None = None, build_algo: str | None = None,
              diversify: str | None = None, n_entry: int | None = None, device: Device = "auto",
              random_state: Seed = None, beam: int | None = None, tau: float | None = None,
              max_iters: int | None = None, n_seeds: int | None = None, connectivity: bool | None = None,
              entry: str | None = None, params: IndexParams | None = None, search_params: SearchParams | None = None,
              calibrate: bool = True, placement: str = "auto", compression: str | None = None,
              pq_bytes: int | None = None) -> GraphIndex:
        """Build a graph search index over ``data``.

        Parameters
        ----------
        data : array-like (n, d)
            float32, float16, uint8 or int8 vectors (float64 is converted to float32); numpy,
            cupy or torch. Stored in its dtype, distances computed in float32.
        metric : {"sqeuclidean", "euclidean", "inner_product", "cosine"}
        graph_degree : int, optional
            Out-degree R of the search graph. Default: chosen from the data's estimated local
            intrinsic dimension (LID, Levina-Bickel MLE on 500 sampled points, see
            ``index/_auto.py``): 32 below LID 28 (SIFT, Fashion-MNIST, most embeddings),
            48 up to 40, 64 above (noise-dominated neighbourhoods need more edges).
        intermediate_degree : int, optional
            Degree of the k-NN graph that is diversified (default: 64 for R = 32, 96 for
            R = 48 or 64, otherwise ``2R`` below 64 and ``1.5R`` from 64 on).
        alpha : float, optional
            RobustPrune slack (>= 1): larger keeps more long edges. Default 1.1 below LID 28 and
            1.0 above (1.0 gave +0.03-0.05 recall at equal beam on LID ~45 data; 1.1 is
            marginally better on low-LID data).
        build_algo : {"nndescent", "brute"}
            How the k-NN graph is built (NN-Descent, or exact). Small inputs are always exact, and
            so, on the CPU, are inputs of up to 150,000 points made of clusters of fewer points
            than the graph's degree (detected from the intrinsic-dimension estimate), where the
            descent converges slowly and exact lists cost less.
        diversify : {"prune", "ggnn"}
            ``"prune"`` (default): RobustPrune plus reverse edges, pruned on the GPU when the index
            is built there; ``"ggnn"``: GGNN's R/2 nearest plus up to R/2 symmetric links (CPU).
            Measured on clustered 100k x 128, SIFT10K and Fashion-MNIST: equal recall for the same
            number of distance evaluations within noise, so the default is the one with a GPU kernel.
        n_entry : int, optional
            Number of k-means entry points (default ``sqrt(n)``, at most 4096).
        device : "auto", "cpu", "gpu" or int
            Where the index is built and lives.
        random_state : int or None
            Seed for the k-NN graph and the k-means (results repeatable).
        beam, tau, max_iters, n_seeds :
            Default search parameters stored in the index (see :meth:`search`).
        entry : {"kmeans", "hierarchy"}, default "kmeans"
            Where searches start: the medoids of a coarse k-means (and one per graph component),
            or GGNN's layer hierarchy (random subsets of n/16, n/256, ... points with their own
            graphs, searched top-down).
        calibrate : bool, default True
            Measure recall against exact neighbours over a beam sweep on 500 sampled points
            (``index.calibration``), so that ``search(target_recall=...)`` can choose the beam; when
            the default beam misses 0.95 the stored default is raised.
        connectivity : bool, default True
            Repair the search graph so that every point is reachable from the entry points
            (``build_params["connectivity"]`` reports components and links before/after).
        params : IndexParams, optional
            The build parameters as one object (the keywords above are shortcuts for its fields).
        search_params : SearchParams, optional
            The default search parameters as one object.
        placement : {"auto", "device", "host"}, default "auto"
            ``"device"``: graph and vectors live where the index is built (GPU memory on a GPU).
            ``"host"`` (BANG): graph and full-precision vectors stay in host memory (``data`` may
            be a memory map), the GPU holds PQ codes only; each search step gathers neighbour
            lists on the host, and the final candidates are re-ranked with exact distances.
            ``"auto"``: host when graph + vectors exceed the memory budget
            (:func:`knnkit.set_memory_budget`; on a CPU-only machine only an explicit budget
            counts); logged and shown in ``repr``. Host indexes are not calibrated and do not
            support :meth:`extend`; their build checks the walk on 200 data rows held out of the
            graph instead (``build_params["host_check"]``: recall@10 at the default beam and 2x /
            4x it, 8x and 16x while below 0.90; the first beam that reaches 0.95 becomes the default, else
            the best checked; a walk below 0.90 everywhere warns).
        compression : {None, "pq", "opq"}
            Vector compression for the GPU walk (host placement; device placement has none):
            ``"pq"`` (product quantisation, 256 centroids per subspace) or ``"opq"`` (PQ after a
            learned orthogonal rotation, Ge et al.; queries are rotated the same way). None picks
            OPQ when each subspace spans 8 or more dimensions (codes cut down by ``pq_bytes`` or
            the memory budget: measured +0.01 to +0.11 recall@10 of the PQ order there, nothing at
            the default 2 dimensions per subspace), PQ otherwise.
        pq_bytes : int, optional
            PQ code bytes per vector (subspaces), ``1 <= pq_bytes <= d``; default ``ceil(d / 2)``
            (at most 128), lowered so that the codes take at most half of the memory budget.

        Returns
        -------
        GraphIndex

        Examples
        --------
        >>> import numpy as np, knnkit
        >>> data = np.random.default_rng(1).random((1000, 8), dtype=np.float32)
        >>> index = knnkit.GraphIndex.build(data, metric="cosine", graph_degree=8, device="cpu")
        >>> index.graph.shape
        (1000, 8)
        """
        bp = merge_params(IndexParams, params, graph_degree=graph_degree, intermediate_degree=intermediate_degree,
                          alpha=alpha, build_algo=build_algo, diversify=diversify, n_entry=n_entry,
                          connectivity=connectivity, entry=entry)
        sp = merge_params(SearchParams, search_params, "search_params", beam=beam, tau=tau, max_iters=max_iters,
                          n_seeds=n_seeds)
        host = _resolve_placement(data, device, placement, compression, pq_bytes, graph_degree=bp.graph_degree)
        if host is not None:
            return cls._build_host(host, metric, bp, sp, random_state, pq_bytes, compression, check=calibrate)
        P = prepare(data, metric=metric, device=device)
        if P.n < 2:
            raise ValueError("a GraphIndex needs at least 2 data points")
        build_params = dict(graph_degree=bp.graph_degree, intermediate_degree=bp.intermediate_degree,
                            alpha=bp.alpha, build_algo=bp.build_algo, diversify=bp.diversify,
                            n_entry=default_n_entry(P.n) if bp.n_entry is None else bp.n_entry,
                            repair=bp.connectivity, entry=bp.entry,
                            random_state=(int(random_state) if isinstance(random_state, numbers.Integral)
                                          else None if random_state is None else repr(random_state)))
        # one bar over the build's stages (the engine adds its own; calibration is the last one)
        with device_scope(P.device, P.device_id), \
                progress(total=1 if calibrate else 0, desc="GraphIndex.build", unit="stage") as bar:
            auto = bp.graph_degree is None and bp.intermediate_degree is None and bp.alpha is None
            engine = SearchGraph.build(P.raw, P.metric, build_params, random_state, scale=P.scale, bar=bar,
                                        holdout=calibrate, keep_candidates=auto and calibrate)
            index = cls(engine, sp)
            if calibrate:
                t_cal = time.perf_counter()
                # a low-tier graph's sweep stops at beam 64 when that already asks for the denser
                # tier (the rest is measured only if the low tier is kept, below)
                index._calibrate(pause=auto and _may_be_too_sparse(index))
                if isinstance(getattr(engine, "build_timings", None), dict):
                    engine.build_timings["calibration"] = time.perf_counter() - t_cal
                bar.update()
                if auto and _too_sparse(index):
                    index = cls._denser(index, P, build_params, sp, random_state)
                if (index.calibration or {}).get("paused"):  # the low tier kept: its sweep measured to the end
                    index._resume_calibration()
            engine.first_candidates = engine.first_candidate_dist = engine.first_entry = None  # (for _denser only)
        return index

    @classmethod
    def _denser(cls, index, P, build_params, sp, random_state):
        """The index built again with the next tier of automatic parameters (:data:`DENSER`), kept
        when its calibrated recall at beam 64 is higher. The intrinsic-dimension rule put the data
        in the low tier (degree 32), but the calibration measured the walk short of
        :data:`DENSER_BELOW` at beam 64: the estimate does not see everything that makes a graph
        hard to walk (CPU, 100k: SIFT-like uint8, LID 16, plateaued at 0.974 at beam 64 with degree
        32 and reaches 0.999 with degree 48 from 96 candidates; uniform 32-d, LID 24, QPS at 0.99
        2.1x), while Fashion-MNIST (LID 16, 0.998 at beam 64) keeps its cheaper graph.

        On the CPU it goes in two steps:

        1. The low tier's own candidate lists pruned again at the denser degree and alpha (no new
           candidates: 4.4-5.6 s at 100k), unless the low tier's walk gained less than
           :data:`WALK_FIRST_BELOW` of its miss between beams 32 and 64 (a walk that more beam does
           not help is short of reachable paths, not of edges: SIFT-like 0.15, where the
           re-prune gained nothing; 0.44-0.69 where it gained) or missed less than
           :data:`REPRUNE_MIN_MISS16` at beam 16 (a high, flat curve: SIFT-like). Kept when its recall at beam 64 reaches
           :data:`DENSER_BELOW` or closes at least :data:`REPRUNE_ENOUGH` of the gap to it. Where
           the low tier was short of edges, this is the cure: 100k, 2 cores, recall at beam 64
           low tier -> re-pruned -> walked (step 2): uniform 32-d 0.881 -> 0.968 -> 0.976 (walk 16 s
           against 4.6 s), Gaussian 32-d 0.833 -> 0.948 -> 0.951, uniform 24-d 0.957 -> 0.991 ->
           0.994, broad clusters 32-d 0.932 -> 0.969 -> 0.972
           (`benchmarks/results/cpu/denser_reprune_2026-11-30_s28.txt`).
        2. Otherwise the candidate lists are each row's :data:`DENSER`-K nearest other rows as the
           low tier's walk finds them (beam :data:`DENSER_SEARCH_BEAM`; Vamana's search-based
           candidates) joined with the low tier's lists. Where the walk, not the degree, was short
           (SIFT-like: 0.9406 at beam 64 re-pruned as before it, 0.9948 walked), the rows a walk
           passes on its way are the links that make them reachable.

        Data whose copies the build merged (a walk would list a row's copies) and GPU builds run
        NN-Descent again at the denser K."""
        R, K, alpha = DENSER
        before = _recall_at(index.calibration, 64)
        logger.info("GraphIndex: calibrated recall %.3f at beam 64 with graph_degree=%d: building again with "
                    "graph_degree=%d, intermediate_degree=%d, alpha=%.2f", before, index.graph_degree, R, K, alpha)
        t0 = time.perf_counter()
        first = index._engine
        frm = [index.graph_degree, index.build_params.get("intermediate_degree"), index.build_params.get("alpha")]
        cand = entry = None
        reprune_r = None
        r32 = _recall_at(index.calibration, 32)
        progress = (before - r32) / (1.0 - r32) if r32 is not None and r32 < 1.0 else 1.0
        r16 = _recall_at(index.calibration, 16)
        miss16 = 1.0 - r16 if r16 is not None else 1.0
        if first.first_candidates is not None:  # a CPU build without merged copies
            entry = first.first_entry  # the same k-means entry points (0.2-0.25 s at 100k)
        if first.first_candidates is not None and progress >= WALK_FIRST_BELOW and miss16 >= REPRUNE_MIN_MISS16:
            # step 1: the low tier's candidates, pruned to the denser degree and alpha
            K1 = int(first.first_candidates.shape[1])
            bp1 = dict(build_params, graph_degree=R, intermediate_degree=K1, alpha=alpha)
            bp1["candidates"] = {"method": "first", "K": K1}
            engine = SearchGraph.build(P.raw, P.metric, bp1, random_state, scale=P.scale, holdout=True,
                                       candidates=(first.first_candidates, first.first_candidate_dist), entry=entry)
            repruned = cls(engine, sp)
            repruned._calibrate()
            reprune_r = _recall_at(repruned.calibration, 64)
            if reprune_r is not None and (reprune_r >= DENSER_BELOW
                                          or reprune_r - before >= REPRUNE_ENOUGH * (DENSER_BELOW - before)):
                return cls._denser_kept(index, repruned, frm, before, reprune_r, t0, "reprune", None, progress)
            logger.info("GraphIndex: the low tier's candidates pruned to graph_degree=%d read %.3f at beam 64: "
                        "candidates from the low tier's walk", R, reprune_r)
        bp2 = dict(build_params, graph_degree=R, intermediate_degree=K, alpha=alpha)
        if first.first_candidates is not None:
            # step 2: the K candidates come from walking the low tier's graph for every row (Vamana's
            # search-based candidates) instead of a second NN-Descent at K, joined with the first
            # build's own lists: a walk trapped in a cluster finds no other (tight clusters
            # without the repair: 0.80 at every beam from the walk alone)
            if DENSER_CANDIDATES == "two_hop":
                from ..index._prune_cpu import two_hop_lists  # (Numba: not at import time)

                X1, g1, _e1 = first._host_arrays()
                walked = two_hop_lists(X1, g1, first.first_candidates, K, first._imetric)
                bp2["candidates"] = {"method": "two_hop+first", "K": K}
                cand = (merged_candidates(walked, first.first_candidates), None)
            else:
                from ..index._prune_cpu import joined_lists  # (Numba: not at import time)

                b, tau, iters, seeds = sp.resolve(K + 1, {"beam": max(K + 1, DENSER_SEARCH_BEAM),
                                                          "tau": float("inf")}, n_entry=len(first._entry))
                walked, walked_d = first.own_neighbour_lists(K, beam=b, tau=tau, max_iters=iters, n_seeds=seeds,
                                                             with_distances=True)
                bp2["candidates"] = {"method": "search+first", "K": K, "beam": b}
                # with their distances: the rebuild computes none again and sorts no row
                cand = joined_lists(walked, walked_d, first.first_candidates, first.first_candidate_dist)
        engine = SearchGraph.build(P.raw, P.metric, bp2, random_state, scale=P.scale, holdout=True, candidates=cand,
                                   entry=entry)
        denser = cls(engine, sp)
        denser._calibrate()
        after = _recall_at(denser.calibration, 64)
        return cls._denser_kept(index, denser, frm, before, after, t0, "walk" if cand is not None else "rebuild",
                                reprune_r, progress)

    @staticmethod
    def _denser_kept(index, denser, frm, before, after, t0, step, reprune_r=None, progress=None):
        """The better of ``index`` and ``denser`` by calibrated recall at beam 64, with the
        ``build_params["denser"]`` record (``step``: "reprune", "walk" or "rebuild"; the re-prune's
        recall when a walk followed it; ``progress``: the low tier's gain from beam 32 to 64 over
        its miss at 32) and the phase time."""
        record = {"from": frm, "recall_at_64": [before, after], "kept": bool(after is not None and after > before),
                  "step": step, "seconds": round(time.perf_counter() - t0, 3)}
        if progress is not None:
            record["progress_32_64"] = round(float(progress), 4)
        if reprune_r is not None:
            record["reprune_recall_at_64"] = reprune_r
        kept = denser if record["kept"] else index
        kept.build_params["denser"] = record
        if isinstance(getattr(kept._engine, "build_timings", None), dict):
            kept._engine.build_timings["denser"] = record["seconds"]
        return kept

    @classmethod
    def _build_host(cls, host, metric, bp, sp, random_state, pq_bytes, compression=None, check=True):
        """placement="host": the HostIndex engine (BANG) over host data; no calibration, a recall
        check of the walk instead (``check``, see :meth:`_check_host`)."""
        from .._core.metrics import scale_for_max, scaled_absmax
        from .._core.validation import check_metric

        a, dev, dev_id, budget = host
        metric = check_metric(metric)
        if a.shape[0] < 2:
            raise ValueError("a GraphIndex needs at least 2 data points")
        build_params = dict(graph_degree=bp.graph_degree, intermediate_degree=bp.intermediate_degree,
                            alpha=bp.alpha, build_algo=bp.build_algo, diversify=bp.diversify,
                            n_entry=default_n_entry(a.shape[0]) if bp.n_entry is None else bp.n_entry,
                            repair=bp.connectivity, entry=bp.entry,
                            random_state=(int(random_state) if isinstance(random_state, numbers.Integral)
                                          else None if random_state is None else repr(random_state)))
        with device_scope(dev, dev_id):
            engine = HostIndex.build(a, metric, build_params, random_state, device=dev,
                                     scale=scale_for_max(scaled_absmax(a)), pq_bytes=pq_bytes, budget=budget,
                                     compression=compression)
            index = cls(engine, sp)
            if check:
                t0 = time.perf_counter()
                index._check_host(random_state)
                if isinstance(getattr(engine, "build_timings", None), dict):
                    engine.build_timings["host_check"] = time.perf_counter() - t0
        return index

    #: Host indexes are not calibrated; their build checks the walk instead: ``HOST_CHECK_ROWS``
    #: data rows held out of the graph (:meth:`HostIndex.hold_out`) as queries, recall@10 against
    #: exact distances to the other points (ties forgiven) at the default beam, then at 2x and 4x it
    #: while below ``HOST_CHECK_TARGET``, and at 8x and 16x it while still below ``HOST_CHECK_WARN``.
    #: A larger beam that reaches the target becomes the index's default, else the best beam
    #: checked; below ``HOST_CHECK_WARN`` at every beam the build warns. (The steps past 4x: broad
    #: 2M x 96, H200, the default beam became 256 at recall 0.883 where 512 read 0.930 for 10k
    #: queries, results/h200-2026-12-01-s42/first/; uniform 960-d, 50k points, 128-byte OPQ codes:
    #: 0.83 at 512 in the check, 0.89 for queries, 0.97 at 1024.) Short PQ codes and hard
    #: data are how a host index gets there (H100, 2M x 96: 12-byte PQ 0.09-0.34 at beams 16-128;
    #: broad overlapping clusters with the default codes 0.52-0.76 at beams 64-256;
    #: ``benchmarks/results/h100-2026-11-26-s14/bang/``).
    HOST_CHECK_ROWS = 200
    HOST_CHECK_TARGET = 0.95
    HOST_CHECK_WARN = 0.90
    #: multiples of the default beam the check walks at (past 4x only while below ``HOST_CHECK_WARN``,
    #: and only up to ``HOST_CHECK_MAX_BEAM`` and below the number of points)
    HOST_CHECK_MULTIPLES = (1, 2, 4, 8, 16)
    #: (the GPU walk's list lives in shared memory: a user's default beam of 2048 must not send the
    #: check to 32768)
    HOST_CHECK_MAX_BEAM = 4096

    def _check_host(self, random_state):
        from .._core.random import seed_from

        eng = self._engine
        n = eng.n
        k = min(10, n - 1)
        seed = seed_from(0 if random_state is None else random_state)
        if n - self.HOST_CHECK_ROWS < 2 * k:
            return  # too small to hold rows out
        rows = np.sort(np.random.default_rng([seed, 11]).choice(n, size=self.HOST_CHECK_ROWS, replace=False))
        # the rows are held out (cut from the graph, never answers): a data row left in the graph
        # finds itself and its own graph neighbours at once, and measured what unseen queries do
        # not get (H100, 2M x 96 broad clusters: 0.82 / 0.91 / 0.97 at beams 64 / 128 / 256 for
        # rows in the graph, 0.52 / 0.65 / 0.76 for 10k held-out queries)
        # rows with an exact copy among the others are left out: cutting a row out of the graph
        # also cuts the links its copies hang from (the build gives a group of copies one
        # candidate list, other rows link to one of them, and the copies chain to each other), so
        # the walk could not reach the copies of a held-out row while a query can (4^3 lattice,
        # 1,500 points: 0.873 at every beam and a warning while queries got >= 0.95)
        if internal_metric(self.metric) == "l2":
            kth, has_copy = eng.kth_distances(rows, k, device=self.device, exclude=rows, copies=True)
            keep = ~np.asarray(has_copy, bool)
        else:
            kth = eng.kth_distances(rows, k, device=self.device, exclude=rows)
            keep = np.ones(len(rows), bool)
        if not keep.any():
            self.build_params["host_check"] = {"k": k, "rows": 0, "skipped": "every sampled row has an exact copy"}
            return
        rows, kth = rows[keep], kth[keep]
        q = np.ascontiguousarray(np.asarray(eng.data[rows]))
        extra = {f: getattr(self.search_params, f) for f in BANG_SEARCH_KEYS}
        base = max(self.search_params.beam or 64, k)
        beams, recall = [], []
        restore = eng.hold_out(rows)
        try:
            for mult in self.HOST_CHECK_MULTIPLES:
                if mult > 4 and (recall[-1] >= self.HOST_CHECK_WARN or base * mult > self.HOST_CHECK_MAX_BEAM
                                 or base * mult >= n):
                    break  # the last beam holds the warning line (not worth a default twice as slow), or
                    # the next is past what the check walks
                beam_, tau_, iters_, seeds_ = self.search_params.resolve(k, {"beam": base * mult},
                                                                         n_entry=len(eng._entry))
                d, _i = eng.search(q, k, beam=beam_, tau=tau_, max_iters=iters_, n_seeds=seeds_,
                                   device=self.device, **extra)
                d = np.asarray(as_host(d), np.float64)
                tol = 1e-5 * np.maximum(np.abs(kth), 1e-30)
                recall.append(float((d <= (kth + tol)[:, None]).sum()) / d.size)
                beams.append(int(beam_))
                if recall[-1] >= self.HOST_CHECK_TARGET:
                    break
        finally:
            restore()
        self.build_params["host_check"] = {"k": k, "rows": int(len(rows)), "beams": beams, "recall": recall}
        best = int(np.argmax(recall))  # (the first that reaches the target: the loop stopped there)
        if recall[0] < self.HOST_CHECK_TARGET and recall[best] > recall[0]:
            # the first checked beam that reaches the target, else the best one checked: a default
            # left at the first beam answered 0.77 where 4x it gave 0.89 (broad 200k x 96, degree 32)
            logger.info("GraphIndex (host): recall@%d %.3f at beam %d, %.3f at beam %d: default beam raised to %d",
                        k, recall[0], beams[0], recall[best], beams[best], beams[best])
            self.search_params = self.search_params.replace(beam=beams[best])
        if max(recall) < self.HOST_CHECK_WARN:
            # on broad 200k x 96 data the walk on exact distances reached what the 48-byte PQ walk
            # did (benchmarks/results/cpu/bang_rerank_broad200k_*): the graph, not the codes, set it
            warnings.warn(f"GraphIndex (host placement): the build's check found recall@{k} {max(recall):.3f} at "
                          f"beam {beams[int(np.argmax(recall))]} (beams {beams}: {[round(r, 3) for r in recall]}) "
                          f"with a degree-{eng.graph_degree} graph and {eng.pq_bytes}-byte "
                          f"{eng.compression.upper()} codes; the default beam is now {self.search_params.beam or base}: for more, search "
                          f"with a larger beam, build a denser graph (graph_degree, if it was set lower than the "
                          f"build's own choice), or raise the memory budget or pq_bytes (longer codes)",
                          RuntimeWarning, stacklevel=4)

    # ------------------------------------------------------------------ calibration
    @property
    def calibration(self) -> dict[str, Any] | None:
        """The recall-vs-beam curve measured at build (dict with ``k``, ``beams``, ``recall``), or
        None (see :mod:`knnkit.index._calibrate`). ``deferred``: beams a GPU build left out once
        the default beam was settled; the first ``search(target_recall=)`` (or :meth:`reaches`,
        :meth:`beam_for`) that the curve misses measures them and adds them to the curve."""
        return self.build_params.get("calibration")

    #: The calibration is measured again (at the end of :meth:`extend` or :meth:`compact`) once the
    #: points changed since it was measured (inserted, or deleted) by more than this fraction of the
    #: live points it was measured on. Without it ``search(target_recall=)`` kept a stale curve:
    #: uniform 32-d, 6k points extended to 18k, target 0.9 / 0.95 / 0.99 gave 0.83 / 0.89 / 0.95.
    RECALIBRATE_FRACTION = 0.1

    def _changes(self):
        """``{"n", "n_extended", "n_deleted"}``: the counters a calibration records."""
        return {"n": int(self.n), "n_extended": int(self.build_params.get("n_extended", 0)),
                "n_deleted": int(self._engine.n_deleted)}

    def _calibrate(self, pause=False):
        """Measure the calibration (``pause``: the sweep may stop at beam 64 below
        :data:`DENSER_BELOW`, see :func:`knnkit.index._calibrate.calibrate`; the default beam is
        then settled by :meth:`_resume_calibration`)."""
        cal = calibrate(self._engine, self.search_params, defer=_calibration.DEFER_AT_BUILD,
                        pause=(64, DENSER_BELOW) if pause else None)
        self._set_calibration(cal)

    def _resume_calibration(self):
        """A paused calibration (:meth:`_calibrate`) measured to its end (kept as it was, without
        the pause mark, if that fails)."""
        cal = self.calibration
        more = resume(self._engine, self.search_params, cal, defer=_calibration.DEFER_AT_BUILD)
        if not more:
            more = {key: v for key, v in cal.items() if key not in ("paused", "at")}
        self._set_calibration(more)

    def _set_calibration(self, cal):
        if cal:
            cal["at"] = self._changes()
        self.build_params["calibration"] = cal
        if cal and not cal.get("paused"):
            better = raised_default_beam(cal, self.search_params.beam or 64)
            if better:
                self.search_params = self.search_params.replace(beam=better)

    def _recalibrate_if_stale(self) -> None:
        """Measure the calibration again when more than ``RECALIBRATE_FRACTION`` of the points
        changed since it was measured (and the graph carries no tombstone links)."""
        cal = self.calibration
        if not cal or isinstance(self._engine, HostIndex) or not self._engine.consolidated:
            return
        now = self._changes()
        # calibrations without a record were measured at build: no extends, no deletes
        at = cal.get("at") or {"n": now["n"] - now["n_extended"], "n_extended": 0, "n_deleted": 0}
        changed = (now["n_extended"] - at["n_extended"]) + abs(now["n_deleted"] - at["n_deleted"])
        if changed <= self.RECALIBRATE_FRACTION * max(1, at["n"] - at["n_deleted"]):
            return
        logger.info("GraphIndex: %d points inserted or deleted since the calibration (measured on %d live points): "
                    "measuring it again", changed, at["n"] - at["n_deleted"])
        self._calibrate()

    def _calibration_for(self, target_recall):
        """The calibration, with its deferred beams measured first when the curve so far does not
        reach ``target_recall`` + 0.005 (GPU builds leave their largest beams for the first target
        that needs them: :func:`knnkit.index._calibrate.extend`)."""
        cal = self.calibration
        if not cal:
            raise ValueError("this index has no calibration (built with calibrate=False, by an older knnkit, or too few "
                             "live points to measure one)")
        if cal.get("deferred") and first_beam_reaching(cal, target_recall) is None:
            cal = extend(self._engine, self.search_params, cal, target_recall=target_recall)
            self.build_params["calibration"] = cal
        return cal

    def beam_for(self, target_recall: float) -> int:
        """The smallest calibrated beam whose measured recall reaches ``target_recall`` + 0.005
        (the largest calibrated beam when none does); see :func:`knnkit.index._calibrate.beam_for`."""
        return beam_for(self._calibration_for(target_recall), target_recall)

    def reaches(self, target_recall: float) -> bool:
        """Whether some calibrated beam reached ``target_recall`` + 0.005. When none did, the
        graph cannot be trusted to deliver that recall (data of very high intrinsic dimension:
        1M x 128 uniform reached 0.955 at beam 2048 with degree 64 on the GPU), or a CPU
        calibration stopped where walking had become slower than the exact scan
        (``calibration["stopped_at"]``), and ``search(target_recall=...)`` answers by an exact
        scan instead."""
        return first_beam_reaching(self._calibration_for(target_recall), target_recall) is not None

    def _exact_all(self, q, info, k, device, beam=None, why=None):
        """Exact k-NN of validated queries over every stored point (``search(target_recall=)``
        beyond what the graph reached in calibration, or where the calibrated ``beam`` that reached
        it walked slower than the exact search; queries too large for the index's scale, ``why``).
        Distances in the user metric, as a walk's."""
        from .._core.prepare import prepare_queries, rescaled
        from .exact import exact_search

        cal = self.calibration
        if why is not None:
            logger.info("GraphIndex.search: %s; searching exactly over all %d points", why, self.n)
        elif beam is None:
            logger.info("GraphIndex.search: no calibrated beam reached the target recall (best %.3f at beam %d); "
                        "searching exactly over all %d points", max(cal["recall"]), cal["beams"][-1], self.n)
        else:
            logger.info("GraphIndex.search: the calibrated beam %d for the target recall walked slower than an "
                        "exact search in calibration; searching exactly over all %d points", beam, self.n)
        dev = self.device if device is None else resolve_device(device, info)[0]
        # deleted points are returned here too: the caller (_search_filtered) drops them
        P = prepare(self._engine.data, metric=self.metric, device=dev)
        Q = prepare_queries(q, P)
        d, i, _ = exact_search(rescaled(P, Q.scale), Q, k)
        return wrap_output(d, info), wrap_output(i, info)

    # ------------------------------------------------------------------ search
    def search(self, queries: ArrayLike, k: int = 10, *, beam: int | None = None, tau: float | None = None,
               max_iters: int | None = None, n_seeds: int | None = None, device: Device | None = None,
               batch_size: int | None = None, traversal: str | None = None, params: SearchParams | None = None,
               target_recall: float | None = None, filter: ArrayLike | None = None) -> NeighborPair:
        """Approximate k nearest neighbours of each query.

        Parameters
        ----------
        queries : array-like (nq, d)
            Same dimension as the data; any supported dtype (computed in float32).
        k : int
            Neighbours per query, ``1 <= k <= min(n, 1024)``.
        beam : int, optional
            Candidate-list size, at least ``k`` (a smaller beam given here is refused). Larger:
            higher recall, slower. Default: the index's (``search_params.beam``, calibrated at
            build) raised to ``k``; for host placement to ``2 * k``, since its PQ walk re-ranks
            what it logged and needs that slack at large ``k``. A ``params`` object's beam is a
            default too: raised the same way, not refused.
        tau : float, optional
            GGNN slack: stop once the next candidate is farther than
            ``d_k + tau * min(d_1, d_nn1+)`` on a Euclidean scale (see ``_search_cpu``).
            ``inf`` disables it (plain beam search, the default unless the index stores a tau);
            None takes the index default. Useful values are small (0.02 - 0.2) with a long
            ``beam``. Smaller: faster.
        max_iters : int, optional
            Cap on node expansions per query (default ``max(64, 8 * beam)``).
        n_seeds : int, optional
            Entry points per query (medoids of its nearest k-means centroids); at least
            ``beam // 16`` are used.
        device : None, "cpu", "gpu" or int
            Where to search (default: where the index lives).
        batch_size : int, optional
            Queries per batch (bounds temporary memory).
        params : SearchParams, optional
            These parameters as one object (keywords given to the call override its fields).
        target_recall : float, optional
            Choose the beam from the index's calibration (``index.calibration``): the smallest
            measured beam whose recall@10 reached the target plus 0.005. When no calibrated beam
            reached it (:meth:`reaches` is False: data of very high intrinsic dimension), the
            search is an exact scan over every point instead (logged), so the target holds; also
            where the calibration (CPU) timed that beam's walk slower than an exact search of the
            same queries (high-dimensional data at large beams).
        traversal : {"auto", "fp16", "fp32"}
            GPU only. ``"fp16"`` walks the graph on a cached float16 copy of the vectors (half the
            bytes per expansion) and re-ranks the final candidate list with exact float32
            distances (BANG section 4.9): returned distances are exact, the neighbour set can
            differ slightly from an fp32 walk. ``"auto"`` (default) uses fp16 when every
            vector component fits float16's range and float16's rounding stays below a tenth of
            the graph's typical edge (not on data far from the origin against its spread, where
            the fp16 walk would steer by rounding noise); ``"fp32"`` never does.
        filter : array-like, optional
            Only points that pass are returned; the forms of :func:`knnkit.knn`'s ``filter`` (a
            mask or bitset for all queries, or one per query). Where many points pass, the walk
            fetches ``ceil(2 k / selectivity)`` candidates and keeps the passing ones; where few
            pass, and for any query the walk leaves with fewer than ``k``, the search is exact
            over the passing points. The switch is measured per device: on the CPU, exact when at
            most 8192 points pass or the walk would fetch more than 96 candidates (k = 10:
            selectivity below about 21 %); see ``knnkit.api.index.filter_thresholds``. A query
            whose filter passes fewer than ``k`` points gets all of them, then ``-1`` / ``inf``
            (``-inf`` for inner_product) in the
            remaining slots; one that passes none gets only ``-1``. Nowhere else.

        Returns
        -------
        distances : float32 (nq, k)
            In the user metric, best first (inner_product: largest first). Slots beyond the
            reachable points hold ``inf`` (``-inf`` for inner_product).
        indices : int64 (nq, k)
            ``-1`` in those slots.

        Examples
        --------
        >>> import numpy as np, knnkit
        >>> data = np.random.default_rng(0).random((500, 4), dtype=np.float32)
        >>> index = knnkit.GraphIndex.build(data, graph_degree=8, device="cpu")
        >>> d, i = index.search(data[:2], k=1, beam=16)
        >>> i.ravel().tolist()
        [0, 1]
        """
        q, info = check_matrix(queries, "queries")
        check_pair(self._engine.data, q)
        k = check_k(k, self.n, max_k=MAX_K)
        kw = dict(beam=beam, tau=tau, max_iters=max_iters, n_seeds=n_seeds, device=device, batch_size=batch_size,
                  traversal=traversal, params=params, target_recall=target_recall)
        if self._engine.n_deleted:
            n_live = self.n - self._engine.n_deleted
            if n_live == 0:
                raise ValueError("every point of this index is deleted")
            if k > n_live:
                raise ValueError(f"k={k} is larger than the number of points not deleted ({n_live})")
            # tombstones: the live points are a filter (deleted points are walked through, never returned)
            return self._search_filtered(queries, k, ~self._engine.deleted if filter is None else filter, kw,
                                         live=~self._engine.deleted)
        if filter is not None:
            return self._search_filtered(queries, k, filter, kw)
        return self._walk(q, info, k, **kw)

    def _walk(self, q, info, k, *, beam=None, tau=None, max_iters=None, n_seeds=None, device=None, batch_size=None,
              traversal=None, params=None, target_recall=None):
        """The graph search itself (validated queries ``q``), tombstones and filters aside."""
        scale = self._engine.scale
        # the stored vectors are at the power-of-two scale of the data (1.0 for ordinary data):
        # queries far larger than that scale allows overflow float32 in the walk (inf distances and
        # arbitrary ids, returned without a word); they are answered exactly at a scale for both
        q_max = info.absmax  # (found by check_matrix on the GPU, else None)
        if (np.dtype(q.dtype) == np.float32 or scale > 1.0) and not fits_scale(
                absmax(q) if q_max is None else q_max, scale):
            why = (f"queries have values up to {absmax(q):.3g}, beyond what the index's stored scale "
                   f"(data up to {absmax(self._engine.data):.3g}) can compare in float32")
            if isinstance(self._engine, HostIndex):
                raise ValueError(f"{why}; rescale the queries or build the index over data of their magnitude")
            return self._exact_all(q, info, k, device, why=why)
        if target_recall is not None:
            if beam is not None:
                raise ValueError("give beam or target_recall, not both")
            reached = self.reaches(target_recall)
            calibrated = self.beam_for(target_recall)
            # the calibration's timings are the index's own device's (CPU): they decide there only
            here = device is None or resolve_device(device, info)[0] == self.device
            if not isinstance(self._engine, HostIndex) and (
                    not reached or (here and exact_is_faster(self.calibration, calibrated))):
                return self._exact_all(q, info, k, device, calibrated if reached else None)
            if not reached:
                # host placement: the data need not fit the device, so no exact scan is attempted
                logger.warning("GraphIndex.search: no calibrated beam reached target_recall=%s (best %.3f); "
                               "searching with the largest calibrated beam", target_recall,
                               max(self.calibration["recall"]))
            beam = max(calibrated, k)
        call = dict(beam=beam, tau=tau, max_iters=max_iters, n_seeds=n_seeds, batch_size=batch_size,
                    traversal=traversal, **{f: None for f in BANG_SEARCH_KEYS})
        if params is not None:
            if not isinstance(params, SearchParams):
                raise TypeError(f"params must be a SearchParams, got {type(params).__name__}")
            call = {f: (getattr(params, f) if v is None else v) for f, v in call.items()}
        given = {f: v for f, v in call.items() if v is not None}
        # validates every value given (nothing given: the defaults, validated once)
        checked = SearchParams(**given) if given else _DEFAULT_CALL
        if beam is not None and beam < k:
            # only a beam given to the call is refused; a params object's (SearchParams defaults
            # to 64) is a default like the index's own, raised to k below
            raise ValueError(f"beam={beam} is smaller than k={k}: the search keeps at most beam "
                             f"candidates (use beam >= k, or leave beam unset)")
        # host placement walks by PQ distance and re-ranks what it logged: k = beam leaves the
        # re-rank no slack (k = 100 at the default beam 64: recall 0.91 on 3k x 16 Gaussian, 0.92 on
        # broad clusters 20k x 96, against 0.9996 / 0.977 at beam 2k); without a beam given it walks
        # with at least 2k (the device walk keeps exact distances: beam >= k holds its recall there)
        host_floor = 2 * k if isinstance(self._engine, HostIndex) and beam is None else 0
        beam_, tau_, iters_, seeds_ = self.search_params.resolve(k, call, n_entry=len(self._engine._entry),
                                                                 min_beam=host_floor)
        dev = self.device if device is None else resolve_device(device, info)[0]
        extra = {}
        if isinstance(self._engine, HostIndex):  # BANG knobs: the call's value, else the index default
            extra = {f: getattr(checked if call[f] is not None else self.search_params, f) for f in BANG_SEARCH_KEYS}
        d, i = self._engine.search(q, k, beam=beam_, tau=tau_, max_iters=iters_, n_seeds=seeds_, device=dev,
                                   batch_size=checked.batch_size, traversal=checked.traversal, **extra)
        # queries with neighbours closer than float32 resolves (values spanning more than ~1e19):
        # answered exactly in float64 over every stored point, or refused (knnkit._core.underflow)
        tiny = underflow_rows(d, i, self._engine.data, q, internal_metric(self.metric), scale)
        warn_unresolved_cosine(d, i, self._engine.data, q, self.metric, stacklevel=4)
        d = finalize_distances(d, self.metric, scale)
        if tiny.size:
            d, i = answer_in_float64(d, i, tiny, self._engine.data, as_host(q)[tiny], k, self.metric,
                                     n_queries=int(q.shape[0]), absmax=absmax(self._engine.data), stacklevel=4)
        if scale != 1.0:  # only scaled data can give distances beyond float32 (as knnkit.knn reports)
            xp = get_array_module(d)
            if not bool(xp.isfinite(d[i >= 0]).all()):
                warnings.warn("some distances exceed the float32 range and are returned as inf", RuntimeWarning,
                              stacklevel=3)
        return wrap_output(d, info), wrap_output(i, info)

    def _search_filtered(self, queries, k, filt, kw, live=None, *, strategy="auto", overfetch=None):
        """search(filter=...): over-fetch and keep the passing points, or exact over them.

        Parameters
        ----------
        queries, k, filt
            As :meth:`search` (``k`` validated).
        kw : dict
            :meth:`search`'s walk keywords (``beam``, ``device``, ...).
        live : numpy.ndarray of bool, optional
            A tombstone mask's complement, intersected with the filter.
        strategy : {"auto", "exact", "graph"}
            ``"auto"``: by the device's thresholds (:func:`filter_thresholds`), exact for any query
            the walk leaves with fewer than ``k``. ``"exact"``: exact over the passing points for
            every query. ``"graph"``: the over-fetching walk for every query, at most ``MAX_K``
            candidates, no exact fallback (a query may get fewer than ``k``): for measuring.
        overfetch : float, optional
            ``f >= 1`` of the ``ceil(f * k / selectivity)`` candidates fetched (default: the device's).
        """
        from .._core.params import check_choice, check_float
        from .._core.prepare import prepare_queries, rescaled
        from .exact import exact_search, filter_rows, group_filter_rows

        strategy = check_choice(strategy, "strategy", FILTER_STRATEGIES)
        overfetch = check_float(overfetch, "overfetch", minimum=1.0, allow_none=True)
        qh = np.asarray(as_host(queries) if not isinstance(queries, np.ndarray) else queries)
        _q, info = check_matrix(queries, "queries")
        n, m = self.n, qh.shape[0]
        shared, rows = filter_rows(filt, n, m)
        if live is not None:
            rows = rows[live[rows]] if shared else [r[live[r]] for r in rows]
        groups = [(np.arange(m), rows)] if shared else group_filter_rows(rows)
        dev = self.device if kw.get("device") is None else resolve_device(kw["device"], info)[0]
        exact_max, default_f, fetch_max = filter_thresholds(dev)
        f = default_f if overfetch is None else overfetch
        fill = -np.inf if self.metric == "inner_product" else np.inf
        D = np.full((m, k), fill, np.float32)
        I = np.full((m, k), -1, np.int64)
        data = self._engine.data
        xp = get_array_module(data)

        def exact(qrows, ids):
            kk = min(k, ids.size)
            if kk == 0:  # nothing passes: the -1 / fill the docstring promises
                return
            sub = data[xp.asarray(ids)]  # gathered where the vectors live: only the subset moves
            P = prepare(sub, metric=self.metric, device=dev)
            Q = prepare_queries(qh[qrows], P)
            d, i, _ = exact_search(rescaled(P, Q.scale), Q, kk)
            D[qrows, :kk] = as_host(d)
            I[qrows, :kk] = ids[as_host(i)]

        for qrows, ids in groups:
            fetch = int(np.ceil(f * k * n / max(1, ids.size)))
            if strategy == "exact" or (strategy == "auto" and (ids.size <= exact_max or fetch > fetch_max)):
                exact(qrows, ids)
                continue
            if ids.size == 0:  # "graph" with nothing passing: no walk can return anything
                continue
            fetch = max(k, min(fetch, MAX_K, n))
            call = dict(kw, beam=max(kw.get("beam") or self.search_params.beam or 0, fetch)
                        if kw.get("target_recall") is None else None)
            qq, qinfo = check_matrix(qh[qrows], "queries")
            d, i = self._walk(qq, qinfo, fetch, **call)
            d, i = as_host(d), as_host(i)
            passing = np.zeros(n, bool)
            passing[ids] = True
            ok = (i >= 0) & passing[np.maximum(i, 0)]
            order = np.argsort(~ok, axis=1, kind="stable")[:, :k]  # passing ones first, in rank order
            got = np.take_along_axis(ok, order, axis=1)
            D[qrows] = np.where(got, np.take_along_axis(d, order, axis=1), fill)
            I[qrows] = np.where(got, np.take_along_axis(i, order, axis=1), -1)
            short = qrows[got.sum(axis=1) < min(k, ids.size)]
            if short.size and strategy == "auto":  # too few passing candidates fetched: exact for those
                exact(short, ids)
        return wrap_output(D, info), wrap_output(I, info)

    # ------------------------------------------------------------------ extend
    def extend(self, new_data: ArrayLike, *, batch_size: int | None = None, beam: int | None = None) -> GraphIndex:
        """Insert new points (ids ``n, n+1, ...``); the index stays searchable with high recall.

        Each batch of new points searches its neighbours in the current index, adds exact
        neighbours among the batch itself, prunes the candidates with RobustPrune and adds the
        reverse edges (re-pruning lists that overflow). Entry points are recomputed. The update
        runs on the CPU (a GPU index is copied back to the GPU afterwards). Once more than
        ``RECALIBRATE_FRACTION`` (10 %) of the points were inserted or deleted since the
        calibration was measured, it is measured again (here, or at :meth:`compact`), so that
        ``search(target_recall=)`` picks its beam from the index as it is now.

        Parameters
        ----------
        new_data : array-like (m, d)
            Same dimension as the index; converted to the index's storage dtype.
        batch_size : int, optional
            Points inserted per batch (default ``max(1024, n // 2)``).
        beam : int, optional
            Candidate-list size of the neighbour search (default ``2 * intermediate_degree``).

        Returns
        -------
        self

        Examples
        --------
        >>> import numpy as np, knnkit
        >>> rng = np.random.default_rng(0)
        >>> index = knnkit.GraphIndex.build(rng.random((500, 4), dtype=np.float32), device="cpu")
        >>> new = rng.random((100, 4), dtype=np.float32)
        >>> len(index.extend(new))
        600
        """
        batch_size = check_int(batch_size, "batch_size", minimum=1, allow_none=True)
        beam = check_int(beam, "beam", minimum=1, allow_none=True)
        if isinstance(new_data, (list, tuple)):
            new_data = np.asarray(new_data)
        a, _info = check_matrix(new_data, "new_data")
        check_pair(self._engine.data, a, "new_data")
        a = as_host(a)
        dt = self.dtype
        if a.dtype != dt:
            if dt.kind == "f" and a.dtype.kind == "f":
                with np.errstate(over="ignore"):
                    a = a.astype(dt)
                if not np.isfinite(a).all():  # float32 beyond float16's 65504 would be stored as inf
                    raise ValueError(f"new_data values exceed the range of the index dtype {dt}")
            elif dt.kind in "iu" and a.dtype.kind in "iu":
                info_t = np.iinfo(dt)
                if a.min() < info_t.min or a.max() > info_t.max:
                    raise ValueError(f"new_data values do not fit the index dtype {dt}")
                a = a.astype(dt)
            else:
                raise TypeError(f"new_data has dtype {a.dtype}, the index stores {dt}")
        if not fits_scale(absmax(a), self._engine.scale):
            # the graph is built at the stored data's scale: such points overflow its float32 distances
            raise ValueError(f"new_data has values up to {absmax(a):.3g}, beyond what this index (built on data up "
                             f"to {absmax(self._engine.data):.3g}) can compare in float32; build a new index "
                             f"over all the data")
        self._engine.extend(a, batch_size=batch_size, beam=beam)
        self._recalibrate_if_stale()
        return self

    # ------------------------------------------------------------------ deletes
    #: ``delete(compact=None)`` consolidates the graph once more than this fraction of the points
    #: carries tombstones that still have links.
    AUTO_COMPACT_FRACTION = 0.2

    @property
    def n_deleted(self) -> int:
        """Number of deleted points (their ids stay reserved)."""
        return self._engine.n_deleted

    @property
    def deleted(self) -> HostArray:
        """Sorted int64 ids of the deleted points."""
        d = self._engine.deleted
        return np.zeros(0, np.int64) if d is None else np.flatnonzero(d).astype(np.int64)

    def delete(self, ids: ArrayLike, *, compact: bool | None = None) -> int:
        """Delete points: from this call on no search returns them (tombstones).

        Ids stay stable: live points keep theirs, deleted ids are never reused (:meth:`extend`
        appends). Deleting an already deleted id is a no-op (as hnswlib's ``mark_deleted`` of a
        marked point is refused, FAISS's ``remove_ids`` of an absent id is a no-op: knnkit takes
        the forgiving side; ids outside ``[0, n)`` raise).

        Until the graph is consolidated, deleted points keep their links and the search walks
        through them; :meth:`compact` rewires their neighbours (FreshDiskANN-style).

        Parameters
        ----------
        ids : int or array-like of int
        compact : bool or None
            True: consolidate now; False: not now; None (default): when more than
            ``AUTO_COMPACT_FRACTION`` (20 %) of the points are deleted and not yet consolidated.

        Returns
        -------
        int
            Points newly deleted by this call.

        Examples
        --------
        >>> import numpy as np, knnkit
        >>> X = np.random.default_rng(0).random((500, 4), dtype=np.float32)
        >>> index = knnkit.GraphIndex.build(X, device="cpu")
        >>> index.delete([0, 1, 2])
        3
        >>> int(index.search(X[:1], k=1)[1][0, 0]) in (0, 1, 2)
        False
        """
        if compact is not None and not isinstance(compact, bool):
            raise TypeError(f"compact must be True, False or None, got {type(compact).__name__}")
        a = np.asarray(as_host(ids) if hasattr(ids, "__cuda_array_interface__") else ids)
        if a.ndim == 0:
            a = a.reshape(1)
        if a.ndim != 1:
            raise ValueError(f"ids must be an int or a 1-D array of ints, got shape {a.shape}")
        if a.size and a.dtype.kind not in "iu":
            raise TypeError(f"ids must be integers, got dtype {a.dtype}")
        a = a.astype(np.int64)
        if a.size and (a.min() < 0 or a.max() >= self.n):
            raise ValueError(f"ids must be in [0, {self.n}), got values in [{a.min()}, {a.max()}]")
        every = np.union1d(self.deleted, a).size == self.n
        if compact and every:  # refused before anything is marked: the call changes nothing
            raise ValueError("compact=True: this call would delete every point of the index; nothing would be "
                             "left to compact (delete with compact=None or False)")
        new = self._engine.mark_deleted(a)
        stale = not self._engine.consolidated
        # with every point deleted there is nothing to consolidate: the deletes stand, searches refuse
        if compact or (compact is None and stale and not every
                       and self._engine.n_deleted > self.AUTO_COMPACT_FRACTION * self.n):
            self.compact()
        return new

    def compact(self) -> dict[str, Any]:
        """Consolidate the graph around deleted points without a rebuild: every live point that
        linked to a deleted one gets a new RobustPrune'd list from its live neighbours and the
        live neighbours of its deleted ones; deleted points lose all links; the connectivity
        repair makes every live point reachable again; entry points move to live points.
        Returns the statistics (also in ``build_params["compaction"]``)."""
        if self._engine.n_deleted and self._engine.n_deleted == self.n:
            raise ValueError("every point of this index is deleted; nothing to compact")
        st = self._engine.compact()
        self._recalibrate_if_stale()
        return st

    # ------------------------------------------------------------------ persistence
    def save(self, path: PathLike) -> None:
        """Write the index to ``path`` (the knnkit container, kind "index"; atomic).

        Examples
        --------
        >>> import numpy as np, knnkit, tempfile, os
        >>> index = knnkit.GraphIndex.build(np.random.default_rng(0).random((300, 4), dtype=np.float32),
        ...                                 device="cpu")
        >>> path = os.path.join(tempfile.mkdtemp(), "index.knnkit")
        >>> index.save(path)
        >>> knnkit.load(path, device="cpu").n
        300
        """
        from .._core.version import __version__

        meta, arrays = self._engine.to_arrays()
        meta.update(knnkit_version=__version__, search_params=self.search_params.as_dict())
        write_container(path, "index", meta, arrays)

    @classmethod
    def load(cls, path: PathLike, *, device: Device = "auto", mmap: bool = False) -> GraphIndex:
        """Read an index written by :meth:`save` (CPU-only machines load GPU-built indexes).

        Parameters
        ----------
        path : str or os.PathLike
        device : "auto", "cpu", "gpu" or int
            Where the loaded index lives ("auto": the GPU when one is usable).

        Returns
        -------
        GraphIndex

        Raises
        ------
        ValueError
            For files that are not knnkit indexes, of an unknown format version, truncated or
            corrupted (checksum mismatch), or whose content cannot be an index (ids out of range,
            unknown metric, shapes that disagree).

        Examples
        --------
        >>> import numpy as np, knnkit, tempfile, os
        >>> index = knnkit.GraphIndex.build(np.eye(8, dtype=np.float32), device="cpu")
        >>> path = os.path.join(tempfile.mkdtemp(), "eye.knnkit")
        >>> index.save(path)
        >>> knnkit.GraphIndex.load(path, device="cpu").search(np.eye(8, dtype=np.float32)[:1], k=1)[1]
        array([[0]])
        """
        if sniff(path) == "legacy-index":
            meta, arrays = read_legacy_index(path)
        else:
            meta, arrays = read_container(path, kind="index", mmap=mmap)
        validate_index(meta, arrays, path)
        dev, dev_id = resolve_device(device, None)
        engine_cls = HostIndex if meta.get("placement") == "host" else SearchGraph
        engine = engine_cls.from_arrays(meta, arrays, dev, dev_id)
        sp = {k: v for k, v in (meta.get("search_params") or {}).items() if k in SearchParams.field_names()}
        return cls(engine, SearchParams(**sp))



def _resolve_placement(data, device, placement, compression, pq_bytes, *, graph_degree):
    """None for device placement, else ``(host array, device, device id, budget)`` for host
    placement (BANG); validates ``placement``, ``compression`` and ``pq_bytes``."""
    from .._core.config import get_memory_budget, logger
    from .._core.params import check_choice

    check_choice(placement, "placement", ("auto", "device", "host"))
    if compression is not None:
        check_choice(compression, "compression", ("pq", "opq"))
    pq_bytes = check_int(pq_bytes, "pq_bytes", minimum=1, allow_none=True)
    if placement == "device":
        if compression is not None or pq_bytes is not None:
            raise ValueError("compression / pq_bytes apply to placement='host' (or 'auto') only")
        return None
    check_point_count(data, "data")  # (before check_matrix's scan and any copy)
    a, info = check_matrix(data, "data")
    if pq_bytes is not None and pq_bytes > a.shape[1]:
        raise ValueError(f"pq_bytes={pq_bytes} exceeds the dimension d={a.shape[1]}")
    dev, dev_id = resolve_device(device, info)
    budget = get_memory_budget()
    if placement == "auto":
        need = host_bytes(a.shape[0], a.shape[1], a.dtype.itemsize, graph_degree or 64)
        if not budget or need <= budget:
            if compression is not None or pq_bytes is not None:
                logger.info("GraphIndex: placement='auto' resolved to device; compression/pq_bytes unused")
            return None
        logger.info("GraphIndex: graph + vectors need %d bytes, the memory budget is %d: placement='host' with PQ",
                    need, budget)
    return as_host(a), dev, dev_id, budget
