"""GGM: merge the k-NN graphs of two disjoint sets into the graph of their union
(Wang, Zhao & Zeng, section 5.1, Algorithm 3).

Each list of ``G1`` keeps its nearest half (``G1^u``) and gets the other half filled with random
members of ``S2`` (and symmetrically for ``G2``); NN-Descent then refines the joined graph
comparing only pairs from different subsets (``split=n1``: both sub-graphs are already
"fully baked", so same-subset pairs would only repeat work); finally each list is merged with the
far half it gave up (``G1^v``/``G2^v``) and sorted.
"""

import time

import numpy as np

from .._core.backend import as_host, as_device, device_of
from .._core.config import get_memory_budget
from .._core.metrics import internal_metric, prepare_vectors, to_internal
from .nndescent import run_nndescent

__all__ = ["ggm_merge", "merge_lists", "merge_candidates_gpu", "ggm_init"]


def _no_sync():
    pass


def merge_lists(ind, dist, add_ind, add_dist, k):
    """Merge candidate lists into sorted lists (internal distances, host arrays); top k."""
    from .nndescent._cpu import merge_rows

    ind = np.ascontiguousarray(ind, dtype=np.int32).copy()
    dist = np.ascontiguousarray(dist, dtype=np.float32).copy()
    merge_rows(ind, dist, np.ascontiguousarray(add_ind, dtype=np.int32),
               np.ascontiguousarray(add_dist, dtype=np.float32))
    return ind[:, :k], dist[:, :k]


def ggm_init(I1, I2, n1, n2, K, rng):
    """Initial lists of Algorithm 3: kept halves (own ids, ``S2`` shifted by n1) plus random
    members of the other set; returns ``(init (n1+n2, K) int32, far1, far2)`` where ``far*`` are
    the dropped tails (global ids) to merge back at the end."""
    h = K // 2
    h1 = min(h, I1.shape[1])
    h2 = min(h, I2.shape[1])
    init = np.full((n1 + n2, K), -1, np.int32)
    init[:n1, :h1] = I1[:, :h1]
    init[n1:, :h2] = np.where(I2[:, :h2] >= 0, I2[:, :h2] + n1, -1)
    # random members of the other subset fill the rest (Algorithm 3 lines 3-8)
    if K - h1 > 0:
        init[:n1, h1:] = n1 + rng.integers(0, n2, size=(n1, K - h1), dtype=np.int64)
    if K - h2 > 0:
        init[n1:, h2:] = rng.integers(0, n1, size=(n2, K - h2), dtype=np.int64)
    far1 = I1[:, h1:]
    far2 = np.where(I2[:, h2:] >= 0, I2[:, h2:] + n1, -1)
    return init, (h1, far1), (h2, far2)


def _ggm_init_gpu(cp, I1, I2, n1, n2, K, seed):
    """``ggm_init`` built on the device (the host version's random fill and upload of an (n, K)
    array cost more than the merge's descent at 300k-point shards). Random members come from
    CuPy's generator: same seed, same lists on the GPU, but not the CPU path's lists."""
    h = K // 2
    h1 = min(h, I1.shape[1])
    h2 = min(h, I2.shape[1])
    init = cp.empty((n1 + n2, K), cp.int32)
    init[:n1, :h1] = cp.asarray(np.ascontiguousarray(I1[:, :h1]), dtype=cp.int32)
    top2 = cp.asarray(np.ascontiguousarray(I2[:, :h2]), dtype=cp.int32)
    init[n1:, :h2] = cp.where(top2 >= 0, top2 + np.int32(n1), np.int32(-1))
    rs = cp.random.RandomState(int(seed) % (2 ** 63))
    if K - h1 > 0:
        init[:n1, h1:] = rs.randint(n1, n1 + n2, size=(n1, K - h1), dtype=cp.int32)
    if K - h2 > 0:
        init[n1:, h2:] = rs.randint(0, n1, size=(n2, K - h2), dtype=cp.int32)
    return init, (h1, h2)


def _merge_far_gpu(cp, I, D, I1, D1, I2, D2, n1, h1, h2, k, metric, Xp, mi, sample, seed, scale=1.0):
    """Algorithm 3 line 12 on the device: each refined list (internal distances) merged with the
    far half of its own graph, sorted, first k kept. The refinement only inserts cross-subset
    ids and the far half holds own-subset ids, but a hole the descent's init refilled at random
    may repeat one, so repeats are dropped. One warp-per-row kernel over the prepared data ``Xp``
    (internal metric ``mi``) does it (``sort_rows_gpu``); two CuPy sorts where it does not apply."""
    n = I.shape[0]
    F = max(I1.shape[1] - h1, I2.shape[1] - h2, 0)
    if F == 0:
        return I[:, :k], D[:, :k]
    far = cp.full((n, F), -1, cp.int32)
    fard = cp.full((n, F), cp.inf, cp.float32)
    f1, f2 = I1.shape[1] - h1, I2.shape[1] - h2
    if f1:
        far[:n1, :f1] = cp.asarray(np.ascontiguousarray(I1[:, h1:]), dtype=cp.int32)
        fard[:n1, :f1] = cp.asarray(to_internal(D1[:, h1:], metric, scale))
    if f2:
        b = cp.asarray(np.ascontiguousarray(I2[:, h2:]), dtype=cp.int32)
        far[n1:, :f2] = cp.where(b >= 0, b + np.int32(n1), np.int32(-1))
        fard[n1:, :f2] = cp.asarray(to_internal(D2[:, h2:], metric, scale))
    from .nndescent._gpu import sort_rows_gpu

    out = sort_rows_gpu(Xp, (I, far), (D, fard), k, mi, sample=sample, seed=seed)
    if out is not None:
        return out
    return merge_candidates_gpu(cp, (I, far), (D, fard), k)


def merge_candidates_gpu(cp, ids, dists, k):
    """Row-wise union of candidate lists on the device: ``ids`` / ``dists`` are tuples of (n, *)
    int32 / float32 internal-distance arrays (-1 = none); returns the k nearest distinct ids of
    each row, sorted by (distance, id), missing as -1 / inf. Works in row tiles: the sorts'
    temporaries take ~40 bytes per candidate, more than the lists."""
    n = ids[0].shape[0]
    width = sum(a.shape[1] for a in ids)
    out_i = cp.empty((n, k), cp.int32)
    out_d = cp.empty((n, k), cp.float32)
    tile = max(1024, get_memory_budget() // (8 * 40 * width))
    for a in range(0, n, tile):
        b = min(n, a + tile)
        ci = cp.concatenate([x[a:b].astype(cp.int32, copy=False) for x in ids], axis=1)
        cd = cp.concatenate([x[a:b].astype(cp.float32, copy=False) for x in dists], axis=1)
        cd = cp.where(ci < 0, cp.float32(cp.inf), cd)
        # sorted by id (stable sorts), a repeated id gets inf; the distance sort then keeps
        # equal distances in id order
        by_id = cp.argsort(ci, axis=1, kind="stable")
        ci = cp.take_along_axis(ci, by_id, axis=1)
        cd = cp.take_along_axis(cd, by_id, axis=1)
        rep = cp.zeros(ci.shape, dtype=cp.bool_)
        rep[:, 1:] = (ci[:, 1:] == ci[:, :-1]) & (ci[:, 1:] >= 0)
        cd = cp.where(rep, cp.float32(cp.inf), cd)
        order = cp.argsort(cd, axis=1, kind="stable")[:, :k]
        ti = cp.take_along_axis(ci, order, axis=1)
        td = cp.take_along_axis(cd, order, axis=1)
        out_i[a:b] = cp.where(cp.isinf(td), cp.int32(-1), ti)
        out_d[a:b] = td
    if k > width:  # fewer candidates than k
        out_i[:, width:] = -1
        out_d[:, width:] = cp.inf
    return out_i, out_d


def ggm_merge(X1, X2, I1, D1, I2, D2, k, *, metric, params, seed, scale=1.0):
    """Engine of the GGM merge (Algorithm 3) on validated arrays.

    Parameters
    ----------
    X1, X2 : (n1, d), (n2, d) arrays
        The two point sets in their storage dtype, both on the device of the computation
        (numpy: CPU, cupy: GPU).
    I1, D1, I2, D2 : host arrays
        Their neighbour lists (self excluded; ids local to each set) and USER-metric distances.
    k : int
        Neighbours in the result.
    metric : str
        User metric.
    params : NNDescentParams
        Resolved for ``n1 + n2`` points (drives the cross-subset refinement).
    seed : int
    scale : float
        Power-of-two factor of the data (:func:`knnkit._core.metrics.safe_scale` over both sets).

    Returns
    -------
    I, D, stats, X : (n1 + n2, k) ids (``data1`` first), INTERNAL distances, statistics, and the
    concatenated data in its storage dtype (one buffer on the device, kept by the caller's graph).
    """
    t_start = time.perf_counter()
    kind = device_of(X1)
    n1, n2 = int(X1.shape[0]), int(X2.shape[0])
    n = n1 + n2
    rng = np.random.default_rng(seed)
    K, p, iters, upd = params.n_neighbors_internal, params.sample, params.max_iters, params.update
    K = max(k, min(K, n - 1))
    delta = params.delta
    mi = internal_metric(metric)
    phase = {"validate": time.perf_counter() - t_start}
    # (the caller has made the device of X1 current)
    if kind == "gpu":
        from .._core.backend import cupy_or_none

        cp = cupy_or_none()
        sync = cp.cuda.get_current_stream().synchronize  # so that each phase's time is its own
    else:
        sync = _no_sync
    t0 = time.perf_counter()
    if kind == "gpu":
        X = cp.empty((n, X1.shape[1]), dtype=X1.dtype)  # one device buffer, no concatenated copy
        X[:n1] = as_device(X1)
        X[n1:] = as_device(X2)
        init_d, (h1, h2) = _ggm_init_gpu(cp, I1, I2, n1, n2, K, seed)
    else:
        X = np.concatenate([as_host(X1), as_host(X2)])
        init_d, (h1, far1), (h2, far2) = ggm_init(I1, I2, n1, n2, K, rng)
    Xp = prepare_vectors(X, metric, scale)
    sync()
    phase["init"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    I, D, st = run_nndescent(Xp, K, sample=p, max_iters=iters, delta=delta, metric=mi,
                             init_indices=init_d, split=n1, seed=seed, update=upd, reverse=params.reverse)
    del init_d
    sync()
    phase["descent"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    # Algorithm 3 line 12: merge with the far halves that were set aside, sort, keep k
    if kind == "gpu":
        Ih, Dh = _merge_far_gpu(cp, I, D, I1, D1, I2, D2, n1, h1, h2, k, metric, Xp, mi, p, seed, scale)
        del I, D
    else:
        far = np.full((n, max(far1.shape[1], far2.shape[1], 1)), -1, np.int32)
        fard = np.full(far.shape, np.inf, np.float32)
        far[:n1, :far1.shape[1]] = far1
        far[n1:, :far2.shape[1]] = far2
        fard[:n1, :far1.shape[1]] = to_internal(D1[:, h1:], metric, scale)
        fard[n1:, :far2.shape[1]] = to_internal(D2[:, h2:], metric, scale)
        Ih, Dh = merge_lists(as_host(I), as_host(D), far, fard, k)
    sync()
    phase["far_merge"] = time.perf_counter() - t0
    phase["total"] = time.perf_counter() - t_start
    stats = {"method": "merge", "device": kind, "iterations": int(st["iterations"]),
             "updates": [int(u) for u in st["updates"]], "time_s": [float(t) for t in st["time_s"]],
             "K": K, "sample": p, "update": upd, "seed": seed, "phase_s": phase}
    return Ih, Dh, stats, X
