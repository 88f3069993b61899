"""Exact k-NN by brute force (GEMM): the ground truth every other knnkit algorithm is measured
against, and the ``"gemm"`` method of :func:`knnkit.knn`.

CPU twin: blocked BLAS GEMM + Numba heap selection (``_cpu.py``). GPU twin: cuBLAS GEMM tiles +
the k-selection kernel of ``topk.cu`` (``_gpu.py``), optionally with tensor-core candidate
generation followed by an exact float32 re-rank. Both define ``knn(X, Q, k, metric,
exclude_self, *, precision, batch_size)``; :func:`knn_lists` is the engine the facades call.
"""

import dataclasses

from .._core.backend import device_of, twin
from .._core.params import Params, check_choice, check_int

__all__ = ["ExactParams", "knn_lists", "topk_rows", "PRECISIONS", "MAX_GPU_K"]

#: Values of ``ExactParams.precision``. Only "exact" runs a plain float32 GEMM; the ``*_rerank``
#: modes generate candidates with a tensor-core GEMM, re-rank them in exact float32 and certify
#: every row with an error bound (rows that fail are recomputed exactly). GPU only.
PRECISIONS = ("exact", "fp16_rerank", "tf32_rerank", "bf16_rerank")

#: Largest k served by the selection kernel (larger k on the GPU falls back to a sort per tile).
MAX_GPU_K = 1024


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExactParams(Params):
    """Parameters of the GEMM exact search.

    Parameters
    ----------
    precision : {"exact", "fp16_rerank", "tf32_rerank", "bf16_rerank"}
        See :func:`knnkit.knn`.
    batch_size : int, optional
        Queries per tile (GPU) or block (CPU); default from the memory budget.
    """

    precision: str = "exact"
    batch_size: int | None = None

    def _validate(self):
        return {"precision": check_choice(self.precision, "precision", PRECISIONS),
                "batch_size": check_int(self.batch_size, "batch_size", minimum=1, allow_none=True)}


def knn_lists(X, Q, k, *, metric, exclude_self, params=None, seed=0, certify=True, candidates=None):
    """Engine of exact k-NN on prepared arrays (contract in :mod:`knnkit._core.registry`).

    Returns ``(dist, idx, stats)``: internal distances float32 (m, k), int64 ids, rows sorted by
    (distance, id). ``seed`` is unused (the GEMM path has no random choice). ``certify=False`` is
    for internal estimates that do not need exact ties (the intrinsic-dimension estimate): the CPU
    then keeps the float32 answer of rows its rounding certificate rejects instead of recomputing
    them in float64 (skewed-norm data, 500 rows x 100k: 1.5 s of a 1.6 s estimate); on the GPU
    the tensor-core modes then keep ``candidates`` (default k) per row, re-ranked exactly, with no
    certificate (the near-exact fallback of ``knn_graph``)."""
    params = params or ExactParams()
    impl = twin(__name__, device_of(X))
    dist, idx = impl.knn(X, Q, k, metric, exclude_self, precision=params.precision, batch_size=params.batch_size,
                         certify=certify, candidates=candidates)
    return dist, idx, {"method": "gemm", "precision": params.precision}


def topk_rows(D, k, *, col_offset=0, self_ids=None):
    """The k smallest entries of every row of a float32 (or float16) CuPy matrix ``D``.

    Returns ``(values float32 (m, k), columns int32 (m, k))`` sorted by (value, column); see
    :func:`._gpu.topk_rows`.
    """
    from .._core.params import check_int
    from ._gpu import topk_rows as _impl

    width = int(D.shape[1]) if getattr(D, "ndim", 0) == 2 else 0
    # the columns come back as int32: the last one, col_offset + width - 1, must fit
    col_offset = check_int(col_offset, "col_offset", minimum=0, maximum=max(0, 2**31 - 1 - width))
    k = check_int(k, "k", minimum=1)
    return _impl(D, k, col_offset=col_offset, self_ids=self_ids)
