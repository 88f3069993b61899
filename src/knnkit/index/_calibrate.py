"""Search calibration (issue "quality on unseen data", item 4): at build the index measures
recall@10 over a beam sweep on **held-out** queries, and ``GraphIndex.search(target_recall=)``
picks the beam from that curve; a default beam that misses 0.95 is raised.

Held out, because a query that is itself an indexed point is far easier than an unseen one: the
walk converges onto the point, whose own links are its nearest neighbours. On uniform 128-d
data (100k, GPU) data-point queries measured 0.978 at beam 16 where unseen queries got 0.31,
so the default beam was never raised. Here a sample of rows is hidden from the graph for the
duration of the sweep (their own rows and every link into them set to ``-1``, restored after):
the walk cannot reach them, the exact neighbours are taken among the other points, and the
sample points play the part of unseen queries from the data's own distribution.
"""

import numpy as np

from .._core.backend import get_array_module
from .._core.config import logger
from .._core.params import check_float

__all__ = ["calibrate", "beam_for", "first_beam_reaching", "raised_default_beam", "BEAMS", "SAMPLE"]

BEAMS = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
#: Beams tried after BEAMS while the calibrated recall is still below EXTEND_UNTIL: data of high
#: intrinsic dimension keeps gaining past 512 (uniform 128-d, 100k: 0.931 / 0.969 / 0.982 at
#: 256 / 384 / 512; 960-d: 0.838 / 0.910 / 0.947), so a target of 0.95 or 0.99 needs them.
EXTRA_BEAMS = (768, 1024, 1536, 2048)
EXTEND_UNTIL = 0.995
SAMPLE = 500
#: The default search must reach this (calibrated) recall, or its beam is raised.
DEFAULT_TARGET = 0.95
#: ... with this margin on the calibrated curve: 500 held-out rows estimate the recall of unseen
#: queries within about 0.01 (skin, 244k x 3 on the H100: calibrated 0.95+ at the default beam,
#: 0.948 measured on the suite's 1,000 queries), so a default that only just reaches the target on
#: the curve is raised too.
DEFAULT_MARGIN = 0.01
#: extra exact neighbours computed so that k remain after dropping hidden ones
_SPARE = 32


def _exact_outside(X, rows, hidden, k, metric):
    """(kth, ok): exact k-th distance (with a rounding slack) of each row of ``X[rows]`` among the
    points not ``hidden``, and which rows have k such neighbours among the first k + _SPARE."""
    from ..graph._estimate import _row_distances

    xp = get_array_module(X)
    kk = min(X.shape[0], k + _SPARE)
    if xp is np:
        from ..exact._cpu import knn_cpu

        _d, ids = knn_cpu(X, np.ascontiguousarray(X[rows]), kk, metric, False)
    else:
        from ..exact._gpu import knn_gpu

        _d, ids = knn_gpu(X, xp.ascontiguousarray(X[rows]), kk, metric, False)
    ids = xp.asarray(ids).astype(xp.int64)
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


def calibrate(engine, search_params, *, sample=SAMPLE, beams=BEAMS, extra_beams=EXTRA_BEAMS):
    """``{"k", "beams", "recall", "queries"}`` of ``engine`` (a SearchGraph) on held-out rows, or
    None when it cannot be measured (logged: calibration refines defaults, its failure must not
    cost the index). The engine's graph is modified during the sweep and restored exactly.
    ``extra_beams`` are tried in order only while the recall of the last beam is below
    ``EXTEND_UNTIL`` (hard data; the sweep costs nothing more elsewhere)."""
    n = engine.n
    k = min(10, n - 1)
    s = min(int(sample), n // 50)  # hiding more than 2% of the points biases the curve low (lost bridges)
    if k < 1 or s < 20:
        return None
    G = engine._graph
    xp = get_array_module(G)
    rs = np.random.default_rng(np.random.SeedSequence([0x5AFE, 0xCA1B]))
    rows_h = np.sort(rs.choice(n, size=s, replace=False)).astype(np.int64)
    rows = xp.asarray(rows_h)
    hidden = xp.zeros(n, dtype=bool)
    hidden[rows] = True
    saved_rows = G[rows].copy()
    into = (G >= 0) & hidden[xp.maximum(G, 0)]
    pos = xp.nonzero(into)
    saved_links = G[pos]
    try:
        G[pos] = -1
        G[rows] = -1
        kth, ok = _exact_outside(engine._X, rows, hidden, k, engine._imetric)
        if int(ok.sum()) < s // 2:
            return None
        q = engine.data[rows]
        used, curve = [], []
        for beam in tuple(beams) + tuple(extra_beams):
            if beam < k or beam > n or (used and beam > max(beams) and curve[-1] >= EXTEND_UNTIL):
                continue
            b, tau, iters, seeds = search_params.resolve(k, {"beam": beam, "tau": float("inf")},
                                                         n_entry=len(engine._entry))
            _d, i = engine.search(q, k, beam=b, tau=tau, max_iters=iters, n_seeds=seeds, device=engine.device)
            used.append(int(beam))
            curve.append(round(_recall(engine._X, rows, i, hidden, kth, ok, k, engine._imetric), 4))
        return {"k": k, "beams": used, "recall": curve, "queries": int(ok.sum())}
    except Exception as e:
        logger.warning("GraphIndex: calibration failed (%s: %s); search defaults unchanged", type(e).__name__, e)
        return None
    finally:
        G[rows] = saved_rows
        G[pos] = saved_links


def first_beam_reaching(calibration, target_recall):
    """The smallest calibrated beam whose recall reaches ``target_recall`` + 0.005, or None."""
    target = check_float(target_recall, "target_recall", minimum=0.0, maximum=1.0)
    for beam, r in zip(calibration["beams"], calibration["recall"]):
        if r >= min(1.0, target + 0.005):
            return int(beam)
    return None


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
