"""Parameters and run-time decisions of Sweet KNN shared by the CPU twin and the GPU engine.

Everything here is device-independent: the parameter object, the number of landmarks
(``3 sqrt(n)`` capped by memory, paper section IV-D1), the filter strength (``k/d`` against
``partial_ratio``, section IV-D1), the safety margin of every pruning test, the landmark
selection by repeated random sampling (section III-A), and the sample estimate that gates the
merging of repeated rows (not in the paper; NOTES_sweet.md, "Repeated rows merged").
"""

import dataclasses
import math

import numpy as np

from ..._core.params import Params, check_choice, check_float, check_int

__all__ = ["SweetParams", "default_landmarks", "choose_filter", "pruning_rel", "choose_landmarks",
           "draw_landmark_sets", "mean_copies", "dup_sample", "mean_copies_of_sample", "copies_from_pairs",
           "level1_verdict"]

FILTERS = ("auto", "full", "partial")
PARALLELISMS = ("auto", "query", "split")


def pruning_rel(dim):
    """Relative slack of every pruning test (Euclidean space).

    A candidate is skipped only when ``lower_bound > theta + rel * (theta + a + b)`` with ``a``,
    ``b`` the landmark distances the bound is made of. ``rel`` covers the float32 rounding of a
    reported squared distance summed over ``dim`` terms (at most ``dim * 2^-24`` relative, half
    of that after the square root), the float32 storage of member-to-centre distances and the
    float64 bound arithmetic, with a wide factor on top: a pair whose reported distance ties the
    k-th one is never pruned, so ties still go to the smaller index as in the GEMM path.
    """
    return 1e-5 + 2.0 * dim * 2.0 ** -24


@dataclasses.dataclass(frozen=True, kw_only=True, repr=False)
class SweetParams(Params):
    """Parameters of the Sweet KNN exact engine (triangle-inequality filtering).

    Parameters
    ----------
    n_landmarks_query, n_landmarks_data : int or None
        Number of clusters formed on the queries and on the data. ``None`` uses ``3 sqrt(n)``
        (the paper's choice), capped by the memory the cluster-pair tables need.
    filter : {"auto", "full", "partial"}
        Level-2 filter strength. ``"full"`` keeps a per-query k-best list whose k-th distance
        shrinks the bound as points are found; ``"partial"`` keeps the level-1 bound fixed,
        writes every surviving distance out and k-selects afterwards. ``"auto"`` picks partial
        when ``k / d > partial_ratio`` (never, by default: see ``partial_ratio``).
    parallelism : {"auto", "query", "split"}
        ``"query"``: one worker per query; ``"split"``: several workers per query splitting its
        candidate clusters, each with its own k-best list, merged at the end. ``"auto"`` splits
        when there are too few queries to fill the device.
    partial_ratio : float, default inf
        Threshold on ``k / d`` above which ``filter="auto"`` chooses the partial filter. The
        paper's rule is 8; measured here the full filter was faster on every case with
        ``k / d > 8`` (GPU, H100, all points: uniform / clustered 2-D 500k k = 17-100 10-110x,
        3-D 250k k = 32-100 12-60x; CPU 100k 2.3-7x), so ``"auto"`` keeps the full filter
        unless a ratio is given.
    landmark_trials : int, default 10
        Random landmark sets drawn; the one with the largest sum of pairwise distances is kept.
    split_factor : int or None
        Workers per query when splitting; ``None`` derives it from the device.
    """

    n_landmarks_query: int = None
    n_landmarks_data: int = None
    filter: str = "auto"
    parallelism: str = "auto"
    partial_ratio: float = float("inf")
    landmark_trials: int = 10
    split_factor: int = None

    def _validate(self):
        return {
            "n_landmarks_query": check_int(self.n_landmarks_query, "n_landmarks_query", minimum=1, allow_none=True),
            "n_landmarks_data": check_int(self.n_landmarks_data, "n_landmarks_data", minimum=1, allow_none=True),
            "filter": check_choice(self.filter, "filter", FILTERS),
            "parallelism": check_choice(self.parallelism, "parallelism", PARALLELISMS),
            "partial_ratio": check_float(self.partial_ratio, "partial_ratio", minimum=0.0, allow_inf=True),
            "landmark_trials": check_int(self.landmark_trials, "landmark_trials", minimum=1),
            "split_factor": check_int(self.split_factor, "split_factor", minimum=1, maximum=1024, allow_none=True),
        }


def default_landmarks(requested, n, other, budget_bytes):
    """Landmark count for a set of ``n`` points: ``requested`` or ``ceil(3 sqrt(n))``, at most
    ``n`` and small enough that the cluster-pair tables (``~24`` bytes per pair with ``other``
    clusters on the other side) stay within ``budget_bytes``."""
    count = requested if requested is not None else int(math.ceil(3.0 * math.sqrt(n)))
    if budget_bytes:
        cap = max(1, int(budget_bytes // (24 * max(1, other))))
        if count > cap:
            count = cap
    return max(1, min(count, n))


def choose_filter(params, k, dim, merged=False):
    """``"full"`` or ``"partial"`` (paper Fig. 8: partial when ``k/d`` exceeds the ratio, which is
    infinite by default: the full filter measured faster everywhere, see ``SweetParams``).

    ``merged`` (repeated rows merged before level 2): always full under ``"auto"``. The partial
    filter writes every surviving copy out, where the full filter offers copies in ascending index
    and stops at the first refused: skin (245k x 3, 51k distinct), k = 100, CPU: 138M -> 17M
    distances, 3.03 -> 0.70 s, identical results; on the H200 the partial filter took 1.54 s, 5x
    the GEMM path."""
    if params.filter != "auto":
        return params.filter
    if merged:
        return "full"
    return "partial" if k / dim > params.partial_ratio else "full"


def level1_verdict(saved1, enough=None, hopeless=None):
    """What level 1 alone decides about a join, from ``saved1``, the fraction of all queries'
    distance computations it saves: False when it saves less than ``hopeless`` (level 2 will not
    make up the rest), True when it saves at least ``enough`` (level 2 only adds to it), None when
    level 2 must be sampled. One rule for the savings estimate's early exit and the gate inside a
    run, on both twins."""
    if hopeless is not None and saved1 < float(hopeless):
        return False
    if enough is not None and saved1 >= float(enough):
        return True
    return None


def draw_landmark_sets(n, count, trials, rng):
    """The ``trials`` random landmark sets of ``choose_landmarks`` as one ``(trials, count)`` int64
    array, each row sorted: the same draws from ``rng`` in the same order, so the GPU engine, which
    scores all sets in one kernel, picks from the very sets the CPU twin scores one by one."""
    return np.stack([np.sort(rng.choice(n, size=count, replace=False)) for _ in range(trials)])


def choose_landmarks(points, count, trials, rng, xp=np, spread_fn=None):
    """Indices of ``count`` rows of ``points`` drawn at random ``trials`` times, keeping the draw
    with the largest sum of pairwise Euclidean distances (paper section III-A).

    ``points`` may be numpy or cupy; the draws come from the host ``rng`` (``draw_landmark_sets``)
    so that the CPU twin and the GPU engine pick the same landmarks for the same seed (up to float
    rounding of the spread sums). ``spread_fn(L)`` may replace the GEMM-based sum of pairwise
    distances."""
    n = points.shape[0]
    picks = draw_landmark_sets(n, count, trials, rng)
    if trials == 1:
        return picks[0]
    spreads = []
    for pick in picks:
        L = points[xp.asarray(pick)].astype(xp.float32)
        if spread_fn is not None:
            spreads.append(float(spread_fn(L)))
            continue
        sq = xp.einsum("ij,ij->i", L, L)
        d2 = sq[:, None] + sq[None, :] - 2.0 * (L @ L.T)
        spreads.append(xp.sqrt(xp.maximum(d2, 0.0)).sum())  # stays on the device: one sync below
    if spread_fn is None:
        spreads = [float(v) for v in (xp.stack(spreads).get() if xp is not np else spreads)]
    best = int(np.argmax(spreads))  # the first of equal spreads, as a running maximum would keep
    return picks[best]


DUP_SAMPLE = 4096


def mean_copies(X, rng):
    """Estimated mean number of *other* copies a row of ``X`` has (identical float32 bit patterns),
    from the equal pairs among ``DUP_SAMPLE`` rows drawn by ``rng``.

    ``X`` may be numpy or cupy; only the sample (a few KiB) comes to the host, so both twins take
    the same decision for the same seed. Equal pairs in the sample over all sample pairs estimate
    the chance that two rows are equal; times ``n - 1`` it is the expected copies per row. (The
    GPU engine counts the pairs of the same sample on the device: ``dup_sample`` and
    ``copies_from_pairs`` are the two halves it shares.)"""
    n = X.shape[0]
    pick = dup_sample(n, rng)
    if pick is None:
        return 0.0
    if isinstance(X, np.ndarray):
        sample = X[pick]
    else:
        import cupy as cp

        sample = cp.asnumpy(X[cp.asarray(pick)])
    return mean_copies_of_sample(sample, n)


def dup_sample(n, rng):
    """The rows ``mean_copies`` samples (sorted), or None when there are fewer than two."""
    s = min(n, DUP_SAMPLE)
    if s < 2:
        return None
    return np.sort(rng.choice(n, size=s, replace=False))


def mean_copies_of_sample(sample, n):
    """``mean_copies`` from the sampled rows (host array) of an ``n``-row matrix."""
    rows = np.ascontiguousarray(sample, dtype=np.float32).view(np.uint32)
    counts = _equal_row_counts(rows)
    pairs = float((counts * (counts - 1.0) / 2.0).sum())
    return copies_from_pairs(pairs, rows.shape[0], n)


def copies_from_pairs(pairs, s, n):
    """Expected other copies per row from ``pairs`` equal pairs among ``s`` sampled rows of ``n``."""
    return float(pairs) / (s * (s - 1.0) / 2.0) * (n - 1)


def _equal_row_counts(rows):
    """Sizes of the groups of identical rows of the uint32 matrix ``rows`` (any order).

    A 64-bit hash per row, one sort of the hashes, runs of equal hash confirmed row by row. This is
    what ``np.unique`` of the rows as a void dtype returns, ~10x faster (its sort compares 12-byte
    blobs through a generic function: ~0.9 ms for 4096 rows at d = 3, paid on every all-points call
    of either twin). A run with two different rows (a hash collision, ~2^-40 for 4096 rows) falls
    back to ``np.unique``, so the counts are always exact."""
    s, dim = rows.shape
    h = _hash_rows(rows)
    o = np.argsort(h, kind="stable")
    hs = h[o]
    new = np.ones(s, bool)
    new[1:] = hs[1:] != hs[:-1]
    rs = rows[o]
    # inside a run of equal hashes every row must equal the one before it
    if not (rs[1:] == rs[:-1]).all(axis=1)[~new[1:]].all():
        _, counts = np.unique(rows.view(np.dtype((np.void, 4 * dim))).ravel(), return_counts=True)
        return counts
    return np.diff(np.append(np.flatnonzero(new), s))


def _hash_rows(rows):
    """A 64-bit hash of each row of a uint32 matrix (the mixing step of the GPU's sweet_row_hash)."""
    h = np.full(rows.shape[0], 0x9E3779B97F4A7C15 ^ rows.shape[1], np.uint64)
    with np.errstate(over="ignore"):
        for c in range(rows.shape[1]):
            h ^= rows[:, c].astype(np.uint64)
            h *= np.uint64(0xFF51AFD7ED558CCD)
            h ^= h >> np.uint64(29)
    return h
