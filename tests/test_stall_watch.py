"""NN-Descent stops early when its recall, extrapolated, stays far below the target (the exact graph
follows): knnkit.graph._estimate.StallWatch and its use in knn_graph and the index build."""

import numpy as np
import pytest

import knnkit
from knnkit.datasets.suite import make_tight_clusters, make_uniform_cube
from knnkit.graph._estimate import RecallProbe, StallWatch


class _FixedProbe:
    """A probe whose recall follows a given sequence (the watch only calls recall_of)."""

    def __init__(self, seq):
        self.seq = list(seq)

    def recall_of(self, X, cand):
        return self.seq.pop(0)


def _run(seq, level):
    w = StallWatch(_FixedProbe(seq), None, level)
    for it in range(len(seq)):
        if w(it, None):
            return it, w
    return None, w


def test_watch_stops_a_descent_that_levels_off_far_below():
    it, w = _run([0.20, 0.30, 0.36, 0.39, 0.40], 0.91)
    assert it == 2 and w.stopped[0] == 2 and w.stopped[2] < 0.91


def test_watch_keeps_a_descent_that_still_climbs():
    # gains 0.3, 0.25, 0.2: the extrapolation (ratio 0.8, twice the remainder) passes 0.91
    it, _ = _run([0.2, 0.5, 0.75, 0.95], 0.91)
    assert it is None


def test_watch_needs_three_estimates():
    it, _ = _run([0.1, 0.1], 0.91)
    assert it is None


def test_engine_callback_true_stops_the_descent():
    from knnkit.graph.nndescent._cpu import nndescent

    X = make_uniform_cube(3000, 16, random_state=0)
    seen = []

    def stop_after_one(it, ind, dist):
        seen.append(it)
        return it >= 1

    _i, _d, st = nndescent(X, 16, sample=8, max_iters=30, delta=0.0, metric="l2", callback=stop_after_one)
    assert seen == [0, 1] and st["iterations"] == 2 and st["stopped_by_callback"] == 1


def test_knn_graph_stops_a_stalled_descent_and_returns_the_exact_graph():
    X = make_uniform_cube(6000, 96, random_state=1)
    g = knnkit.knn_graph(X, 10, random_state=0)
    extra = g.stats.extra
    assert "stalled" in extra and extra["stalled"]["predicted"] < extra["stalled"]["level"]
    assert extra["exact_fallback"]["descent_stopped_at_iteration"] == extra["stalled"]["iteration"]
    assert g.stats.iterations == extra["stalled"]["iteration"] + 1
    _d, truth = knnkit.knn(X, k=10, method="gemm")
    assert g.recall(truth) >= 0.999


def test_knn_graph_easy_data_is_not_stopped():
    X = make_tight_clusters(6000, 32, 60, random_state=2)
    g = knnkit.knn_graph(X, 10, random_state=0)
    assert "stalled" not in g.stats.extra and "exact_fallback" not in g.stats.extra
    assert g.stats.extra["recall_estimate"] >= 0.99


def test_watch_sees_the_callers_numbering_through_a_reordered_descent():
    # the CPU forest start reorders the data; the watch's lists must be mapped back: a stopped
    # descent's last estimate equals the probe's estimate of the returned lists (same lists)
    X = make_uniform_cube(6000, 96, random_state=3)
    from knnkit.graph import build_lists, choose_method

    method = choose_method("auto", 6000, "cpu", "sqeuclidean")
    probe = RecallProbe(X, 10, "l2", 500, 7)
    w = StallWatch(probe, X, 0.999)
    params = knnkit.NNDescentParams(target_recall=None).resolve(k=10, n=6000, device="cpu", metric="sqeuclidean")
    I, _D, st = build_lists(X, 10, metric="sqeuclidean", method=method, params=params, seed=0, watch=w)
    assert w.stopped is not None
    assert probe.recall(X, I) == pytest.approx(w.history[-1], abs=0.02)


def test_index_candidates_stop_early_and_are_exact(monkeypatch):
    from knnkit.index import _build

    X = make_uniform_cube(6000, 96, random_state=4)

    calls = []

    def after_the_descent(*a, **kw):  # the estimate after a full descent must not be needed
        calls.append(1)
        return None, False

    monkeypatch.setattr(_build, "_candidates_stalled", after_the_descent)
    monkeypatch.setattr(_build, "CANDIDATE_EXACT_MAX_WORK", {"cpu": 1e12, "gpu": 1e12})
    monkeypatch.setattr(_build, "INDEX_BRUTE_MAX_N", {"cpu": 1000, "gpu": 1000})  # NN-Descent at this n
    idx, _dist = _build.candidate_graph(X, 10, "l2", random_state=0)  # short lists: recall@10 stalls
    _d, truth = knnkit.knn(X, k=10, method="gemm")
    hit = np.mean([len(set(idx[i, :10]) & set(truth[i])) / 10 for i in range(0, 6000, 7)])
    assert hit >= 0.999 and not calls
