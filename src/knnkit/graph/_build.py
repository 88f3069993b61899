"""``knn_graph``: the public entry point for k-NN graph construction (exact or NN-Descent)."""

import math
import time

import numpy as np

from .._core.backend import resolve_device, as_host, as_device
from .._core.config import logger
from .._core.metrics import internal_metric, prepare_vectors, finalize_distances
from .._core.validation import METRICS, check_matrix, check_k, check_metric
from ._graph import KnnGraph, index_dtype_for

__all__ = ["knn_graph", "default_parameters", "GRAPH_METRICS", "run_nndescent", "seed_from", "BRUTE_AUTO_MAX_N"]

GRAPH_METRICS = METRICS + ("manhattan",)

#: ``method="auto"`` uses the exact brute-force graph up to this many points (it is then both
#: exact and about as fast as NN-Descent); NN-Descent above.
BRUTE_AUTO_MAX_N = {"cpu": 20_000, "gpu": 100_000}

#: Longest list the GPU NN-Descent kernels support (``_gpu._MAX_K``).
GPU_MAX_K = 256


def seed_from(random_state):
    """A 63-bit integer seed from None / int / numpy Generator / RandomState."""
    if random_state is None:
        return int(np.random.default_rng().integers(2 ** 62))
    if isinstance(random_state, (int, np.integer)) and not isinstance(random_state, bool):
        return int(random_state) & 0x7FFFFFFFFFFFFFFF
    if isinstance(random_state, np.random.Generator):
        return int(random_state.integers(2 ** 62))
    if isinstance(random_state, np.random.RandomState):
        return int(random_state.randint(2 ** 31))
    raise TypeError(f"random_state must be None, an int or a numpy Generator/RandomState, "
                    f"got {type(random_state).__name__}")


def default_update(device, metric):
    """Default NN-Descent update rule: ``"selective"`` on the GPU, ``"basic"`` on the CPU, and
    ``"basic"`` everywhere for raw ``"inner_product"``.

    Why the exception: the selective update inserts only each sample's nearest NEW and OLD
    candidate. Under an unnormalised inner product most points share the same few "nearest"
    points (the largest-norm ones), so that rule keeps offering the same hubs and the lists stop
    improving: 9,000 clustered 20-d points (``tests/test_out_of_core.py``), recall@10 0.774 with
    selective vs 0.994 with basic (CPU, full build); GGM merge 0.786 vs 0.987; the GPU merge gave
    0.81. Cosine (unit rows) has no hubs and keeps the selective update. (``knn_graph`` itself
    uses the selective update for inner_product on the GPU when its hub refinement is on: the
    refinement repairs what the stall leaves, at a quarter of the descent's cost.)"""
    if metric == "inner_product":
        return "basic"
    return "selective" if device == "gpu" else "basic"


def default_parameters(k, n, *, device="cpu"):
    """Internal list length ``K``, samples per list ``p`` and iteration cap for a k-NN graph.

    The rules (measured on clustered 128-d data, ``make_clustered``: intrinsic dim 16 plus
    isotropic noise; recall@k on 500-10000 sampled rows against exact neighbours):

    * CPU: ``K = k + max(6, k // 8) + g(n)`` with ``g(n) = round(6 * log2(n / 1e5))`` above 100k
      points (0 below), capped at ``n - 1``. A list longer than asked for keeps the descent from
      stalling in local minima, the main reason NN-Descent recall plateaus below 1, and the
      plateau falls as n grows (neighbour distances approach the noise floor): with K=20, k=10
      gave 0.994 at 100k, 0.983 at 300k and (K=24) 0.983 at 1M.
    * GPU: ``K = max(48, min(4k, 2k + 64)) + round(max(8, k / 4) log2(n / 1e6))`` (the last term
      above 1M points only), capped at 256 (the kernels' limit) and ``n - 1``: k = 10 -> 48,
      32 -> 128, 64 -> 192 at 1M. GNND's selective update refines the tail of a list least, so
      the GPU needs a longer list than the CPU for the same recall@k. H200, 1M x 128, p = 16,
      recall@k at convergence: k=10: K=48 0.991; k=32: K=64 0.966, K=96 0.989, K=128 0.996;
      k=64: K=128 0.972 (0.983 with p=32: the old 128-entry limit), K=160 0.986, K=192 0.992,
      K=224 0.996.
    * ``p``: CPU ``min(K, max(14 + round(log2(n / 1e5)), ceil(K / 4)))`` samples (NEW and OLD
      each, reverse fill up to ``2p``): sampling most of a short list beats a longer list
      sampled thinly (100k, k=10: K=16/p=14 -> 0.994 in 1.2 s, K=20/p=10 -> 0.994 in 1.4 s,
      K=16/p=12 -> 0.992, K=20/p=8 -> 0.985). At least K/4 because with fewer samples a long
      list is explored so slowly that an iteration can make fewer than delta*n*K updates long
      before convergence (k=100, n=1200, K=112: p=12 stopped at recall 0.73, p=28 gave 0.99998).
      GPU: ``p = 16`` for every K: ``2p <= 32`` keeps the local join in 128-thread blocks
      (p = 32 needs 256 threads and 4x the pairs), and more iterations of the cheap join beat
      fewer of the expensive one (1M, k=64, K=192: p=16 reaches recall@64 0.987 in 24
      iterations / 2.2 s, p=32 0.991 in 17 / 3.6 s; k=32, K=128: p=16 0.996 in 1.4 s, p=32
      0.998 in 3.4 s).
    * ``max_iters = 2 * ceil(log2 n) + 6`` (+ 10 on the GPU, where p = 16 on long lists takes
      more rounds): NN-Descent converges in O(log n) rounds; the ``delta`` rule (fewer than
      ``delta * n * K`` updates) stops it earlier in practice.

    Measured with these defaults, GPU (H200, make_clustered x 128, recall@k on 10k rows):
    k = 10 / 32 / 64 -> 10k: 0.99999 / 0.9996 / 0.9945; 100k: 0.9988 / 0.9994 / 0.9981;
    1M: 0.9912 (0.61 s) / 0.9960 (1.42 s) / 0.9924 (2.88 s); 10M: 0.9902 (9.3 s) /
    0.9921 (20.5 s) / 0.9882 (31.7 s, with the former growth term: K = 219). CPU: 100k k=10
    0.994 (K=16, p=14); 300k k=10 0.997 (K=25, p=16); 1M k=10 0.996 (K=36, p=17).
    """
    g = int(round(6 * max(0.0, math.log2(max(n, 1) / 1e5))))
    if device == "gpu":
        # growth above 1M points: 8 per doubling measured enough for k <= 32 at 10M (k=10: K=75
        # -> 0.990, k=32: K=155 -> 0.992) but not for k=64 (K=219 -> 0.988), hence k/4 per
        # doubling for larger k (k=64 at 10M: K=245; not yet measured, see NOTES_gnnd.md)
        g_gpu = int(round(max(8.0, k / 4) * max(0.0, math.log2(max(n, 1) / 1e6))))
        K = max(48, min(4 * k, 2 * k + 64)) + g_gpu
        K = min(K, max(k, GPU_MAX_K))  # the GPU kernels hold at most 256 entries per list
    else:
        K = k + max(6, k // 8) + g
    K = max(k, min(K, n - 1))
    p = sample_for(K, device, n)
    max_iters = 2 * int(math.ceil(math.log2(max(n, 2)))) + 6
    if device == "gpu":
        # p = 16 on long lists needs more rounds (1M, K=192: 40 before the delta rule stops it);
        # at 10k, k=64 the old cap (34) stopped it at recall@64 0.990
        max_iters += 10
    return K, max(1, p), max_iters


def sample_for(K, device="cpu", n=100_000):
    """Default ``p`` for a list length ``K`` and n points (see :func:`default_parameters`)."""
    if device == "gpu":
        # p = 16 for every K: the 128-thread join (NOTES_gnnd.md, "K > 128")
        return max(1, min(K, 16))
    cap = 14 + int(round(max(0.0, math.log2(max(n, 1) / 1e5))))
    return max(1, min(K, max(cap, int(math.ceil(K / 4)))))


def run_nndescent(Xp, K, *, device, sample, max_iters, delta, metric_internal, init_indices=None,
                  init_distances=None, split=None, seed=0, update="selective"):
    """Dispatch to ``nndescent_cpu`` or ``nndescent_gpu`` (arrays already on that device)."""
    kw = dict(sample=sample, max_iters=max_iters, delta=delta, metric=metric_internal,
              init_indices=init_indices, init_distances=init_distances, split=split, seed=seed, update=update)
    if device == "gpu":
        try:
            from .nndescent._gpu import nndescent_gpu
        except Exception as e:  # the GPU module or its kernels are missing / broken
            raise RuntimeError(f"GPU NN-Descent is not available ({type(e).__name__}: {e}); "
                               f"use device='cpu'") from e
        return nndescent_gpu(Xp, K, **kw)
    from .nndescent._cpu import nndescent_cpu

    return nndescent_cpu(as_host(Xp), K, **kw)


def _brute(X, kk, metric, kind, device):
    """Exact neighbour lists (internal ids/user distances) for method='brute'."""
    if metric == "manhattan":
        from .nndescent._cpu import exact_graph_cpu

        I, D = exact_graph_cpu(np.ascontiguousarray(as_host(X), dtype=np.float32), kk, "l1")
        return I, D
    from ..exact import knn

    D, I = knn(X, None, kk, metric=metric, device=device)
    return I, D


def knn_graph(data, k=10, *, method="auto", metric="sqeuclidean", device="auto", random_state=None,
              n_neighbors_internal=None, sample=None, max_iters=None, delta=0.001, init_graph=None,
              include_self=False, update=None, refine_hubs=None, verbose=False):
    """Build the k-nearest-neighbour graph of ``data``.

    NN-Descent (GNND on the GPU, a Numba version on the CPU) for large inputs, exact brute force
    for small ones.

    Parameters
    ----------
    data : array-like, shape (n, d)
        numpy / cupy / torch, float32, float16, uint8, int8 (float64 is converted).
    k : int, default 10
        Neighbours per point (``include_self=True`` counts the point itself).
    method : {"auto", "nndescent", "brute"}
        ``"auto"``: brute force when n <= 20 000 on the CPU (100 000 on the GPU), NN-Descent above.
    metric : {"sqeuclidean", "euclidean", "inner_product", "cosine", "manhattan"}
        ``manhattan`` (L1) is NN-Descent only (brute force falls back to a CPU loop).
    device : {"auto", "cpu", "gpu"} or int
    random_state : None, int or numpy Generator
        Same seed, same device, same thread count -> same graph (the CPU path is independent of
        the thread count too).
    n_neighbors_internal : int, optional
        ``K >= k``, the list length NN-Descent works with (default: :func:`default_parameters`,
        ``k + max(6, k // 8)`` on the CPU plus a term growing with log n).
    sample : int, optional
        ``p``, NEW/OLD samples per list and iteration (default ``min(K, max(14 + log2(n / 1e5), K / 4))`` on the CPU).
    max_iters : int, optional
        Iteration cap (default ``2 * ceil(log2 n) + 6``).
    delta : float, default 0.001
        Stop when an iteration changes fewer than ``delta * n * K`` list entries.
    init_graph : KnnGraph or (n, m) int array, optional
        Start from these lists instead of a random graph (missing entries are filled at random).
    include_self : bool, default False
        Put each point itself in column 0 (UMAP / ``kneighbors_graph(include_self=True)``
        convention); its distance is the point's distance to itself (0, or ``|x|^2`` for
        ``inner_product``).
    update : {"basic", "selective"}, optional
        Graph update rule (paper section 4.3). Default: ``"selective"`` on the GPU (fewer
        global-memory writes), ``"basic"`` on the CPU (it converges in fewer iterations, and on the
        CPU distances, not writes, are the cost). ``"inner_product"`` with ``refine_hubs=False``:
        ``"basic"`` on both (see ``default_update``).
    refine_hubs : bool, optional
        ``inner_product`` only. After NN-Descent, replace every list by the exact top-k over the
        points that occur in any approximate top-k list (the "hubs" an unnormalised inner product
        concentrates on; see ``knnkit.graph._hubs``). Default (None): when those are at most
        a quarter of the points and the work is bounded (1M x 128 clustered, GPU: recall@10 0.93
        -> 0.999); ``True`` forces it, ``False`` keeps the NN-Descent lists.
        ``stats["hubs"]`` reports the support size and whether it ran.
    verbose : bool
        Log per-iteration progress at INFO level.

    Returns
    -------
    KnnGraph
        ``indices`` (n, k) int32 (int64 when n >= 2**31), ``distances`` (n, k) float32 in
        ``metric``, on the input's device (see :func:`knnkit.set_output`).

    Examples
    --------
    >>> import numpy as np, knnkit
    >>> X = np.random.default_rng(0).random((2000, 16), dtype=np.float32)
    >>> g = knnkit.knn_graph(X, k=10, method="nndescent", device="cpu", random_state=0)
    >>> truth = knnkit.knn(X, k=10, device="cpu")[1]
    >>> g.recall(truth) > 0.95
    True
    """
    t_start = time.perf_counter()
    check_metric(metric, GRAPH_METRICS)
    X, info = check_matrix(data, "data")
    n = int(X.shape[0])
    k = check_k(k, n, self_excluded=not include_self)
    kk = k - 1 if include_self else k  # neighbours to find besides self
    if method not in ("auto", "nndescent", "brute"):
        raise ValueError(f"method must be 'auto', 'nndescent' or 'brute', got {method!r}")
    kind, dev_id = resolve_device(device, info)
    if not (isinstance(delta, (int, float)) and delta >= 0):
        raise ValueError(f"delta must be a number >= 0, got {delta!r}")
    if method == "auto":
        method = "brute" if n <= BRUTE_AUTO_MAX_N[kind] else "nndescent"
    seed = seed_from(random_state)
    stats = {"method": method, "device": kind, "phase_s": {}}
    # device argument of the brute-force calls (exact graph, hub refinement)
    knn_device = device if kind == "cpu" else (dev_id if dev_id is not None else "gpu")
    ctx = _device_ctx(kind, dev_id)
    with ctx:
        Xd = as_device(X) if kind == "gpu" else as_host(X)
        if kk == 0:
            xp = np if kind == "cpu" else _cp()
            I = xp.zeros((n, 0), np.int32)
            D = xp.zeros((n, 0), np.float32)
        elif method == "brute":
            t0 = time.perf_counter()
            I, D = _brute(Xd, kk, metric, kind, knn_device)
            stats["phase_s"]["brute"] = time.perf_counter() - t0
            stats.update(iterations=0, updates=[], time_s=[])
        else:
            K0, p0, it0 = default_parameters(kk, n, device=kind)
            K = int(n_neighbors_internal) if n_neighbors_internal is not None else K0
            if K < kk:
                raise ValueError(f"n_neighbors_internal={K} must be >= the neighbours asked for ({kk})")
            K = min(K, n - 1) if n > 1 else K
            p = int(sample) if sample is not None else (p0 if n_neighbors_internal is None
                                                       else sample_for(K, kind, n))
            if p < 1:
                raise ValueError(f"sample must be >= 1, got {p}")
            iters = int(max_iters) if max_iters is not None else it0
            upd = update or default_update(kind, metric)
            if update is None and metric == "inner_product" and refine_hubs is not False and kind == "gpu":
                # the selective update stalls on hubs, which is exactly what the hub refinement
                # repairs: 1M x 128 on an H200, selective + refinement 0.95 s at recall 0.9994,
                # basic + refinement 2.29 s at 0.9992, basic alone 1.88 s at 0.93 (NOTES_gnnd.md)
                upd = "selective"
            t0 = time.perf_counter()
            Xp = prepare_vectors(Xd, metric)
            init_i = None
            if init_graph is not None:
                gi = init_graph._ind if isinstance(init_graph, KnnGraph) else init_graph
                if isinstance(init_graph, KnnGraph) and init_graph.include_self:
                    gi = gi[:, 1:]
                init_i = as_device(gi) if kind == "gpu" else np.asarray(as_host(gi))
                if init_i.ndim != 2 or init_i.shape[0] != n:
                    raise ValueError(f"init_graph must have {n} rows, got shape {tuple(init_i.shape)}")
                init_i = init_i.astype(np.int32)
            init_d = None
            order = None
            if init_i is None and kind == "cpu" and n > 4 * K:
                # Renumber the points by the leaf order of one random-projection tree, so that
                # neighbours sit close in memory and the joins hit the cache; then a few more
                # trees give NN-Descent a far better start than random lists (as PyNNDescent
                # does). The GPU version starts from random lists.
                from .nndescent._cpu import rp_forest_init, rp_order

                t1 = time.perf_counter()
                mi_ = internal_metric(metric)
                order = rp_order(Xp, metric=mi_, seed=seed)
                Xp = Xp[order]
                init_i, init_d = rp_forest_init(Xp, K, metric=mi_, seed=seed)
                stats["phase_s"]["rp_forest"] = time.perf_counter() - t1
            stats["phase_s"]["prepare"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            if verbose:
                logger.info("knn_graph: NN-Descent on %s, n=%d K=%d p=%d max_iters=%d update=%s",
                            kind, n, K, p, iters, upd)
            I, D, st = run_nndescent(Xp, K, device=kind, sample=p, max_iters=iters, delta=delta,
                                     metric_internal=internal_metric(metric), init_indices=init_i,
                                     init_distances=init_d, seed=seed, update=upd)
            if order is not None:  # back to the caller's numbering
                Io = np.empty_like(I)
                Io[order] = np.where(I >= 0, order[np.maximum(I, 0)], -1)
                Do = np.empty_like(D)
                Do[order] = D
                I, D = Io, Do
            stats["phase_s"]["descent"] = time.perf_counter() - t0
            if "init_s" in st:
                stats["phase_s"]["init"] = st["init_s"]
            stats.update(iterations=int(st["iterations"]), updates=[int(u) for u in st["updates"]],
                         time_s=[float(t) for t in st["time_s"]], K=K, sample=p, update=upd, seed=seed,
                         max_iters=iters, delta=float(delta))
            if verbose:
                for i, (u, t) in enumerate(zip(stats["updates"], stats["time_s"])):
                    logger.info("  iteration %d: %d updates, %.3f s", i, u, t)
            I = I[:, :kk]
            D = D[:, :kk]
            if metric != "manhattan":
                D = finalize_distances(D.copy(), metric)
            if metric == "inner_product" and refine_hubs is not False:
                from ._hubs import refine_hubs as _refine

                t0 = time.perf_counter()
                I, D, hub_info = _refine(Xd, I, D, kk, kind=kind, force=bool(refine_hubs), device=knn_device)
                hub_info["time_s"] = time.perf_counter() - t0
                stats["hubs"] = hub_info
                if not hub_info["refined"] and hub_info.get("reason") == "work cap":
                    logger.warning("knn_graph(inner_product): %d hub points for %d rows exceed the refinement's "
                                   "work cap; the lists are NN-Descent's (update=%r). Pass refine_hubs=True to "
                                   "refine anyway, or update='basic'.", hub_info["hubs"], n, upd)
                stats["phase_s"]["refine_hubs"] = hub_info["time_s"]
        xp = np if isinstance(I, np.ndarray) else _cp()
        itype = index_dtype_for(n)
        I = xp.ascontiguousarray(I.astype(itype, copy=False))
        D = xp.ascontiguousarray(D.astype(np.float32, copy=False))
        if include_self:
            self_col = xp.arange(n, dtype=itype)[:, None]
            if metric == "inner_product":
                Xf = prepare_vectors(Xd, metric)
                sd = (Xf * Xf).sum(axis=1, keepdims=True).astype(np.float32)
            else:
                sd = xp.zeros((n, 1), np.float32)
            I = xp.ascontiguousarray(xp.concatenate([self_col, I], axis=1))
            D = xp.ascontiguousarray(xp.concatenate([sd, D], axis=1))
    stats["phase_s"]["total"] = time.perf_counter() - t_start
    return KnnGraph(I, D, metric=metric, include_self=include_self, stats=stats, info=info, data=data,
                    params={"device": device, "seed": seed})


def _cp():
    from .._core.backend import cupy_or_none

    return cupy_or_none()


class _NullCtx:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _device_ctx(kind, dev_id):
    if kind == "gpu" and dev_id is not None:
        return _cp().cuda.Device(dev_id)
    return _NullCtx()
