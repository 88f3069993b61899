"""GraphIndex build on the GPU: reverse edges on the device (``_reverse_gpu``), prune distances,
``build_graph_gpu`` against the CPU build, recall of the built index, metrics and tiny inputs.

The first test runs on the CPU (numpy): the reverse-candidate step followed by ``prune_cpu`` must
give the edge sets of the CPU ``add_reverse_edges``.
"""

import numpy as np
import pytest

import knnkit
from knnkit.index._build import exact_knn_cpu
from knnkit.index._prune_cpu import add_reverse_edges, pair_distances, prune_cpu
from knnkit.index._reverse_gpu import reverse_candidates

needs_gpu = pytest.mark.skipif(not knnkit.gpu_available(), reason="needs an NVIDIA GPU and CuPy")


def _pruned(n, d, K, R, metric, seed, alpha=1.2):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)).astype(np.float32)
    if metric == "ip":
        X /= np.linalg.norm(X, axis=1, keepdims=True)
    _cd, ci = exact_knn_cpu(X, X, K, metric, exclude_self=True)
    cd = pair_distances(X, ci, metric)
    g = prune_cpu(X, ci, cd, R, alpha, metric)
    return X, g, pair_distances(X, g, metric)


def _same_sets(a, b):
    return np.array([set(x[x >= 0].tolist()) == set(y[y >= 0].tolist()) for x, y in zip(a, b)])


def _recall(found, truth):
    k = truth.shape[1]
    return np.mean([len(set(f[:k].tolist()) & set(t.tolist())) / k for f, t in zip(found, truth)])


@pytest.mark.parametrize("metric,n,d,K,R,cap", [("l2", 1500, 12, 24, 12, 12), ("ip", 1200, 16, 32, 16, 16),
                                                ("l2", 40, 3, 8, 4, 4), ("l2", 4, 2, 3, 2, 1)])
def test_reverse_candidates_numpy_then_prune_equals_cpu_add_reverse_edges(metric, n, d, K, R, cap):
    X, g, gd = _pruned(n, d, K, R, metric, seed=n)
    ref = add_reverse_edges(X, g, R, 1.2, metric)
    ri, rd = reverse_candidates(g, gd, cap)
    # rows: new reverse sources only (not already in the row), nearest first, distances symmetric
    for v in range(0, n, max(1, n // 50)):
        srcs = ri[v][ri[v] >= 0]
        assert not set(srcs.tolist()) & set(g[v].tolist())
        assert all(v in g[u] for u in srcs)
        assert np.all(np.diff(rd[v][: srcs.size]) >= 0)
    got = prune_cpu(X, np.concatenate([g, ri], 1), np.concatenate([gd, rd], 1), R, 1.2, metric)
    # the cap may drop far reverse edges of hubs; RobustPrune drops those anyway in these data
    assert _same_sets(got, ref).mean() >= 0.99


def test_reverse_candidates_rows_and_counts():
    X, g, gd = _pruned(800, 8, 24, 8, "l2", seed=5)
    ri, rd, counts = reverse_candidates(g, gd, 64, return_counts=True)
    n, R = g.shape
    # counts: every edge u -> v whose reverse is new, per target v
    ref = np.zeros(n, np.int64)
    for u in range(n):
        for v in g[u]:
            if v >= 0 and v != u and u not in g[v]:
                ref[v] += 1
    assert np.array_equal(counts, ref)
    rows = np.array([int(np.argmax(counts)), 3, 0, 77])
    ri2, rd2 = reverse_candidates(g, gd, 64, rows=rows)
    assert np.array_equal(ri2, ri[rows]) and np.array_equal(rd2, rd[rows])
    ri3, _ = reverse_candidates(g, gd, 2, rows=rows)  # the nearest 2 of the same lists
    assert np.array_equal(ri3, ri[rows, :2])


def test_reverse_candidates_hub_lists_from_the_same_sort(monkeypatch):
    """The hubs' longer lists (``hubs_cap``) equal a second call with that cap on the hubs, also
    when the targets are sorted in several ranges (memory budget), and are absent when the cap
    does not exceed ``cap`` or no node is a hub."""
    import knnkit.index._reverse_gpu as rg

    X, g, gd = _pruned(900, 8, 24, 8, "l2", seed=6)
    _ri, _rd, counts = reverse_candidates(g, gd, 3, return_counts=True)
    seen = []

    def cap_of(c):
        seen.append(c.copy())
        return 11

    ri, rd, hubs, hi, hd = reverse_candidates(g, gd, 3, hubs_cap=cap_of)
    assert np.array_equal(seen[0], counts)
    assert np.array_equal(hubs, np.nonzero(counts > 3)[0]) and hubs.size > 10
    ref_i, ref_d = reverse_candidates(g, gd, 11, rows=hubs)
    assert np.array_equal(hi, ref_i) and np.array_equal(hd, ref_d)
    assert np.array_equal(ri, _ri) and np.array_equal(rd, _rd)
    monkeypatch.setattr(rg, "get_memory_budget", lambda: 1)  # (numpy: one range anyway)
    assert reverse_candidates(g, gd, 3, hubs_cap=lambda c: 3)[3] is None  # cap not exceeded
    none = reverse_candidates(g, gd, 10 ** 6, hubs_cap=lambda c: 0)
    assert none[2].size == 0 and none[3] is None


# ------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_gpu_reverse_candidates_equal_numpy(metric):
    import cupy as cp

    from knnkit.index._prune_gpu import new_reverse_mask

    _X, g, gd = _pruned(3000, 16, 32, 16, metric, seed=7)
    g[::97, -1] = -1  # holes
    gd[::97, -1] = np.inf
    n, R = g.shape
    mask = cp.asnumpy(new_reverse_mask(cp.asarray(g)))
    u = np.repeat(np.arange(n), R)
    v = g.ravel()
    ref = np.array([vv >= 0 and vv != uu and uu not in g[vv] for uu, vv in zip(u, v)])
    assert np.array_equal(mask, ref)
    ri, rd = reverse_candidates(cp.asarray(g), cp.asarray(gd), 16)
    ri_np, rd_np = reverse_candidates(g, gd, 16)
    assert np.array_equal(cp.asnumpy(ri), ri_np)
    assert np.array_equal(cp.asnumpy(rd), rd_np)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("metric,alpha", [("l2", 1.2), ("ip", 1.0), ("l2", 1.0)])
def test_gpu_add_reverse_edges_matches_cpu(metric, alpha):
    import cupy as cp

    from knnkit.index._prune_gpu import prune_gpu
    from knnkit.index._reverse_gpu import add_reverse_edges_gpu

    X, g, gd = _pruned(4000, 24, 40, 16, metric, seed=11, alpha=alpha)
    ref = add_reverse_edges(X, g, 16, alpha, metric)
    got = cp.asnumpy(add_reverse_edges_gpu(cp.asarray(X), cp.asarray(g), cp.asarray(gd), 16, alpha, metric))
    assert got.shape == ref.shape and got.dtype == np.int32
    assert _same_sets(got, ref).mean() >= 0.98  # float32 near-ties and the reverse cap only
    # the first prune on the GPU gives the distances of the kept edges
    Xd = cp.asarray(X)
    _cd, ci = exact_knn_cpu(X, X, 40, metric, exclude_self=True)
    cd = pair_distances(X, ci, metric)
    g2, gd2 = prune_gpu(Xd, cp.asarray(ci), cp.asarray(cd), 16, alpha, metric, return_distances=True)
    g2, gd2 = cp.asnumpy(g2), cp.asnumpy(gd2)
    np.testing.assert_allclose(gd2, pair_distances(X, g2, metric), rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def clustered():
    X, Q = knnkit.datasets.make_clustered(6000, 24, n_queries=300, random_state=3, device="cpu")
    return X.astype(np.float32), Q.astype(np.float32)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("metric", ["sqeuclidean", "euclidean", "inner_product", "cosine"])
def test_gpu_build_recall_and_cpu_agreement(clustered, metric):
    import cupy as cp

    X, Q = clustered
    truth = knnkit.knn(X, Q, k=10, metric=metric, device="cpu")[1]
    gi = knnkit.GraphIndex.build(cp.asarray(X), metric=metric, graph_degree=16, random_state=0)
    ci = knnkit.GraphIndex.build(X, metric=metric, graph_degree=16, random_state=0, device="cpu")
    assert gi.device == "gpu" and gi.graph.shape == (6000, 16)
    assert set(gi.build_timings) >= {"candidates", "prune", "reverse", "entry_points"}
    g_gpu, g_cpu = cp.asnumpy(gi.graph), np.asarray(ci.graph)
    assert g_gpu.min() >= 0 and g_gpu.max() < 6000
    assert not (g_gpu == np.arange(6000)[:, None]).any()
    # exact candidates on both (n <= knn_graph's brute-force size): the same graph up to near-ties
    assert _same_sets(g_gpu, g_cpu).mean() >= 0.95
    assert abs(gi.nn1_max - ci.nn1_max) <= 1e-3 * max(1.0, ci.nn1_max)
    r = _recall(cp.asnumpy(gi.search(cp.asarray(Q), k=10, beam=64)[1]), truth)
    r_cpu = _recall(ci.search(Q, k=10, beam=64)[1], truth)
    assert r >= 0.93 and r >= r_cpu - 0.02  # same graph as the CPU's: same recall (0.95-0.97 here)


@pytest.mark.gpu
@needs_gpu
def test_gpu_build_nndescent_recall_large():
    import cupy as cp

    # n above knn_graph's GPU brute-force size: the NN-Descent candidates and their distances
    X, Q = knnkit.datasets.make_clustered(120_000, 32, n_queries=500, random_state=5, device="gpu")
    index = knnkit.GraphIndex.build(X, random_state=0)
    truth = cp.asnumpy(knnkit.knn(X, Q, k=10, device="gpu")[1])
    for beam, floor in ((32, 0.93), (64, 0.97)):
        assert _recall(cp.asnumpy(index.search(Q, k=10, beam=beam)[1]), truth) >= floor


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("n", [2, 3, 9, 40])
def test_gpu_build_tiny_and_duplicates(n):
    import cupy as cp

    rng = np.random.default_rng(n)
    X = rng.standard_normal((n, 5)).astype(np.float32)
    X[n // 2] = X[0]  # a duplicate
    index = knnkit.GraphIndex.build(cp.asarray(X), graph_degree=8, random_state=0)
    g = cp.asnumpy(index.graph)
    assert g.shape == (n, 8)
    valid = g[g >= 0]
    assert valid.size and valid.max() < n
    assert not (g == np.arange(n)[:, None]).any()
    # every point reaches itself: a search for each point finds it (or its duplicate) first
    d, i = index.search(cp.asarray(X), k=1, beam=16)
    assert np.allclose(cp.asnumpy(d)[:, 0], 0, atol=1e-5)


@pytest.mark.gpu
@needs_gpu
def test_gpu_reverse_hubs_match_uncapped_cpu_merge():
    """Tight clusters of ~10 points: many nodes get more new reverse edges than R. The hub pass
    offers them up to 8 R (the CPU offers all): the edge sets agree with the CPU merge, and a
    subset prune with node_ids equals the same rows of a whole prune."""
    import cupy as cp

    from knnkit.index._prune_gpu import prune_gpu
    from knnkit.index._reverse_gpu import add_reverse_edges_gpu

    rng = np.random.default_rng(2)
    centres = rng.standard_normal((600, 16)).astype(np.float32)
    X = (centres[rng.integers(0, 600, 6000)] + 0.01 * rng.standard_normal((6000, 16))).astype(np.float32)
    _cd, ci = exact_knn_cpu(X, X, 48, "l2", exclude_self=True)
    cd = pair_distances(X, ci, "l2")
    g = prune_cpu(X, ci, cd, 16, 1.0, "l2")
    gd = pair_distances(X, g, "l2")
    _ri, _rd, counts = reverse_candidates(g, gd, 16, return_counts=True)
    assert (counts > 16).sum() > 0  # the data has hubs
    ref = add_reverse_edges(X, g, 16, 1.0, "l2")
    got = cp.asnumpy(add_reverse_edges_gpu(cp.asarray(X), cp.asarray(g), cp.asarray(gd), 16, 1.0, "l2"))
    assert _same_sets(got, ref).mean() >= 0.98
    hubs = np.flatnonzero(counts > 16)
    assert _same_sets(got[hubs], ref[hubs]).mean() >= 0.95
    full = cp.asnumpy(prune_gpu(cp.asarray(X), cp.asarray(ci), cp.asarray(cd), 16, 1.0, "l2"))
    sub = cp.asnumpy(prune_gpu(cp.asarray(X), cp.asarray(ci[hubs]), cp.asarray(cd[hubs]), 16, 1.0, "l2",
                               node_ids=cp.asarray(hubs)))
    assert np.array_equal(sub, full[hubs])


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("metric", ["sqeuclidean", "inner_product", "cosine"])
@pytest.mark.parametrize("scale", [1.0, 1e4, 1e-4])
def test_brute_graph_on_the_gpu_is_exact(metric, scale):
    """method="brute" on the GPU takes the certified tensor-core GEMM by default: the same graph as
    the CPU's float64-checked exact graph (ids up to ties, distances to float32 rounding), on
    off-centre data of large and small magnitude."""
    import cupy as cp

    rng = np.random.default_rng(31)
    X = ((rng.standard_normal((7001, 48)) + 3.0) * scale).astype(np.float32)
    g = knnkit.knn_graph(cp.asarray(X), 10, metric=metric, method="brute")
    assert g.stats.extra.get("precision") == "fp16_rerank"
    h = knnkit.knn_graph(X, 10, metric=metric, method="brute", device="cpu")
    gi, gd = cp.asnumpy(g.indices), cp.asnumpy(g.distances)
    same = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(gi.tolist(), h.indices.tolist())])
    assert same >= 0.999, same
    np.testing.assert_allclose(gd, h.distances, rtol=2e-5, atol=2e-5 * float(np.abs(h.distances).max()))
    assert (gi >= 0).all() and (gi != np.arange(len(X))[:, None]).all()


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("metric", ["l2", "ip"])
@pytest.mark.parametrize("K,R", [(24, 24), (16, 24), (32, 24)])
def test_gpu_build_skips_the_first_prune_only_when_it_keeps_everything(monkeypatch, metric, K, R):
    """K <= R: the first RobustPrune (with fill) would keep every candidate, so build_graph_gpu
    hands the lists to the reverse-edge stage as they are (``SKIP_PRUNE_WHEN_ALL_KEPT``): the same
    graph as with the prune, also with repeated rows (lists built on the distinct rows) and K < R
    (padded lists); K > R prunes either way."""
    import cupy as cp

    from knnkit.index import _build

    rng = np.random.default_rng(K + R)
    X = rng.standard_normal((3000, 12)).astype(np.float32)
    X[2500:] = X[:500]  # copies
    Xd = cp.asarray(X)
    graphs = {}
    for skip in (False, True):
        monkeypatch.setattr(_build, "SKIP_PRUNE_WHEN_ALL_KEPT", skip)
        t = {}
        g, nn1 = _build.build_graph_gpu(Xd, R, K, metric, alpha=1.0, build_algo="brute", random_state=0, timings=t)
        graphs[skip] = (cp.asnumpy(g), nn1)
    np.testing.assert_array_equal(graphs[True][0], graphs[False][0])
    assert graphs[True][1] == graphs[False][1]
    g = graphs[True][0]
    assert g.shape == (3000, R) and g.max() < 3000
    assert not (g == np.arange(3000)[:, None]).any()


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("R", [1, 5, 32, 37, 128])
def test_gpu_new_reverse_mask_equals_numpy(R):
    """The warp-per-node mask of new reverse edges against the numpy rule, with -1 slots, self
    loops, repeated ids and many mutual edges (small n: rows share most of their ids), R below,
    at and above a warp's 32 lanes."""
    import cupy as cp

    from knnkit.index._prune_gpu import new_reverse_mask
    from knnkit.index._reverse_gpu import _new_reverse_mask_xp

    rng = np.random.default_rng(R)
    for n in (3, 50, 1001):
        g = rng.integers(-1, n, (n, R)).astype(np.int32)
        g[rng.random((n, R)) < 0.05] = -1
        g[: n // 3, 0] = np.arange(n // 3)  # self loops
        want = _new_reverse_mask_xp(g, np)
        got = cp.asnumpy(new_reverse_mask(cp.asarray(g)))
        np.testing.assert_array_equal(got, want)


@pytest.mark.gpu
@needs_gpu
def test_gpu_calibration_defers_its_largest_beams_until_a_target_needs_them(monkeypatch):
    """A GPU build leaves GPU_EXTRA_BEAMS out of its calibration once the default beam is settled
    (``calibration["deferred"]``); the first target the curve misses measures them on the same
    held-out rows, with the recall a full sweep of the same graph reads."""
    import cupy as cp

    from knnkit.index import _calibrate

    monkeypatch.setattr(_calibrate, "EXTEND_UNTIL", 1.01)  # small data reaches 0.995 early: sweep on
    rng = np.random.default_rng(4)
    X = cp.asarray(rng.random((12000, 48), dtype=np.float32))
    index = knnkit.GraphIndex.build(X, random_state=0)
    cal = index.calibration
    past = list(_calibrate.EXTRA_BEAMS + _calibrate.GPU_EXTRA_BEAMS)
    assert cal["deferred"] == past and cal["beams"][-1] == max(_calibrate.BEAMS), cal
    full = _calibrate.calibrate(index._engine, index.search_params)
    assert full["beams"][-len(past):] == past and "deferred" not in full
    grown = _calibrate.extend(index._engine, index.search_params, cal)
    assert grown["beams"] == full["beams"] and "deferred" not in grown
    np.testing.assert_allclose(grown["recall"], full["recall"], atol=0.002)
    # through the index: a target the curve so far misses (the curve capped at 0.9 here) measures the
    # deferred beams up to the first that reaches it
    index.build_params["calibration"] = dict(cal, recall=[min(r, 0.9) for r in cal["recall"]])
    want = dict(zip(full["beams"], full["recall"]))
    first = next(b for b in past if want[b] >= 0.955)
    assert index.reaches(0.95) and index.beam_for(0.95) == first
    now = index.calibration
    assert now["beams"][-1] == first and now["deferred"] == [b for b in past if b > first]
    assert abs(now["recall"][-1] - want[first]) <= 0.002
    monkeypatch.setattr(_calibrate, "DEFER_AT_BUILD", False)
    assert "deferred" not in knnkit.GraphIndex.build(X, random_state=0).calibration
