"""Hub refinement of raw inner-product graphs (beyond the GNND paper; measured in NOTES_gnnd.md).

Under an unnormalised inner product the neighbour lists of all points draw on a small set of
"hubs": point ``u``'s top-k is ``argmax_v u.v``, which depends on the direction of ``u`` only, so
large-norm points lead the lists of everybody in their direction. NN-Descent copes badly with
this: low-norm points are nobody's neighbour, so they only improve as reverse samples of the hubs
(capped at ``2p`` per hub and iteration), and their lists stall (1M x 128 clustered, GPU, k=10:
recall 0.93 with the basic update). But the hubs themselves are easy to find: the union of the
approximate top-k lists holds nearly all true neighbours (200k rows, CPU: the top-10 lists of a
0.97-recall graph cover 5.6 % of the points, and exact search over those gives recall 0.999).

So after NN-Descent, ``refine_hubs`` takes ``H`` = the ids in the top-k lists and, when ``H`` is a
small part of the data (at most ``max_fraction`` of n, i.e. at most that share of a brute-force
graph's work), replaces every list by the exact top-k over ``H`` (GEMM + top-k selection of
:func:`knnkit.knn`). The result can only be better than the approximate lists: they are a subset
of ``H``. On data without hubs (e.g. rows of equal norm, where the inner product ranks like
cosine) ``H`` is most of the data and nothing is done.
"""

import numpy as np

from .._core.backend import device_of, get_array_module

__all__ = ["refine_hubs"]


# Work caps of the automatic mode (row x hub pairs): about an exact all-points graph of 1M points
# (~3 s, fp16 GEMM + top-k on an H200), a few seconds of BLAS on two CPU cores. Above: lists kept.
MAX_PAIRS = {"gpu": 1e12, "cpu": 4e9}


def refine_hubs(X, I, D, k, *, force=False, max_fraction=0.25):
    """Exact top-k of every row over the support of the approximate top-k lists.

    Parameters
    ----------
    X : (n, d) numpy or cupy array
        The data (on the device of the computation).
    I, D : (n, >= k) arrays
        Approximate neighbour ids (-1 = none) and internal distances (minus the inner products,
        ascending), self excluded.
    k : int
        Neighbours to return per row.
    force : bool
        Refine whatever the support's size (exact search over it; with a support of all points
        this is a brute-force graph).
    max_fraction : float
        Without ``force``, refine only when the support holds at most this fraction of the points
        and ``n * |H|`` is within ``MAX_PAIRS[kind]``.

    Returns
    -------
    I, D, info : the refined (or unchanged) lists (n, k) and ``{"hubs": |H|, "refined": bool}``.
    The work runs where ``X`` is (numpy: CPU, cupy: GPU with the fp16 GEMM and exact re-ranking).
    """
    from ..exact import ExactParams, knn_lists

    xp = get_array_module(I)
    kind = device_of(X)
    n = int(X.shape[0])
    top = I[:, :k].ravel()
    hubs = xp.unique(top[top >= 0])
    info = {"hubs": int(hubs.size), "refined": False}
    # full top-k lists give at least k + 1 hubs (a hub's own row lists k other hubs); lists with
    # holes may not, and are left as they are
    if hubs.size < k + 1:
        info["reason"] = "too few hubs"
        return I[:, :k], D[:, :k], info
    if not force:
        if hubs.size > max_fraction * n:
            info["reason"] = "no hubs"  # most points are somebody's neighbour: nothing concentrates
            return I[:, :k], D[:, :k], info
        if n * float(hubs.size) > MAX_PAIRS[kind]:
            info["reason"] = "work cap"
            return I[:, :k], D[:, :k], info
    # k + 1: a row's own id may be among the hubs
    # fp16_rerank: tensor-core GEMM, candidates re-ranked in fp32 and certified (exact results)
    hd, hi, _ = knn_lists(X[hubs], X, k + 1, metric="ip", exclude_self=False,
                          params=ExactParams(precision="fp16_rerank" if kind == "gpu" else "exact"))
    ids = hubs[xp.asarray(hi)].astype(I.dtype, copy=False)
    hd = xp.asarray(hd)
    # drop each row's own id wherever it ranks (a stable sort keeps the others in order), or the
    # (k+1)-th entry where it is not among them
    is_self = ids == xp.arange(n, dtype=ids.dtype)[:, None]
    order = xp.argsort(is_self.astype(np.int8), axis=1, kind="stable")[:, :k]
    ids = xp.take_along_axis(ids, order, axis=1)
    hd = xp.take_along_axis(hd, order, axis=1)
    info["refined"] = True
    return xp.ascontiguousarray(ids), xp.ascontiguousarray(hd.astype(np.float32, copy=False)), info
