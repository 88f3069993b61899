"""Build orchestration: candidate k-NN graph -> fixed out-degree search graph -> entry points.

Steps (device-agnostic where the array code allows it):

1. a k-NN graph of degree ``intermediate_degree`` (>= R): NN-Descent (:func:`knnkit.knn_graph`)
   or exact brute force;
2. diversification to out-degree R, either

   * ``"prune"``: RobustPrune of every node's candidates (Vamana, as BANG's graphs), then the
     reverse of every kept edge is added, re-pruning the lists that overflow R; or
   * ``"ggnn"``: GGNN section 5.2: R/2 nearest neighbours plus up to R/2 reverse links requested
     where a small local search finds no path back;

3. entry points (coarse k-means medoids, :mod:`._entry`).
"""

import numpy as np

from .._config import logger
from .._backend import as_host, get_array_module, inspect_array
from ._prune_cpu import prune_cpu, add_reverse_edges, ggnn_diversify, pair_distances

__all__ = ["exact_knn_cpu", "candidate_graph", "diversify", "select_topk", "nn1_max"]


def nn1_max(X, cand_dist, metric, *, xnorm_max=None):
    """GGNN's ``d_nn1+``: the largest distance of a point to its nearest neighbour, on the slack
    criterion's scale (Euclidean for 'l2'; ``sqrt(d + |x| max|x|)`` for 'ip', see ``_search_cpu``).

    ``X`` holds the rows of ``cand_dist``; ``xnorm_max`` (default: from ``X``) is ``max |x|`` over
    the whole data."""
    d1 = np.min(cand_dist, axis=1).astype(np.float64)
    if metric == "ip":
        xn = np.sqrt(np.einsum("ij,ij->i", X, X)).astype(np.float64)
        d1 = d1 + xn * (xn.max() if xnorm_max is None else float(xnorm_max))
    d1 = d1[np.isfinite(d1)]
    return float(np.sqrt(np.maximum(d1, 0).max())) if d1.size else float("inf")


def select_topk(D, k):
    """Indices (sorted ascending by D, ties by index) of the k smallest per row; numpy or cupy."""
    xp = get_array_module(D)
    if k < D.shape[1]:
        part = xp.argpartition(D, k - 1, axis=1)[:, :k]
    else:
        part = xp.broadcast_to(xp.arange(D.shape[1]), D.shape).copy()
    pd = xp.take_along_axis(D, part, axis=1)
    order = xp.lexsort(xp.stack([part, pd]), axis=-1) if xp is np else xp.argsort(pd, axis=1)
    idx = xp.take_along_axis(part, order, axis=1)
    return idx, xp.take_along_axis(D, idx, axis=1)


def exact_knn_cpu(X, Q, k, metric, *, exclude_self=False, block=None):
    """Exact internal-metric k-NN of Q in X on the CPU (numpy BLAS, blocked).

    Returns ``(dist float32 (nq, k), idx int64 (nq, k))``. With ``exclude_self`` Q must be X and
    each row omits itself.
    """
    n = X.shape[0]
    xn = np.einsum("ij,ij->i", X, X)
    block = block or max(1, (1 << 25) // max(n, 1))
    out_i = np.empty((Q.shape[0], k), np.int64)
    out_d = np.empty((Q.shape[0], k), np.float32)
    for s in range(0, Q.shape[0], block):
        q = Q[s:s + block]
        dots = q @ X.T
        if metric == "ip":
            D = -dots
        else:
            D = xn[None, :] - 2 * dots
            D += np.einsum("ij,ij->i", q, q)[:, None]
            np.maximum(D, 0, out=D)
        if exclude_self:
            D[np.arange(q.shape[0]), np.arange(s, s + q.shape[0])] = np.inf
        idx, dd = select_topk(D, k)
        out_i[s:s + block] = idx
        out_d[s:s + block] = dd
    return out_d, out_i


def candidate_graph(X, K, metric, *, build_algo="nndescent", device="cpu", random_state=None,
                    user_metric=None):
    """Candidate lists: int64 (n, K) neighbour ids (self excluded) as a host numpy array.

    ``build_algo="nndescent"`` uses :func:`knnkit.knn_graph` when it is available and falls back to
    exact brute force (logged) otherwise; ``"brute"`` is exact.
    """
    n = X.shape[0]
    K = min(K, n - 1)
    if build_algo == "nndescent" and n > 4096:
        try:
            from ..nn_descent import knn_graph

            # the search graph needs good candidates, not a 0.99-recall K-NN graph: build with the
            # list length K itself instead of knn_graph's longer default (1M x 128 on an H200:
            # 3.5 s with K=128 internal lists for K=64)
            g = knn_graph(X, K, metric=_user_metric_for(metric, user_metric), device=device,
                          random_state=random_state, n_neighbors_internal=K)
            idx = g.indices if hasattr(g, "indices") else (g[1] if isinstance(g, tuple) else g)
            idx = _host_int64(idx)
            if idx.shape == (n, K):
                return idx
            logger.warning("knn_graph returned shape %s, expected %s; using brute force", idx.shape, (n, K))
        except NotImplementedError:
            logger.info("knn_graph (NN-Descent) not available yet; building the candidate graph exactly")
        except Exception as e:  # a failing optional path must not break the index build
            logger.warning("knn_graph failed (%s); building the candidate graph exactly", e)
    if device == "gpu":
        try:
            from ..brute_force import knn

            _d, idx = knn(X, None, k=K, metric=_user_metric_for(metric, user_metric), device="gpu")
            idx = _host_int64(idx)
            if idx.shape == (n, K):
                return idx
        except (ImportError, NotImplementedError) as e:
            logger.warning("GPU brute force not available (%s); exact candidate graph on the CPU", e)
    Xh = np.ascontiguousarray(as_host(X))
    _d, idx = exact_knn_cpu(Xh, Xh, K, metric, exclude_self=True)
    return idx


def _host_int64(a):
    """A host int64 numpy copy of whatever array the library returned (numpy, cupy or torch,
    depending on ``knnkit.set_output``)."""
    arr, _info = inspect_array(a)
    return np.ascontiguousarray(as_host(arr)).astype(np.int64, copy=False)


def _user_metric_for(internal, user_metric):
    if user_metric is not None:
        # cosine data is already unit-normalised: its inner product ranks the same
        return "inner_product" if user_metric == "cosine" else user_metric
    return "inner_product" if internal == "ip" else "sqeuclidean"


def _prune_dispatch(X, cand_idx, cand_dist, R, alpha, metric, device):
    if device == "gpu":
        try:
            import cupy
            from ._prune_gpu import prune_gpu

            return as_host(prune_gpu(cupy.asarray(X), cupy.asarray(cand_idx), cupy.asarray(cand_dist),
                                     R, alpha, metric))
        except (ImportError, NotImplementedError) as e:
            logger.warning("GPU pruning is not available (%s); pruning on the CPU", e)
    return prune_cpu(as_host(X), cand_idx, cand_dist, R, alpha, metric)


def diversify(X, cand_idx, R, metric, *, alpha=1.2, method="prune", device="cpu", cand_dist=None):
    """Turn candidate lists (n, K) into a fixed out-degree (n, R) int32 graph (host numpy).

    ``X`` is the prepared float32 data (numpy, or cupy when ``device == "gpu"``).
    """
    Xh = np.ascontiguousarray(as_host(X))
    cand_idx = np.ascontiguousarray(cand_idx, dtype=np.int64)
    if cand_dist is None:
        cand_dist = pair_distances(Xh, cand_idx, metric)
    if method == "ggnn":
        order = np.argsort(cand_dist, axis=1, kind="stable")
        cand_idx = np.take_along_axis(cand_idx, order, axis=1)
        return ggnn_diversify(Xh, cand_idx, None, R, metric)
    if method != "prune":
        raise ValueError(f"diversify must be 'prune' or 'ggnn', got {method!r}")
    g = _prune_dispatch(X, cand_idx, cand_dist, R, alpha, metric, device)
    return add_reverse_edges(Xh, g, R, alpha, metric)
