"""One forest: the CPU RSFK twin's whole-tree path against the level driver, and NN-Descent's forest
starts (init="auto" / "rpforest" / "rsfk") built on it."""

import numpy as np
import pytest

import knnkit
from knnkit.datasets import make_clustered
from knnkit.exact._cpu import knn_cpu
from knnkit.graph.nndescent import CPU_AUTO_INIT, forest_init_params, forest_start
from knnkit.graph.rsfk import RSFKParams, rsfk_lists
from knnkit.graph.rsfk._cpu import CpuBackend
from knnkit.graph.rsfk._engine import _force_depth, build_tree


def recall_at(X, idx, k):
    """Tie-aware recall@k of lists over all rows (float64 distances)."""
    _d, ex = knn_cpu(X, X, k, "l2", True)
    X64 = X.astype(np.float64)
    kth = ((X64[ex] - X64[:, None]) ** 2).sum(-1).max(1)
    got = ((X64[np.maximum(idx[:, :k], 0)] - X64[:, None]) ** 2).sum(-1)
    ok = (idx[:, :k] >= 0) & (got <= kth[:, None] * (1 + 1e-9) + 1e-12)
    return float(np.minimum(ok.sum(1), k).sum()) / (X.shape[0] * k)


@pytest.fixture(scope="module")
def clustered():
    seed = int(np.random.default_rng().integers(1 << 30))
    return np.ascontiguousarray(make_clustered(4000, 24, random_state=seed, device="cpu"), dtype=np.float32)


@pytest.mark.parametrize("split", ["sample", "projection"])
@pytest.mark.parametrize("metric", [0, 1])
def test_whole_trees_equal_level_driver(rng, split, metric):
    """The whole-tree path grows the trees of the level driver: same pivots, rules and leaves."""
    n = int(rng.integers(500, 3000))
    X = rng.standard_normal((n, int(rng.integers(1, 20)))).astype(np.float32)
    X[: n // 10] = X[0]  # duplicates: rejected splits and forced halves
    be = CpuBackend()
    inv = be.inv_norms(X) if metric else np.ones(1, np.float32)
    leaf = int(rng.integers(12, 80))
    mc = int(rng.integers(1, leaf // 2 + 1))
    seed = int(rng.integers(1 << 40))
    grown = be._build_trees(X, metric, inv, leaf, mc, split, seed, 5, 3, _force_depth(n, mc))
    for b, (perm, heads, lo, levels) in enumerate(grown):
        ref_perm, ref_lo, ref_hi, ref_levels = build_tree(be, X, metric, inv, leaf, mc, split, seed, 5 + b)
        np.testing.assert_array_equal(perm, ref_perm)
        np.testing.assert_array_equal(lo, ref_lo)
        np.testing.assert_array_equal(heads[lo], ref_hi)
        assert levels == ref_levels


def test_batches_do_not_change_the_lists(clustered, monkeypatch):
    """Trees are a function of (seed, tree): growing them one or several per call gives the same lists."""
    p = RSFKParams(n_trees=5, nne=True)
    a = rsfk_lists(clustered, 10, metric="l2", params=p, seed=3)
    monkeypatch.setattr(CpuBackend, "_trees_per_batch", lambda self, n: 1)
    b = rsfk_lists(clustered, 10, metric="l2", params=p, seed=3)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def test_forest_start_beats_random_start_at_equal_cost(clustered):
    """The forest's initial lists against random lists that evaluated as many candidates per point."""
    n, K = clustered.shape[0], 16
    Xw, order, I0, D0, _ = forest_start(clustered, K, metric="l2", init="rpforest", seed=1)
    assert sorted(order.tolist()) == list(range(n))
    np.testing.assert_array_equal(Xw, clustered[order])
    fr = recall_at(Xw, I0, 10)
    params = forest_init_params("rpforest", n, K, "cpu")
    _i, _d, st = rsfk_lists(clustered, K, metric="l2", params=params, seed=1)
    per_point = sum(lv["mean"] - 1 for lv in st["leaves"])  # candidates a point met in its leaves
    m = int(np.ceil(per_point))
    rng = np.random.default_rng(2)
    cand = rng.integers(0, n - 1, (n, m))
    cand += cand >= np.arange(n)[:, None]  # no self
    d = ((clustered[cand] - clustered[:, None]) ** 2).sum(-1)
    best = np.take_along_axis(cand, np.argsort(d, axis=1)[:, :K], axis=1)
    rr = recall_at(clustered, best, 10)
    assert fr > rr + 0.2, (fr, rr, m)
    # and the descent that follows still reaches the usual recall
    g = knnkit.knn_graph(clustered, k=10, method="nndescent", device="cpu", random_state=0)
    assert recall_at(clustered, np.asarray(g.indices), 10) >= 0.98


@pytest.mark.parametrize("init", ["auto", "rsfk", "rpforest"])
def test_forest_inits_repeatable_with_random_state(clustered, init):
    X = clustered[:2500]
    a = knnkit.knn_graph(X, k=8, method="nndescent", device="cpu", init=init, random_state=11)
    b = knnkit.knn_graph(X, k=8, method="nndescent", device="cpu", init=init, random_state=11)
    np.testing.assert_array_equal(np.asarray(a.indices), np.asarray(b.indices))
    np.testing.assert_array_equal(np.asarray(a.distances), np.asarray(b.distances))
    assert recall_at(X, np.asarray(a.indices), 8) >= 0.97
    s1 = forest_start(X, 12, metric="l2", init=init, seed=4)
    s2 = forest_start(X, 12, metric="l2", init=init, seed=4)
    s3 = forest_start(X, 12, metric="l2", init=init, seed=5)
    np.testing.assert_array_equal(s1[2], s2[2])
    assert not np.array_equal(s1[2], s3[2])


def test_init_choices_map_to_one_forest():
    assert CPU_AUTO_INIT in ("rpforest", "rsfk", "random")
    assert forest_init_params("random", 10_000, 16, "cpu") is None
    assert forest_init_params("auto", 10_000, 16, "gpu") is None  # the GPU starts from random lists
    assert forest_init_params("rpforest", 10_000, 16, "gpu") is None
    r = forest_init_params("rsfk", 10_000, 16, "gpu")
    assert r == forest_init_params("rsfk", 10_000, 16, "cpu") and r.nne and r.n_trees == 2
    p = forest_init_params("rpforest", 10_000, 16, "cpu")
    assert not p.nne and p.leaf_size >= 16 + 1
    assert forest_init_params("rpforest", 60, 16, "cpu") is None  # n <= 4K: random lists
    assert forest_init_params("rsfk", 17, 16, "cpu") is None  # n <= K + 1


@pytest.mark.parametrize("metric", ["cosine", "inner_product", "manhattan"])
def test_forest_start_other_metrics(rng, metric):
    X = rng.standard_normal((1500, 10)).astype(np.float32)
    g = knnkit.knn_graph(X, k=6, metric=metric, method="nndescent", device="cpu", init="rpforest", random_state=0)
    assert np.asarray(g.indices).shape == (1500, 6)
    assert (np.asarray(g.indices) >= 0).all()
