"""RSFK on the GPU: each warp-centric leaf-update kernel against exact neighbours and the CPU twin."""

import numpy as np
import pytest

from knnkit.datasets import make_clustered
from knnkit.graph.rsfk import RSFKParams, estimate_recall, rsfk_lists

from test_rsfk import check_lists, true_recall

pytestmark = pytest.mark.gpu

VARIANTS = ["atomic", "tiles", "diagonal"]


def gpu_lists(X, K, metric="l2", **kw):
    import cupy as cp

    seed = kw.pop("seed", 0)
    idx, dist, stats = rsfk_lists(cp.asarray(X), K, metric=metric, params=RSFKParams(**kw), seed=seed)
    return cp.asnumpy(idx), cp.asnumpy(dist), stats


@pytest.fixture(scope="module")
def clustered():
    return np.ascontiguousarray(make_clustered(5000, 40, random_state=3, device="cpu"), dtype=np.float32)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_variant_matches_cpu_recall(clustered, variant, metric):
    X = clustered if metric == "l2" else clustered / np.linalg.norm(clustered, axis=1, keepdims=True)
    X = np.ascontiguousarray(X, dtype=np.float32)
    kw = dict(n_trees=3, nne=True, seed=11)
    gi, gd, gs = gpu_lists(X, 10, metric, leaf_update=variant, **kw)
    check_lists(X, gi, gd, 10, metric)
    assert gs["leaf_update"] == variant
    ci, _cd, _ = rsfk_lists(X, 10, metric=metric, params=RSFKParams(**{k: v for k, v in kw.items() if k != "seed"}),
                            seed=11)
    rg, rc = true_recall(X, gi, 10, metric), true_recall(X, ci, 10, metric)
    # same hash, same pivots: only the rounding of side tests differs between the twins
    assert abs(rg - rc) < 0.02, (rg, rc)
    assert rg >= 0.85


def test_variants_give_the_same_lists(clustered):
    # each variant offers every leaf pair to both lists; the lists keep the top K by (distance, id)
    # whatever the order, and the trees do not depend on the variant
    out = [gpu_lists(clustered, 10, n_trees=2, nne=False, leaf_update=v, seed=5) for v in VARIANTS]
    for gi, gd, _ in out[1:]:
        np.testing.assert_array_equal(gi, out[0][0])
        np.testing.assert_array_equal(gd, out[0][1])


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("d,leaf", [(1, 64), (33, 97), (256, 300)])
def test_variant_dims_and_leaf_sizes(rng, variant, d, leaf):
    X = rng.standard_normal((3000, d)).astype(np.float32)
    gi, gd, gs = gpu_lists(X, 16, n_trees=3, leaf_size=leaf, leaf_update=variant, seed=2)
    check_lists(X, gi, gd, 16)
    assert all(lv["max"] <= leaf for lv in gs["leaves"])


@pytest.mark.parametrize("split", ["sample", "projection"])
def test_split_rules(clustered, split):
    gi, gd, _ = gpu_lists(clustered, 10, split=split, seed=1)
    check_lists(clustered, gi, gd, 10)
    assert true_recall(clustered, gi, 10) >= 0.9


@pytest.mark.parametrize("variant", VARIANTS)
def test_duplicates_and_identical(rng, variant):
    base = rng.standard_normal((40, 6)).astype(np.float32)
    X = np.ascontiguousarray(base[rng.integers(0, 40, 2000)])
    gi, gd, _ = gpu_lists(X, 10, n_trees=3, leaf_update=variant)
    check_lists(X, gi, gd, 10)
    assert true_recall(X, gi, 10) >= 0.99
    Y = np.ones((1000, 5), np.float32)
    gi, gd, gs = gpu_lists(Y, 7, n_trees=2, leaf_update=variant)
    check_lists(Y, gi, gd, 7)
    assert (gd == 0).all()
    assert all(lv["max"] <= gs["leaf_size"] for lv in gs["leaves"])


@pytest.mark.parametrize("n", [1, 2, 11, 12])
def test_tiny_n(rng, n):
    X = rng.standard_normal((n, 3)).astype(np.float32)
    gi, gd, _ = gpu_lists(X, 10)
    check_lists(X, gi, gd, 10)


def test_small_leaves_filled(rng):
    X = rng.standard_normal((500, 4)).astype(np.float32)
    gi, gd, _ = gpu_lists(X, 10, n_trees=1, leaf_size=11, nne=False)
    check_lists(X, gi, gd, 10)


def test_target_recall_and_estimator(clustered):
    import cupy as cp

    gi, gd, gs = gpu_lists(clustered, 10, target_recall=0.95, max_trees=30, seed=3)
    r = true_recall(clustered, gi, 10)
    assert gs["recall_per_tree"][-1] >= 0.95 and r >= 0.94, (r, gs["recall_per_tree"])
    est = estimate_recall(cp.asarray(clustered), cp.asarray(gi), 10, metric="l2", sample=clustered.shape[0])
    assert abs(est - r) < 1e-3, (est, r)


# ---------------------------------------------------------------- the stopping rule (issue 14)

def test_nne_with_reverse_matches_cpu():
    """One NNE pass over lists widened to 2K with a reverse sample: the CUDA kernel (snapshot of W
    columns, -1 skipped) gives the CPU twin's lists (distances up to rounding)."""
    import cupy as cp

    from knnkit.graph.rsfk._cpu import CpuBackend
    from knnkit.graph.rsfk._engine import _reverse_sample, _widen
    from knnkit.graph.rsfk._gpu import GpuBackend
    from knnkit.datasets.suite import make_uniform_cube

    X = np.ascontiguousarray(make_uniform_cube(4000, 32, random_state=5), dtype=np.float32)
    idx, dist, _ = rsfk_lists(X, 10, metric="l2", params=RSFKParams(n_trees=2, nne=False), seed=1)
    cpu, gpu = CpuBackend(), GpuBackend()
    ci, cd = _widen(cpu, idx, dist, 20)
    crev = _reverse_sample(cpu, ci, 20, 7, 1)
    gi, gd = _widen(gpu, cp.asarray(idx), cp.asarray(dist), 20)
    grev = _reverse_sample(gpu, gi, 20, 7, 1)
    # same hash: the same reverse sample on both devices
    assert np.array_equal(np.sort(crev, axis=1), np.sort(cp.asnumpy(grev), axis=1))
    cpu.nne(X, 0, ci, cd, crev)
    gpu.nne(cp.asarray(X), 0, gi, gd, grev)
    gi, gd = cp.asnumpy(gi), cp.asnumpy(gd)
    assert np.mean(gi == ci) > 0.99
    np.testing.assert_allclose(np.sort(gd, axis=1), np.sort(cd, axis=1), rtol=1e-4, atol=1e-5)


def test_uniform_high_d_reaches_target_with_defaults_gpu():
    from knnkit.datasets.suite import make_uniform_cube

    X = np.ascontiguousarray(make_uniform_cube(3000, 128, random_state=11), dtype=np.float32)
    gi, gd, stats = gpu_lists(X, 10, seed=3)
    check_lists(X, gi, gd, 10)
    assert true_recall(X, gi, 10) >= 0.95, stats
    assert stats["switch"] is not None and stats["nne_rounds"] >= 1
    assert stats["stop_reason"] in ("target_by_nne", "exact_fallback")
