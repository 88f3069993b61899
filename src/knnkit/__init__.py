"""knnkit: nearest neighbours on NVIDIA GPUs, with a CPU path behind the same API.

Exact k-NN (:func:`knn`), approximate k-NN graphs (:func:`knn_graph`, GPU NN-Descent),
graph merge and out-of-core builds, and graph search indexes (:class:`GraphIndex`).
"""

from ._core.config import set_output, get_output, set_memory_budget, get_memory_budget, set_progress
from ._core.backend import gpu_available
from .exact import knn
from .graph import KnnGraph, knn_graph, merge_graphs, knn_graph_out_of_core
from .index import GraphIndex
from ._persist import load
from . import io, datasets, evaluate

__version__ = "0.1.0"

__all__ = [
    "knn", "knn_graph", "KnnGraph", "merge_graphs", "knn_graph_out_of_core", "GraphIndex", "load",
    "set_output", "get_output", "set_memory_budget", "get_memory_budget", "set_progress",
    "gpu_available", "io", "datasets", "evaluate", "__version__",
]
