"""Graph search index engine: a fixed out-degree proximity graph (RobustPrune or GGNN
diversification of a k-NN graph) searched best-first with the GGNN slack stop, on the GPU or the
CPU. :class:`SearchGraph` (``_engine.py``) is the engine behind :class:`knnkit.GraphIndex`.

Papers: GGNN (Groh et al., "GGNN: Graph-based GPU Nearest Neighbor Search": block-per-query
search with the slack criterion, symmetric links), BANG (Karthik et al.: Bloom-filter visited set,
exact re-ranking), DiskANN/Vamana's RobustPrune.

>>> import numpy as np, knnkit
>>> data = np.random.default_rng(0).random((1000, 8), dtype=np.float32)
>>> index = knnkit.GraphIndex.build(data, device="cpu")
>>> dist, idx = index.search(data[:3], k=5)
>>> idx.shape
(3, 5)
"""

import dataclasses
import math

from .._core.params import Params, check_bool, check_choice, check_float, check_int
from ._engine import SearchGraph, default_n_entry

__all__ = ["SearchGraph", "IndexParams", "SearchParams", "default_n_entry"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class IndexParams(Params):
    """Build parameters of a :class:`knnkit.GraphIndex` (see :meth:`knnkit.GraphIndex.build`).

    ``None`` fields are chosen from the data (graph degree and alpha from the estimated intrinsic
    dimension, ``n_entry`` from n). ``connectivity=True`` (default) repairs the search graph so
    that every point is reachable from the entry points (components, a door into each, links
    between neighbouring components; :mod:`knnkit.index._connect`). ``entry="hierarchy"``
    replaces the k-means entry points by GGNN's layer hierarchy (random subsets with their own
    graphs, searched top-down for the start points; :mod:`knnkit.index._hierarchy`).
    """

    graph_degree: int | None = None
    intermediate_degree: int | None = None
    alpha: float | None = None
    build_algo: str = "nndescent"
    diversify: str = "prune"
    n_entry: int | None = None
    connectivity: bool = True
    entry: str = "kmeans"

    def _validate(self):
        R = check_int(self.graph_degree, "graph_degree", minimum=1, allow_none=True)
        K = check_int(self.intermediate_degree, "intermediate_degree", minimum=1, allow_none=True)
        if R is not None and K is not None and K < R:
            raise ValueError(f"intermediate_degree ({K}) must be >= graph_degree ({R})")
        return {"graph_degree": R, "intermediate_degree": K,
                "alpha": check_float(self.alpha, "alpha", minimum=1.0, allow_none=True),
                "build_algo": check_choice(self.build_algo, "build_algo", ("nndescent", "brute")),
                "diversify": check_choice(self.diversify, "diversify", ("prune", "ggnn")),
                "n_entry": check_int(self.n_entry, "n_entry", minimum=1, allow_none=True),
                "connectivity": check_bool(self.connectivity, "connectivity"),
                "entry": check_choice(self.entry, "entry", ("kmeans", "hierarchy"))}


@dataclasses.dataclass(frozen=True, kw_only=True)
class SearchParams(Params):
    """Search parameters (see :meth:`knnkit.GraphIndex.search`). An index stores defaults; a call
    overrides the fields it gives."""

    beam: int | None = 64
    tau: float | None = None
    max_iters: int | None = None
    n_seeds: int | None = 4
    traversal: str = "auto"
    batch_size: int | None = None
    #: host placement (BANG) only: expanded candidates re-ranked exactly (default: beam; k = off)
    rerank: int | None = None
    #: host placement on the GPU only: choose the next candidate before the merge (BANG 4.6)
    prefetch: bool = True
    #: host placement on the GPU only: queries per pipelined batch (default: half of the call's)
    pipeline_batch: int | None = None
    #: host placement only: work-list entries expanded per query per iteration (CAGRA's search
    #: width W; 1 = BANG's one-candidate walk; at most 64). Larger W: fewer GPU iterations, a few
    #: more expansions. 4: on an H200, 3M x 96, L = 64, iterations 70 -> 21 and QPS 82k -> 118k at
    #: the same recall (0.997); W = 8 gave 0-15 % more (index/bang/NOTES.md)
    search_width: int = 4

    def _validate(self):
        tau = check_float(self.tau, "tau", minimum=0.0, allow_none=True, allow_inf=True)
        return {"beam": check_int(self.beam, "beam", minimum=1, allow_none=True),
                "tau": None if tau is None or math.isinf(tau) else tau,
                "max_iters": check_int(self.max_iters, "max_iters", minimum=1, allow_none=True),
                "n_seeds": check_int(self.n_seeds, "n_seeds", minimum=1, allow_none=True),
                "traversal": check_choice(self.traversal, "traversal", ("auto", "fp16", "fp32")),
                "batch_size": check_int(self.batch_size, "batch_size", minimum=1, allow_none=True),
                "rerank": check_int(self.rerank, "rerank", minimum=1, allow_none=True),
                "prefetch": check_bool(self.prefetch, "prefetch"),
                "pipeline_batch": check_int(self.pipeline_batch, "pipeline_batch", minimum=1, allow_none=True),
                # 64: the GPU kernels' shared scratch (bang.cu BANG_MAX_W); W*R rows per query beyond it
                "search_width": check_int(self.search_width, "search_width", minimum=1, maximum=64)}

    @classmethod
    def field_names(cls) -> "tuple[str, ...]":
        return tuple(f.name for f in dataclasses.fields(cls))

    def resolve(self, k: int, call: "dict[str, object]", n_entry: int,
                min_beam: int = 0) -> "tuple[int, float, int, int]":
        """``(beam, tau, max_iters, n_seeds)`` of one search: ``call`` holds the values given to the
        call (None: this object's default; ``tau=inf``: slack stop off for this call); the beam is
        at least ``k`` and ``min_beam``."""
        beam = max(call.get("beam") or self.beam or 64, k, int(min_beam))
        tau = call.get("tau")
        if tau is None:
            tau = self.tau
        tau = math.inf if tau is None else float(tau)
        max_iters = call.get("max_iters") or self.max_iters or max(64, 8 * beam)
        # a long candidate list wants entries from several clusters: well separated clusters can
        # leave the k-NN graph disconnected, and only seeds reach the other components
        n_seeds = min(max(call.get("n_seeds") or self.n_seeds or 4, beam // 16), max(1, n_entry))
        return beam, tau, max_iters, n_seeds
