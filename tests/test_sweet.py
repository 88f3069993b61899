"""Sweet KNN CPU twin: exact agreement with the ground truth on fresh random inputs and edge
cases, every forced branch, and parameter validation.

The ground truth is the full distance matrix computed the way knn_cpu re-computes its winners
(float64 accumulation in coordinate order, rounded to float32), ordered by (distance, index).
knn_cpu itself is compared too, with a tolerance: its candidate selection works on float32
GEMM keys ``||x||^2 - 2 q.x``, whose cancellation can swap neighbours whose distances differ by
less than the key error (seen in 1-D with tiny gaps), so it is not an exact oracle there."""

import numpy as np
import pytest

from knnkit.exact._cpu import knn_cpu
from knnkit.exact.sweet import SweetParams, estimate_savings, sweet_knn
from knnkit.exact.sweet import _cpu as sweet_cpu_module


def assert_same_knn(d, i, d0, i0):
    """Distances equal (both paths compute them the same way); ids equal wherever the distance
    is not tied with a neighbour in the row (ties are ordered by index, so ids agree there too,
    but a tie at the k-th position may legitimately extend past the list)."""
    assert d.shape == d0.shape and i.shape == i0.shape
    assert d.dtype == np.float32 and i.dtype == np.int64
    np.testing.assert_array_equal(np.sort(d, axis=1), np.sort(d0, axis=1))
    np.testing.assert_array_equal(d, d0)
    distinct = np.ones_like(d, dtype=bool)
    distinct[:, 1:] &= d[:, 1:] != d[:, :-1]
    distinct[:, :-1] &= d[:, :-1] != d[:, 1:]
    np.testing.assert_array_equal(i[distinct], i0[distinct])
    # the whole row agrees too: both order ties by smaller index
    np.testing.assert_array_equal(i, i0)


def exact_knn(X, Q, k, exclude_self):
    """Brute-force ground truth: every distance, rows ordered by (float32 distance, index)."""
    X64, Q64 = X.astype(np.float64), Q.astype(np.float64)
    out_d = np.empty((Q.shape[0], k), np.float32)
    out_i = np.empty((Q.shape[0], k), np.int64)
    step = max(1, (1 << 22) // X.shape[0])
    for s in range(0, Q.shape[0], step):
        acc = np.zeros((min(step, Q.shape[0] - s), X.shape[0]))
        for c in range(X.shape[1]):  # coordinate order, as the engines accumulate
            diff = Q64[s:s + step, c, None] - X64[None, :, c]
            acc += diff * diff
        d32 = acc.astype(np.float32)
        if exclude_self:
            d32[np.arange(d32.shape[0]), np.arange(s, s + d32.shape[0])] = np.inf
        cols = np.broadcast_to(np.arange(X.shape[0]), d32.shape)
        order = np.lexsort((cols, d32), axis=1)[:, :k]
        out_d[s:s + step] = np.take_along_axis(d32, order, 1)
        out_i[s:s + step] = order
    return out_d, out_i


def run_both(X, Q, k, params=None, seed=0):
    all_points = Q is None
    Qx = X if all_points else Q
    d, i, stats = sweet_knn(X, Qx, k, metric="l2", exclude_self=all_points, params=params, seed=seed)
    d0, i0 = exact_knn(X, Qx, k, all_points)
    assert_same_knn(d, i, d0, i0)
    # the GEMM path agrees up to its key rounding
    dg, _ = knn_cpu(X, Qx, k, "l2", all_points)
    np.testing.assert_allclose(d, dg, rtol=1e-4, atol=1e-6 * float(np.abs(X).max()) ** 2)
    if all_points:
        assert not (i == np.arange(X.shape[0])[:, None]).any()
    return stats


@pytest.mark.parametrize("dim", [1, 2, 3, 8, 32])
def test_random_all_points(rng, dim):
    X = rng.standard_normal((1500 + int(rng.integers(0, 97)), dim)).astype(np.float32)
    stats = run_both(X, None, int(rng.integers(1, 25)), seed=int(rng.integers(1 << 30)))
    assert 0.0 <= stats["saved_total"] <= 1.0
    assert set(stats["times"]) >= {"clusters", "level1", "level2", "total"}


@pytest.mark.parametrize("dim", [2, 3, 8])
def test_random_separate_queries(rng, dim):
    X = rng.random((2003, dim), dtype=np.float32)
    Q = (rng.random((517, dim), dtype=np.float32) * 1.4 - 0.2)
    run_both(X, Q, 10)


def test_clustered_saves_work(rng):
    centres = rng.standard_normal((20, 3)).astype(np.float32) * 20
    X = (centres[rng.integers(0, 20, 4000)] + rng.standard_normal((4000, 3)).astype(np.float32)).astype(np.float32)
    stats = run_both(X, None, 5)
    # a filter that saves nothing on well separated 3-D clusters would be broken
    assert stats["saved_total"] > 0.8
    assert stats["saved_level1"] > 0.5


def test_heavy_duplicates(rng):
    base = rng.integers(0, 8, (300, 3)).astype(np.float32)
    X = base[rng.integers(0, 300, 2000)]
    for k in (1, 7, 30):
        run_both(X, None, k)
    run_both(X, base[:50] + 0.5, 9)


def test_all_identical_and_single_cluster(rng):
    X = np.full((400, 4), 3.25, np.float32)
    stats = run_both(X, None, 12)
    # identical rows are merged: one distinct row, one distance
    assert stats["distinct_rows"] == 1 and stats["distance_computations"] == 1
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sweet_cpu_module, "_DUP_MIN_COPIES", np.inf)  # merging off
        stats = run_both(X, None, 12)
    # nothing can be pruned when every distance ties: all pairs but the excluded self pairs
    assert stats["distinct_rows"] is None and stats["distance_computations"] == 400 * 399
    run_both(X, X[:10] + 1, 5)
    one = rng.standard_normal((300, 3)).astype(np.float32) * 1e-3 + 5
    run_both(one, None, 8, params=SweetParams(n_landmarks_data=1))
    run_both(one, one[:37] * 1.0001, 8, params=SweetParams(n_landmarks_data=1, n_landmarks_query=1))


@pytest.mark.parametrize("merge", [True, False])
def test_duplicate_merging_forced(rng, monkeypatch, merge):
    """Both sides of the duplicate gate on both kinds of data: merging forced on rows with few
    copies (and many ties at distinct distances, integer grid), and off on rows with many; every
    k-best variant behind it (sorted list, heap, partial filter, split parts)."""
    monkeypatch.setattr(sweet_cpu_module, "_DUP_MIN_COPIES", 0.0 if merge else np.inf)
    few = rng.integers(0, 40, (1500, 3)).astype(np.float32)  # ~2 % repeated rows, many equal distances
    many = rng.integers(0, 6, (200, 3)).astype(np.float32)[rng.integers(0, 200, 1200)]
    for X in (few, many):
        for k, p in ((1, None), (7, None), (31, SweetParams(filter="full")), (40, SweetParams(filter="full")),
                     (40, SweetParams(filter="partial")), (9, SweetParams(parallelism="split")),
                     (9, SweetParams(filter="partial", parallelism="split"))):
            stats = run_both(X, None, k, params=p)
            assert (stats["distinct_rows"] is not None) == merge
            if merge:
                assert stats["distinct_rows"] == np.unique(X, axis=0).shape[0]
    # separate queries never merge
    assert run_both(many, many[:40] + 0.5, 5)["distinct_rows"] is None


def test_duplicate_gate_auto(rng):
    """The sample gate merges heavy duplicates and leaves distinct float rows alone."""
    X = rng.random((3000, 3), dtype=np.float32)
    _, _, s = sweet_knn(X, X, 5, exclude_self=True)
    assert s["distinct_rows"] is None
    Y = X[rng.integers(0, 300, 3000)]
    _, _, s = sweet_knn(Y, Y, 5, exclude_self=True)
    assert s["distinct_rows"] == np.unique(Y, axis=0).shape[0]


@pytest.mark.parametrize("dim", [1, 2, 3])
def test_grid_assignment_is_nearest(rng, dim):
    """The ring search over the landmark grid (d <= 3) and the per-cell candidate lists pick what a full scan picks: the nearest
    landmark by float32 distance, ties to the smaller landmark index; clustered, integer (ties),
    flat-axis and single-value inputs."""
    cases = [rng.standard_normal((3000, dim)).astype(np.float32) * np.float32(10) ** rng.integers(-3, 4),
             rng.integers(0, 5, (2000, dim)).astype(np.float32),
             np.concatenate([rng.random((1000, dim), dtype=np.float32), rng.random((1000, dim), dtype=np.float32) + 50])]
    flat = rng.random((1500, dim), dtype=np.float32)
    flat[:, 0] = 2.5
    cases += [flat, np.full((50, dim), 7.0, np.float32)]
    for P in cases:
        for m in (1, 7, 150):
            L = np.ascontiguousarray(P[np.sort(rng.choice(P.shape[0], size=min(m, P.shape[0]), replace=False))])
            labels = np.empty(P.shape[0], np.int32)
            sweet_cpu_module._assign_grid(P, L, labels)
            d2 = ((P[:, None, :] - L[None, :, :]) ** 2).sum(-1, dtype=np.float32)
            np.testing.assert_array_equal(labels, np.argmin(d2, axis=1))
            # the per-cell candidate lists: same labels, and the exact centre distances
            for cpl in (0.5, 2.0, 8.0):
                lab2 = np.full(P.shape[0], -1, np.int32)
                dist = np.empty(P.shape[0])
                sweet_cpu_module._assign_cells(P, L, lab2, dist, cpl)
                np.testing.assert_array_equal(lab2, labels)
                want = np.empty(P.shape[0])
                sweet_cpu_module._point_centre_dist(P, L, labels, want)
                np.testing.assert_array_equal(dist, want)


def test_k_equals_n_minus_1_and_k1(rng):
    X = rng.standard_normal((211, 3)).astype(np.float32)
    run_both(X, None, 210)
    run_both(X, None, 1)
    run_both(X, X[:13] + 0.01, 211)


def test_queries_far_outside(rng):
    X = rng.random((1777, 3), dtype=np.float32)
    Q = rng.random((99, 3), dtype=np.float32) + np.float32(1000)
    run_both(X, Q, 6)
    run_both(X, -Q, 1)


def test_forced_branches(rng):
    X = rng.standard_normal((2500, 4)).astype(np.float32)
    Q = rng.standard_normal((31, 4)).astype(np.float32)
    seen = set()
    for filt in ("full", "partial"):
        for par in ("query", "split"):
            p = SweetParams(filter=filt, parallelism=par)
            s = run_both(X, None, 9, params=p)
            s2 = run_both(X, Q, 40, params=p)
            assert s["filter"] == filt and s2["filter"] == filt
            assert s["parallelism"] == par and (s["parts"] > 1) == (par == "split")
            seen.add((s2["filter"], s2["parallelism"]))
    assert len(seen) == 4


def test_auto_choices():
    X = np.random.default_rng(3).random((600, 2), dtype=np.float32)
    _, _, s = sweet_knn(X, X, 40, exclude_self=True)  # k/d = 20: full by default (measured faster)
    assert s["filter"] == "full"
    _, _, s = sweet_knn(X, X, 40, exclude_self=True, params=SweetParams(partial_ratio=8.0))  # the paper's rule
    assert s["filter"] == "partial"
    _, _, s = sweet_knn(X, X, 4, exclude_self=True, params=SweetParams(partial_ratio=8.0))
    assert s["filter"] == "full"
    assert s["n_landmarks_data"] == int(np.ceil(3 * np.sqrt(600)))


def test_estimate_savings(rng):
    centres = rng.standard_normal((30, 3)).astype(np.float32) * 30
    X = (centres[rng.integers(0, 30, 5000)] + rng.standard_normal((5000, 3)).astype(np.float32)).astype(np.float32)
    est = estimate_savings(X, None, 10, sample=300)
    _, _, stats = sweet_knn(X, X, 10, exclude_self=True)
    assert 0.0 <= est <= 1.0
    assert abs(est - stats["saved_total"]) < 0.05
    # uniform data in 32-D: filtering saves far less than on 3-D clusters
    Y = rng.random((3000, 32), dtype=np.float32)
    assert estimate_savings(Y, None, 10, sample=200) < est


def test_estimate_savings_stops_after_level1(rng):
    """With ``need``, the estimate returns level 1's exact fraction (all queries) when it already
    reaches ``need``; it is a lower bound of the full estimate. Below ``need`` it runs the sample."""
    from knnkit.exact.sweet._cpu import sweet_cpu

    centres = rng.standard_normal((40, 3)).astype(np.float32) * 40
    X = (centres[rng.integers(0, 40, 6000)] + rng.standard_normal((6000, 3)).astype(np.float32) * 0.5).astype(np.float32)
    full = estimate_savings(X, None, 10, sample=300)
    sel = np.arange(0, 6000, 20)
    d, i, st = sweet_cpu(X, X, 10, SweetParams(), 0, True, qsel=sel, enough=0.5)
    assert d is None and i is None and st["early"] and st["saved_level1"] >= 0.5
    early = estimate_savings(X, None, 10, sample=300, need=0.5)
    assert early == pytest.approx(st["saved_level1"]) and 0.5 <= early <= full + 1e-9
    # a need above level 1's fraction runs the sampled level 2: the same value as without need
    assert estimate_savings(X, None, 10, sample=300, need=0.999999) == pytest.approx(full)
    # a floor above level 1's fraction gives up after level 1 (auto above 16-D); below it, samples
    d, i, st = sweet_cpu(X, X, 10, SweetParams(), 0, True, qsel=sel, hopeless=1.0)
    assert d is None and st["early"] and st["saved_total"] == pytest.approx(st["saved_level1"])
    assert estimate_savings(X, None, 10, sample=300, need=0.999999, floor=1e-9) == pytest.approx(full)
    Y = rng.random((3000, 32), dtype=np.float32)  # uniform 32-D: level 1 saves (nearly) nothing
    from knnkit.exact.sweet import level1_floor

    floor = level1_floor(Y, "gpu")  # (the GPU's rule, run here on the CPU twin; the CPU has none)
    assert 0 < floor < 0.5 and level1_floor(X, "gpu") is None and level1_floor(Y, "cpu") is None
    assert estimate_savings(Y, None, 10, sample=200, need=0.98, floor=floor) < floor


def test_validation():
    X = np.zeros((10, 2), np.float32)
    with pytest.raises(ValueError, match="n_landmarks_data"):
        SweetParams(n_landmarks_data=0)
    with pytest.raises(ValueError, match="n_landmarks_query"):
        SweetParams(n_landmarks_query=0)
    with pytest.raises(ValueError, match="filter"):
        SweetParams(filter="foo")
    with pytest.raises(ValueError, match="parallelism"):
        SweetParams(parallelism="warp")
    with pytest.raises(TypeError, match="landmark_trials"):
        SweetParams(landmark_trials=2.5)
    with pytest.raises(ValueError, match="partial_ratio"):
        SweetParams(partial_ratio=-1)
    with pytest.raises(ValueError, match="inner product"):
        sweet_knn(X, X, 1, metric="ip")
    with pytest.raises(ValueError, match="k must be"):
        sweet_knn(X, X, 10, metric="l2", exclude_self=True)
    with pytest.raises(TypeError, match="SweetParams"):
        sweet_knn(X, X, 1, params={"filter": "full"})
    with pytest.raises(TypeError):
        SweetParams(1)  # keyword-only


def test_public_cosine_through_normalisation(rng):
    """method="sweet" with metric="cosine" runs on unit rows (squared Euclidean ranks as cosine
    there) and returns cosine distances equal to the GEMM path's; inner product is refused."""
    import knnkit

    X = (rng.standard_normal((1500, 3)) + 2.0).astype(np.float32)
    Q = (rng.standard_normal((200, 3)) + 2.0).astype(np.float32)
    ds, is_ = knnkit.knn(X, Q, k=7, metric="cosine", method="sweet")
    dg, ig = knnkit.knn(X, Q, k=7, metric="cosine", method="gemm")
    np.testing.assert_allclose(ds, dg, atol=2e-6)
    # ties aside, the same neighbours: compare the exact cosine distances of the returned ids
    Xn = X / np.linalg.norm(X, axis=1, keepdims=True)
    Qn = Q / np.linalg.norm(Q, axis=1, keepdims=True)
    cos_s = 1 - np.einsum("qd,qkd->qk", Qn, Xn[is_])
    np.testing.assert_allclose(cos_s, dg, atol=2e-6)
    assert (np.diff(ds, axis=1) >= 0).all()
    _d, iself = knnkit.knn(X, k=5, metric="cosine", method="sweet")
    assert not (iself == np.arange(X.shape[0])[:, None]).any()
    with pytest.raises(ValueError, match="inner_product|metric"):
        knnkit.knn(X, Q, k=5, metric="inner_product", method="sweet")


@pytest.mark.parametrize("mode", ["seeded_all_k", "no_seeds", "off"])
def test_seeded_and_straight_level2_forced(rng, monkeypatch, mode):
    """Level 2's straight band scan and the lists seeded from the previous query (d <= 3, one
    worker per query, sorted lists): seeds forced for every k (k = 1 included), straight scans
    without seeds, and both off; tiny blocks so many queries start unseeded. Integer grid data
    without merging: seeds met again in the scan tie exactly and must not enter twice, and ties
    at the k-th distance must still go to the smaller index."""
    monkeypatch.setattr(sweet_cpu_module, "_DUP_MIN_COPIES", np.inf)
    monkeypatch.setattr(sweet_cpu_module, "_SEED_BLOCK", 3)
    if mode == "seeded_all_k":
        monkeypatch.setattr(sweet_cpu_module, "_SEED_MIN_K", 1)
    elif mode == "no_seeds":
        monkeypatch.setattr(sweet_cpu_module, "_SEED_MIN_K", 10 ** 9)
    else:
        monkeypatch.setattr(sweet_cpu_module, "_SEED_MAX_DIM", 0)
    for dim in (1, 2, 3):
        grid = rng.integers(0, 12, (1300, dim)).astype(np.float32)
        smooth = rng.standard_normal((1300, dim)).astype(np.float32)
        for X in (grid, smooth):
            for k in (1, 8, 20, 32):
                run_both(X, None, k)
            run_both(X, X[:200] + 0.5, 8)


@pytest.mark.parametrize("seeds", [True, False])
def test_seeded_level2_on_merged_rows(rng, monkeypatch, seeds):
    """Seeds and straight bands on rows merged as copies (lists of original indices): every copy
    offered once (a seed met again as a copy is skipped, the copies after it still offered), ties
    by the smaller index; forced for every k, tiny blocks; and off. Exact against the GEMM path."""
    monkeypatch.setattr(sweet_cpu_module, "_DUP_MIN_COPIES", 0.0)  # merging forced
    monkeypatch.setattr(sweet_cpu_module, "_SEED_BLOCK", 3)
    monkeypatch.setattr(sweet_cpu_module, "_SEED_MERGED", seeds)
    monkeypatch.setattr(sweet_cpu_module, "_SEED_MERGED_MIN_K", 1)
    monkeypatch.setattr(sweet_cpu_module, "_SEED_MIN_K", 1)
    few = rng.integers(0, 40, (1500, 3)).astype(np.float32)
    many = rng.integers(0, 6, (200, 3)).astype(np.float32)[rng.integers(0, 200, 1200)]
    flat = rng.integers(0, 9, (900, 2)).astype(np.float32)
    for X in (few, many, flat):
        for k in (1, 8, 20, 100):
            stats = run_both(X, None, k, params=SweetParams(parallelism="query"))
            assert stats["distinct_rows"] is not None


def test_equal_row_counts_match_unique(rng, monkeypatch):
    """The hash-run counting of ``mean_copies`` equals ``np.unique`` of the rows, also when the
    hash collides (then it falls back to ``np.unique``)."""
    from knnkit.exact.sweet import _plan

    for _ in range(50):
        d = int(rng.integers(1, 7))
        R = rng.integers(0, 3, (int(rng.integers(1, 400)), d)).astype(np.uint32)
        _, want = np.unique(R.view(np.dtype((np.void, 4 * d))).ravel(), return_counts=True)
        assert sorted(_plan._equal_row_counts(R)) == sorted(want)
    R = np.array([[1, 2], [3, 4], [1, 2], [3, 4], [5, 6]], np.uint32)
    # every hash equal: unequal rows share a run, which must be detected
    monkeypatch.setattr(_plan, "_hash_rows", lambda rows: np.zeros(rows.shape[0], np.uint64))
    assert sorted(_plan._equal_row_counts(R)) == [1, 2, 2]


@pytest.mark.parametrize("stratified", [True, False])
def test_stratified_landmarks_forced(rng, monkeypatch, stratified):
    """Landmarks spread along a Morton curve (the CPU's choice for d <= 3) or the paper's sampling
    (forced off): exact results either way, for all-points and separate queries, d = 1..3, with
    repeated rows, and the landmark picks are distinct (also when every row is one)."""
    if not stratified:
        monkeypatch.setattr(sweet_cpu_module, "_STRAT_MAX_DIM", 0)
    for dim in (1, 2, 3):
        X = rng.standard_normal((1500, dim)).astype(np.float32)
        Xg = rng.integers(0, 6, (900, dim)).astype(np.float32)
        for k in (1, 5):
            run_both(X, None, k)
            run_both(Xg, None, k)
            run_both(X, Xg[:150], k)
    for count in (1, 7, 100, 400):
        ids = sweet_cpu_module._stratified_landmarks(X[:400], count, np.random.default_rng(count))
        assert ids.size == count and np.unique(ids).size == count and ids.min() >= 0 and ids.max() < 400
    c = sweet_cpu_module._Clusters(X, 40, 3, np.random.default_rng(0), stratified)
    assert np.unique(c.landmark_ids).size == 40


@pytest.mark.parametrize("one,octants", [(True, True), (True, False), (False, True)])
def test_k1_path_forced(rng, monkeypatch, one, octants):
    """k = 1 through ``_level2_one`` (d <= 3, one worker per query, rows not merged), over each
    cluster's octants (``_level2_one(octants=True)``) or the whole shell, or forced through the general
    level 2: exact either way, ties (integer grid) by the smaller index, all-points and separate
    queries, queries far away; the path is not taken with merged copies, in 8-D or when split."""
    monkeypatch.setattr(sweet_cpu_module, "_ONE_PATH", one)
    monkeypatch.setattr(sweet_cpu_module, "_ONE_OCTANTS", octants)
    monkeypatch.setattr(sweet_cpu_module, "_DUP_MIN_COPIES", np.inf)
    for dim in (1, 2, 3):
        grid = rng.integers(0, 10, (1400, dim)).astype(np.float32)
        smooth = rng.standard_normal((1400, dim)).astype(np.float32)
        for X in (grid, smooth):
            s = run_both(X, None, 1)
            assert s["distance_computations"] > 0
            run_both(X, X[:100] + 0.5, 1)
            run_both(X, X[:50] + 100.0, 1)
    X = rng.standard_normal((900, 3)).astype(np.float32)
    run_both(X, None, 1, params=SweetParams(parallelism="split"))
    run_both(X, X[:60] * 0.5, 1, params=SweetParams(filter="partial"))


@pytest.mark.parametrize("cells", [True, False])
def test_cell_assignment_forced(rng, monkeypatch, cells):
    """The engine with the per-cell candidate lists (``_assign_cells``, d <= 3) or forced back to the
    per-point ring search plus ``_point_centre_dist``: exact either way."""
    monkeypatch.setattr(sweet_cpu_module, "_CELL_ASSIGN", cells)
    for dim in (1, 2, 3):
        X = np.concatenate([rng.standard_normal((1200, dim)), rng.standard_normal((5, dim)) * 50]).astype(np.float32)
        run_both(X, None, 1)
        run_both(X, None, 7)
        run_both(X, X[:80] + 0.25, 3)


def test_auto_method_low_d_skips_the_estimate(monkeypatch):
    """method="auto": up to SWEET_AUTO_ALWAYS_D dimensions Sweet KNN is taken without the
    savings estimate (which costs a second clusters phase); above it the estimate decides."""
    from knnkit._core.prepare import prepare
    from knnkit.api import exact as api_exact
    import knnkit.exact.sweet as sweet_pkg

    calls = []

    def fake_estimate(*a, **kw):
        calls.append(1)
        return 0.0  # "saves nothing": the GEMM path

    monkeypatch.setattr(sweet_pkg, "estimate_savings", fake_estimate)
    rng = np.random.default_rng(1)
    n = 20_000  # 4e8 pairs all-points: above the CPU threshold
    P3 = prepare(rng.random((n, 3), dtype=np.float32), metric="sqeuclidean", device="cpu")
    assert api_exact.choose_exact_method("auto", P3, None, 10).name == "sweet" and not calls
    P8 = prepare(rng.random((n, 8), dtype=np.float32), metric="sqeuclidean", device="cpu")
    assert api_exact.choose_exact_method("auto", P8, None, 10).name == "sweet" and not calls
    P12 = prepare(rng.random((n, 12), dtype=np.float32), metric="sqeuclidean", device="cpu")
    assert api_exact.choose_exact_method("auto", P12, None, 10).name == "gemm" and calls
    small = prepare(rng.random((500, 3), dtype=np.float32), metric="sqeuclidean", device="cpu")
    assert api_exact.choose_exact_method("auto", small, None, 10).name == "gemm"  # too few pairs


def test_auto_method_thresholds_by_dimension(monkeypatch):
    """Above SWEET_AUTO_ALWAYS_D the estimated savings decide, up to SWEET_AUTO_MAX_D (64) and with
    the GPU asking more above 16-D (a computed distance costs more there than a GEMM pair):
    clustered 32-D / 64-D (99 % saved) takes Sweet KNN, 99 % at 24-D on the GPU too, 97 % at
    24-D only on the CPU; beyond 64-D the GEMM path without an estimate."""
    import knnkit.exact.sweet as sweet_pkg
    from knnkit.exact.sweet import sweet_pays

    saved = [0.0]
    calls = []

    def fake_estimate(*a, **kw):
        calls.append(1)
        return saved[0]

    monkeypatch.setattr(sweet_pkg, "estimate_savings", fake_estimate)
    X = {d: np.zeros((40_000, d), np.float32) for d in (12, 24, 64, 65)}
    for device in ("cpu", "gpu"):
        saved[0] = 0.99
        assert sweet_pays(X[64], None, 10, device=device) and sweet_pays(X[24], None, 10, device=device)
        saved[0] = 0.97
        assert sweet_pays(X[12], None, 10, device=device)
        assert sweet_pays(X[24], None, 10, device=device) == (device == "cpu")
        saved[0] = 0.5
        assert not sweet_pays(X[12], None, 10, device=device)
        calls.clear()
        saved[0] = 1.0
        assert not sweet_pays(X[65], None, 10, device=device) and not calls


def test_auto_filter_full_when_rows_are_merged(rng):
    """filter="auto" keeps the full filter when repeated rows are merged (the partial filter writes
    every surviving copy out: skin k = 100, 138M vs 17M distances), even under the paper's
    k / d rule, which without copies picks partial. Same ids either way."""
    X = rng.integers(0, 12, (6000, 3)).astype(np.float32)  # 1,728 distinct rows, ~3.5 copies each
    d, i, s = sweet_knn(X, X, 40, exclude_self=True, params=SweetParams(partial_ratio=8.0))
    assert s["distinct_rows"] is not None and s["filter"] == "full"
    dp, ip, sp = sweet_knn(X, X, 40, exclude_self=True, params=SweetParams(filter="partial"))
    assert sp["filter"] == "partial"
    np.testing.assert_array_equal(i, ip)
    np.testing.assert_array_equal(d, dp)
    Y = rng.random((3000, 3), dtype=np.float32)
    assert sweet_knn(Y, Y, 40, exclude_self=True, params=SweetParams(partial_ratio=8.0))[2]["filter"] == "partial"


def test_exact_graph_takes_sweet_where_it_pays(rng):
    """knn_graph(method="brute") answers low-dimensional squared-L2 data with Sweet KNN (as
    knn(method="auto") would) and equals the GEMM path's lists; GEMM parameters keep GEMM."""
    import knnkit
    from knnkit.exact import ExactParams
    from knnkit.graph import _brute

    X = rng.random((12_000, 3), dtype=np.float32)  # 1.4e8 pairs: above the CPU threshold
    g = knnkit.knn_graph(X, k=10, method="brute", device="cpu")
    assert g.stats["exact_method"] == "sweet"
    I, D, st = _brute.brute_graph(X, 10, metric="l2", params=ExactParams(batch_size=4096))
    assert st["exact_method"] == "gemm"
    np.testing.assert_array_equal(np.asarray(g.indices), I)
    np.testing.assert_array_equal(np.asarray(g.distances), D)
    # inner product never takes Sweet KNN
    assert _brute.brute_graph(X[:3000], 5, metric="ip")[2]["exact_method"] == "gemm"


def test_gate_inside_the_cpu_run(rng):
    """The CPU twin's gate: level 1 alone passes clustered data (no sample), a floor above level 1
    gives way at once, an unreachable min_saved samples level 2 and gives way; a run that passes
    equals the GEMM path's answer."""
    import knnkit

    centres = rng.standard_normal((40, 12)).astype(np.float32) * 10
    Xc = (centres[rng.integers(0, 40, 6000)] + rng.standard_normal((6000, 12)).astype(np.float32) * 0.3)
    Xc = Xc.astype(np.float32)
    d, i, st = sweet_knn(Xc, Xc, 5, exclude_self=True, gate=(0.5, 256))
    assert st["gate"]["passed"] and st["gate"]["sample"] == 0
    d0, i0 = knnkit.knn(Xc, k=5, method="gemm", device="cpu")
    np.testing.assert_allclose(d, d0, rtol=1e-4, atol=1e-4)
    d, i, st = sweet_knn(Xc, Xc, 5, exclude_self=True, gate=(0.5, 256, 1.0))
    assert d is None and st["gate"]["sample"] == 0 and not st["gate"]["passed"]
    # an unreachable min_saved: the sample stops at its first chunk (already over what it allows)
    from knnkit.exact.sweet._cpu import _GATE_CHUNK

    full = estimate_savings(Xc, None, 5, sample=256)
    d, i, st = sweet_knn(Xc, Xc, 5, exclude_self=True, gate=(1.0, 256))
    assert d is None and st["gate"]["sample"] == _GATE_CHUNK and not st["gate"]["passed"]
    assert abs(st["gate"]["saved_estimate"] - full) < 0.05
    # a reachable one above level 1's fraction (wide clusters: level 1 weak, level 2 most of the
    # savings): the whole sample runs and the join goes on
    Xw = (centres[rng.integers(0, 40, 6000)] + rng.standard_normal((6000, 12)).astype(np.float32) * 4.0)
    Xw = Xw.astype(np.float32)
    level1 = estimate_savings(Xw, None, 5, sample=256, need=0.0)  # level 1's exact fraction
    full = estimate_savings(Xw, None, 5, sample=256)
    assert level1 + 0.1 < full
    d, i, st = sweet_knn(Xw, Xw, 5, exclude_self=True, gate=((level1 + full) / 2, 256))
    assert d is not None and st["gate"]["passed"] and st["gate"]["sample"] == 256
    assert abs(st["gate"]["saved_estimate"] - full) < 0.05
    d0, i0 = knnkit.knn(Xw, k=5, method="gemm", device="cpu")
    np.testing.assert_allclose(d, d0, rtol=1e-4, atol=1e-4)


def test_gated_auto_path_on_the_cpu(monkeypatch):
    """SWEET_AUTO_GATE asks Sweet KNN to estimate inside its run on the CPU too: ``auto`` answers
    as the GEMM path does when the gate gives way (uniform 12-D and 32-D: the sample stops early; the
    CPU has no level-1 floor)."""
    from knnkit._core.prepare import prepare
    from knnkit.api import exact as api_exact

    rng = np.random.default_rng(3)
    monkeypatch.setattr(api_exact, "SWEET_AUTO_GATE", True)
    monkeypatch.setitem(api_exact.SWEET_AUTO_PREGATE, "cpu", None)  # the gate itself (the pre-gate: below)
    for dim in (12, 32):
        X = rng.random((12_000, dim), dtype=np.float32)
        P = prepare(X, metric="sqeuclidean", device="cpu")
        m, need = api_exact.choose_exact_method("auto", P, None, 10, gated=True)
        assert m.name == "sweet" and need == (0.9, None)  # no level-1 floor on the CPU
        d, i, st = api_exact.exact_search(P, None, 5, method="auto")
        d0, i0, _ = api_exact.exact_search(P, None, 5, method="gemm")
        np.testing.assert_allclose(d, d0, rtol=1e-5, atol=1e-6)
        assert (i == i0).mean() > 0.999
        gate = st.get("sweet_gate") or st.get("gate")
        # a sample that stops once over what 90 % saved allows (uniform data: after a chunk or three)
        assert gate is not None and 0 < gate["sample"] < 256 and not gate["passed"]
    monkeypatch.setattr(api_exact, "SWEET_AUTO_GATE", False)
    m, need = api_exact.choose_exact_method("auto", P, None, 10, gated=True)
    assert need is None


def test_auto_pregate_on_a_subset_cpu(rng, monkeypatch):
    """On the CPU ``auto`` first estimates Sweet KNN's savings on a subset: uniform 32-D gives way
    to the GEMM path without the gated run (no need returned); clustered data whose subset already
    saves what is asked runs Sweet KNN without a gate (a denser whole set saves more), and one
    whose subset falls short within the slack goes on to the gated run; the answers equal the
    GEMM path's."""
    from knnkit._core.prepare import prepare
    from knnkit.api import exact as api_exact

    assert api_exact.SWEET_AUTO_PREGATE["cpu"] is not None and api_exact.SWEET_AUTO_PREGATE["gpu"] is None
    U = rng.random((40_000, 32), dtype=np.float32)
    P = prepare(U, metric="sqeuclidean", device="cpu")
    m, need = api_exact.choose_exact_method("auto", P, None, 10, gated=True)
    assert m.name == "gemm" and need is None
    from knnkit.datasets import make_clustered

    C = make_clustered(40_000, 32, random_state=int(rng.integers(1 << 30)), device="cpu")
    PC = prepare(C, metric="sqeuclidean", device="cpu")
    m, need = api_exact.choose_exact_method("auto", PC, None, 10, gated=True)
    assert m.name == "sweet" and need is None
    d, i, st = api_exact.exact_search(PC, None, 5, method="auto")
    assert "filter" in st and "gate" not in st
    d0, i0, _ = api_exact.exact_search(PC, None, 5, method="gemm")
    np.testing.assert_allclose(d, d0, rtol=1e-5, atol=1e-5)
    assert (i == i0).mean() > 0.999
    from knnkit.exact import sweet as sweet_pkg

    # asked more than the subset saves (clustered 32-D subsets: 0.945-0.977), within the slack
    monkeypatch.setitem(sweet_pkg.SWEET_AUTO_MIN_SAVED, "cpu", (0.99, 0.99))
    m, need = api_exact.choose_exact_method("auto", PC, None, 10, gated=True)
    assert m.name == "sweet" and need == (0.99, None)
    d, i, st = api_exact.exact_search(PC, None, 5, method="auto")
    assert ("gate" in st) != ("sweet_gate" in st)  # the gated run, passed or given way
    np.testing.assert_allclose(d, d0, rtol=1e-5, atol=1e-5)


def test_octant_order_and_scan(rng):
    """``_octant_order`` keeps every member once, each in the octant of its offset from the centre,
    by descending centre distance inside an octant; ``_level2_one`` over the octants gives the
    same pair as over whole clusters (ids and float32 distances) on points on the centres' planes (integer
    grid, landmarks among the points), duplicated rows of one value, and 1-D / 2-D data."""
    for dim, X in ((3, rng.integers(0, 5, (2500, 3))), (3, np.repeat(rng.standard_normal((40, 3)), 30, axis=0)),
                   (2, rng.standard_normal((2000, 2)) * 1e-3), (1, rng.standard_normal((1500, 1)) * 1e4)):
        X = np.ascontiguousarray(X, dtype=np.float32)
        out = {}
        for octants in (False, True):
            sweet_cpu_module._ONE_OCTANTS = octants
            try:
                d, i, st = sweet_cpu_module.sweet_cpu(X, X, 1, SweetParams(), 3, True)
            finally:
                sweet_cpu_module._ONE_OCTANTS = True
            out[octants] = (d, i, st["distance_computations"])
        np.testing.assert_array_equal(out[True][1], out[False][1])
        np.testing.assert_array_equal(out[True][0], out[False][0])
        assert out[True][2] <= out[False][2]
    # the regrouping itself, on a small clustered set
    X = rng.standard_normal((3000, 3)).astype(np.float32)
    c = sweet_cpu_module._Clusters(X, 30, 3, np.random.default_rng(0), True)
    moff = np.zeros(31, np.int64)
    np.cumsum(c.size, out=moff[1:])
    members, mdist = np.empty(3000, np.int64), np.empty(3000, np.float64)
    sweet_cpu_module._cluster_order(c.labels, c.dist, moff, members, mdist)
    XsT = np.ascontiguousarray(X[members].T)
    om, od, oX, ooff = np.empty(3000, np.int64), np.empty(3000), np.empty((3, 3000), np.float32), np.empty(241, np.int64)
    sweet_cpu_module._octant_order(XsT, c.L, moff, members, mdist, om, od, oX, ooff)
    assert np.array_equal(np.sort(om), np.arange(3000)) and ooff[-1] == 3000
    np.testing.assert_array_equal(oX, X[om].T)
    for cl in range(30):
        for o in range(8):
            seg = slice(ooff[8 * cl + o], ooff[8 * cl + o + 1])
            assert np.all(c.labels[om[seg]] == cl)
            bits = ((X[om[seg]].astype(np.float64) >= c.L[cl].astype(np.float64)) * [1, 2, 4]).sum(axis=1)
            assert np.all(bits == o)
            assert np.all(np.diff(od[seg]) <= 0)


@pytest.mark.parametrize("octants", [True, False])
def test_direct_octants_forced(rng, monkeypatch, octants):
    """k > 1, one worker per query, d <= 3: level 2 over each cluster's octants (``_DIRECT_OCTANTS``)
    or over whole clusters: exact either way, below and above the seeding k (8) and the merged
    copies' straight-band k (16), integer grids (ties by the smaller index, members on the
    centres' planes), repeated rows, separate and far queries."""
    monkeypatch.setattr(sweet_cpu_module, "_DIRECT_OCTANTS", octants)
    for dim in (1, 2, 3):
        grid = rng.integers(0, 7, (1600, dim)).astype(np.float32)
        smooth = rng.standard_normal((1600, dim)).astype(np.float32)
        copies = np.repeat(rng.standard_normal((160, dim)), 10, axis=0).astype(np.float32)
        for X in (grid, smooth, copies):
            for k in (3, 9, 17):
                s = run_both(X, None, k)
                assert s["distance_computations"] > 0
            run_both(X, X[:90] + 0.25, 9)
            run_both(X, X[:40] + 50.0, 5)
