"""Coarse k-means on numpy or cupy arrays: the nearest centroid of every row and Lloyd iterations.

Shared by the index's entry points (``index/_entry.py``: centroids that cover the data) and the
exact CPU all-points graph's locality order (``exact/_cpu.py``: rows of one cell visited together).
Both need a few iterations on a sample, not a converged clustering.
"""

__all__ = ["sqnorms", "nearest_centroid", "lloyd"]


def sqnorms(xp, A):
    """Squared L2 norm of every row of ``A``."""
    return (A * A).sum(axis=1)


def nearest_centroid(xp, A, C, metric, block=65536):
    """Index of the nearest centroid (internal metric) for each row of A, blocked."""
    out = xp.empty(A.shape[0], dtype=xp.int64)
    cn = sqnorms(xp, C)
    for s in range(0, A.shape[0], block):
        a = A[s:s + block]
        dots = a @ C.T
        if metric == "ip":
            out[s:s + block] = xp.argmax(dots, axis=1)  # (the first largest: argmin of -dots)
        else:
            # in place, the same values as cn - 2 dots (-2 is exact, a + (-b) is a - b), without
            # two temporaries of the block's size
            dots *= -2
            dots += cn[None, :]
            out[s:s + block] = xp.argmin(dots, axis=1)
    return out


def lloyd(xp, S, C, n_iter, metric):
    """``n_iter`` Lloyd iterations of the centroids ``C`` (float32) on the rows ``S``; a centroid
    with no row keeps its place. ``metric="ip"``: spherical k-means (centroids normalised).
    Returns the new centroids."""
    c = C.shape[0]
    for _ in range(n_iter):
        lab = nearest_centroid(xp, S, C, metric)
        sums = xp.zeros_like(C)
        if xp.__name__ == "numpy":
            import numpy as np

            # per-cluster sums over the rows sorted by label (np.add.at took 0.11 of 0.17 s at
            # 10k x 128 and most of 0.8 s at 100k x 64: a ufunc.at is a scalar loop)
            order = np.argsort(lab, kind="stable")
            ls = lab[order]
            starts = np.flatnonzero(np.concatenate(([True], ls[1:] != ls[:-1])))
            sums[ls[starts]] = np.add.reduceat(S[order], starts, axis=0)
        else:
            import cupyx

            cupyx.scatter_add(sums, lab, S)
        cnt = xp.bincount(lab, minlength=c).astype(xp.float32)
        nonempty = cnt > 0
        C = xp.where(nonempty[:, None], sums / xp.maximum(cnt, 1)[:, None], C).astype(xp.float32)
        if metric == "ip":
            # spherical k-means: directions matter for inner products
            nrm = xp.sqrt(sqnorms(xp, C))[:, None]
            C = (C / xp.where(nrm > 0, nrm, 1)).astype(xp.float32)
    return C
