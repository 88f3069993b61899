"""Neighbours closer than float32 can tell apart: found after a search, answered in float64.

Two distinct float32 rows whose coordinates differ only by amounts below about ``2^-63`` (at the
power-of-two scale the search ran at, see :func:`knnkit._core.metrics.safe_scale`) have a squared
distance below float32's smallest normal number: it computes as 0, or as a subnormal without
precision, and such rows tie with true duplicates of the query, so the ids come out in index order
instead of distance order. It happens only when the data's values span more than ~10^19 (e.g. rows
near 1e-25 beside rows near 1, or rows near 1 beside one row near 1e25 that sets the scale); no
search in float32 can rank them, and before this check knnkit returned such lists without a word.

:func:`underflow_rows` finds the query rows concerned from a search's result (a returned neighbour
at an internal distance below :data:`TINY` whose stored row differs from the query's; true
duplicates at distance 0 are not concerned), and :func:`exact_rows_float64` answers those rows
exactly on the host in float64 (direct differences, no ``|x|^2 - 2 x.y + |y|^2`` cancellation).
When the rows are too many for that (:data:`EXACT64_MAX_WORK`), the caller refuses with
:func:`range_error`.
"""

import math
import warnings

import numpy as np

from .backend import as_host, get_array_module

__all__ = ["TINY", "EXACT64_MAX_WORK", "underflow_rows", "exact_rows_float64", "range_error", "answer_in_float64",
           "warn_unresolved_cosine"]

#: Internal distances (squared L2 or L1, at the search's scale) below this are not trusted to rank:
#: 2^6 above float32's smallest normal number (2^-126), a margin for the rounding of a sum of terms.
TINY = 2.0 ** -120
#: The float64 answer of the rows concerned costs ``rows x n x d`` multiply-adds on the host (numpy,
#: ~1e9 per second); beyond this the search refuses instead.
EXACT64_MAX_WORK = 4e9
#: data rows per float64 block (a block of differences is ``rows x d`` float64)
_BLOCK = 1 << 16


#: ``scale x`` the smallest non-zero magnitude of the rows at or above this: two distinct float32
#: rows then differ by at least ``2^-30 x 2^-24`` in some coordinate at the search's scale, so
#: their squared distance is at least ``2^-108``, far above :data:`TINY` (see :func:`_resolvable`)
_MIN_NONZERO = 2.0 ** -30


def _resolvable(A, scale):
    """True when no two distinct rows of ``A`` can be closer than float32 resolves at ``scale``:
    any two distinct float32 values differ by at least ``2^-24`` times the smaller non-zero
    magnitude of the two (or by the non-zero one's magnitude), so a floor on the smallest non-zero
    magnitude is a floor on every distance between distinct rows. One pass over ``A``."""
    xp = get_array_module(A)
    a = xp.abs(A)
    nz = a[a > 0]
    return not nz.size or float(nz.min()) * float(scale) >= _MIN_NONZERO


def underflow_rows(d_internal, ids, raw_data, raw_queries, internal, scale=1.0):
    """Query rows (sorted host int64) whose result holds a neighbour closer than float32 resolves.

    Parameters
    ----------
    d_internal : (m, k) float32 array
        The search's internal distances (before :func:`~knnkit._core.metrics.finalize_distances`).
    ids : (m, k) int array
        The neighbour ids (``-1`` for an empty slot).
    raw_data, raw_queries : float32 (n, d) / (m, d) arrays
        The stored rows, as the user gave them (``Prepared.raw``; the queries' rows in the order of
        ``d_internal``'s rows).
    internal : {"l2", "l1", "ip"}
        Internal metric; inner products (and cosine) are not checked (their zero is no tie with a
        duplicate: orthogonal rows are legitimately at similarity 0).
    scale : float
        The power-of-two factor the search ran at (``Prepared.scale``).

    Returns
    -------
    numpy int64 array
        Empty for the ordinary case (one comparison of the distances with :data:`TINY`).
    """
    none = np.empty(0, np.int64)
    if internal not in ("l2", "l1") or np.dtype(raw_data.dtype) != np.float32 or not d_internal.size:
        return none
    xp = get_array_module(d_internal)
    if float(d_internal.min()) >= TINY:  # the ordinary case: one reduction (empty slots are inf)
        return none
    # distances this small are mostly a query's own row or its exact duplicates (searching with
    # data points): only pairs whose rows differ are concerned
    q, c = xp.nonzero((d_internal < TINY) & (ids >= 0))
    if not q.size:
        return none
    if q.size * 8 >= raw_data.shape[0] and _resolvable(raw_data, scale) and (
            raw_queries is raw_data or _resolvable(raw_queries, scale)):
        # many pairs this close (data with many exact copies: skin as float32, k = 100, had ~1.5 s
        # of row comparisons on a 0.56 s search): one pass over the rows proves them all copies
        return none
    q, _nb = _pairs_of_differing_rows(q, c, ids, raw_data, raw_queries)
    return np.unique(q).astype(np.int64)


def _pairs_of_differing_rows(q, c, ids, raw_data, raw_queries):
    """The pairs (query row ``q``, its neighbour ``ids[q, c]``) whose stored rows differ, as host
    int64 arrays: a query's own row and exact copies are no concern of the resolution checks."""
    xp = get_array_module(ids)
    nb = ids[q, c].astype(xp.int64)
    if get_array_module(raw_data) is not xp or get_array_module(raw_queries) is not xp:
        # (a search on another device than its stored rows: compared on the host, a rare path)
        q, nb, raw_data, raw_queries = as_host(q), as_host(nb), as_host(raw_data), as_host(raw_queries)
    differ = (raw_queries[q] != raw_data[nb]).any(axis=1)
    if not bool(differ.any()):
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return as_host(q[differ]).astype(np.int64), as_host(nb[differ]).astype(np.int64)


def exact_rows_float64(raw_data, queries, k, metric, exclude=None):
    """Exact k-NN of a few queries over all rows, in float64 on the host.

    Parameters
    ----------
    raw_data : (n, d) array (numpy or cupy)
    queries : (r, d) array
    k : int
    metric : {"sqeuclidean", "euclidean", "manhattan"}
    exclude : int array (r,), optional
        A data row each query must not return (itself, in an all-points search).

    Returns
    -------
    distances float32 (r, k) in the user metric (correctly rounded from float64: a distance below
    float32's range is 0), ids int64 (r, k); ties by smaller id.

    Examples
    --------
    >>> X = np.array([[0.0], [3e-30], [1e-30], [1.0]], np.float32)
    >>> exact_rows_float64(X, X[:1], 2, "sqeuclidean", exclude=np.array([0]))[1].tolist()
    [[2, 1]]
    """
    X = as_host(raw_data)  # converted block by block below: never a float64 copy of all the data
    Q = as_host(queries).astype(np.float64)
    n = X.shape[0]
    out_d = np.empty((Q.shape[0], k), np.float32)
    out_i = np.empty((Q.shape[0], k), np.int64)
    D = np.empty(n, np.float64)
    for r in range(Q.shape[0]):
        for lo in range(0, n, _BLOCK):
            diff = X[lo:lo + _BLOCK].astype(np.float64) - Q[r]
            D[lo:lo + _BLOCK] = np.abs(diff).sum(axis=1) if metric == "manhattan" else (diff * diff).sum(axis=1)
        if exclude is not None:
            D[int(exclude[r])] = np.inf
        # the k smallest, ties by index: everything up to the k-th value, then a stable sort
        kth = np.partition(D, k - 1)[k - 1]
        cand = np.flatnonzero(D <= kth)
        order = cand[np.argsort(D[cand], kind="stable")][:k]
        out_i[r] = order
        out_d[r] = (np.sqrt(D[order]) if metric == "euclidean" else D[order]).astype(np.float32)
    return out_d, out_i


def range_error(rows, m, absmax):
    """The ValueError of a search whose rows concerned are too many to answer in float64."""
    return ValueError(
        f"{rows} of the {m} query rows have neighbours closer than float32 can resolve beside values up to "
        f"{absmax:.3g}: the data's values span a range too wide for float32 distances (more than ~1e19 between "
        f"the largest value and the smallest differences), so no float32 search can rank them. Center or "
        f"rescale the data, or remove the outlying rows")


def answer_in_float64(d, i, rows, raw_data, queries, k, metric, *, n_queries, absmax, max_work=EXACT64_MAX_WORK,
                      exclude=None, col0=0, stacklevel=3):
    """Rows ``rows`` of a result ``(d, i)`` (user-metric distances, ids; numpy or cupy) answered
    again exactly in float64 (:func:`exact_rows_float64`) in place, columns ``col0:`` (a graph's
    self column stays), with a ``RuntimeWarning``; or :func:`range_error` when that costs more
    than ``max_work`` multiply-adds (``n_queries`` and ``absmax`` name the search in the message).
    ``queries``: the rows' own query rows (``raw_data``'s rows for an all-points search, with
    ``exclude`` their ids)."""
    if rows.size * float(raw_data.shape[0]) * raw_data.shape[1] > max_work:
        raise range_error(rows.size, n_queries, absmax)
    d64, i64 = exact_rows_float64(raw_data, queries, k, metric, exclude=exclude)
    xp = get_array_module(d)
    sel = xp.asarray(rows)
    d[sel, col0:] = xp.asarray(d64)
    i[sel, col0:] = xp.asarray(i64).astype(i.dtype)
    warnings.warn(f"{rows.size} rows have neighbours closer than float32 resolves (the data's values span more "
                  f"than ~1e19); they were answered exactly in float64", RuntimeWarning, stacklevel=stacklevel)
    return d, i


def cosine_resolution(dim):
    """Cosine distances below this are float32 rounding: ``1 - x.y`` of rows normalised in float32
    carries an error of about ``sqrt(d) 2^-24`` (a 16x margin here; 3.8e-6 at d = 16)."""
    return 2.0 ** -24 * 16.0 * math.sqrt(max(1, int(dim)))


def warn_unresolved_cosine(d_internal, ids, raw_data, raw_queries, metric, *, stacklevel=3):
    """Warn (RuntimeWarning) when a cosine result holds neighbours closer than float32 resolves.

    Cosine is computed as ``1 - x.y`` of rows normalised in float32, so similarities above
    ``1 - cosine_resolution(d)`` are not ordered among themselves (1,500 x 16 rows sharing a
    direction, similarities ~0.99999: exact recall 0.74 by float64 ids, RSFK 0.18 while its own
    estimate read 0.98). Pairs of equal or parallel rows (a query's own row, exact copies,
    multiples: ties at distance 0) are no concern.
    One comparison of the distances with the threshold in the ordinary case; returns the number
    of query rows concerned."""
    if metric != "cosine" or not d_internal.size:
        return 0
    xp = get_array_module(d_internal)
    thr = cosine_resolution(raw_data.shape[1])
    if float(d_internal.min()) >= thr - 1.0:  # internal key -x.y: distance 1 + key
        return 0
    q, c = xp.nonzero((d_internal < thr - 1.0) & (ids >= 0))
    q, nb = _pairs_of_differing_rows(q, c, ids, raw_data, raw_queries)
    if not q.size:
        return 0
    # rows that are parallel (one a multiple of the other) are at distance 0 in exact arithmetic:
    # ties, whatever their order; the pairs whose float64 distance is not 0 are the concern
    concern = np.zeros(q.size, bool)
    xq, xd = get_array_module(raw_queries), get_array_module(raw_data)
    for s in range(0, q.size, 1 << 16):
        a = np.asarray(as_host(raw_queries[xq.asarray(q[s:s + (1 << 16)])]), np.float64)
        b = np.asarray(as_host(raw_data[xd.asarray(nb[s:s + (1 << 16)])]), np.float64)
        a /= np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-300)
        b /= np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-300)
        concern[s:s + (1 << 16)] = 0.5 * ((a - b) ** 2).sum(axis=1) > 2.0 ** -40
    rows = int(np.unique(q[concern]).size)
    if rows:
        warnings.warn(f"{rows} query rows have neighbours at cosine distance below {thr:.1e} (similarities above "
                      f"{1 - thr:.7f}), where float32 cannot order them: cosine is 1 - x.y of rows normalised in "
                      f"float32. For an exact order normalise the vectors yourself and search them by "
                      f"metric='sqeuclidean'", RuntimeWarning, stacklevel=stacklevel)
    return rows

