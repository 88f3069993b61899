"""Prepared arrays: validated once, on the right device, metric transform applied once.

Every public function turns its inputs into :class:`Prepared` objects at its entry and hands
those to the engines; no engine validates or converts again.
"""

import contextlib
import dataclasses

from .backend import ArrayInfo, as_device, as_host, resolve_device
from .metrics import internal_metric, prepare_vectors, scale_for_max, scaled_absmax
from .validation import check_matrix, check_metric, check_pair, METRICS

__all__ = ["Prepared", "prepare", "prepare_queries", "rescaled", "device_scope", "MAX_POINTS", "check_point_count"]

#: Point ids are int32 in the GPU kernels and in the graphs (k-NN graphs, search graphs, their
#: builders on both devices): at most this many points (one id value stays free for "none").
MAX_POINTS = 2**31 - 2


def check_point_count(data, name, why="knnkit's graphs and GPU kernels"):
    """ValueError when the rows of ``data`` (an array, or anything with a ``shape``; its rows read
    from the shape alone, before any scan or copy) exceed :data:`MAX_POINTS` (``why``: what holds
    int32 ids). Objects without a shape pass (``check_matrix`` judges them)."""
    shape = getattr(data, "shape", None)
    if shape is None or len(shape) < 1:
        return
    n = int(shape[0])
    if n > MAX_POINTS:
        raise ValueError(f"{name} has {n} points: {why} index points with int32 ids, so at most "
                         f"{MAX_POINTS} (2**31 - 2) points; index it in parts, or search it with knnkit.knn on the "
                         f"CPU, whose ids are int64")


@dataclasses.dataclass(frozen=True)
class Prepared:
    """One validated input.

    Attributes
    ----------
    raw : array
        The validated array in its storage dtype (float32/float16/uint8/int8), on ``device``.
    X : array
        float32, metric transform applied (cosine: unit rows), on ``device``.
    metric : str
        User metric.
    internal : str
        Internal minimised metric: ``"l2"``, ``"ip"`` or ``"l1"``.
    device : {"cpu", "gpu"}
    device_id : int or None
    info : ArrayInfo
        Where results for this input go (framework and device of the input).
    scale : float
        Power of two the float32 vectors were multiplied by (1.0 for ordinary data; see
        :func:`knnkit._core.metrics.safe_scale`); results are converted back.
    """

    raw: object
    X: object
    metric: str
    internal: str
    device: str
    device_id: object
    info: ArrayInfo
    scale: float = 1.0
    absmax: float = 0.0  # largest |value| of float32 data (0.0 otherwise): scales of pairs from it

    @property
    def n(self):
        return int(self.X.shape[0])

    @property
    def d(self):
        return int(self.X.shape[1])


def device_scope(device, device_id):
    """Context that makes ``device_id`` the current CUDA device (a no-op on the CPU)."""
    if device == "gpu" and device_id is not None:
        import cupy

        return cupy.cuda.Device(device_id)
    return contextlib.nullcontext()


def _place(a, device, device_id):
    if device == "cpu":
        return as_host(a)
    with device_scope(device, device_id):
        return as_device(a)


def prepare(data, *, metric="sqeuclidean", device="auto", name="data", metrics=METRICS, check_finite=True,
            int32_ids=True):
    """Validate ``data`` (2-D, supported dtype, finite), resolve the device, move it there and
    apply the metric transform. Returns a :class:`Prepared`. ``int32_ids``: the caller stores
    point ids as int32 (graphs, indexes): more than :data:`MAX_POINTS` rows are refused before any
    copy; GPU data is held to it in any case (the kernels' ids)."""
    metric = check_metric(metric, metrics)
    if int32_ids:
        check_point_count(data, name)
    a, info = check_matrix(data, name, check_finite=check_finite)
    kind, dev_id = resolve_device(device, info)
    if kind == "gpu":
        check_point_count(a, name, "the GPU kernels")
    with device_scope(kind, dev_id):
        raw = _place(a, kind, dev_id)
        absmax = scaled_absmax(raw)
        scale = scale_for_max(absmax)
        X = prepare_vectors(raw, metric, scale)
    return Prepared(raw, X, metric, internal_metric(metric), kind, dev_id, info, scale, absmax)


def prepare_queries(queries, like, *, name="queries", check_finite=True, scale=None):
    """Validate ``queries`` against a prepared data set ``like`` (same dimension, metric and device);
    results go where the queries came from. Their scale covers the data's magnitude and theirs (or
    is ``scale``); :func:`rescaled` brings ``like`` to it when it differs."""
    a, info = check_matrix(queries, name, check_finite=check_finite)
    check_pair(like.raw, a)
    with device_scope(like.device, like.device_id):
        raw = _place(a, like.device, like.device_id)
        absmax = scaled_absmax(raw)
        # one scale for both: queries may be far larger or smaller than the data
        scale = scale_for_max(max(like.absmax, absmax)) if scale is None else scale
        X = prepare_vectors(raw, like.metric, scale)
    return Prepared(raw, X, like.metric, like.internal, like.device, like.device_id, info, scale, absmax)


def rescaled(P, scale):
    """``P`` with its vectors at another power-of-two ``scale`` (queries of a very different
    magnitude than the data: one scale must serve both)."""
    if scale == P.scale:
        return P
    with device_scope(P.device, P.device_id):
        X = prepare_vectors(P.raw, P.metric, scale)
    return Prepared(P.raw, X, P.metric, P.internal, P.device, P.device_id, P.info, scale, P.absmax)
