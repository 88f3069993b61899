"""Exact k-NN by brute force: the ground truth every other knnkit algorithm is measured against.

CPU: blocked BLAS GEMM + Numba heap selection (:mod:`._cpu`). GPU: cuBLAS GEMM tiles + the
k-selection kernel of ``kernels/topk.cu`` (:mod:`._gpu`), optionally with tensor-core
candidate generation followed by an exact float32 re-rank.
"""

import numpy as np

from .._core.backend import resolve_device, as_host, as_device, wrap_output
from .._core.metrics import internal_metric, prepare_vectors, finalize_distances
from .._core.validation import check_matrix, check_pair, check_k, check_metric
from ._cpu import knn_cpu, select_rows_cpu

__all__ = ["knn", "knn_cpu", "knn_gpu", "topk_rows", "select_rows_cpu", "PRECISIONS", "MAX_GPU_K"]

#: Values accepted by ``knn(precision=...)``. Only "exact" runs a plain float32 GEMM; the
#: ``*_rerank`` modes generate candidates with a tensor-core GEMM, re-rank them in exact float32
#: and certify every row with an error bound (rows that fail are recomputed exactly).
PRECISIONS = ("exact", "fp16_rerank", "tf32_rerank", "bf16_rerank")

#: Largest k served by the selection kernel (larger k on the GPU falls back to a sort per tile).
MAX_GPU_K = 1024


def knn_gpu(Xd, Qd, k, metric_internal, exclude_self, precision="exact", batch_size=None):
    """Exact k-NN on the GPU with internal (minimised) distances; see :func:`._gpu.knn_gpu`."""
    from ._gpu import knn_gpu as _impl

    return _impl(Xd, Qd, k, metric_internal, exclude_self, precision=precision, batch_size=batch_size)


def topk_rows(D, k, *, col_offset=0, self_ids=None):
    """The k smallest entries of every row of a float32 (or float16) CuPy matrix ``D``.

    Returns ``(values float32 (m, k), columns int32 (m, k))`` sorted by (value, column); see
    :func:`._gpu.topk_rows`.
    """
    from ._gpu import topk_rows as _impl

    return _impl(D, k, col_offset=col_offset, self_ids=self_ids)


def knn(data, queries=None, k=10, *, metric="sqeuclidean", device="auto", precision="exact",
        batch_size=None):
    """Exact k nearest neighbours by brute force (the library's ground truth).

    Parameters
    ----------
    data : array-like, shape (n, d)
        Data points: numpy, cupy or torch (CPU or CUDA), float32/float16/uint8/int8
        (float64 is converted to float32; everything is computed in float32).
    queries : array-like, shape (m, d), optional
        Query points. ``None`` builds the all-points k-NN graph of ``data``: row ``i`` holds the
        neighbours of ``data[i]`` excluding ``i`` itself (by index: an exact duplicate of point
        ``i`` stored at another index is returned, at distance 0).
    k : int, default 10
        Neighbours per query, ``1 <= k <= n`` (``k <= n - 1`` when ``queries`` is None).
    metric : {"sqeuclidean", "euclidean", "inner_product", "cosine"}
        ``inner_product`` returns similarities sorted descending; ``cosine`` returns
        ``1 - cos`` distances.
    device : {"auto", "cpu", "gpu"} or int
        ``"auto"`` uses the GPU when one is usable (and always when the input is on a GPU).
    precision : {"exact", "fp16_rerank", "tf32_rerank", "bf16_rerank"}, default "exact"
        GPU only (the CPU path is always exact). ``"exact"`` uses a float32 GEMM. The
        ``*_rerank`` modes are faster on tensor cores: a low-precision GEMM (float16 of centred,
        scaled vectors; TF32; bfloat16) picks ``k' > k`` candidates, which are re-ranked with
        exact float32 distances; each row is then checked against a worst-case rounding bound
        (from the vector norms and the format's unit roundoff) and rows whose candidate margin
        is too small are recomputed in exact mode. Results can differ from ``"exact"`` only
        among distances equal to float32 rounding.
    batch_size : int, optional
        Queries per tile (GPU) or per block (CPU); by default sized from the memory budget.

    Returns
    -------
    distances : array, float32, shape (m, k)
        Sorted ascending (``inner_product``: similarities sorted descending).
    indices : array, int64, shape (m, k)
        Indices into ``data``; equal distances are ordered by smaller index.
        Both are returned on the framework/device of ``queries`` (of ``data`` when
        ``queries`` is None), per :func:`knnkit.set_output`.

    Examples
    --------
    >>> import numpy as np, knnkit
    >>> X = np.random.default_rng(0).standard_normal((1000, 16)).astype(np.float32)
    >>> d, i = knnkit.knn(X, X[:5], k=3, device="cpu")
    >>> i[:, 0].tolist()
    [0, 1, 2, 3, 4]
    >>> d, i = knnkit.knn(X, k=3, device="cpu")   # all-points graph, self excluded
    >>> bool((i != np.arange(1000)[:, None]).all())
    True
    """
    metric = check_metric(metric)
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; expected one of {', '.join(PRECISIONS)}")
    if batch_size is not None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer or None, got {batch_size!r}")
        batch_size = int(batch_size)
    X, info_x = check_matrix(data, "data")
    self_excluded = queries is None
    if self_excluded:
        Q, info_q = X, info_x
    else:
        Q, info_q = check_matrix(queries, "queries")
        check_pair(X, Q)
    k = check_k(k, X.shape[0], self_excluded=self_excluded)
    kind, dev_id = resolve_device(device, info_q if not self_excluded else info_x)
    mi = internal_metric(metric)

    if kind == "cpu":
        Xp = prepare_vectors(as_host(X), metric)
        Qp = Xp if self_excluded else prepare_vectors(as_host(Q), metric)
        if batch_size is not None:
            from . import _cpu

            old = _cpu._QUERY_BLOCK
            _cpu._QUERY_BLOCK = batch_size
            try:
                dist, idx = knn_cpu(Xp, Qp, k, mi, self_excluded)
            finally:
                _cpu._QUERY_BLOCK = old
        else:
            dist, idx = knn_cpu(Xp, Qp, k, mi, self_excluded)
    else:
        import cupy

        with cupy.cuda.Device(dev_id if dev_id is not None else cupy.cuda.Device().id):
            Xp = prepare_vectors(as_device(X), metric)
            Qp = Xp if self_excluded else prepare_vectors(as_device(Q), metric)
            dist, idx = knn_gpu(Xp, Qp, k, mi, self_excluded, precision=precision, batch_size=batch_size)
    dist = finalize_distances(dist, metric)
    return wrap_output(dist, info_q), wrap_output(idx, info_q)
