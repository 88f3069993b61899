"""Search calibration (issue "quality on unseen data", item 4): at build the index measures
recall@10 over a beam sweep on **held-out** queries, and ``GraphIndex.search(target_recall=)``
picks the beam from that curve; a default beam that misses 0.95 is raised.

Held out, because a query that is itself an indexed point is far easier than an unseen one: the
walk converges onto the point, whose own links are its nearest neighbours. On uniform 128-d
data (100k, GPU) data-point queries measured 0.978 at beam 16 where unseen queries got 0.31,
so the default beam was never raised. Here a sample of rows plays the part of unseen queries from
the data's own distribution: the walk cannot reach them, and the exact neighbours are taken among
the other points.

The graph walked (CPU builds with RobustPrune in the high-dimensional regime, alpha <=
``_engine.HOLDOUT_MAX_ALPHA``): a second diversification of the candidate lists with the sample
taken out (``holdout_graph``; the connectivity repair's links of the real graph kept), i.e. the
graph the build would have made without those points. Cutting the sample out of the finished
graph instead (their rows and every link into them set to ``-1``, restored after; the rule
elsewhere: GPU, GGNN diversification, alpha > 1) leaves their neighbourhoods without the links
the hidden points had occluded in RobustPrune, and the curve read 0.02-0.07 low at small beams
(uniform 128-d / 256-d / 960-d, 2k-50k points, against a graph really built without the rows or
unseen queries, which the hold-out curve matches within ~0.01). No held-out row seeds the walk
(``_live_entry``). The recall is strict (ties within 1e-6): the suite's ann-benchmarks rule
(1e-3) forgives near-ties, which on concentrated distances is a real difference (uniform
960-d, 50k, beam 2048: 0.991 strict, 0.997 with the 1e-3 rule).
"""

import copy
import time

import numpy as np

from .._core.backend import as_host, get_array_module
from .._core.config import logger
from .._core.params import check_float

__all__ = ["calibrate", "extend", "resume", "beam_for", "first_beam_reaching", "raised_default_beam", "exact_is_faster",
           "holdout_rows", "holdout_graph", "BEAMS", "SAMPLE"]

BEAMS = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
#: Beams tried after BEAMS while the calibrated recall is still below EXTEND_UNTIL: data of high
#: intrinsic dimension keeps gaining past 512 (uniform 128-d, 100k: 0.931 / 0.969 / 0.982 at
#: 256 / 384 / 512; 960-d: 0.838 / 0.910 / 0.947), so a target of 0.95 or 0.99 needs them. A
#: timed (CPU) calibration stops earlier once the default's target is met and the last walk took
#: longer than the exact scan of the same rows (``stopped_at``): a larger beam could only lose to
#: the scan that ``search(target_recall=)`` then uses.
EXTRA_BEAMS = (768, 1024, 1536, 2048)
#: ... and on the GPU these too (a beam of 4096 walks 500 rows in ~0.06 s there): broad 128-d 1M
#: reads 0.986 at 2048 and 0.991 at 4096 with the top tier's graph (H200, `gpu_hard_degree.py`).
#: A GPU build defers these and EXTRA_BEAMS (``defer=True``) once the curve settles the default
#: beam: they only serve ``search(target_recall=)`` above what the curve reached, which measures
#: them on its first call, up to the first that reaches its target (:func:`extend`). On broad
#: 128-d 1M (H200) the calibration took 0.21 s of a 2.14 s build with every beam, 0.044 s with the
#: beams past 768 deferred (build 1.98 s; benchmarks/results/h200-2026-11-29-s22/).
GPU_EXTRA_BEAMS = (3072, 4096)
#: Whether GraphIndex builds pass ``defer=True`` (a switch for benchmarks/build_flag_ab.py --flag defer).
DEFER_AT_BUILD = True
EXTEND_UNTIL = 0.995
SAMPLE = 500
#: The default search must reach this (calibrated) recall, or its beam is raised.
DEFAULT_TARGET = 0.95
#: ... with this margin on the calibrated curve: 500 held-out rows estimate the recall of unseen
#: queries within about 0.01 (skin, 244k x 3 on the H100: calibrated 0.95+ at the default beam,
#: 0.948 measured on the suite's 1,000 queries), so a default that only just reaches the target on
#: the curve is raised too.
DEFAULT_MARGIN = 0.01
#: search(target_recall=) scans exactly when the calibrated walk for the target took more than this
#: many times the calibration's exact search of the same rows: whichever was faster (both meet the
#: target; timing noise only decides between two nearly equal costs). Measured, 2 loaded cores:
#: uniform 960-d 50k, walk at beam 2048 ~4x the scan; broad 100k x 64 at beam 768 ~5x;
#: tight clusters 100k x 64 (float64 exact fallback) at beam 384 1.3x
EXACT_FASTER = 1.0
#: A timed (CPU) sweep stops once two consecutive beams from SATURATED_FROM on read this recall
#: (``saturated_at``): the walk finds every held-out row's neighbours already. The default beam (64)
#: and the denser tier's beams 32 / 64 are always measured.
SATURATED = 1.0
SATURATED_FROM = 64
#: extra exact neighbours computed so that k remain after dropping hidden ones
_SPARE = 32


def _exact_outside(X, rows, hidden, k, metric, pool=None):
    """(kth, ok): exact k-th distance (with a rounding slack) of each row of ``X[rows]`` among the
    points not ``hidden``, and which rows have k such neighbours among the first k + _SPARE.
    ``pool``: the ids searched (the live points of an index with deletes), default all."""
    from ..graph._estimate import _row_distances

    xp = get_array_module(X)
    base = X if pool is None else xp.ascontiguousarray(X[pool])
    kk = min(base.shape[0], k + _SPARE)
    if xp is np:
        from ..exact._cpu import knn_cpu

        _d, ids = knn_cpu(base, np.ascontiguousarray(X[rows]), kk, metric, False)
    else:
        from ..exact._gpu import knn_gpu

        _d, ids = knn_gpu(base, xp.ascontiguousarray(X[rows]), kk, metric, False)
    ids = xp.asarray(ids).astype(xp.int64)
    if pool is not None:
        ids = xp.where(ids >= 0, pool[xp.maximum(ids, 0)], -1)
    keep = ~hidden[xp.maximum(ids, 0)] & (ids >= 0)
    ok = keep.sum(axis=1) >= k
    # the first k kept ids of each row (stable: kept ones first, in rank order)
    order = xp.argsort((~keep).astype(xp.int8), axis=1, kind="stable")[:, :k]
    first = xp.take_along_axis(ids, order, axis=1)
    dist = _row_distances(xp, X, rows, xp.maximum(first, 0), metric)
    kth = dist.max(axis=1)
    return kth + xp.float32(1e-6) * xp.abs(kth), ok


def _recall(X, rows, found, hidden, kth, ok, k, metric):
    """Recall@k of ``found`` ids (hidden ones and -1 ignored; ties by distance count)."""
    from ..graph._estimate import _row_distances

    xp = get_array_module(X)
    found = xp.asarray(found).astype(xp.int64)
    valid = (found >= 0) & ~hidden[xp.maximum(found, 0)]
    dd = _row_distances(xp, X, rows, xp.maximum(found, 0), metric)
    hits = xp.minimum(((dd <= kth[:, None]) & valid).sum(axis=1), k)
    return float(hits[ok].sum()) / float(max(1, int(ok.sum())) * k)


def holdout_rows(n, sample=SAMPLE, live=None):
    """The calibration's held-out rows of an index of ``n`` points (sorted int64, seeded by ``n``
    only), or None when too few to measure. ``live``: bool (n,) of the points not deleted; the
    rows are then drawn among those (a recalibration after deletes)."""
    ids = None if live is None else np.flatnonzero(live)
    m = n if ids is None else ids.size
    s = min(int(sample), m // 50)  # hiding more than 2% of the points biases the curve low (lost bridges)
    if min(10, m - 1) < 1 or s < 20:
        return None
    rs = np.random.default_rng(np.random.SeedSequence([0x5AFE, 0xCA1B]))
    if ids is None:
        return np.sort(rs.choice(n, size=s, replace=False)).astype(np.int64)
    return np.sort(ids[rs.choice(m, size=s, replace=False)]).astype(np.int64)


def holdout_graph(graph, before, without, rows):
    """The graph the calibration walks: ``without`` (diversified from candidate lists with the
    held-out ``rows`` taken out) where the build's ``graph`` equals its pre-repair state
    ``before``, and ``graph``'s own entries where the connectivity repair changed a slot (its
    links between components and to unreachable points stay). No link into ``rows``; their own
    rows are empty. Host arrays, int32."""
    g = np.where(graph != before, graph, without).astype(np.int32)
    hidden = np.zeros(g.shape[0], dtype=bool)
    hidden[rows] = True
    g[(g >= 0) & hidden[np.maximum(g, 0)]] = -1
    g[rows] = -1
    return g


def calibrate(engine, search_params, *, sample=SAMPLE, beams=BEAMS, extra_beams=EXTRA_BEAMS, defer=False, pause=None):
    """``{"k", "beams", "recall", "queries"}`` of ``engine`` (a SearchGraph) on held-out rows, or
    None when it cannot be measured (logged: calibration refines defaults, its failure must not
    cost the index). The walk uses the engine's hold-out graph when the build made one
    (``engine._holdout``, dropped here), else the engine's graph with the rows cut out (modified
    during the sweep and restored exactly). ``extra_beams`` are tried in order only while the
    recall of the last beam is below ``EXTEND_UNTIL`` (hard data; the sweep costs nothing more
    elsewhere). ``defer``: a GPU sweep leaves its beams past ``beams`` for later (``"deferred"`` in
    the result, measured by :func:`extend`) once its curve reaches the default's target.
    ``pause``: ``(beam, below)``: the sweep stops after ``beam`` when its recall is below ``below``
    (``"paused": True`` in the result; the engine keeps its hold-out graph): the caller decides from
    that much whether to build a denser graph, and :func:`resume` measures the rest of the same
    sweep if it keeps this one (the curve is then the one an uninterrupted sweep measures)."""
    return _measure(engine, search_params, sample, tuple(beams), tuple(extra_beams), defer, grow=None, pause=pause)


def resume(engine, search_params, calibration, *, sample=SAMPLE, beams=BEAMS, extra_beams=EXTRA_BEAMS, defer=False):
    """A calibration that :func:`calibrate` paused (``pause=``), measured to its end: the sweep goes
    on from its last beam with the same stopping rules (the same held-out rows; their exact
    neighbours computed again; the first exact timing kept for the rule that compares walks with
    the scan; ``defer`` as the paused call had it). The same dict back when it was not paused."""
    if not calibration or not calibration.get("paused"):
        return calibration
    return _measure(engine, search_params, sample, tuple(beams), tuple(extra_beams), defer, grow=None,
                    start=calibration)


def extend(engine, search_params, calibration, *, target_recall=None, sample=SAMPLE):
    """``calibration`` with its deferred beams (``calibration["deferred"]``) measured on the same
    held-out rows and appended to its curve, in order up to the first whose recall reaches
    ``target_recall`` + 0.005 (all of them without a target; the others stay deferred); the same
    dict back when none are deferred, or without the ``"deferred"`` entry when they cannot be
    measured here (a GPU build's index on the CPU)."""
    deferred = [int(b) for b in calibration.get("deferred", ())]
    if not deferred:
        return calibration
    out = {key: v for key, v in calibration.items() if key != "deferred"}
    if not _deferrable(engine):
        # a GPU build's index moved to the CPU: walks at these beams cost more there than the
        # exact scan that search(target_recall=) falls back to for a target the curve misses
        return out
    until = 2.0 if target_recall is None else min(1.0, float(target_recall) + 0.005)
    # measured on a shallow copy of the engine with its own graph: the sweep cuts the held-out rows
    # out of the graph it walks, and this runs inside a search, where another thread may be
    # searching the same index
    walked = copy.copy(engine)
    walked._graph = engine._graph.copy()
    more = _measure(walked, search_params, sample, tuple(deferred), (), False, grow=until)
    if more is None or more["k"] != calibration["k"]:
        return out
    if more.get("deferred"):
        out["deferred"] = more["deferred"]
    logger.info("GraphIndex: calibration extended to beams %s (recall %s)", more["beams"], more["recall"])
    out["beams"] = list(calibration["beams"]) + list(more["beams"])
    out["recall"] = list(calibration["recall"]) + list(more["recall"])
    return out


def _measure(engine, search_params, sample, beams, extra_beams, defer, grow, pause=None, start=None):
    """The body of :func:`calibrate`, :func:`extend` and :func:`resume`: held-out rows, the graph
    they walk, the sweep (``pause``, ``start``: see :func:`_sweep`)."""
    n = engine.n
    held = getattr(engine, "_holdout", None)
    engine._holdout = None  # used once (kept by a paused sweep); its memory goes with it
    # deleted points (a recalibration after deletes and compaction): never a query, never an answer
    dead = getattr(engine, "deleted", None)
    dead = None if dead is None or not dead.any() else np.asarray(dead, dtype=bool)
    k = min(10, n - 1 - (0 if dead is None else int(dead.sum())))
    rows_h = holdout_rows(n, sample, live=None if dead is None else ~dead)
    if rows_h is None:
        return None
    G = engine._graph
    xp = get_array_module(G)
    if xp is np and not G.flags.writeable:  # a memory-mapped load: the cut below writes to the graph
        engine._graph = G = np.array(G)
    rows = xp.asarray(rows_h)
    hidden = xp.zeros(n, dtype=bool)
    hidden[rows] = True
    pool = None
    if dead is not None:
        hidden[xp.asarray(dead)] = True
        pool = xp.asarray(np.flatnonzero(~dead).astype(np.int64))
    entry = engine._entry
    try:
        engine._entry = _live_entry(entry, G, rows_h)
    except Exception as e:  # a refinement of the calibration: never the cause of a failed build
        logger.warning("GraphIndex: calibration kept the entry points as they are (%s: %s)", type(e).__name__, e)
    try:
        if held is not None and xp is np and np.array_equal(held[0], rows_h) and held[1].shape == G.shape:
            engine._graph = held[1]
            try:
                out = _sweep(engine, search_params, rows, hidden, k, beams, extra_beams, "holdout", pool, defer,
                             grow, pause, start)
            finally:
                engine._graph = G
            if out is not None and out.get("paused"):
                engine._holdout = held  # walked again by resume()
            return out
        restore = cut_rows(G, rows, hidden)
        try:
            return _sweep(engine, search_params, rows, hidden, k, beams, extra_beams, "cut", pool, defer, grow, pause,
                          start)
        finally:
            restore()
    finally:
        engine._entry = entry


def cut_rows(G, rows, hidden):
    """Cut ``rows`` out of the graph ``G`` in place (numpy or cupy): their own lists and every link
    into them (``hidden``: bool (n,), True on ``rows``). Returns the function that restores ``G``
    exactly. Used by the calibration and by host indexes' build check
    (:meth:`knnkit.index.bang.HostIndex.hold_out`)."""
    xp = get_array_module(G)
    saved_rows = G[rows].copy()
    pos = xp.nonzero((G >= 0) & hidden[xp.maximum(G, 0)])
    saved_links = G[pos]
    G[pos] = -1
    G[rows] = -1

    def restore():
        G[rows] = saved_rows
        G[pos] = saved_links

    return restore


def _live_entry(entry, graph, rows):
    """``entry`` with every medoid among the held-out ``rows`` replaced by its first out-neighbour
    that is not held out (the graph's rows start with the nearest kept candidates), so that no
    held-out point seeds the walk. Otherwise a held-out query that is itself a medoid is its own
    seed: found at distance 0, dead (its row is cut), and one of its k result slots lost (100k
    tight clusters of 10 points, 10,272 entries: ~100 of the 500 held-out rows are medoids and the
    curve stayed near 0.97-0.99 where unseen queries got 1.0 at every beam). A hierarchy is left
    as it is."""
    from ._entry import EntryPoints

    if not isinstance(entry, EntryPoints):
        return entry
    med = np.asarray(as_host(entry.medoids))
    hidden = np.zeros(int(graph.shape[0]), dtype=bool)
    hidden[rows] = True
    bad = np.flatnonzero((med >= 0) & hidden[np.maximum(med, 0)])
    if bad.size == 0:
        return entry
    nb = np.asarray(as_host(graph[get_array_module(graph).asarray(med[bad].astype(np.int64))]))
    live = (nb >= 0) & ~hidden[np.maximum(nb, 0)]
    first = np.where(live.any(axis=1), nb[np.arange(bad.size), np.argmax(live, axis=1)], -1)
    new = med.copy()
    new[bad] = first.astype(med.dtype)
    xp = get_array_module(entry.medoids)
    return EntryPoints(entry.centroids, new if xp is np else xp.asarray(new), entry.metric)


def _deferrable(engine):
    """The beams past the ladder that a sweep over ``engine`` may defer (and adds after its
    ``extra_beams``): EXTRA_BEAMS and GPU_EXTRA_BEAMS on the GPU, none on the CPU (whose timed
    sweep stops on its own where walking costs more than the exact scan)."""
    return EXTRA_BEAMS + GPU_EXTRA_BEAMS if engine.device == "gpu" else ()


def _sweep(engine, search_params, rows, hidden, k, beams, extra_beams, how, pool=None, defer=False, grow=None,
           pause=None, start=None):
    """The beam sweep of :func:`calibrate` over the engine's (hold-out or cut) graph; ``pool``: the
    live ids when the index has deleted points; ``grow`` (the deferred beams of :func:`extend`):
    ``beams`` are measured in order until the recall reaches ``grow``, the rest deferred again.
    ``pause``: ``(beam, below)``, stop after ``beam`` if its recall is below ``below``;
    ``start``: a paused sweep's result, continued from its last beam."""
    timed = engine.device == "cpu"  # (a GPU walk would need a synchronisation per beam)
    try:
        t0 = time.perf_counter()
        kth, ok = _exact_outside(engine._X, rows, hidden, k, engine._imetric, pool)
        exact_s = time.perf_counter() - t0
        if int(ok.sum()) < int(rows.shape[0]) // 2:
            return None
        q = engine.data[rows]
        used, curve, secs = [], [], []
        if start is not None:
            if start["k"] != k or start["held_out"] != how or start["queries"] != int(ok.sum()):
                raise RuntimeError("the paused calibration does not match this index")
            used, curve = [int(b) for b in start["beams"]], [float(r) for r in start["recall"]]
            secs = list(start.get("seconds", ()))
            exact_s = float(start.get("exact_seconds", exact_s))
        out_stop = saturated = None
        paused = False
        deferrable = _deferrable(engine) if extra_beams else ()
        extra = tuple(extra_beams) + tuple(b for b in deferrable if b not in extra_beams)
        deferred = []
        for beam in tuple(beams) + extra:
            if beam < k or beam > engine.n or (used and start is not None and beam <= used[-1]):
                continue
            if pause is not None and used and used[-1] >= pause[0] and curve[-1] < pause[1]:
                paused = True  # the caller decides from this much (resume() goes on from here)
                break
            if grow is not None and used and curve[-1] >= grow:
                deferred.append(int(beam))  # extend(): the target is reached, the rest wait
                continue
            if grow is None and used and beam > max(beams) and curve[-1] >= EXTEND_UNTIL:
                continue
            if (defer and beam in deferrable and beam > max(beams)
                    and first_beam_reaching({"beams": used, "recall": curve}, DEFAULT_TARGET + DEFAULT_MARGIN)):
                deferred.append(int(beam))  # the default is settled: larger beams wait for a target
                continue
            if (timed and grow is None and len(used) >= 2 and used[-1] >= SATURATED_FROM
                    and min(curve[-2:]) >= SATURATED):
                # every held-out row found all its neighbours at two beams in a row: a larger beam
                # walks longer for the same curve (siftsmall 10k: beams 192-512 were 0.08 s of a
                # 0.9 s build)
                saturated = int(used[-1])
                break
            if (timed and used and beam > max(beams) and secs[-1] > EXACT_FASTER * exact_s
                    and first_beam_reaching({"beams": used, "recall": curve}, DEFAULT_TARGET + DEFAULT_MARGIN)):
                # the default is settled and walking already costs more than the exact scan, which
                # answers any higher target (search(target_recall=) prefers it): no larger beam
                out_stop = int(used[-1])
                break
            b, tau, iters, seeds = search_params.resolve(k, {"beam": beam, "tau": float("inf")},
                                                         n_entry=len(engine._entry))
            t0 = time.perf_counter()
            _d, i = engine.search(q, k, beam=b, tau=tau, max_iters=iters, n_seeds=seeds, device=engine.device)
            secs.append(round(time.perf_counter() - t0, 4))
            used.append(int(beam))
            curve.append(round(_recall(engine._X, rows, i, hidden, kth, ok, k, engine._imetric), 4))
        out = {"k": k, "beams": used, "recall": curve, "queries": int(ok.sum()), "held_out": how}
        if paused:
            out["paused"] = True
        if deferred:
            out["deferred"] = deferred
        if timed:
            out.update(seconds=secs, exact_seconds=round(exact_s, 4))
            if out_stop is not None:
                out["stopped_at"] = out_stop  # larger beams: slower than the exact scan
            if saturated is not None:
                out["saturated_at"] = saturated  # larger beams: the same recall, SATURATED
        return out
    except Exception as e:
        logger.warning("GraphIndex: calibration failed (%s: %s); search defaults unchanged", type(e).__name__, e)
        return None


def first_beam_reaching(calibration, target_recall):
    """The smallest calibrated beam whose recall reaches ``target_recall`` + 0.005, or None."""
    target = check_float(target_recall, "target_recall", minimum=0.0, maximum=1.0)
    for beam, r in zip(calibration["beams"], calibration["recall"]):
        if r >= min(1.0, target + 0.005):
            return int(beam)
    return None


def exact_is_faster(calibration, beam):
    """True when the calibration timed its walks (CPU) and the walk at ``beam`` took more than
    EXACT_FASTER times the exact search of the same held-out rows: a target reached only at such
    a beam is answered faster by the exact scan (uniform 960-d, 50k, 2 cores: beam 2048 ~30 queries/s
    where the scan gives ~850). False for calibrations without timings (GPU, older indexes)."""
    secs, exact_s = calibration.get("seconds"), calibration.get("exact_seconds")
    if not secs or exact_s is None or int(beam) not in calibration["beams"]:
        return False
    return secs[calibration["beams"].index(int(beam))] > EXACT_FASTER * float(exact_s)


def beam_for(calibration, target_recall):
    """The smallest calibrated beam whose recall reaches ``target_recall`` + 0.005, or the largest."""
    beam = first_beam_reaching(calibration, target_recall)
    return int(calibration["beams"][-1]) if beam is None else beam


def raised_default_beam(calibration, default):
    """A larger default beam when the calibrated recall at ``default`` misses DEFAULT_TARGET (plus
    DEFAULT_MARGIN), else None."""
    at_default = float(np.interp(default, calibration["beams"], calibration["recall"]))
    if at_default >= DEFAULT_TARGET + DEFAULT_MARGIN:
        return None
    better = beam_for(calibration, DEFAULT_TARGET + DEFAULT_MARGIN)
    if better <= default:
        return None
    logger.info("GraphIndex: calibrated recall@%d at the default beam %d is %.3f; default beam raised to %d",
                calibration["k"], default, at_default, better)
    return better
