"""Metric handling shared by every algorithm.

Internally every algorithm minimises one of two kernels on float32 vectors:
``"l2"`` (squared Euclidean) or ``"ip"`` (negative inner product). ``cosine`` is ``ip`` on
unit-normalised vectors plus one; ``euclidean`` is ``l2`` followed by a square root.
"""

import numpy as np

from .backend import get_array_module

__all__ = ["internal_metric", "prepare_vectors", "finalize_distances", "to_internal", "to_float32",
           "is_similarity"]


def internal_metric(metric):
    return "ip" if metric in ("inner_product", "cosine") else ("l1" if metric == "manhattan" else "l2")


def is_similarity(metric):
    return metric == "inner_product"


def to_float32(a):
    xp = get_array_module(a)
    if a.dtype == np.float32:
        return a
    return a.astype(xp.float32)


def prepare_vectors(a, metric):
    """float32 copy of ``a`` ready for the internal kernel (normalised for cosine)."""
    xp = get_array_module(a)
    a = to_float32(a)
    if metric == "cosine":
        norms = xp.sqrt((a * a).sum(axis=1, keepdims=True))
        norms = xp.where(norms > 0, norms, xp.float32(1))
        a = (a / norms).astype(xp.float32)
    return a


def finalize_distances(d, metric):
    """Turn internal distances (smaller is better) into the user's metric, in place when possible."""
    xp = get_array_module(d)
    if metric == "euclidean":
        return xp.sqrt(xp.maximum(d, 0, out=d), out=d)
    if metric == "sqeuclidean":
        return xp.maximum(d, 0, out=d)
    if metric == "inner_product":
        return xp.negative(d, out=d)
    if metric == "cosine":
        d += 1
        return d
    return d


def to_internal(d, metric):
    """User-metric distances back to the internal minimised form (inverse of
    :func:`finalize_distances`), as a new float32 array (numpy or cupy)."""
    xp = get_array_module(d)
    d = xp.asarray(d, dtype=xp.float32)
    if metric == "euclidean":
        return d * d
    if metric == "inner_product":
        return -d
    if metric == "cosine":
        return d - xp.float32(1)
    return d.copy()
