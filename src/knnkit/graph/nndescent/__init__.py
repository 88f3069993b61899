"""NN-Descent: GNND on the GPU (``_gpu.py`` + ``gnnd.cu``), the Numba twin on the CPU (``_cpu.py``).

Paper: Wang, Zhao & Zeng, "Large-Scale Approximate k-NN Graph Construction on GPU" (GNND),
section 4: fixed-size NEW/OLD sampling (4.1), per-node cross-matching in shared memory (4.2),
selective update (4.3), segmented locks (4.4). The twins share one signature,
``nndescent(X, K, *, sample, max_iters, delta, metric, init_indices, init_distances, split,
seed, update, reverse, callback)``; :func:`nndescent_graph` is the engine of the
``"nndescent"`` method and :func:`run_nndescent` the call GGM merges share.
"""

import dataclasses
import math
import time

import numpy as np

from ..._core.backend import device_of, get_array_module, twin
from ..._core.config import logger, verbose_logging
from ..._core.params import Params, check_bool, check_choice, check_float, check_int

__all__ = ["NNDescentParams", "nndescent_graph", "run_nndescent", "default_parameters", "default_update",
           "sample_for", "forest_init_params", "CPU_AUTO_INIT", "GPU_MAX_K"]

#: Longest list the GPU NN-Descent kernels support (``_gpu._MAX_K``).
GPU_MAX_K = 256


@dataclasses.dataclass(frozen=True, kw_only=True)
class NNDescentParams(Params):
    """Parameters of NN-Descent (GNND). ``None`` fields are chosen by :meth:`resolve` from the
    problem (see :func:`default_parameters`).

    Parameters
    ----------
    n_neighbors_internal : int, optional
        ``K >= k``, the list length NN-Descent works with.
    sample : int, optional
        ``p``, NEW/OLD samples per list and iteration.
    max_iters : int, optional
        Iteration cap.
    delta : float, default 0.001
        Stop when an iteration changes fewer than ``delta * n * K`` list entries.
    update : {"basic", "selective"}, optional
        Graph update rule (paper section 4.3); default by device and metric (:func:`default_update`).
    refine_hubs : bool, optional
        ``inner_product`` only: exact top-k over the support of the approximate lists
        (:mod:`knnkit.graph._hubs`). None: automatic.
    reverse : {"random", "atomic"}
        GPU reverse-neighbour sampling: uniform (default) or the paper's first-come append.
    target_recall : float or None, default 0.99
        After the descent, recall@k is estimated on 1000 sampled rows against exact neighbours
        (``stats["recall_estimate"]``); below the target, up to two more rounds continue from the
        lists with 1.5x longer internal lists (``stats["target_rounds"]``). Where the exact graph
        is affordable, a descent bound to end far below the target gives way to it: before the
        descent when the data's local intrinsic dimension is at least
        :data:`knnkit.graph.STALL_LID` (``stats["stalled"]["before_descent"]``), else when the
        descent's extrapolated recall stalls (``stats["stalled"]``); ``stats["exact_fallback"]``
        says so. None: no estimate and no exact fallback.
    init : {"auto", "random", "rpforest", "rsfk"}
        Initial lists. Every forest is the one RSFK forest (:mod:`knnkit.graph.rsfk`);
        :func:`forest_init_params` gives its settings. ``"rsfk"``: two random-sample trees with
        the default leaf size plus one NNE pass, on either device. ``"rpforest"`` (CPU): several
        small-leaf trees without NNE, as PyNNDescent starts. ``"auto"``: the CPU default
        (``"rpforest"``, measured in ``benchmarks/results/rsfk_cpu/``) and random lists on the GPU.
        ``"random"``: random lists. On the CPU a forest start also renumbers the points by the
        first tree's leaf order (cache locality of the descent).
    verbose : bool
        Log per-iteration progress at INFO level.
    """

    n_neighbors_internal: int | None = None
    sample: int | None = None
    max_iters: int | None = None
    delta: float = 0.001
    update: str | None = None
    refine_hubs: bool | None = None
    reverse: str = "random"
    init: str = "auto"
    target_recall: float | None = 0.99
    verbose: bool = False

    def _validate(self):
        return {
            "n_neighbors_internal": check_int(self.n_neighbors_internal, "n_neighbors_internal", minimum=1,
                                              allow_none=True),
            "sample": check_int(self.sample, "sample", minimum=1, allow_none=True),
            "max_iters": check_int(self.max_iters, "max_iters", minimum=0, allow_none=True),
            "delta": check_float(self.delta, "delta", minimum=0.0),
            "update": None if self.update is None else check_choice(self.update, "update", ("basic", "selective")),
            "refine_hubs": check_bool(self.refine_hubs, "refine_hubs", allow_none=True),
            "reverse": check_choice(self.reverse, "reverse", ("random", "atomic")),
            "init": check_choice(self.init, "init", ("auto", "random", "rpforest", "rsfk")),
            "target_recall": check_float(self.target_recall, "target_recall", minimum=0.0, maximum=1.0,
                                         allow_none=True),
            "verbose": check_bool(self.verbose, "verbose"),
        }

    def resolve(self, *, k: int, n: int, device: str, metric: str) -> "NNDescentParams":
        """A copy with every ``None`` chosen for ``k`` neighbours of ``n`` points on ``device``
        under the user ``metric``; ``ValueError`` when ``n_neighbors_internal < k``."""
        K0, p0, it0 = default_parameters(k, n, device=device)
        K = K0 if self.n_neighbors_internal is None else self.n_neighbors_internal
        if K < k:
            raise ValueError(f"n_neighbors_internal={K} must be >= the neighbours asked for ({k})")
        K = min(K, n - 1) if n > 1 else K
        p = self.sample if self.sample is not None else (p0 if self.n_neighbors_internal is None
                                                         else sample_for(K, device, n))
        iters = self.max_iters if self.max_iters is not None else it0
        upd = self.update or default_update(device, metric)
        if self.update is None and metric == "inner_product" and self.refine_hubs is not False and device == "gpu":
            # the selective update stalls on hubs, which is exactly what the hub refinement
            # repairs: 1M x 128 on an H200, selective + refinement 0.95 s at recall 0.9994,
            # basic + refinement 2.29 s at 0.9992, basic alone 1.88 s at 0.93 (NOTES_gnnd.md)
            upd = "selective"
        refine = self.refine_hubs
        if metric != "inner_product":
            refine = False
        return dataclasses.replace(self, n_neighbors_internal=K, sample=p, max_iters=iters, update=upd,
                                   refine_hubs=refine)


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


def run_nndescent(X, K, *, sample, max_iters, delta, metric, init_indices=None, init_distances=None,
                  split=None, seed=0, update="selective", reverse="random", callback=None):
    """NN-Descent on prepared ``X`` with the twin of its device (numpy: CPU, cupy: GPU)."""
    impl = twin(__name__, device_of(X))
    return impl.nndescent(X, K, sample=sample, max_iters=max_iters, delta=delta, metric=metric,
                          init_indices=init_indices, init_distances=init_distances, split=split, seed=seed,
                          update=update, reverse=reverse, callback=callback)


def _watch_callback(watch, n, order, xp):
    """The descent's per-iteration callback for a :class:`knnkit.graph._estimate.StallWatch`: the
    probe's rows' current lists, in the caller's numbering (the descent may work on reordered data,
    ``order[i]`` = caller id of working row i), NEW flags (GPU: bit 31) cleared."""
    rows = watch.probe.rows_h
    if order is not None:
        inverse = np.empty(n, np.int64)
        inverse[order] = np.arange(n)
        rows = inverse[rows]
    rows = xp.asarray(rows)
    order_x = None if order is None else xp.asarray(order)

    def callback(iteration, ind, dist):
        cand = ind[rows].astype(xp.int64)
        if xp is not np:  # GPU lists carry the NEW flag in bit 31; -1 (empty) has every bit set
            cand = cand & 0x7FFFFFFF
        cand = xp.where((cand >= 0) & (cand < n), cand, -1)
        if order_x is not None:
            cand = xp.where(cand >= 0, order_x[xp.maximum(cand, 0)], -1)
        return watch(iteration, cand)

    return callback


#: the CPU's ``init="auto"``: the forest start measured fastest to recall 0.90-0.99
#: (benchmarks/results/rsfk_cpu/RESULTS.md)
CPU_AUTO_INIT = "rpforest"


def forest_init_params(init, n, K, device):
    """The RSFK settings of NN-Descent's forest start ``init`` on ``device``, or None for random lists.

    ``"rpforest"``: leaves of at most ``max(K + 2, 24)`` points and ``max(3, min(8, round(2 log10
    n)))`` trees, fewer in proportion when the leaves are larger (a bigger leaf already gives each
    point more candidates), no NNE: the descent is the refinement. ``"rsfk"``: two trees of the
    default leaf size and one NNE pass. ``"auto"`` is :data:`CPU_AUTO_INIT` on the CPU and random
    lists on the GPU. ``"rpforest"`` with ``n <= 4K`` (the descent is nearly exact there) and
    ``"rsfk"`` with ``n <= K + 1`` start from random lists. ``"rpforest"`` on the GPU is random lists.

    Examples
    --------
    >>> p = forest_init_params("rpforest", 100_000, 16, "cpu")
    >>> p.n_trees, p.leaf_size, p.nne
    (8, 24, False)
    >>> forest_init_params("auto", 100_000, 16, "gpu") is None
    True
    """
    from ..rsfk import RSFKParams

    if init == "auto":
        init = CPU_AUTO_INIT if device == "cpu" else "random"
    if init == "random":
        return None
    if init == "rsfk":
        return RSFKParams(n_trees=2, nne=True) if n > K + 1 else None
    if n <= 4 * K:
        return None
    if device != "cpu":  # "rpforest" has no GPU version: random lists, as before
        return None
    n_trees = max(3, min(8, int(round(2.0 * math.log10(max(n, 10))))))
    leaf_size = max(K + 2, 24)
    n_trees = max(2, int(round(n_trees * 24 / leaf_size)))
    return RSFKParams(n_trees=n_trees, leaf_size=int(leaf_size), nne=False)


def forest_start(X, K, *, metric, init, seed):
    """NN-Descent's start from the forest ``init`` (:func:`forest_init_params`) on prepared ``X``.

    Returns ``(Xw, order, indices, distances, info)``: the data the descent works on, the
    renumbering (``Xw = X[order]``, CPU; None when not renumbered), the initial lists in ``Xw``'s
    numbering (None with ``distances`` None for random lists), and ``{"forest": seconds}``.
    """
    device = device_of(X)
    n = int(X.shape[0])
    forest = forest_init_params(init, n, K, device)
    if forest is None:
        return X, None, None, None, {}
    from ..rsfk import rsfk_lists

    t1 = time.perf_counter()
    # the forest is built with the internal metric when it has one (l2, ip); l1 uses l2 trees and
    # NN-Descent recomputes the distances
    fmetric = metric if metric in ("l2", "ip") else "l2"
    ids, dd, fst = rsfk_lists(X, K, metric=fmetric, params=forest, seed=seed, leaf_order=device == "cpu")
    if fmetric != metric:
        dd = None
    order = None
    Xw = X
    if device == "cpu":
        # renumber the points by the first tree's leaf order, so that neighbours sit close in memory
        # and the joins hit the cache (the forest gives that order for free)
        from ._cpu import renumber_lists

        order = fst["leaf_order"].astype(np.int64)
        Xw = X[order]
        inv = np.empty(n, np.int64)
        inv[order] = np.arange(n)
        ids, dd2 = renumber_lists(np.ascontiguousarray(ids), None if dd is None else np.ascontiguousarray(dd),
                                  order, inv)
        dd = None if dd is None else dd2
    info = {"forest": time.perf_counter() - t1}
    return Xw, order, ids, dd, info


def nndescent_graph(X, k, *, metric, params, seed, init_indices=None, watch=None):
    """Engine of the ``"nndescent"`` graph method on prepared ``X`` (contract in
    :mod:`knnkit._core.registry`); ``params`` resolved (:meth:`NNDescentParams.resolve`).
    ``watch``: a :class:`knnkit.graph._estimate.StallWatch` that may stop the descent early
    (``stats["stalled"]``: its verdict), for callers that then build the exact graph.

    Returns ``(I, D, stats)``: (n, k) ids (self excluded, -1 for missing) and internal
    distances, and a dict of statistics (iterations, updates and time per iteration, phases).
    """
    device = device_of(X)
    n = int(X.shape[0])
    K, p, iters = params.n_neighbors_internal, params.sample, params.max_iters
    phase = {}
    t0 = time.perf_counter()
    init_d = None
    order = None
    Xw = X  # the data in the order the descent works on
    if init_indices is None:
        Xw, order, init_indices, init_d, info = forest_start(X, K, metric=metric, init=params.init, seed=seed)
        phase.update(info)
    phase["prepare"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    if params.verbose:
        verbose_logging()
        logger.info("knn_graph: NN-Descent on %s, n=%d K=%d p=%d max_iters=%d update=%s",
                    device, n, K, p, iters, params.update)
    callback = None if watch is None else _watch_callback(watch, n, order, get_array_module(Xw))
    I, D, st = run_nndescent(Xw, K, sample=p, max_iters=iters, delta=params.delta, metric=metric,
                             init_indices=init_indices, init_distances=init_d, seed=seed, update=params.update,
                             reverse=params.reverse, callback=callback)
    if order is not None:  # back to the caller's numbering
        Io = np.empty_like(I)
        Io[order] = np.where(I >= 0, order[np.maximum(I, 0)], -1)
        Do = np.empty_like(D)
        Do[order] = D
        I, D = Io, Do
    phase["descent"] = time.perf_counter() - t0
    if "init_s" in st:
        phase["init"] = st["init_s"]
    stats = dict(iterations=int(st["iterations"]), updates=[int(u) for u in st["updates"]],
                 time_s=[float(t) for t in st["time_s"]], K=K, sample=p, update=params.update, seed=seed,
                 max_iters=iters, delta=float(params.delta), phase_s=phase)
    if watch is not None and watch.history:
        # the probe's estimate of the lists as returned (callers need not measure them again)
        stats["watch_recall"] = round(watch.history[-1], 5)
    if watch is not None and watch.stopped is not None:
        it, r, pred = watch.stopped
        stats["stalled"] = {"iteration": it, "recall_estimate": r, "predicted": pred, "level": watch.level}
    if params.verbose:
        for i, (u, t) in enumerate(zip(stats["updates"], stats["time_s"])):
            logger.info("  iteration %d: %d updates, %.3f s", i, u, t)
    I, D = I[:, :k], D[:, :k]
    if metric == "ip" and params.refine_hubs is not False:
        # raw inner product (resolve() sets refine_hubs=False for cosine): exact lists over the hubs
        from .._hubs import refine_hubs

        t0 = time.perf_counter()
        I, D, hub_info = refine_hubs(X, I, D, k, force=bool(params.refine_hubs))
        hub_info["time_s"] = time.perf_counter() - t0
        stats["hubs"] = hub_info
        if not hub_info["refined"] and hub_info.get("reason") == "work cap":
            logger.warning("knn_graph(inner_product): %d hub points for %d rows exceed the refinement's "
                           "work cap; the lists are NN-Descent's (update=%r). Pass refine_hubs=True to "
                           "refine anyway, or update='basic'.", hub_info["hubs"], n, params.update)
        phase["refine_hubs"] = hub_info["time_s"]
    return I, D, stats
