"""knnkit: nearest neighbours on NVIDIA GPUs, with a CPU path behind the same API.

Exact k-NN (:func:`knn`), approximate k-NN graphs (:func:`knn_graph`, GPU NN-Descent),
graph merge and out-of-core builds, and graph search indexes (:class:`GraphIndex`).

Layers (see README, "Architecture"): ``_core`` (arrays, validation, metrics, memory budget,
kernel cache, parameter objects, registry, file container) <- algorithms (``exact``, ``graph``,
``index``) <- facades (``api``, ``io``, ``cli``, ``datasets``, ``evaluate``).
"""

from ._core.config import set_output, get_output, set_memory_budget, get_memory_budget, set_progress
from ._core.backend import gpu_available
from .api.exact import knn
from .api.graph import KnnGraph, knn_graph, merge_graphs, knn_graph_out_of_core, umap_knn
from .api.index import GraphIndex
from .api.load import load, methods
from .exact import ExactParams
from .graph.nndescent import NNDescentParams
from .graph.rsfk import RSFKParams
from .index import IndexParams, SearchParams
from . import io, datasets, evaluate

__version__ = "0.2.0"

__all__ = [
    "knn", "knn_graph", "KnnGraph", "merge_graphs", "knn_graph_out_of_core", "umap_knn", "GraphIndex", "load", "methods",
    "ExactParams", "NNDescentParams", "RSFKParams", "IndexParams", "SearchParams",
    "set_output", "get_output", "set_memory_budget", "get_memory_budget", "set_progress",
    "gpu_available", "io", "datasets", "evaluate", "__version__",
]
