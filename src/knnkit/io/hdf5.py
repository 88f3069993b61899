"""ann-benchmarks HDF5 files (``train``, ``test``, ``neighbors``, ``distances`` datasets)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .._core.types import PathLike

__all__ = ["read_hdf5"]

# ann-benchmarks' names for its metrics -> knnkit's
_METRIC_NAMES = {"euclidean": "euclidean", "angular": "cosine", "cosine": "cosine", "dot": "inner_product",
                 "ip": "inner_product", "inner_product": "inner_product", "sqeuclidean": "sqeuclidean"}


def read_hdf5(path: PathLike) -> dict[str, Any]:
    """Read an ann-benchmarks HDF5 file (e.g. ``fashion-mnist-784-euclidean.hdf5``).

    Parameters
    ----------
    path : str or os.PathLike

    Returns
    -------
    dict
        ``"train"`` (n, d) and ``"test"`` (nq, d) vectors, ``"neighbors"`` (nq, k) int64 true neighbour
        ids and ``"distances"`` (nq, k) float32 true distances, as numpy arrays (a key is absent when the
        file lacks that dataset), plus ``"metric"``: the file's ``distance`` attribute in knnkit's names
        (``"angular"`` -> ``"cosine"``), or None.

    Raises
    ------
    ImportError
        h5py is not installed (``pip install h5py`` or ``pip install knnkit[hdf5]``).

    Examples
    --------
    >>> from knnkit.io import read_hdf5
    >>> d = read_hdf5("glove-100-angular.hdf5")  # doctest: +SKIP
    >>> d["metric"], d["train"].shape  # doctest: +SKIP
    ('cosine', (1183514, 100))
    """
    try:
        import h5py
    except ImportError:
        raise ImportError("reading HDF5 files needs h5py: pip install h5py (or pip install knnkit[hdf5])") from None
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    out = {}
    try:
        with h5py.File(path, "r") as f:
            for key in ("train", "test", "neighbors", "distances"):
                if key in f:
                    # a group (or link to one) under a dataset's name: say so, not a cryptic numpy error
                    if not isinstance(f[key], h5py.Dataset):
                        raise ValueError(f"{path}: {key!r} is an HDF5 {type(f[key]).__name__.lower()}, not a "
                                         f"dataset (an ann-benchmarks file stores {key!r} as an array)")
                    a = np.asarray(f[key])
                    if key in ("train", "test") and (a.ndim != 2 or a.dtype.kind not in "fiu"):
                        raise ValueError(f"{path}: {key!r} must be a 2-D numeric (n, d) array, got shape "
                                         f"{a.shape} dtype {a.dtype}")
                    out[key] = a
            raw = f.attrs.get("distance")
    except OSError as e:
        raise ValueError(f"{path}: not a readable HDF5 file ({e})") from None
    if isinstance(raw, bytes):
        raw = raw.decode()
    out["metric"] = _METRIC_NAMES.get(str(raw).lower(), str(raw)) if raw is not None else None
    if "neighbors" in out:
        out["neighbors"] = out["neighbors"].astype(np.int64, copy=False)
    if "distances" in out:
        out["distances"] = out["distances"].astype(np.float32, copy=False)
    if not any(k in out for k in ("train", "test")):
        raise ValueError(f"{path}: no 'train' or 'test' dataset (not an ann-benchmarks file)")
    return out
