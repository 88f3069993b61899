"""Type aliases of the public signatures (annotations only; nothing here runs at import time).

knnkit takes and returns arrays of several frameworks (numpy, cupy, torch) and does not depend on
cupy or torch, so array types are aliases of ``Any``: a checker accepts any array there, and the
names document what a parameter expects."""

from __future__ import annotations

import os
from typing import Any, Tuple, Union

__all__ = ["ArrayLike", "Array", "HostArray", "PathLike", "Device", "Seed", "Metric", "Params", "NeighborPair"]

#: Input vectors or ids: numpy.ndarray, cupy.ndarray, torch.Tensor (CPU or CUDA), numpy.memmap, or a
#: nested sequence ``numpy.asarray`` accepts.
ArrayLike = Any
#: A result array in the framework :func:`knnkit.set_output` selects (numpy, cupy or torch).
Array = Any
#: A numpy array (results that always live on the host).
HostArray = Any
#: A file name.
PathLike = Union[str, os.PathLike]
#: ``"auto"``, ``"cpu"``, ``"gpu"`` or a CUDA device ordinal.
Device = Union[str, int]
#: ``None``, an int seed or a ``numpy.random.Generator``.
Seed = Any
#: A metric name: "sqeuclidean", "euclidean", "inner_product", "cosine" (graphs also "manhattan");
#: a plain ``str`` so that a variable holding one type-checks (the value is checked at run time).
Metric = str
#: A method's parameter object (ExactParams, SweetParams, NNDescentParams, RSFKParams, ...).
Params = Any
#: ``(distances, indices)``.
NeighborPair = Tuple[Array, Array]
