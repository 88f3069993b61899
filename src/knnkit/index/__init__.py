"""Graph search index: a fixed out-degree proximity graph (RobustPrune or GGNN diversification of
a k-NN graph) searched best-first with the GGNN slack stop, on the GPU or the CPU.

>>> import numpy as np, knnkit
>>> data = np.random.default_rng(0).random((1000, 8), dtype=np.float32)
>>> index = knnkit.GraphIndex.build(data, device="cpu")
>>> dist, idx = index.search(data[:3], k=5)
>>> idx.shape
(3, 5)
"""

from ._index import GraphIndex

__all__ = ["GraphIndex"]
