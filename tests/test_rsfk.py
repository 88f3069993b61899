"""RSFK (random-sample forest k-NN lists + NNE) on the CPU twin, against exact neighbours."""

import numpy as np
import pytest

from knnkit.datasets import make_clustered
from knnkit.exact._cpu import knn_cpu
from knnkit.graph.rsfk import RSFKParams, estimate_recall, rsfk_lists
from knnkit.graph.rsfk._engine import build_tree
from knnkit.graph.rsfk._cpu import CpuBackend


def exact(X, k, metric="l2"):
    d, i = knn_cpu(X, X, k, metric, True)
    return i, d


def true_recall(X, idx, k, metric="l2"):
    """Tie-aware recall@k over all rows: a listed neighbour counts when its distance is at most the
    exact k-th distance (float64 recomputation), at most k per row."""
    ex_i, _ = exact(X, k, metric)
    X64 = X.astype(np.float64)

    def dist(rows, cols):
        if metric == "l2":
            return ((X64[cols] - X64[rows][:, None]) ** 2).sum(-1)
        return -(X64[cols] * X64[rows][:, None]).sum(-1)

    rows = np.arange(X.shape[0])
    kth = dist(rows, ex_i).max(1)
    ok = (idx[:, :k] >= 0) & (dist(rows, np.maximum(idx[:, :k], 0)) <= kth[:, None] * (1 + 1e-9) + 1e-9)
    return float(np.minimum(ok.sum(1), k).sum()) / (X.shape[0] * k)


def check_lists(X, idx, dist, K, metric="l2"):
    """Self excluded, ids distinct and in range, rows sorted, distances true, -1 only when n - 1 < K."""
    n = X.shape[0]
    assert idx.shape == (n, K) and dist.shape == (n, K)
    assert idx.dtype == np.int32 and dist.dtype == np.float32
    avail = min(K, n - 1)
    assert (idx[:, :avail] >= 0).all(), "holes although enough points exist"
    assert (idx[:, avail:] == -1).all() and np.isinf(dist[:, avail:]).all()
    assert (idx < n).all()
    assert not (idx == np.arange(n)[:, None]).any(), "self in a list"
    for row in idx[:, :avail]:
        assert len(set(row.tolist())) == avail, "repeated id in a row"
    assert (np.diff(dist[:, :avail], axis=1) >= 0).all(), "row not sorted"
    v = idx[:, :avail]
    if metric == "l2":
        ref = ((X[v] - X[:, None]) ** 2).sum(-1)
    else:
        ref = -(X[v] * X[:, None]).sum(-1)
    np.testing.assert_allclose(dist[:, :avail], ref, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def clustered():
    return np.ascontiguousarray(make_clustered(5000, 16, random_state=3, device="cpu"), dtype=np.float32)


def test_defaults_reach_090_on_clustered(clustered):
    idx, dist, stats = rsfk_lists(clustered, 10, metric="l2", seed=1)
    check_lists(clustered, idx, dist, 10)
    r = true_recall(clustered, idx, 10)
    assert r >= 0.90, (r, stats["trees"])
    assert stats["trees"] >= 1 and len(stats["leaves"]) == stats["trees"]
    assert all(lv["max"] <= stats["leaf_size"] and lv["min"] >= stats["min_child"] for lv in stats["leaves"])


def test_more_trees_raise_recall(clustered):
    rs = []
    for t in (1, 3, 8):
        idx, dist, _ = rsfk_lists(clustered, 10, metric="l2", params=RSFKParams(n_trees=t, nne=False), seed=2)
        rs.append(true_recall(clustered, idx, 10))
    assert rs[0] < rs[1] < rs[2], rs
    assert rs[2] >= 0.9, rs


def test_nne_raises_recall(clustered):
    p = RSFKParams(n_trees=3, nne=False)
    a = true_recall(clustered, rsfk_lists(clustered, 10, metric="l2", params=p, seed=4)[0], 10)
    b = true_recall(clustered, rsfk_lists(clustered, 10, metric="l2", params=p.replace(nne=True), seed=4)[0], 10)
    assert b > a + 0.05, (a, b)


@pytest.mark.parametrize("split", ["sample", "projection"])
@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_random_data_both_splits_and_metrics(rng, split, metric):
    X = rng.standard_normal((3000, 12)).astype(np.float32)
    if metric == "ip":
        X /= np.linalg.norm(X, axis=1, keepdims=True)  # cosine
    idx, dist, stats = rsfk_lists(X, 8, metric=metric, params=RSFKParams(n_trees=8, split=split),
                                  seed=int(rng.integers(1 << 30)))
    check_lists(X, idx, dist, 8, metric)
    assert true_recall(X, idx, 8, metric) >= 0.8
    assert stats["split"] == split


def test_target_recall_met_and_estimate_close(rng):
    X = np.ascontiguousarray(make_clustered(3000, 16, random_state=int(rng.integers(1 << 30)), device="cpu"),
                             dtype=np.float32)
    target = 0.93
    idx, dist, stats = rsfk_lists(X, 10, metric="l2", params=RSFKParams(target_recall=target, max_trees=40),
                                  seed=int(rng.integers(1 << 30)))
    r = true_recall(X, idx, 10)
    assert stats["trees"] < 40, stats["recall_per_tree"]
    assert stats["recall_per_tree"][-1] >= target
    assert r >= target - 0.01, (r, stats["recall_per_tree"])
    assert abs(stats["recall_estimate"] - r) <= 0.02, (stats["recall_estimate"], r)
    # the per-tree estimate is the recall after one NNE pass: monotone as trees are added
    assert np.all(np.diff(stats["recall_per_tree"]) >= -1e-9)


def test_estimate_recall_matches_full_recall(clustered):
    idx, dist, _ = rsfk_lists(clustered, 10, metric="l2", params=RSFKParams(n_trees=2, nne=False), seed=5)
    full = true_recall(clustered, idx, 10)
    est = estimate_recall(clustered, idx, 10, metric="l2", sample=clustered.shape[0])
    assert abs(est - full) < 1e-6, (est, full)
    est500 = estimate_recall(clustered, idx, 10, metric="l2", sample=500, seed=1)
    assert abs(est500 - full) < 0.05
    ex_i, _ = exact(clustered, 10)
    assert estimate_recall(clustered, ex_i, 10, metric="l2", sample=500) == 1.0


def test_duplicates_heavy(rng):
    base = rng.standard_normal((40, 6)).astype(np.float32)
    X = np.ascontiguousarray(base[rng.integers(0, 40, 2000)])  # 2000 points, 40 distinct
    idx, dist, stats = rsfk_lists(X, 10, metric="l2", params=RSFKParams(n_trees=3), seed=7)
    check_lists(X, idx, dist, 10)
    assert true_recall(X, idx, 10) >= 0.99  # ~50 copies of each point: all-zero lists are exact
    assert all(lv["max"] <= stats["leaf_size"] for lv in stats["leaves"])


def test_all_points_identical():
    X = np.ones((1000, 5), np.float32)
    idx, dist, stats = rsfk_lists(X, 7, metric="l2", params=RSFKParams(n_trees=2), seed=0)
    check_lists(X, idx, dist, 7)
    assert (dist == 0).all()
    assert all(lv["max"] <= stats["leaf_size"] and lv["min"] >= stats["min_child"] for lv in stats["leaves"])


@pytest.mark.parametrize("split", ["sample", "projection"])
def test_one_dimension(rng, split):
    X = rng.standard_normal((2000, 1)).astype(np.float32)
    idx, dist, _ = rsfk_lists(X, 5, metric="l2", params=RSFKParams(n_trees=4, split=split), seed=1)
    check_lists(X, idx, dist, 5)
    assert true_recall(X, idx, 5) >= 0.95


@pytest.mark.parametrize("n", [1, 2, 5, 11, 12])
def test_tiny_n(rng, n):
    K = 10
    X = rng.standard_normal((n, 3)).astype(np.float32)
    idx, dist, _ = rsfk_lists(X, K, metric="l2", seed=0)
    check_lists(X, idx, dist, K)
    if n > 1:
        assert true_recall(X, idx, min(K, n - 1)) == 1.0  # one leaf holds everything: exact


def test_small_leaves_filled(rng):
    # leaf_size = K + 1 allows children of (K + 2) // 2 points: holes after the trees are filled
    X = rng.standard_normal((500, 4)).astype(np.float32)
    idx, dist, _ = rsfk_lists(X, 10, metric="l2", params=RSFKParams(n_trees=1, leaf_size=11, nne=False), seed=3)
    check_lists(X, idx, dist, 10)


def test_init_lists_merged(clustered):
    ex_i, _ = exact(clustered, 10)
    idx, dist, _ = rsfk_lists(clustered, 10, metric="l2", params=RSFKParams(n_trees=1, nne=False),
                              init=ex_i.astype(np.int64), seed=0)
    check_lists(clustered, idx, dist, 10)
    assert true_recall(clustered, idx, 10) == 1.0


def test_tree_leaves_partition_the_points(rng):
    X = rng.standard_normal((3000, 8)).astype(np.float32)
    for split in ("sample", "projection"):
        perm, lo, hi, levels = build_tree(CpuBackend(), X, 0, np.ones(1, np.float32), 40, 11, split, 9, 0)
        assert sorted(perm.tolist()) == list(range(3000))
        assert lo[0] == 0 and (lo[1:] == hi[:-1]).all() and hi[-1] == 3000
        sizes = hi - lo
        assert sizes.max() <= 40 and sizes.min() >= 11
        assert levels >= int(np.ceil(np.log2(3000 / 40)))


def test_parameter_errors(clustered):
    X = clustered[:100]
    with pytest.raises(ValueError, match="leaf_size"):
        rsfk_lists(X, 10, metric="l2", params=RSFKParams(leaf_size=10))
    with pytest.raises(ValueError, match="n_trees"):
        RSFKParams(n_trees=0)
    with pytest.raises(ValueError, match="split"):
        RSFKParams(split="foo")
    with pytest.raises(ValueError, match="leaf_update"):
        RSFKParams(leaf_update="heap")
    with pytest.raises(TypeError, match="nne"):
        RSFKParams(nne="yes")
    with pytest.raises(ValueError, match="nne_iters"):
        RSFKParams(nne_iters=0)
    with pytest.raises(ValueError, match="target_recall"):
        RSFKParams(target_recall=1.5)
    with pytest.raises(ValueError, match="target_recall"):
        RSFKParams(target_recall=0.0)
    with pytest.raises(ValueError, match="n_trees or target_recall"):
        RSFKParams(n_trees=3, target_recall=0.9)
    with pytest.raises(ValueError, match="max_trees"):
        RSFKParams(max_trees=0)
    with pytest.raises(TypeError, match="n_trees"):
        RSFKParams(n_trees=2.5)
    with pytest.raises(ValueError, match="metric"):
        rsfk_lists(X, 5, metric="cosine")
    with pytest.raises(ValueError, match="K"):
        rsfk_lists(X, 0, metric="l2")


def test_graph_engine_contract(clustered):
    from knnkit.graph.rsfk import rsfk_graph

    idx, dist, stats = rsfk_graph(clustered[:1000], 5, metric="l2", params=RSFKParams(n_trees=2), seed=0, device="cpu")
    check_lists(clustered[:1000], idx, dist, 5)
    with pytest.raises(ValueError, match="device"):
        rsfk_graph(clustered[:100], 5, metric="l2", device="gpu")


# ---------------------------------------------------------------- the stopping rule (issue 14)

def _uniform(n, d, seed):
    from knnkit.datasets.suite import make_uniform_cube

    return np.ascontiguousarray(make_uniform_cube(n, d, random_state=seed), dtype=np.float32)


def test_uniform_high_d_reaches_target_with_defaults():
    # trees alone stall here (HEAD before the rule: 128 trees on uniform 20k x 128 gave 0.77)
    X = _uniform(3000, 128, 11)
    idx, dist, stats = rsfk_lists(X, 10, metric="l2", seed=3)
    check_lists(X, idx, dist, 10)
    assert true_recall(X, idx, 10) >= 0.95, stats
    assert stats["switch"] is not None and stats["switch"]["reason"] == "trees_stalled", stats["switch"]
    assert stats["trees"] == stats["switch"]["after_trees"] < 128
    assert stats["nne_rounds"] >= 1
    assert stats["stop_reason"] in ("target_by_nne", "exact_fallback")
    assert len(stats["recall_per_round"]) == stats["nne_rounds"] + 1


def test_switch_to_nne_rounds_reaches_target():
    X = _uniform(3000, 32, 1)
    idx, dist, stats = rsfk_lists(X, 10, metric="l2", params=RSFKParams(exact_fallback=False), seed=0)
    check_lists(X, idx, dist, 10)
    assert stats["switch"] is not None, stats["recall_per_tree"]
    assert stats["stop_reason"] == "target_by_nne" and stats["nne_stop"] == "target", stats
    assert stats["nne_width"] == 20
    assert stats["recall_per_round"][-1] >= 0.95
    assert true_recall(X, idx, 10) >= 0.94
    # the rounds only improve the lists
    assert np.all(np.diff(stats["recall_per_round"]) >= -1e-9)


def test_no_switch_where_trees_suffice(clustered):
    idx, dist, stats = rsfk_lists(clustered, 10, metric="l2", seed=1)
    assert stats["switch"] is None and stats["nne_rounds"] == 0
    assert stats["stop_reason"] == "target_by_trees"
    # trees stop only once the estimate clears the target by the probe's margin, never at it
    from knnkit.graph.rsfk._engine import DEFAULT_TARGET_RECALL, ESTIMATE_MARGIN

    assert stats["recall_per_tree"][-1] >= DEFAULT_TARGET_RECALL + ESTIMATE_MARGIN
    assert all(r < DEFAULT_TARGET_RECALL + ESTIMATE_MARGIN for r in stats["recall_per_tree"][:-1])
    _, _, fixed = rsfk_lists(clustered, 10, metric="l2", params=RSFKParams(n_trees=2), seed=1)
    assert fixed["stop_reason"] == "n_trees" and fixed["switch"] is None


def test_switch_disabled_keeps_trees(caplog):
    X = _uniform(2000, 128, 2)
    params = RSFKParams(nne_rounds=0, max_trees=12, exact_fallback=False)
    with caplog.at_level("WARNING", logger="knnkit"):
        idx, dist, stats = rsfk_lists(X, 10, metric="l2", params=params, seed=0)
    assert stats["trees"] == 12 and stats["switch"] is None and stats["stop_reason"] == "max_trees"
    assert "below the target" in caplog.text


def test_exact_fallback_recorded():
    X = _uniform(2000, 128, 2)
    params = RSFKParams(nne_rounds=1, max_trees=10)
    idx, dist, stats = rsfk_lists(X, 10, metric="l2", params=params, seed=0)
    assert stats["stop_reason"] == "exact_fallback", stats
    assert stats["exact_fallback"]["estimate_before"] < 0.95
    check_lists(X, idx, dist, 10)
    assert true_recall(X, idx, 10) >= 0.999


def test_trees_stalled_rule():
    from knnkit.graph.rsfk import trees_stalled

    assert trees_stalled([0.1] * 8, 0.95, 128) == (False, None)  # too few trees to judge
    stalled, proj = trees_stalled([0.1] * 9, 0.95, 128)  # no gain at all
    assert stalled and proj <= 0.1 + 1e-9
    steady = [0.05 * t for t in range(1, 10)]  # 0.05 per tree: 0.95 within the trees left
    assert trees_stalled(steady, 0.95, 128)[0] is False
    assert trees_stalled(steady, 0.95, 12)[0] is True  # ... but not within 3 more
    shrinking = [1 - 0.9 * 0.5 ** t for t in range(9)]  # gains halve: limit 1
    assert trees_stalled(shrinking, 0.95, 128)[0] is False


def test_rule_parameter_errors():
    with pytest.raises(ValueError, match="nne_rounds"):
        RSFKParams(nne_rounds=-1)
    with pytest.raises(TypeError, match="nne_rounds"):
        RSFKParams(nne_rounds=1.5)
    with pytest.raises(ValueError, match="nne_width"):
        RSFKParams(nne_width=0)
    with pytest.raises(ValueError, match="nne_min_gain"):
        RSFKParams(nne_min_gain=1.5)
    with pytest.raises(ValueError, match="nne_min_gain"):
        RSFKParams(nne_min_gain=-0.1)
    with pytest.raises(TypeError, match="exact_fallback"):
        RSFKParams(exact_fallback="yes")
    X = _uniform(200, 8, 0)
    with pytest.raises(ValueError, match="nne_width"):
        rsfk_lists(X, 10, metric="l2", params=RSFKParams(nne_width=5))
