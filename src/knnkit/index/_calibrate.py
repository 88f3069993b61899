"""Search calibration (issue "quality on unseen data", item 4): at build the index measures
recall@10 against exact neighbours over a beam sweep, on 500 sampled data points (each finds itself,
which is not counted). ``GraphIndex.search(target_recall=)`` picks the beam from that curve, and a
default beam that misses 0.95 is raised. Data-point queries search a little easier than held-out
ones on some data (tight clusters: 0.984 held out where the curve said 0.996) and harder on others
(clusters of ten points: the eleventh neighbour lies in another cluster)."""

import numpy as np

from .._core.config import logger
from .._core.params import check_float

__all__ = ["calibrate", "beam_for", "raised_default_beam", "BEAMS", "SAMPLE"]

BEAMS = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
SAMPLE = 500
#: The default search must reach this (calibrated) recall, or its beam is raised.
DEFAULT_TARGET = 0.95


def calibrate(engine, search_params, *, sample=SAMPLE, beams=BEAMS):
    """``{"k", "beams", "recall"}`` of ``engine`` (a SearchGraph), or None when it cannot be
    measured (logged: calibration refines defaults, its failure must not cost the index)."""
    from ..graph._estimate import RecallProbe

    n = engine.n
    k = min(10, n - 1)
    if k < 1:
        return None
    try:
        probe = RecallProbe(engine._X, k, engine._imetric, sample, seed=0)
        q = engine.data[probe.rows]
        used, curve = [], []
        for beam in beams:
            if beam < k + 1:
                continue
            b, tau, iters, seeds = search_params.resolve(k + 1, {"beam": beam, "tau": float("inf")},
                                                         n_entry=len(engine._entry))
            _d, i = engine.search(q, k + 1, beam=b, tau=tau, max_iters=iters, n_seeds=seeds, device=engine.device)
            used.append(int(beam))
            curve.append(round(probe.recall_of(engine._X, i), 4))  # each row's own id is not counted
        return {"k": k, "beams": used, "recall": curve}
    except Exception as e:
        logger.warning("GraphIndex: calibration failed (%s: %s); search defaults unchanged", type(e).__name__, e)
        return None


def beam_for(calibration, target_recall):
    """The smallest calibrated beam whose recall reaches ``target_recall`` + 0.005, or the largest."""
    target = check_float(target_recall, "target_recall", minimum=0.0, maximum=1.0)
    for beam, r in zip(calibration["beams"], calibration["recall"]):
        if r >= min(1.0, target + 0.005):
            return int(beam)
    return int(calibration["beams"][-1])


def raised_default_beam(calibration, default):
    """A larger default beam when the calibrated recall at ``default`` misses DEFAULT_TARGET, else None."""
    at_default = float(np.interp(default, calibration["beams"], calibration["recall"]))
    if at_default >= DEFAULT_TARGET:
        return None
    better = beam_for(calibration, DEFAULT_TARGET)
    if better <= default:
        return None
    logger.info("GraphIndex: calibrated recall@%d at the default beam %d is %.3f; default beam raised to %d",
                calibration["k"], default, at_default, better)
    return better
