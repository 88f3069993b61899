"""The ``"brute"`` graph method: the exact k-NN graph (the exact engine with each point excluding
itself: Sweet KNN where it pays, as ``knnkit.knn(method="auto")`` decides, else the GEMM path --
on the GPU its certified tensor-core mode unless ExactParams say otherwise; manhattan, which
neither serves, by a CPU loop)."""

import numpy as np

from .._core.backend import as_host, device_of
from ..exact import ExactParams, knn_lists

__all__ = ["brute_graph", "GRAPH_GPU_PRECISION"]

#: Precision of the exact graph on the GPU when no ExactParams are given (certified: exact up to
#: ties; "exact" is the plain float32 GEMM).
GRAPH_GPU_PRECISION = "fp16_rerank"


def brute_graph(X, k, *, metric, params=None, seed=0):
    """Engine of the ``"brute"`` graph method on prepared ``X``: ``(I, D, stats)`` with internal
    distances, self excluded (contract in :mod:`knnkit._core.registry`)."""
    if metric == "l1":
        from .nndescent._cpu import exact_graph_cpu

        I, D = exact_graph_cpu(np.ascontiguousarray(as_host(X), dtype=np.float32), k, "l1")
        return I, D, {}
    default = params is None or params == ExactParams()
    if metric == "l2" and default:
        # low-dimensional data: the triangle-inequality filters skip nearly every distance (2-D
        # 100k points on an H100: 1.1 s through the GEMM path); GEMM parameters given keep GEMM
        from ..exact.sweet import sweet_knn, sweet_pays

        if sweet_pays(X, None, k, device=device_of(X), seed=seed):
            D, I, _ = sweet_knn(X, X, k, metric="l2", exclude_self=True, seed=seed)
            return I, D, {"exact_method": "sweet"}
    if default and device_of(X) == "gpu":
        # the certified tensor-core GEMM (every row's error bound checked, failures recomputed in
        # float32: exact up to ties), as the exact fallbacks of knn_graph use: H200, 100k x 128
        # 0.047 s against 0.115 s for the float32 GEMM (benchmarks/graph_auto_crossover.py)
        params = ExactParams(precision=GRAPH_GPU_PRECISION)
    D, I, _ = knn_lists(X, X, k, metric=metric, exclude_self=True, params=params)
    return I, D, {"exact_method": "gemm", "precision": "exact" if params is None else params.precision}
