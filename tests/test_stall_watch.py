"""NN-Descent stops early when its recall, extrapolated, stays far below the target (the exact graph
follows): knnkit.graph._estimate.StallWatch and its use in knn_graph and the index build; and the
verdict given before the descent from the local intrinsic dimension (knnkit.graph.STALL_LID)."""

import math

import numpy as np
import pytest

import knnkit
import knnkit.graph as kgraph
from knnkit.datasets.suite import make_tight_clusters, make_uniform_cube
from knnkit.graph._estimate import RecallProbe, StallWatch


@pytest.fixture
def watch_only(monkeypatch):
    """The descent runs and its watch decides (no verdict before the descent)."""
    monkeypatch.setattr(kgraph, "STALL_LID", math.inf)


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


def test_knn_graph_stops_a_stalled_descent_and_returns_the_exact_graph(watch_only):
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


def test_watch_sees_the_callers_numbering_through_a_reordered_descent(watch_only):
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


def test_index_candidates_stop_early_and_are_exact(monkeypatch, watch_only):
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


# --- the verdict before the descent -------------------------------------------------------------

def _truth_recall(X, idx, k=10):
    _d, truth = knnkit.knn(X, k=k, method="gemm")
    return np.mean([len(set(idx[i, :k]) & set(truth[i])) / k for i in range(0, X.shape[0], 7)])


def test_high_intrinsic_dimension_skips_the_descent():
    X = make_uniform_cube(6000, 160, random_state=5)  # LID ~ 60
    g = knnkit.knn_graph(X, 10, random_state=0)
    extra = g.stats.extra
    st = extra["stalled"]
    assert st["before_descent"] and st["intrinsic_dim"] >= kgraph.STALL_LID and st["iteration"] is None
    assert extra["exact_fallback"]["before_descent"] and g.stats.iterations == 0
    assert extra["recall_estimate"] >= 0.999
    _d, truth = knnkit.knn(X, k=10, method="gemm")
    assert g.recall(truth) >= 0.999


def test_verdict_follows_the_threshold(monkeypatch):
    # the same data with the threshold above its LID: the descent runs (and its watch decides)
    X = make_uniform_cube(6000, 160, random_state=5)
    monkeypatch.setattr(kgraph, "STALL_LID", 500.0)
    g = knnkit.knn_graph(X, 10, random_state=0)
    assert not g.stats.extra.get("stalled", {}).get("before_descent")
    assert g.stats.iterations > 0


def test_low_intrinsic_dimension_runs_the_descent():
    X = make_tight_clusters(6000, 32, 60, random_state=2)
    g = knnkit.knn_graph(X, 10, random_state=0)
    assert "stalled" not in g.stats.extra and g.stats.iterations > 0


def test_measured_intrinsic_dim_is_used_and_a_failed_estimate_keeps_the_watch(monkeypatch):
    from knnkit.graph import _estimate, build_lists, choose_method

    X = make_tight_clusters(6000, 32, 60, random_state=2)  # easy: LID well below the threshold
    method = choose_method("auto", 6000, "cpu", "sqeuclidean")

    def never(*a, **kw):
        raise AssertionError("estimated although the caller measured it")

    monkeypatch.setattr(_estimate, "estimate_intrinsic_dim", never)
    I, _D, st = build_lists(X, 10, metric="sqeuclidean", method=method, seed=0, intrinsic_dim=kgraph.STALL_LID + 1)
    assert st["stalled"]["before_descent"] and st["stalled"]["intrinsic_dim"] == kgraph.STALL_LID + 1
    assert _truth_recall(X, I) == 1.0  # the exact lists, not a placeholder

    def broken(*a, **kw):
        raise RuntimeError("no estimate")

    monkeypatch.setattr(_estimate, "estimate_intrinsic_dim", broken)
    Y = make_uniform_cube(6000, 160, random_state=5)
    I, _D, st = build_lists(Y, 10, metric="sqeuclidean", method=method, seed=0)
    assert not st.get("stalled", {}).get("before_descent") and st["iterations"] > 0
    assert _truth_recall(Y, I) >= 0.999  # the watch (and the exact graph) as before


def test_index_candidates_skip_the_descent_at_high_intrinsic_dimension(monkeypatch):
    from knnkit.index import _build

    X = make_uniform_cube(6000, 160, random_state=6)
    monkeypatch.setattr(_build, "CANDIDATE_EXACT_MAX_WORK", {"cpu": 1e12, "gpu": 1e12})
    monkeypatch.setattr(_build, "INDEX_BRUTE_MAX_N", {"cpu": 1000, "gpu": 1000})  # NN-Descent at this n
    stats = {}
    idx, dist = _build.candidate_graph(X, 24, "l2", random_state=0, stats=stats)
    assert stats["method"] == "brute (NN-Descent stalled)"
    assert idx.shape == (6000, 24) and dist.shape == (6000, 24) and (idx >= 0).all()
    assert _truth_recall(X, idx) >= 0.999


def test_index_build_reports_the_verdict(monkeypatch):
    from knnkit.index import _build

    monkeypatch.setattr(_build, "CANDIDATE_EXACT_MAX_WORK", {"cpu": 1e12, "gpu": 1e12})
    monkeypatch.setattr(_build, "INDEX_BRUTE_MAX_N", {"cpu": 1000, "gpu": 1000})
    X = make_uniform_cube(6000, 160, random_state=7)
    index = knnkit.GraphIndex.build(X, random_state=0)
    cand = index.build_params["candidates"]
    assert cand["method"] == "brute (NN-Descent stalled)"
    _d, truth = knnkit.knn(X, X[:300], k=10, method="gemm")
    _d2, got = index.search(X[:300], 10, beam=128)
    assert np.mean([len(set(got[i]) & set(truth[i])) / 10 for i in range(300)]) >= 0.95


@pytest.mark.gpu
def test_gpu_verdict_graph_and_index_candidates(monkeypatch):
    import cupy as cp

    from knnkit.index import _build

    monkeypatch.setattr(_build, "INDEX_BRUTE_MAX_N", {"cpu": 1000, "gpu": 1000})  # NN-Descent at this n
    monkeypatch.setitem(kgraph.BRUTE_AUTO_MAX_N, "gpu", 1000)  # (knn_graph's "auto" too)
    X = cp.asarray(make_uniform_cube(20000, 160, random_state=8))
    g = knnkit.knn_graph(X, 10, random_state=0)
    assert g.stats.extra["stalled"]["before_descent"] and g.stats.iterations == 0
    _d, truth = knnkit.knn(X, k=10, method="gemm")
    assert g.recall(truth) >= 0.999
    stats = {}
    idx, dist = _build.candidate_graph_gpu(X, 24, "l2", random_state=0, stats=stats)
    assert stats["method"] == "brute (NN-Descent stalled)" and stats["stalled"]["before_descent"]
    assert idx.shape == (20000, 24) and bool((idx >= 0).all())
    truth_h = cp.asnumpy(truth)
    idx_h = cp.asnumpy(idx)
    assert np.mean([len(set(idx_h[i, :10]) & set(truth_h[i])) / 10 for i in range(0, 20000, 37)]) >= 0.99


def test_auto_method_weighs_the_dimension(monkeypatch):
    """``choose_method("auto")`` takes the exact graph up to the size limit and, when the caller
    gives ``d``, only while n * n * d stays under the work limit (public knn_graph passes it)."""
    from knnkit.graph import choose_method

    monkeypatch.setitem(kgraph.BRUTE_AUTO_MAX_N, "cpu", 5000)
    monkeypatch.setitem(kgraph.BRUTE_AUTO_MAX_WORK, "cpu", 4000 * 4000 * 64)
    assert choose_method("auto", 4000, "cpu", "sqeuclidean").name == "brute"             # no d: size only
    assert choose_method("auto", 4000, "cpu", "sqeuclidean", d=64).name == "brute"       # at the limit
    assert choose_method("auto", 4000, "cpu", "sqeuclidean", d=65).name == "nndescent"   # over it
    assert choose_method("auto", 6000, "cpu", "sqeuclidean", d=2).name == "nndescent"    # over the size
    X = np.random.default_rng(0).random((3000, 96), dtype=np.float32)
    assert knnkit.knn_graph(X, 5, device="cpu").stats.method == "brute"
    monkeypatch.setitem(kgraph.BRUTE_AUTO_MAX_WORK, "cpu", 3000 * 3000 * 95)
    g = knnkit.knn_graph(X, 5, device="cpu", random_state=0)
    assert g.stats.method == "nndescent" and g.recall(knnkit.knn(X, k=5, device="cpu")[1]) >= 0.95


# --- the near-exact fallback (GPU lists without a certificate) and its safety net ----------------

def _spoiled_near(monkeypatch, spoil_rows):
    """Let the CPU take the near-exact branch: its lists are the exact ones with the first ``spoil_rows``
    rows' lists replaced by far points (what fp16 rounding gone wrong would look like)."""
    real = kgraph._exact_graph
    calls = []

    def fake(X, k, im, device, near=False):
        calls.append(near)
        I, D = real(X, k, im, device)
        if near:
            I = I.copy()
            I[:spoil_rows] = (np.arange(spoil_rows)[:, None] + 1 + np.arange(k)[None, :] * 997) % X.shape[0]
        return I, D

    monkeypatch.setattr(kgraph, "_near_allowed", lambda device, im, target: target < 1.0)
    monkeypatch.setattr(kgraph, "_exact_graph", fake)
    return calls


@pytest.mark.parametrize("watch", [False, True])
def test_near_exact_lists_kept_when_they_meet_the_target(monkeypatch, watch):
    if watch:
        monkeypatch.setattr(kgraph, "STALL_LID", math.inf)
    X = make_uniform_cube(6000, 160, random_state=5)
    calls = _spoiled_near(monkeypatch, spoil_rows=0)
    g = knnkit.knn_graph(X, 10, random_state=0)
    fb = g.stats.extra["exact_fallback"]
    assert calls == [True] and fb["lists"] == "near_exact" and fb["near_exact_estimate"] == 1.0
    assert fb["before_descent"] if not watch else not fb.get("before_descent")
    assert _truth_recall(X, np.asarray(g.indices)) == 1.0


@pytest.mark.parametrize("watch", [False, True])
def test_near_exact_lists_short_of_the_target_are_replaced(monkeypatch, watch):
    if watch:
        monkeypatch.setattr(kgraph, "STALL_LID", math.inf)
    X = make_uniform_cube(6000, 160, random_state=5)
    calls = _spoiled_near(monkeypatch, spoil_rows=600)  # ~10 % of the rows wrong: recall ~0.90
    g = knnkit.knn_graph(X, 10, random_state=0)
    fb = g.stats.extra["exact_fallback"]
    assert calls == [True, False] and fb["lists"] == "exact"
    assert fb["near_exact_estimate"] < 0.99 <= g.stats.extra["recall_estimate"]
    assert _truth_recall(X, np.asarray(g.indices)) == 1.0


def test_target_one_never_takes_near_exact_lists(monkeypatch):
    X = make_uniform_cube(6000, 160, random_state=5)
    calls = _spoiled_near(monkeypatch, spoil_rows=600)
    g = knnkit.knn_graph(X, 10, random_state=0, target_recall=1.0)
    assert calls == [False] and g.stats.extra["exact_fallback"]["lists"] == "exact"


@pytest.mark.gpu
@pytest.mark.skipif(not knnkit.gpu_available(), reason="needs an NVIDIA GPU and CuPy")
@pytest.mark.parametrize("metric", ["sqeuclidean", "inner_product"])
def test_near_exact_fallback_on_the_gpu(metric):
    import cupy as cp

    X = make_uniform_cube(30_000, 160, random_state=11)  # LID ~ 60: the verdict, then the fallback
    if metric == "inner_product":
        X = X - X.mean(0)
    # (method="auto" would take the exact graph outright at this size)
    g = knnkit.knn_graph(cp.asarray(X), 10, metric=metric, method="nndescent", device="gpu", random_state=0)
    fb = g.stats.extra["exact_fallback"]
    assert fb["lists"] in ("near_exact", "exact")
    if fb["lists"] == "near_exact":
        assert fb["near_exact_estimate"] >= 0.99
    _d, truth = knnkit.knn(X, k=10, metric=metric, method="gemm")
    rec = g.recall(truth)  # ids against ids: ties may cost a little, fp16 swaps no more than 1 %
    assert rec >= 0.99, (rec, fb)
    # the certified graph is exact: switching the near-exact lists off must give ~1.0
    old = kgraph.NEAR_EXACT_EXTRA
    try:
        kgraph.NEAR_EXACT_EXTRA = None
        g2 = knnkit.knn_graph(cp.asarray(X), 10, metric=metric, method="nndescent", device="gpu", random_state=0)
    finally:
        kgraph.NEAR_EXACT_EXTRA = old
    assert g2.stats.extra["exact_fallback"]["lists"] == "exact" and g2.recall(truth) >= 0.999
