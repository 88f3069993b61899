"""The RSFK engine: parameters, the forest driver shared by the CPU and GPU backends, and the recall
estimator.

Paper: Meyer, Pozo & Nunan Zola, "Warp-centric K-Nearest Neighbor Graphs construction on GPU"
(w-KNNG; RSFK tree construction, k-NN set updates, NNE post-processing).
"""

import dataclasses
import math
import time

import numpy as np

from ..._core.config import finish, logger, progress
from ..._core.params import Params, check_bool, check_choice, check_float, check_int
from .._estimate import RecallProbe, _distinct_valid, _row_distances, _xp, estimate_recall  # noqa: F401

__all__ = ["RSFKParams", "rsfk_lists", "rsfk_graph", "estimate_recall", "default_leaf_size", "default_n_trees",
           "trees_stalled"]

_METRICS = {"l2": 0, "ip": 1}
#: leaf_size is bounded so that the diagonal kernel's shared buffer (4 bytes per point) stays small
MAX_LEAF_SIZE = 4096


def default_leaf_size(K):
    """Default largest leaf for lists of ``K``: at least ``2K + 2`` so that every leaf (halves of a
    node above the limit are never smaller than ``K + 1``) gives each of its points ``K``
    candidates, and at least 64 (2 x 2 tiles of the GPU's tiles kernel; on clustered 5k x 16,
    4 trees + NNE gave recall@10 0.980 with 64 against 0.961 with 32, NOTES_rsfk.md)."""
    return int(min(MAX_LEAF_SIZE, max(64, 2 * K + 2)))


def default_n_trees(n, K, nne=True):
    """Default number of trees when neither ``n_trees`` nor ``target_recall`` is given.

    More points need more trees for the same recall (a point's true neighbours are spread over more
    leaves); NNE multiplies what each tree gives. Measured on the CPU twin (NOTES_rsfk.md): with NNE,
    clustered 5k x 16 reaches recall@10 0.98 with 4 trees (leaf_size 64).
    """
    grow = max(0.0, math.log2(max(n, 2) / 5000.0))
    base = 4 + grow if nne else 10 + 3 * grow
    return int(min(64, max(2, round(base))))


#: Recall@K the forest aims for (on an estimate) when the number of trees is not given.
DEFAULT_TARGET_RECALL = 0.95
#: Trees and NNE rounds stop once the sampled estimate clears the target by this much: the probe's
#: own error is of this order (ci suite, CPU: sift-like uint8 estimated 0.9514, measured 0.9495).
ESTIMATE_MARGIN = 0.005


@dataclasses.dataclass(frozen=True, kw_only=True)
class RSFKParams(Params):
    """Parameters of the random-sample forest k-NN graph (RSFK with warp-centric leaf updates).

    Parameters
    ----------
    n_trees : int or None
        Trees of the forest. None (default): as many as ``target_recall`` needs, up to
        ``max_trees`` (``DEFAULT_TARGET_RECALL`` when neither is given). Not together with
        ``target_recall``.
    leaf_size : int or None
        Largest leaf; must be at least ``K + 1`` (checked when K is known). None:
        :func:`default_leaf_size` of K.
    split : {"sample", "projection"}
        ``"sample"`` (RSFK): the hyperplane equidistant to two random points of the node (the
        angular version for inner products); ``"projection"``: a random +-1 direction through the
        node's median.
    leaf_update : {"auto", "atomic", "tiles", "diagonal"}
        GPU k-NN set update kernel (the CPU has one leaf join). ``"auto"`` is ``"tiles"``.
    nne : bool
        Run the nearest-neighbour exploration pass (neighbours of neighbours) after the forest.
    nne_iters : int
        NNE passes (>= 1).
    target_recall : float or None
        Add trees until the recall@K estimated on ``recall_sample`` points with exact neighbours
        (including the effect of one NNE pass when ``nne``) reaches this value, or ``max_trees``.
        None with ``n_trees`` None: ``DEFAULT_TARGET_RECALL``. (A fixed default number of trees,
        4-6 by n, gave recall 0.64 on 3000 x 16 and 0.28 on 20000 x 32 Gaussian data.)
    max_trees : int
        Cap on the trees added for ``target_recall``.
    recall_sample : int
        Points of the recall estimate.
    nne_rounds : int
        With a recall target: most NNE rounds run once trees stop paying (see Notes); 0 disables
        the switch (trees up to ``max_trees``, then one NNE pass, as before).
    nne_width : int or None
        List length during the NNE rounds (>= K; the first K entries are returned). None:
        ``2K``, at most ``n - 1``. A longer list is what lets neighbours-of-neighbours keep
        improving on data of high intrinsic dimension (uniform 20k x 32: K = 10 stalls at 0.70,
        20 reaches 0.96; NOTES_rsfk.md).
    nne_min_gain : float
        A round that adds less estimated recall than this ends the rounds.
    exact_fallback : bool
        When trees and NNE rounds end below the target and the exact graph is affordable
        (:func:`knnkit.graph.exact_affordable`), return the exact graph instead (as
        ``method="nndescent"`` does).

    Notes
    -----
    The stopping rule with a recall target (default): trees are added while they pay. After each
    tree the recall estimate (as it will be after one NNE pass) is recorded; from 9 trees on,
    the gain of the last 4 trees is projected (linearly over the trees left, and, when the gains
    shrink, geometrically to its limit). When either projection falls short of the target the forest
    stops ("switch") and NNE rounds start: each round offers every point the neighbours of its
    neighbours, reverse neighbours included (a random sample of K per point, drawn anew each round),
    over lists lengthened to ``nne_width``. Rounds stop at the target, after a round that gains less
    than ``nne_min_gain``, when the geometric projection of the gains falls short, or after
    ``nne_rounds``. Below the target after that: the exact graph when ``exact_fallback`` and it is
    affordable, else a warning. ``stats`` records ``trees``, ``nne_rounds``, ``switch`` and
    ``stop_reason``.
    """

    n_trees: object = None
    leaf_size: object = None
    split: str = "sample"
    leaf_update: str = "auto"
    nne: bool = True
    nne_iters: int = 1
    target_recall: object = None
    max_trees: int = 128
    recall_sample: int = 500
    nne_rounds: int = 8
    nne_width: object = None
    nne_min_gain: float = 0.005
    exact_fallback: bool = True

    def _validate(self):
        out = {
            "n_trees": check_int(self.n_trees, "n_trees", minimum=1, allow_none=True),
            "leaf_size": check_int(self.leaf_size, "leaf_size", minimum=2, maximum=MAX_LEAF_SIZE, allow_none=True),
            "split": check_choice(self.split, "split", ("sample", "projection")),
            "leaf_update": check_choice(self.leaf_update, "leaf_update", ("auto", "atomic", "tiles", "diagonal")),
            "nne": check_bool(self.nne, "nne"),
            "nne_iters": check_int(self.nne_iters, "nne_iters", minimum=1),
            "target_recall": check_float(self.target_recall, "target_recall", minimum=0.0, maximum=1.0,
                                         open_min=True, allow_none=True),
            "max_trees": check_int(self.max_trees, "max_trees", minimum=1),
            "recall_sample": check_int(self.recall_sample, "recall_sample", minimum=1),
            "nne_rounds": check_int(self.nne_rounds, "nne_rounds", minimum=0),
            "nne_width": check_int(self.nne_width, "nne_width", minimum=1, allow_none=True),
            "nne_min_gain": check_float(self.nne_min_gain, "nne_min_gain", minimum=0.0, maximum=1.0),
            "exact_fallback": check_bool(self.exact_fallback, "exact_fallback"),
        }
        if out["n_trees"] is not None and out["target_recall"] is not None:
            raise ValueError("give n_trees or target_recall, not both (target_recall adds trees up to max_trees)")
        return out


def _backend(X):
    if isinstance(X, np.ndarray):
        from ._cpu import CpuBackend

        return CpuBackend()
    from ._gpu import GpuBackend

    return GpuBackend()


# ----------------------------------------------------------------------------------------- trees

def _orderable(xp, proj):
    """float32 -> uint64 whose unsigned order is the float order."""
    u = proj.view(xp.uint32).astype(xp.uint64)
    flip = xp.where((u >> 31) == 1, xp.uint64(0xFFFFFFFF), xp.uint64(0x80000000))
    return u ^ flip


def _force_depth(n, min_child):
    """A sample split that leaves a child below min_child is retried with new pivots at the next
    level; past this depth every oversized node is halved (random halves), so a tree ends."""
    return 2 * int(math.ceil(math.log2(max(2.0, n / max(1, min_child))))) + 8


def build_tree(be, X, metric, inv_norm, leaf_size, min_child, split, seed, tree):
    """One tree, level by level on ``be``'s device.

    Returns ``(perm, leaf_lo, leaf_hi, levels)``: ``perm`` holds the point ids grouped by leaf, leaf
    ``l`` is ``perm[leaf_lo[l]:leaf_hi[l]]``. Every leaf holds at most ``leaf_size`` points and, when
    ``n >= min_child``, at least ``min_child``.
    """
    xp = be.xp
    n = X.shape[0]
    perm = xp.arange(n, dtype=xp.int32)
    lo = xp.zeros(n, xp.int32)
    hi = xp.full(n, n, xp.int32)
    side = xp.zeros(n, xp.int32)
    cum = xp.zeros(n + 1, xp.int32)
    proj = xp.zeros(n, xp.float32)
    out = [xp.empty_like(perm), xp.empty_like(lo), xp.empty_like(hi)]
    force_depth = _force_depth(n, min_child)
    level = 0
    while n > leaf_size and int((hi - lo).max()) > leaf_size:  # one scalar to the host per level
        force = level >= force_depth
        if split == "projection" and not force:
            be.project(X, perm, lo, hi, leaf_size, seed, tree, level, proj)
            # sort each node by projection (nodes stay in place: lo is the primary key), then halve
            order = be.argsort((lo.astype(xp.uint64) << 32) | _orderable(xp, proj))
            perm = perm[order]
            mode = 1
        else:
            if not force:
                be.side_sample(X, metric, inv_norm, perm, lo, hi, leaf_size, seed, tree, level, side)
                cum[1:] = xp.cumsum(side, dtype=xp.int32)
            mode = 0
        be.partition(perm, lo, hi, side, cum, leaf_size, min_child, mode, force, *out)
        (perm, lo, hi), out = out, [perm, lo, hi]
        level += 1
    heads = xp.nonzero(lo == xp.arange(n, dtype=xp.int32))[0]
    return perm, heads.astype(xp.int32), hi[heads], level


# ------------------------------------------------------------------------------- stopping rule

#: trees per window of the tree-gain projection (the switch is considered from 2 windows on)
SWITCH_WINDOW = 4
#: a geometric projection (trees or NNE rounds) must fall this far below the target to stop: the
#: per-tree / per-round estimates are noisy (500 rows), and stopping too early costs more (the exact
#: fallback) than one more round
PROJECTION_SLACK = 0.02


def _geometric_limit(r, gain, prev_gain):
    """Where a recall curve ends if its gains keep shrinking by ``gain / prev_gain`` (inf when they
    do not shrink)."""
    if prev_gain <= 0.0 or gain >= prev_gain:
        return math.inf
    q = max(0.0, gain / prev_gain)
    return r + gain * q / (1.0 - q)


def trees_stalled(recalls, target, max_trees, window=SWITCH_WINDOW):
    """Whether more trees cannot pay: ``(stalled, projection)`` from the per-tree estimates.

    From ``2 * window + 1`` trees on: the gain ``g`` of the last ``window`` trees, projected linearly over
    the trees left (``r + g / window * left``), and, when it is smaller than the window before's
    gain ``g0``, geometrically (``r + g q / (1 - q)``, ``q = g / g0``). Stalled when the linear
    projection is below the target or the geometric one is ``PROJECTION_SLACK`` below it.
    """
    t = len(recalls)
    if t <= 2 * window:
        return False, None
    r = recalls[-1]
    g = r - recalls[-1 - window]
    g0 = recalls[-1 - window] - recalls[-1 - 2 * window]
    linear = r + g / window * (max_trees - t)
    proj = min(linear, _geometric_limit(r, g, g0))
    return bool(linear < target or proj < target - PROJECTION_SLACK), float(min(proj, 1.0))


def _reverse_sample(be, idx, R, seed, salt):
    """Up to ``R`` reverse neighbours per point (``j`` with ``i`` in ``idx[j]``), chosen uniformly by a
    hash of (seed, salt, j), as an int32 (n, R) array padded with -1 (array code: numpy or cupy)."""
    xp = be.xp
    n, K = idx.shape
    dst = idx.reshape(-1).astype(xp.int64)
    src = xp.repeat(xp.arange(n, dtype=xp.int64), K)
    ok = dst >= 0
    src, dst = src[ok], dst[ok]
    u64 = xp.uint64
    h = src.astype(u64) * u64(0x9E3779B97F4A7C15) + u64((int(seed) * 0xBF58476D1CE4E5B9 + salt) & (2 ** 64 - 1))
    h = (h ^ (h >> u64(31))) * u64(0x94D049BB133111EB)
    h = h ^ (h >> u64(29))
    order = be.argsort((dst.astype(u64) << u64(32)) | (h >> u64(32)))  # by target, random within it
    src, dst = src[order], dst[order]
    rank = xp.arange(dst.shape[0], dtype=xp.int64) - xp.searchsorted(dst, dst, side="left")
    keep = rank < R
    rev = xp.full((n, R), -1, xp.int32)
    rev[dst[keep], rank[keep]] = src[keep].astype(xp.int32)
    return rev


def _widen(be, idx, dist, width):
    """Lists of ``width >= K`` entries holding ``idx``/``dist`` first (rows stay sorted)."""
    n, K = idx.shape
    if width <= K:
        return idx, dist
    wi, wd = be.new_lists(n, width)
    wi[:, :K] = idx
    wd[:, :K] = dist
    return wi, wd


# ---------------------------------------------------------------------------------------- recall

# ---------------------------------------------------------------------------------------- engine

def _init_lists(be, X, metric, init, K, idx, dist):
    """Seed the lists with an initial graph ``init = indices`` or ``(indices, distances)`` (distances are
    recomputed; self, out-of-range and repeated ids dropped)."""
    xp = be.xp
    ids = init[0] if isinstance(init, tuple) else init
    ids = xp.asarray(ids)
    n = X.shape[0]
    if ids.ndim != 2 or ids.shape[0] != n:
        raise ValueError(f"init must have shape ({n}, k'), got {tuple(ids.shape)}")
    ids = xp.where((ids >= 0) & (ids < n), ids, -1)
    rows = xp.arange(n, dtype=xp.int64)
    ids = _distinct_valid(xp, ids, rows)
    dd = _row_distances(xp, X, rows, xp.maximum(ids, 0), metric)
    dd = xp.where(ids >= 0, dd, xp.float32(np.inf))
    # ids are sorted ascending per row and the sort is stable: equal distances keep id order
    order = xp.argsort(dd, axis=1, kind="stable") if xp is np else xp.argsort(dd, axis=1)
    ids = xp.take_along_axis(ids, order, axis=1)[:, :K]
    dd = xp.take_along_axis(dd, order, axis=1)[:, :K]
    c = ids.shape[1]
    idx[:, :c] = ids.astype(xp.int32)
    dist[:, :c] = dd


def rsfk_lists(X, K, *, metric, params=None, seed=0, init=None, leaf_order=False):
    """Approximate k-NN lists from a random-sample forest (RSFK) plus nearest-neighbour exploration.

    Parameters
    ----------
    X : ndarray or cupy.ndarray, float32 (n, d), C-contiguous
        Prepared data: numpy runs the CPU twin (Numba), cupy the GPU kernels.
    K : int
        Neighbours per point.
    metric : {"l2", "ip"}
        Internal metric (squared L2, negative inner product).
    params : RSFKParams, optional
    seed : int
        Seed of the pivots, projections and recall sample.
    init : array (n, k') or (indices, distances), optional
        An initial graph merged into the lists before the first tree.
    leaf_order : bool
        Also return ``stats["leaf_order"]``: the points in the leaf order of the first tree (a
        permutation that puts near points at near positions; NN-Descent renumbers by it).

    Returns
    -------
    idx : int32 (n, K)
    dist : float32 (n, K)
        Rows sorted by (distance, id), self excluded, no repeated id; ``-1`` / ``inf`` only where
        fewer than K other points exist.
    stats : dict
        ``trees``, ``leaf_size``, ``leaves`` (per tree: count, min, mean, max size), ``levels`` (per
        tree), ``time_s`` (per phase), ``leaf_update`` (kernel used), ``nne_rounds`` (rounds run
        after a switch, 0 otherwise), ``switch`` (None, or ``after_trees``, ``reason``
        ``"trees_stalled"`` / ``"max_trees"``, ``estimate``, ``projection``), ``stop_reason``
        (``"n_trees"``: a fixed count; ``"target_by_trees"``; ``"target_by_nne"``;
        ``"exact_fallback"``; ``"below_target"``; ``"max_trees"``: below target with the switch
        disabled), and with a target ``recall_per_tree``, ``recall_estimate``, ``target_recall``;
        after a switch ``recall_per_round`` (before the first round, then per round),
        ``nne_stop`` (``"target"``, ``"gain_below_min"``, ``"projected_short"``, ``"max_rounds"``)
        and ``nne_width``; ``exact_fallback`` (``estimate_before``) when the exact graph replaced
        the lists.

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).random((500, 8), dtype=np.float32)
    >>> idx, dist, stats = rsfk_lists(X, 5, metric="l2", params=RSFKParams(n_trees=2))
    >>> idx.shape, stats["trees"]
    ((500, 5), 2)
    """
    params = RSFKParams() if params is None else params
    if not isinstance(params, RSFKParams):
        raise TypeError(f"params must be an RSFKParams, got {type(params).__name__}")
    if metric not in _METRICS:
        raise ValueError(f"metric must be 'l2' or 'ip' (internal), got {metric!r}")
    K = check_int(K, "K", minimum=1)
    if X.ndim != 2:
        raise ValueError(f"X must be 2-d, got shape {tuple(X.shape)}")
    leaf_size = default_leaf_size(K) if params.leaf_size is None else params.leaf_size
    if leaf_size < K + 1:
        raise ValueError(f"leaf_size must be >= K + 1 = {K + 1} (a leaf of leaf_size points gives each "
                         f"point leaf_size - 1 candidates), got leaf_size={leaf_size}")
    if params.nne_width is not None and params.nne_width < K:
        raise ValueError(f"nne_width must be >= K = {K} (the rounds' lists hold the K returned), "
                         f"got nne_width={params.nne_width}")
    be = _backend(X)
    xp = be.xp
    X = xp.ascontiguousarray(X, dtype=xp.float32)
    n = X.shape[0]
    mcode = _METRICS[metric]
    useed = int(seed) & 0xFFFFFFFFFFFFFFFF
    # every child of a split holds >= min_child points: K + 1 gives each point K candidates per tree
    min_child = max(1, min(K + 1, (leaf_size + 1) // 2))
    stats = {"device": be.name, "n": n, "K": K, "leaf_size": leaf_size, "min_child": min_child,
             "split": params.split, "leaves": [], "levels": [], "leaf_update": None,
             "time_s": {"init": 0.0, "trees": 0.0, "leaves": 0.0, "nne": 0.0, "fill": 0.0, "recall": 0.0}}
    T = stats["time_s"]
    t_start = time.perf_counter()
    idx, dist = be.new_lists(n, K)
    if n < 2:
        stats["trees"] = 0
        if leaf_order:
            stats["leaf_order"] = xp.arange(n, dtype=xp.int32)
        stats["time_s"]["total"] = time.perf_counter() - t_start
        return idx, dist, stats
    if init is not None:
        t0 = time.perf_counter()
        _init_lists(be, X, metric, init, K, idx, dist)
        be.sync()
        T["init"] += time.perf_counter() - t0
    inv_norm = be.inv_norms(X) if mcode == 1 else xp.ones(1, xp.float32)
    probe = None
    target = params.target_recall
    if target is None and params.n_trees is None:
        target = DEFAULT_TARGET_RECALL
    if target is not None:
        t0 = time.perf_counter()
        probe = RecallProbe(X, min(K, n - 1), metric, params.recall_sample, seed)
        stats["recall_per_tree"] = []
        T["recall"] += time.perf_counter() - t0
        n_trees = params.max_trees
    else:
        n_trees = params.n_trees if params.n_trees is not None else default_n_trees(n, K, params.nne)
    aim = None if target is None else min(1.0, target + ESTIMATE_MARGIN)
    stats["switch"] = None
    stats["nne_rounds"] = 0
    # the switch to NNE rounds needs a target to aim at and NNE itself
    rounds_allowed = probe is not None and params.nne and params.nne_rounds > 0
    built = 0
    fast = hasattr(be, "_build_trees")  # the CPU twin grows whole trees, several per call
    force_depth = _force_depth(n, min_child)
    batch = be._trees_per_batch(n) if fast else 1
    first_perm = None
    t = 0
    done = False
    # one step per tree (updated after the host reads each tree's leaf sizes) and per NNE round
    bar = progress(total=n_trees + (params.nne_iters if params.nne else 0), desc="RSFK", unit="step")
    while t < n_trees and not done:
        t0 = time.perf_counter()
        count = min(batch, n_trees - t)
        if fast:
            grown = be._build_trees(X, mcode, inv_norm, leaf_size, min_child, params.split, useed, t, count,
                                   force_depth)
        else:
            grown = [build_tree(be, X, mcode, inv_norm, leaf_size, min_child, params.split, useed, t)]
        be.sync()
        T["trees"] += time.perf_counter() - t0
        for perm, a, b, levels in grown:
            t1 = time.perf_counter()
            if fast:  # a = heads (heads[lo] = hi), b = leaf starts
                heads, leaf_lo = a, b
                stats["leaf_update"] = be._leaf_update_heads(X, mcode, perm, heads, leaf_lo, idx, dist, leaf_size)
                sizes = heads[leaf_lo] - leaf_lo
            else:
                leaf_lo, leaf_hi = a, b
                stats["leaf_update"] = be.leaf_update(X, mcode, perm, leaf_lo, leaf_hi, idx, dist,
                                                      params.leaf_update, leaf_size)
                sizes = leaf_hi - leaf_lo
            be.sync()
            t2 = time.perf_counter()
            T["leaves"] += t2 - t1
            if leaf_order and first_perm is None:
                first_perm = perm.copy()
            stats["leaves"].append({"count": int(sizes.shape[0]), "min": int(sizes.min()),
                                    "mean": float(sizes.astype(xp.float64).mean()), "max": int(sizes.max())})
            stats["levels"].append(levels)
            built += 1
            bar.update()
            if probe is not None:
                r = probe.recall(X, idx, nne=params.nne)
                stats["recall_per_tree"].append(r)
                T["recall"] += time.perf_counter() - t2
                logger.debug("rsfk tree %d: recall estimate %.4f", built - 1, r)
                if r >= aim:
                    done = True
                    stats["stop_reason"] = "target_by_trees"
                    break
                if rounds_allowed:
                    stalled, proj = trees_stalled(stats["recall_per_tree"], aim, n_trees)
                    if stalled:
                        stats["switch"] = {"after_trees": built, "reason": "trees_stalled",
                                           "estimate": round(r, 5), "projection": round(proj, 5)}
                        done = True
                        break
        t += count
    stats["trees"] = built
    if probe is not None and not done:
        if rounds_allowed:
            stats["switch"] = {"after_trees": built, "reason": "max_trees",
                               "estimate": round(stats["recall_per_tree"][-1], 5), "projection": None}
        else:
            stats["stop_reason"] = "max_trees"
    if probe is None:
        stats["stop_reason"] = "n_trees"
    rounds = stats["switch"] is not None
    steps = n_trees + (params.nne_iters if params.nne else 0)
    new_total = built + (params.nne_rounds if rounds else (params.nne_iters if params.nne else 0))
    if new_total != steps and bar.total is not None:  # fewer tree steps, or rounds instead of passes
        bar.total = new_total
        bar.refresh()
    if leaf_order:
        stats["leaf_order"] = first_perm if first_perm is not None else xp.arange(n, dtype=xp.int32)
    if rounds:
        t0 = time.perf_counter()
        idx, dist = _nne_rounds(be, X, mcode, idx, dist, K, params, probe, aim, useed, stats, bar)
        be.sync()
        T["nne"] += time.perf_counter() - t0
    elif params.nne:
        t0 = time.perf_counter()
        for _ in range(params.nne_iters):
            be.nne(X, mcode, idx, dist)
            bar.update()
        be.sync()
        T["nne"] += time.perf_counter() - t0
    k_avail = min(K, n - 1)
    holes = int((idx[:, k_avail - 1] < 0).sum())
    stats["filled_rows"] = holes
    if holes:
        t0 = time.perf_counter()
        be.fill(X, mcode, idx, dist)
        be.sync()
        T["fill"] += time.perf_counter() - t0
    if probe is not None:
        t0 = time.perf_counter()
        est = probe.recall(X, idx)
        stats["target_recall"] = target
        T["recall"] += time.perf_counter() - t0
        if est < target - 0.005:
            idx, dist, est = _below_target(be, X, metric, idx, dist, K, params, probe, est, target, stats, T)
        stats["recall_estimate"] = est
    finish(bar)
    bar.close()
    T["total"] = time.perf_counter() - t_start
    logger.debug("rsfk_lists n=%d K=%d: %d trees, %s", n, K, built, {k: round(v, 4) for k, v in T.items()})
    return idx, dist, stats


def _nne_rounds(be, X, mcode, idx, dist, K, params, probe, target, seed, stats, bar):
    """NNE rounds after the switch (see :class:`RSFKParams` Notes): each offers every point the
    neighbours of its neighbours, forward and a fresh random sample of reverse ones, over lists of
    ``nne_width``; returns the first K columns. Records ``recall_per_round``, ``nne_rounds``,
    ``nne_stop`` and ``nne_width``."""
    xp = be.xp
    n = X.shape[0]
    width = min(max(K, 2 * K if params.nne_width is None else params.nne_width), max(K, n - 1))
    stats["nne_width"] = width
    wi, wd = _widen(be, idx, dist, width)
    prev = probe.recall(X, wi)
    stats["recall_per_round"] = [prev]
    prev_gain = 0.0
    stop = "max_rounds"
    for rnd in range(params.nne_rounds):
        rev = _reverse_sample(be, wi, width, seed, rnd + 1)
        be.nne(X, mcode, wi, wd, rev)
        bar.update()
        r = probe.recall(X, wi)
        stats["recall_per_round"].append(r)
        stats["nne_rounds"] = rnd + 1
        logger.debug("rsfk NNE round %d: recall estimate %.4f", rnd + 1, r)
        gain = r - prev
        if r >= target:
            stop = "target"
            break
        if gain < params.nne_min_gain:
            stop = "gain_below_min"
            break
        if rnd >= 1 and _geometric_limit(r, gain, prev_gain) < target - PROJECTION_SLACK:
            stop = "projected_short"
            break
        prev, prev_gain = r, gain
    stats["nne_stop"] = stop
    stats["stop_reason"] = "target_by_nne" if stop == "target" else "below_target"
    if width == K:
        return wi, wd
    return xp.ascontiguousarray(wi[:, :K]), xp.ascontiguousarray(wd[:, :K])


def _below_target(be, X, metric, idx, dist, K, params, probe, est, target, stats, T):
    """Trees and NNE rounds ended below the target: the exact graph when allowed and affordable
    (``stop_reason = "exact_fallback"``), else a warning."""
    from .. import _exact_graph, exact_affordable

    xp = be.xp
    n, d = X.shape
    if params.exact_fallback and K <= n - 1 and exact_affordable(n, d, be.name):
        t0 = time.perf_counter()
        logger.info("rsfk: trees and NNE rounds reached an estimated recall of %.3f (target %.3f); building "
                    "the exact graph instead (%d x %d)", est, target, n, d)
        I, D = _exact_graph(X, K, metric, be.name)
        idx = xp.ascontiguousarray(xp.asarray(I)[:, :K].astype(xp.int32))
        dist = xp.ascontiguousarray(xp.asarray(D)[:, :K].astype(xp.float32))
        stats["exact_fallback"] = {"estimate_before": round(est, 5)}
        stats["stop_reason"] = "exact_fallback"
        est = probe.recall(X, idx)
        T["exact"] = time.perf_counter() - t0
    else:
        why = ("exact_fallback=False" if not params.exact_fallback else
               f"the exact graph of {n} x {d} is past the affordable size")
        logger.warning("rsfk: estimated recall %.3f after %d trees and %d NNE rounds is below the target %.3f "
                       "(%s); use method='nndescent' or 'brute'", est, stats["trees"], stats["nne_rounds"],
                       target, why)
    return idx, dist, est


def rsfk_graph(X, k, *, metric, params=None, seed=0, device=None):
    """The registry's ``task="graph"`` engine contract around :func:`rsfk_lists`:
    ``engine(X, k, *, metric, params, seed, device) -> (idx, dist, stats)``. ``device`` is implied by
    X (numpy: CPU twin, cupy: GPU) and only checked against it."""
    on_gpu = not isinstance(X, np.ndarray)
    if device is not None and device != ("gpu" if on_gpu else "cpu"):
        raise ValueError(f"device={device!r} but X is a {'cupy' if on_gpu else 'numpy'} array")
    return rsfk_lists(X, k, metric=metric, params=params, seed=seed)
