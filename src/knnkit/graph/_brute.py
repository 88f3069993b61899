"""The ``"brute"`` graph method: the exact k-NN graph (the exact engine with each point excluding
itself; manhattan, which the GEMM path does not serve, by a CPU loop)."""

import numpy as np

from .._core.backend import as_host
from ..exact import knn_lists

__all__ = ["brute_graph"]


def brute_graph(X, k, *, metric, params=None, seed=0):
    """Engine of the ``"brute"`` graph method on prepared ``X``: ``(I, D, stats)`` with internal
    distances, self excluded (contract in :mod:`knnkit._core.registry`)."""
    if metric == "l1":
        from .nndescent._cpu import exact_graph_cpu

        I, D = exact_graph_cpu(np.ascontiguousarray(as_host(X), dtype=np.float32), k, "l1")
        return I, D, {}
    D, I, _ = knn_lists(X, X, k, metric=metric, exclude_self=True, params=params)
    return I, D, {}
