"""RSFK: k-NN graphs from random-sample forests with warp-centric leaf updates (w-KNNG), plus the
nearest-neighbour exploration (NNE) post-pass. GPU kernels in ``rsfk.cu`` (``_gpu.py``), the Numba
twin in ``_cpu.py``; the forest driver, parameters and recall estimator in ``_engine.py``.

Paper: Meyer, Pozo & Nunan Zola, "Warp-centric K-Nearest Neighbor Graphs construction on GPU"
(ICPP 2021 workshops, DUAC). Design and measurements: ``NOTES_rsfk.md``.
"""

from ._engine import (RSFKParams, default_leaf_size, default_n_trees, estimate_recall, rsfk_graph, rsfk_lists,
                      trees_stalled)

__all__ = ["RSFKParams", "rsfk_lists", "rsfk_graph", "estimate_recall", "default_leaf_size", "default_n_trees",
           "trees_stalled"]
