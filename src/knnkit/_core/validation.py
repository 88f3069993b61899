"""Input checks done once at every public entry point, so that bad input gets a clear
ValueError/TypeError here and never reaches a CUDA kernel."""

import math
import numbers

import numpy as np

from .backend import inspect_array, get_array_module

__all__ = ["METRICS", "SUPPORTED_DTYPES", "check_matrix", "check_k", "check_metric", "check_pair"]

METRICS = ("sqeuclidean", "euclidean", "inner_product", "cosine")
SUPPORTED_DTYPES = (np.float32, np.float16, np.uint8, np.int8)


def check_metric(metric, allowed=METRICS):
    if not isinstance(metric, str) or metric not in allowed:
        raise ValueError(f"unknown metric {metric!r}; expected one of {', '.join(allowed)}")
    return metric


def check_matrix(x, name="data", allow_float64=True, check_finite=True, integer=False):
    """Validate a 2-D vector array; return ``(array, info)`` with ``array`` C-contiguous numpy/cupy.

    float64 input is converted to float32 (the library computes in float32). Non-contiguous
    input is copied. ``check_finite=False`` skips the NaN/Inf scan (for data an earlier step of
    the same computation has checked). ``integer=True`` validates an id matrix instead (any
    integer dtype, no conversion).
    """
    if x is None:
        raise TypeError(f"{name} must be an array, got None")
    a, info = inspect_array(x)
    xp = get_array_module(a)
    if a.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array of shape (n, d), got {a.ndim}-D shape {tuple(a.shape)}")
    if a.shape[0] == 0 or a.shape[1] == 0:
        raise ValueError(f"{name} is empty: shape {tuple(a.shape)}")
    dt = np.dtype(a.dtype)
    if not dt.isnative:  # big-endian data (">f8", ">f4" from a file): the same values in native order
        dt = dt.newbyteorder("=")
        a = a.astype(dt)
    if integer:
        if dt.kind not in "iu":
            raise TypeError(f"{name} must hold integer ids, got dtype {dt}")
        return (a if a.flags.c_contiguous else xp.ascontiguousarray(a)), info
    if dt == np.float64 and allow_float64:
        if check_finite:
            if not bool(xp.isfinite(a).all()):
                raise ValueError(f"{name} contains NaN or Inf values")
            big = float(xp.abs(a).max())
            if big > float(np.finfo(np.float32).max):
                raise ValueError(f"{name} has values up to {big:.3g}, beyond the float32 range (3.4e38) that "
                                 f"knnkit computes in; rescale the data")
            if 0.0 < big < float(np.finfo(np.float32).tiny):
                # every value would become a float32 subnormal (or 0), which keeps fewer than 24 bits:
                # the conversion alone would reorder neighbours (1e-44 x Gaussian rows: 10 % of the
                # ids wrong against float64, no warning). Float32 input is exact and is searched at a
                # power-of-two scale (metrics.safe_scale), so only this conversion loses them.
                raise ValueError(f"{name} has values only up to {big:.3g}, below float32's normal range "
                                 f"(1.2e-38) that knnkit computes in: converting them would lose their "
                                 f"precision; rescale the data (e.g. multiply by a power of two)")
        a = a.astype(np.float32)
        dt = np.dtype(np.float32)
    if dt.type not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} has unsupported dtype {dt}; use float32, float16, uint8 or int8 "
                        f"(float64 is converted to float32)")
    if not a.flags.c_contiguous:
        a = xp.ascontiguousarray(a)
    if dt.kind == "f" and check_finite:
        if xp is np:
            finite = bool(xp.isfinite(a).all())
        else:
            # on the GPU one reduction (and one wait for it) serves both: the largest |value| is
            # NaN or Inf exactly when some value is (CuPy's max propagates NaN), and the search's
            # scale check wants it next (ArrayInfo.absmax)
            big = float(xp.abs(a).max())
            finite = math.isfinite(big)
            info.absmax = big if finite else None
        if not finite:
            raise ValueError(f"{name} contains NaN or Inf values")
    return a, info


def check_pair(data, queries, name="queries"):
    """Check that data and queries (the argument ``name``) agree in dimension."""
    if queries.shape[1] != data.shape[1]:
        raise ValueError(f"dimension mismatch: data has d={data.shape[1]}, {name} have d={queries.shape[1]}")


def check_k(k, n, *, self_excluded=False, name="k", max_k=None):
    """k must be an integer with 1 <= k <= n (k < n when each point excludes itself)."""
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(k).__name__}")
    k = int(k)
    if k < 1:
        raise ValueError(f"{name} must be >= 1, got {k}")
    limit = n - 1 if self_excluded else n
    if k > limit:
        what = "n - 1 (each point excludes itself)" if self_excluded else "the number of data points"
        raise ValueError(f"{name}={k} exceeds {what}: {limit}")
    if max_k is not None and k > max_k:
        raise ValueError(f"{name}={k} exceeds the supported maximum {max_k}")
    return k
