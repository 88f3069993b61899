"""knnkit: nearest neighbours on NVIDIA GPUs, with a CPU path behind the same API.

Exact k-NN (:func:`knn`, GEMM or Sweet KNN), approximate k-NN graphs (:func:`knn_graph`,
NN-Descent or RSFK), graph merge and out-of-core builds, and graph search indexes
(:class:`GraphIndex`, device- or host-placed). ``knnkit.sklearn`` and ``knnkit.dask`` are
imported on their own (they need their extras).

Layers (see README, "Architecture"): ``_core`` (arrays, validation, metrics, memory budget,
kernel cache, parameter objects, registry, file container) <- algorithms (``exact``, ``graph``,
``index``) <- facades (``api``, ``io``, ``cli``, ``bench``, ``datasets``, ``evaluate``,
``sklearn``, ``dask``).
"""

import importlib
from typing import TYPE_CHECKING, Any

from ._core.config import set_output, get_output, set_memory_budget, get_memory_budget, set_progress
from ._core.backend import gpu_available

from ._core.version import __version__

# The rest of the face is imported on first use (PEP 562): ``import knnkit`` then costs numpy and
# the core only, not Numba's ~0.3 s (or scipy, CuPy) before the first call needs them.
_LAZY = {
    "knn": ".api.exact", "KnnGraph": ".api.graph", "knn_graph": ".api.graph", "merge_graphs": ".api.graph",
    "knn_graph_out_of_core": ".api.graph", "umap_knn": ".api.graph", "GraphIndex": ".api.index",
    "load": ".api.load", "methods": ".api.load", "ExactParams": ".exact", "NNDescentParams": ".graph.nndescent",
    "RSFKParams": ".graph.rsfk", "IndexParams": ".index", "SearchParams": ".index",
}
_SUBMODULES = ("io", "datasets", "evaluate")

if TYPE_CHECKING:  # type checkers see the real signatures; at run time the names stay lazy
    from . import datasets, evaluate, io
    from .api.exact import knn
    from .api.graph import KnnGraph, knn_graph, knn_graph_out_of_core, merge_graphs, umap_knn
    from .api.index import GraphIndex
    from .api.load import load, methods
    from .exact import ExactParams
    from .graph.nndescent import NNDescentParams
    from .graph.rsfk import RSFKParams
    from .index import IndexParams, SearchParams

__all__ = [
    "knn", "knn_graph", "KnnGraph", "merge_graphs", "knn_graph_out_of_core", "umap_knn", "GraphIndex", "load", "methods",
    "ExactParams", "NNDescentParams", "RSFKParams", "IndexParams", "SearchParams",
    "set_output", "get_output", "set_memory_budget", "get_memory_budget", "set_progress",
    "gpu_available", "io", "datasets", "evaluate", "__version__",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module("." + name, __name__)
    else:
        raise AttributeError(f"module 'knnkit' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
