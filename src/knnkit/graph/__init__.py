"""k-NN graph construction: NN-Descent (GNND on the GPU, Numba on the CPU), exact brute force for
small inputs, graph merge (GGM), incremental and out-of-core builds.

Paper: Wang, Zhao & Zeng, "Large-Scale Approximate k-NN Graph Construction on GPU" (GNND
section 4, GGM and out-of-memory construction section 5).
"""

from ._graph import KnnGraph
from ._build import knn_graph, default_parameters
from ._merge import merge_graphs
from ._out_of_core import knn_graph_out_of_core

__all__ = ["KnnGraph", "knn_graph", "merge_graphs", "knn_graph_out_of_core", "default_parameters"]
