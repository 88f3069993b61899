"""Metric handling shared by every algorithm.

Internally every algorithm minimises one of two kernels on float32 vectors:
``"l2"`` (squared Euclidean) or ``"ip"`` (negative inner product). ``cosine`` is ``ip`` on
unit-normalised vectors plus one; ``euclidean`` is ``l2`` followed by a square root.
"""

import math

import numpy as np

from .backend import get_array_module

__all__ = ["top_direction", "internal_metric", "prepare_vectors", "finalize_distances", "to_internal", "to_float32",
           "is_similarity", "safe_scale", "scaled_absmax", "scale_for_max", "absmax", "fits_scale"]

# Finite float32 data whose largest magnitude lies outside [2^-50, 2^50] is computed at a
# power-of-two scale (exact: only the exponent changes): above, squared distances overflow
# float32 (1e20-scale data gave every id -1 and every distance inf); below, they underflow to 0
# and every pair ties. Inside the range nothing changes, so ordinary data gives the same bits.
_SAFE_LO, _SAFE_HI = 2.0 ** -50, 2.0 ** 50


def internal_metric(metric):
    return "ip" if metric in ("inner_product", "cosine") else ("l1" if metric == "manhattan" else "l2")


def is_similarity(metric):
    return metric == "inner_product"


def to_float32(a):
    xp = get_array_module(a)
    if a.dtype == np.float32:
        return a
    return a.astype(xp.float32)


def safe_scale(a, *others):
    """The power of two that brings the largest ``|value|`` of ``a`` (and of ``others``, arrays that
    are compared with it) near 1 when it lies outside ``[2^-50, 2^50]``, else 1.0 (integer and
    float16 data always get 1.0)."""
    return scale_for_max(max(scaled_absmax(x) for x in (a,) + others))


def scaled_absmax(a):
    """The largest ``|value|`` of a float32 array (0.0 for other dtypes, which never need a scale)."""
    if np.dtype(a.dtype) != np.float32 or not a.size:
        return 0.0
    return float(get_array_module(a).abs(a).max())


def absmax(a):
    """The largest ``|value|`` of an array of any supported dtype, as a Python float (0.0 when empty)."""
    if not a.size:
        return 0.0
    xp = get_array_module(a)
    if np.dtype(a.dtype).kind != "f":  # abs(int8 -128) wraps in int8
        return float(max(abs(float(a.min())), abs(float(a.max()))))
    return float(xp.abs(a).max())


def fits_scale(m, scale):
    """Whether vectors whose largest ``|value|`` is ``m`` can be compared at the power-of-two ``scale``
    chosen for other data (a stored index's): ``m * scale`` stays within the range where squared
    distances and inner products cannot overflow float32 (``2^50``, as :func:`scale_for_max`)."""
    return m * scale <= _SAFE_HI


def scale_for_max(m):
    """:func:`safe_scale` from a known largest magnitude ``m``."""
    if m == 0.0 or _SAFE_LO <= m <= _SAFE_HI or not math.isfinite(m):
        return 1.0
    return 2.0 ** (1 - math.frexp(m)[1])  # max |a| * scale in [1, 2)


def prepare_vectors(a, metric, scale=1.0):
    """float32 copy of ``a`` ready for the internal kernel (multiplied by ``scale``, a power of two
    from :func:`safe_scale`; normalised for cosine)."""
    xp = get_array_module(a)
    a = to_float32(a)
    if scale != 1.0:  # exact power-of-two scaling, through float64 (the factor may not fit float32)
        a = (a.astype(xp.float64) * scale).astype(xp.float32)
    if metric == "cosine":
        norms = xp.sqrt((a * a).sum(axis=1, keepdims=True))
        norms = xp.where(norms > 0, norms, xp.float32(1))
        a = (a / norms).astype(xp.float32)
    return a


def finalize_distances(d, metric, scale=1.0):
    """Turn internal distances (smaller is better) into the user's metric, in place when possible.

    ``scale`` is the factor the vectors were multiplied by (:func:`safe_scale`); distances of
    scaled data are brought back to the data's own units (inf where float32 cannot hold them,
    with a warning)."""
    xp = get_array_module(d)
    if scale != 1.0 and metric != "cosine":
        # in float64: the factor can be far outside float32's range (data near 1e-45 or 1e38)
        d64 = d.astype(xp.float64)
        if metric == "euclidean":
            d64 = xp.sqrt(xp.maximum(d64, 0))
        d64 /= scale if metric in ("euclidean", "manhattan") else scale * scale
        with np.errstate(over="ignore"):
            d[...] = d64.astype(xp.float32)
        if metric == "euclidean":
            return d
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


def to_internal(d, metric, scale=1.0):
    """User-metric distances back to the internal minimised form of data multiplied by ``scale``
    (the inverse of :func:`finalize_distances`), as a new float32 array (numpy or cupy)."""
    xp = get_array_module(d)
    d = xp.asarray(d, dtype=xp.float32)
    if metric == "euclidean":
        d = d * d
    elif metric == "inner_product":
        d = -d
    elif metric == "cosine":
        return d - xp.float32(1)  # unit rows: no scale
    else:
        d = d.copy()
    if scale != 1.0:  # in float64, as finalize_distances: the factor may lie outside float32's range
        d = (d.astype(xp.float64) * (scale if metric == "manhattan" else scale * scale)).astype(xp.float32)
    return d


def top_direction(C, u, iters):
    """Unit vector along the top principal direction of the centred float64 rows ``C``, by
    ``iters`` power iterations from the start vector ``u`` (stopped early when the rows give a
    zero or non-finite product: all rows equal). Shared by the exact path's main-axis windows and
    the Dask tree's hyperplanes."""
    for _ in range(iters):
        v = C.T @ (C @ u)
        nv = np.linalg.norm(v)
        if not np.isfinite(nv) or nv == 0:
            break
        u = v / nv
    return u / np.linalg.norm(u)
