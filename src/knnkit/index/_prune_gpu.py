"""RobustPrune (Vamana / DiskANN) of every node's candidate list on the GPU.

The kernels (``prune.cu``) run one thread block per node: they sort the candidates, compute the
pairwise "p occludes c" relation among them and make the sequential greedy pass over a bit matrix.
For 'l2' and up to 384 candidates ``robust_prune_tc`` computes the pairs on tensor cores (fp16,
centred on the node; near-ties of the rule decided again in fp32), 32 candidates at a time, and
stops once R are kept; the fp32 kernel ``robust_prune`` does the rest ('ip', longer lists).
"""

import numpy as np

from .._core.config import logger
from .._core.cuda import get_kernel, kernel_path

_KERNEL = kernel_path(__file__, "prune.cu")

__all__ = ["prune_gpu", "prune_factor", "prune_shift", "new_reverse_mask"]

_THREADS = 256
#: Largest padded candidate count the tensor-core kernel takes (its accumulators: CP / 64 tiles of
#: 16 x 16 per warp); longer lists (the R = 64 tier's hubs, 576) use the fp32 kernel.
TC_MAX_CP = 384
#: ``robust_prune_tc`` for 'l2' (fp16 tensor-core distances with an fp32 recheck of near-ties, bands
#: skipped once R are kept); False runs the fp32 kernel everywhere (the A/B:
#: ``benchmarks/build_flag_ab.py --flag tc``; the parts: ``benchmarks/prune_kernel_parts.py``).
USE_TENSOR_CORES = True
_TC_MAXT = tuple(range(1, TC_MAX_CP // 64 + 1))
# every kernel of prune.cu, so that the file is compiled once per process
#: Extra compile options of the tensor-core kernel (``-DPT_SKIP_*``: benchmarks/prune_kernel_parts.py).
TC_OPTIONS = ()
_NAMES = ("robust_prune<0>", "robust_prune<1>") + tuple(f"robust_prune_tc<{t}>" for t in _TC_MAXT)
_STATIC_SMEM = 2 * 64 * 33 * 4 + 16  # the two staging tiles of the fp32 kernel


def prune_factor(alpha, metric):
    """The multiplier applied to ``d(p, c) + shift`` in the occlusion test: ``alpha**2``.

    Internal distances behave like squared Euclidean ones (``'l2'`` is squared; ``'ip'`` plus the
    shift ``max |x|**2`` is ``|a - b|**2 / 2`` for unit vectors), so Vamana's rule
    ``alpha * |p - c| > |v - c|`` becomes ``alpha**2 * d(p, c) > d(v, c)`` -- the rule of
    ``_prune_cpu.py``.
    """
    return float(alpha) ** 2


def prune_shift(X, metric):
    """The shift ``s`` of the occlusion test: ``max |x|**2`` for ``'ip'``, 0 for ``'l2'`` (float)."""
    if metric != "ip":
        return 0.0
    return float((X * X).sum(axis=1).max())


def prune_gpu(X, cand_idx, cand_dist, R, alpha, metric, *, fill=True, shift=None, return_distances=False,
              node_ids=None):
    """RobustPrune every node's candidate list in parallel (same rule as ``prune_cpu``).

    Candidates of node ``v`` are taken in increasing ``(distance, index)`` order (invalid entries
    ``-1``, ``v`` itself and repeated indices are dropped); ``c`` is kept when for every already
    kept ``p``: ``alpha**2 * (d(p, c) + s) > d(v, c) + s`` until ``R`` are kept, with ``s = 0``
    for ``'l2'`` (squared distances: Vamana's Euclidean rule) and ``s = max |x|**2`` for ``'ip'``.

    Parameters
    ----------
    X : cupy.ndarray, float32 (n, d)
        Prepared vectors.
    cand_idx : cupy.ndarray, int32 (n, C)
        Candidate neighbours of each node (-1 padded); row ``i`` belongs to node ``i``.
    cand_dist : cupy.ndarray, float32 (n, C)
        Internal distance from the node to each candidate.
    R : int
        Maximum out-degree kept.
    alpha : float
        Diversification factor (1 = classic relative-neighbourhood rule; larger keeps more
        long edges).
    metric : {"l2", "ip"}
        Internal metric.
    fill : bool
        Fill slots left free after pruning with the nearest pruned candidates.
    shift : float, optional
        ``s`` of the rule when already known (:func:`prune_shift`); computed from ``X`` otherwise.
    return_distances : bool
        Also return the distance of every kept edge (``+inf`` in the ``-1`` slots).
    node_ids : cupy.ndarray, int32 (m,), optional
        The node each row of ``cand_idx`` belongs to (default: row ``i`` is node ``i``), to prune
        a subset of the nodes.

    Returns
    -------
    cupy.ndarray, int32 (n, R)
        Kept neighbours (the kept ones in increasing distance, then the filled ones), -1 padded.
    cupy.ndarray, float32 (n, R)
        Only with ``return_distances``: their distances, taken from ``cand_dist``.

    Examples
    --------
    >>> import cupy as cp  # doctest: +SKIP
    >>> X = cp.random.rand(1000, 16, dtype=cp.float32)  # doctest: +SKIP
    >>> d2 = ((X[:, None] - X[None]) ** 2).sum(-1)  # doctest: +SKIP
    >>> idx = cp.argsort(d2, axis=1)[:, 1:33].astype(cp.int32)  # doctest: +SKIP
    >>> g = prune_gpu(X, idx, cp.take_along_axis(d2, idx, 1), 16, 1.2, "l2")  # doctest: +SKIP
    """
    import cupy as cp

    if metric not in ("l2", "ip"):
        raise ValueError(f"prune_gpu: metric must be 'l2' or 'ip', got {metric!r}")
    X = cp.ascontiguousarray(X, dtype=cp.float32)
    cand_idx = cp.ascontiguousarray(cand_idx, dtype=cp.int32)
    cand_dist = cp.ascontiguousarray(cand_dist, dtype=cp.float32)
    n, d = X.shape
    m, C = cand_idx.shape
    if cand_dist.shape != (m, C):
        raise ValueError(f"cand_dist shape {cand_dist.shape} differs from cand_idx shape {cand_idx.shape}")
    R = int(R)
    if R < 1:
        raise ValueError(f"R must be >= 1, got {R}")
    if node_ids is None:
        node_ids = cp.arange(m, dtype=cp.int32)
    else:
        node_ids = cp.ascontiguousarray(node_ids, dtype=cp.int32)
        if node_ids.shape != (m,):
            raise ValueError(f"node_ids must have shape ({m},), got {node_ids.shape}")
    out = cp.full((m, R), -1, dtype=cp.int32)
    out_d = cp.full((m, R), cp.inf, dtype=cp.float32)
    if m == 0 or C == 0:
        return (out, out_d) if return_distances else out
    CP = max(64, -(-C // 64) * 64)
    smem = CP * 16 + CP * (CP // 32) * 4
    static = _STATIC_SMEM
    dpad = -(-d // 32) * 32 if d <= 128 else 128
    tc_smem = smem + CP * 4 + CP * (dpad // 2 + 4) * 4  # + norms, the staged fp16 rows (a chunk of 128 dims)
    tc = metric == "l2" and USE_TENSOR_CORES and CP <= TC_MAX_CP and _tensor_cores_fit(tc_smem + 16)
    if tc:
        name = f"robust_prune_tc<{CP // 64}>"
        smem, static = tc_smem, 16
    else:
        name = _NAMES[0 if metric == "l2" else 1]
    kern = get_kernel(_KERNEL, name, options=TC_OPTIONS if tc else (), name_expressions=_NAMES)
    if smem + static > 48 * 1024:  # past the default limit: opt in (up to 227 KiB on H100/H200)
        kern.max_dynamic_shared_size_bytes = smem
    factor = np.float32(prune_factor(alpha, metric))
    shift = np.float32(prune_shift(X, metric) if shift is None else shift)
    grid = int(min(m, 65535 * 8))
    logger.debug("prune_gpu: %s, %d nodes, C=%d, R=%d, smem=%d", name, m, C, R, smem)
    kern((grid,), (_THREADS,), (X, np.int32(n), np.int32(d), cand_idx, cand_dist, np.int32(m), np.int32(C),
                                np.int32(CP), np.int32(R), factor, shift, np.int32(bool(fill)), out, out_d,
                                node_ids),
         shared_mem=smem)
    return (out, out_d) if return_distances else out


def _tensor_cores_fit(smem_bytes):
    """Whether this device runs ``robust_prune_tc`` with ``smem_bytes`` of shared memory per block:
    mma.sync m16n8k16 on fp16 needs compute capability 8.0, and 384 candidates of 128 dimensions
    take 130 KB (an H100 / H200 opts in to 227 KB, an A100 to 163 KB, a T4 or V100 to 64-96 KB).
    Elsewhere the fp32 kernel (at most ~41 KB) runs."""
    import cupy as cp

    try:
        dev = cp.cuda.Device()
        key = (dev.id, int(smem_bytes))
        if key not in _TC_FITS:
            attrs = dev.attributes
            limit = int(attrs.get("MaxSharedMemoryPerBlockOptin", attrs.get("MaxSharedMemoryPerBlock", 48 * 1024)))
            _TC_FITS[key] = int(dev.compute_capability) >= 80 and int(smem_bytes) <= limit
        return _TC_FITS[key]
    except Exception as e:  # noqa: BLE001 - no usable device attributes: the fp32 kernel
        logger.debug("robust_prune_tc unavailable: %s", e)
        return False


#: (device, shared bytes) -> whether robust_prune_tc runs there (device attributes are ~100 driver
#: queries: asked once)
_TC_FITS = {}


def new_reverse_mask(graph):
    """Boolean (n * R,) mask over the edges ``u -> graph[u, j]`` (row-major) whose reverse is not
    already in the target's list (-1 slots and self loops are False)."""
    import cupy as cp

    graph = cp.ascontiguousarray(graph, dtype=cp.int32)
    n, R = graph.shape
    out = cp.empty(n * R, dtype=cp.uint8)
    if out.size:
        threads = 256  # one warp per node
        get_kernel(_KERNEL, "new_reverse_edges", name_expressions=_NAMES)(
            (-(-n * 32 // threads),), (threads,), (graph, np.int32(n), np.int32(R), out))
    return out.view(cp.bool_)

