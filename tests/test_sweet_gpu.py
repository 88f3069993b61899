"""Sweet KNN on the GPU: the same cases as tests/test_sweet.py against the GEMM GPU path
(bit-identical distances by construction, so ids agree too) and the CPU twin (same distances to
float32 rounding)."""

import numpy as np
import pytest

from knnkit.exact.sweet import SweetParams, estimate_savings, sweet_knn
from knnkit.exact.sweet import _cpu as sweet_cpu_module
from knnkit.exact.sweet import _gpu as sweet_gpu_module

pytestmark = pytest.mark.gpu


def force_merge(mp, merge):
    """Force the repeated-row gate of both twins on (every all-points join with a repeated row
    merges) or off."""
    for mod in (sweet_cpu_module, sweet_gpu_module):
        mp.setattr(mod, "_DUP_MIN_COPIES", 0.0 if merge else np.inf)


def gpu_equals_cpu(X, k, params=None, seed=0):
    """All-points join on integer-valued rows, where both twins' distances are exact (sums of
    squared small integers), so the GPU must return the CPU's rows bit for bit: same distances,
    same ids, ties by smaller index."""
    import cupy as cp

    Xd = cp.asarray(X)
    d, i, stats = sweet_knn(Xd, Xd, k, metric="l2", exclude_self=True, params=params, seed=seed)
    dc, ic, stats_c = sweet_knn(X, X, k, metric="l2", exclude_self=True, params=params, seed=seed)
    assert d.shape == (X.shape[0], k) and i.dtype == cp.int64
    np.testing.assert_array_equal(d.get(), dc)
    np.testing.assert_array_equal(i.get(), ic)
    assert not (i.get() == np.arange(X.shape[0])[:, None]).any()
    return stats, stats_c


def skin_like(rng, n, distinct):
    """Few distinct uint8-valued RGB rows in a narrow band (many equal distances), drawn with a
    heavy-tailed frequency: some rows have hundreds of copies (more than k + 1), most a few."""
    base = np.unique(rng.integers(0, 40, (distinct, 3)) + np.array([90, 120, 150]), axis=0).astype(np.float32)
    p = 1.0 / (np.arange(base.shape[0]) + 1.0) ** 1.1
    rows = base[rng.choice(base.shape[0], size=n, p=p / p.sum())]
    return np.ascontiguousarray(rows[rng.permutation(n)])


def gpu_vs_gemm(X, Q, k, params=None, seed=0):
    import cupy as cp

    from knnkit.exact._gpu import knn_gpu

    all_points = Q is None
    Xd = cp.asarray(X)
    Qd = Xd if all_points else cp.asarray(Q)
    d, i, stats = sweet_knn(Xd, Qd, k, metric="l2", exclude_self=all_points, params=params, seed=seed)
    assert isinstance(d, cp.ndarray) and d.dtype == cp.float32 and i.dtype == cp.int64
    d, i = d.get(), i.get()
    d0, i0 = knn_gpu(Xd, Qd, k, "l2", all_points)
    d0, i0 = d0.get(), i0.get()
    # the GEMM path's candidate selection uses float32 keys: compare ids where its distances
    # are distinct from their neighbours' and the distance multiset everywhere
    np.testing.assert_allclose(np.sort(d, 1), np.sort(d0, 1), rtol=1e-4,
                               atol=1e-6 * float(np.abs(X).max() + 1) ** 2)
    assert (np.diff(d, axis=1) >= 0).all()
    distinct = np.ones_like(d, dtype=bool)
    distinct[:, 1:] &= np.diff(d0, axis=1) > 1e-4 * np.abs(d0[:, 1:])
    distinct[:, :-1] &= np.diff(d0, axis=1) > 1e-4 * np.abs(d0[:, 1:])
    np.testing.assert_array_equal(i[distinct], i0[distinct])
    # the CPU twin computes distances in float64: equal up to float32 rounding
    Qh = X if all_points else Q
    dc, ic, _ = sweet_knn(X, Qh, k, metric="l2", exclude_self=all_points, params=params, seed=seed)
    np.testing.assert_allclose(d, dc, rtol=1e-5, atol=1e-7 * float(np.abs(X).max() + 1) ** 2)
    same = d == dc
    exact_rows = same.all(axis=1)
    # ids where the exact (float64) distance is apart from its row neighbours' and the next point's
    # outside the row by more than float32 rounding: the GPU ranks by float32 distances, which on
    # queries 1000 away (distances ~3e6, float32 steps of 0.25) may swap two points the twin's
    # float64 orders (seed 2866403618: ids 1430 / 1710, equal float32 distances)
    m = X.shape[0] - (1 if all_points else 0)
    if k + 1 <= m:
        _dn, inn, _ = sweet_knn(X, Qh, k + 1, metric="l2", exclude_self=all_points, params=params, seed=seed)
        d64 = ((Qh.astype(np.float64)[:, None, :] - X.astype(np.float64)[inn]) ** 2).sum(-1)
        close = np.diff(d64, axis=1) <= 1e-6 * np.abs(d64[:, 1:]) + 1e-30
        tied = np.zeros_like(same)
        tied[:, 1:] |= close[:, :k - 1]
        tied |= close[:, :k]
        check = exact_rows[:, None] & ~tied
    else:
        check = np.broadcast_to(exact_rows[:, None], same.shape)
    np.testing.assert_array_equal(i[check], ic[check])
    if all_points:
        assert not (i == np.arange(X.shape[0])[:, None]).any()
    return stats


@pytest.mark.parametrize("dim", [1, 2, 3, 8, 32, 40])
def test_random_all_points(rng, dim):
    X = rng.standard_normal((3000 + int(rng.integers(0, 97)), dim)).astype(np.float32)
    gpu_vs_gemm(X, None, int(rng.integers(1, 25)), seed=int(rng.integers(1 << 30)))


@pytest.mark.parametrize("dim", [2, 3, 8])
def test_random_separate_queries(rng, dim):
    X = rng.random((4003, dim), dtype=np.float32)
    Q = rng.random((1517, dim), dtype=np.float32) * 1.4 - 0.2
    gpu_vs_gemm(X, Q, 10)


def test_heavy_duplicates(rng):
    base = rng.integers(0, 8, (300, 3)).astype(np.float32)
    X = base[rng.integers(0, 300, 2000)]
    for k in (1, 7, 30):
        gpu_vs_gemm(X, None, k)


def test_identical_single_cluster_far_queries(rng, monkeypatch):
    X = np.full((400, 4), 3.25, np.float32)
    stats = gpu_vs_gemm(X, None, 12)
    # identical rows are merged: one distinct row, one distance
    assert stats["distinct_rows"] == 1 and stats["distance_computations"] == 1
    with pytest.MonkeyPatch.context() as mp:
        force_merge(mp, False)
        stats = gpu_vs_gemm(X, None, 12)
    # nothing can be pruned when every distance ties: all pairs but the excluded self pairs
    assert stats["distinct_rows"] is None and stats["distance_computations"] == 400 * 399
    one = rng.standard_normal((300, 3)).astype(np.float32) * 1e-3 + 5
    gpu_vs_gemm(one, None, 8, params=SweetParams(n_landmarks_data=1))
    Y = rng.random((1777, 3), dtype=np.float32)
    gpu_vs_gemm(Y, Y[:99] + np.float32(1000), 6)


def test_k_extremes(rng):
    X = rng.standard_normal((211, 3)).astype(np.float32)
    gpu_vs_gemm(X, None, 210)   # global-memory kNearests (k > 128)
    gpu_vs_gemm(X, None, 100)   # local, KCAP 128
    gpu_vs_gemm(X, None, 1)


@pytest.mark.parametrize("filt", ["full", "partial"])
@pytest.mark.parametrize("par", ["query", "split"])
def test_forced_branches(rng, filt, par):
    X = rng.standard_normal((5000, 4)).astype(np.float32)
    Q = rng.standard_normal((31, 4)).astype(np.float32)
    p = SweetParams(filter=filt, parallelism=par)
    s = gpu_vs_gemm(X, None, 9, params=p)
    assert s["filter"] == filt and s["parallelism"] == par
    s = gpu_vs_gemm(X, Q, 140, params=p)
    assert s["filter"] == filt and s["parallelism"] == par


def test_estimate_savings_gpu(rng):
    import cupy as cp

    centres = rng.standard_normal((30, 3)).astype(np.float32) * 30
    X = (centres[rng.integers(0, 30, 20000)] + rng.standard_normal((20000, 3)).astype(np.float32)).astype(np.float32)
    est = estimate_savings(cp.asarray(X), None, 10, sample=500)
    assert 0.9 < est <= 1.0
    early = estimate_savings(cp.asarray(X), None, 10, sample=500, need=0.5)  # level 1 suffices
    assert 0.5 <= early <= est + 1e-9
    cpu = estimate_savings(X, None, 10, sample=500, need=0.5)
    assert early == pytest.approx(cpu, abs=0.05)


def test_ip_rejected_gpu():
    import cupy as cp

    X = cp.zeros((10, 2), cp.float32)
    with pytest.raises(ValueError, match="inner product"):
        sweet_knn(X, X, 1, metric="ip")


@pytest.mark.parametrize("merge", [True, False])
def test_repeated_rows_gpu_equals_cpu(rng, monkeypatch, merge):
    """The GPU repeated-row merge against the CPU twin, gate forced both ways: skin-like data
    (few distinct rows, many copies, many ties), integer grid data with ~2 % repeated rows, n not a
    multiple of the block; every k-best variant (registers k <= 32, local k <= 128, global k > 128
    with k + 1 crossing each boundary, partial filter, split parts)."""
    force_merge(monkeypatch, merge)
    skin = skin_like(rng, 7777, 700)
    few = rng.integers(0, 40, (2501, 3)).astype(np.float32)
    full = SweetParams(filter="full")  # auto: partial from k / d > 8 (k >= 25 at d = 3), full when merged
    cases = ((1, None), (20, None), (31, full), (32, full), (127, full), (150, full), (31, None),
             (40, SweetParams(filter="partial")),
             (9, SweetParams(parallelism="split")), (20, SweetParams(parallelism="query")),
             (9, SweetParams(filter="partial", parallelism="split")))
    for X in (skin, few):
        for k, p in cases:
            stats, stats_c = gpu_equals_cpu(X, k, params=p)
            assert (stats["distinct_rows"] is not None) == merge
            assert stats["distinct_rows"] == stats_c["distinct_rows"]
            if merge:
                assert stats["distinct_rows"] == np.unique(X, axis=0).shape[0]
                assert 0.0 <= stats["saved_total"] <= 1.0


def test_repeated_rows_float_data_vs_gemm(rng, monkeypatch):
    """Merged float rows (not integers): against the GEMM path and the CPU twin within rounding."""
    force_merge(monkeypatch, True)
    base = rng.standard_normal((500, 5)).astype(np.float32)
    X = base[rng.integers(0, 500, 4099)]
    for k in (1, 20, 64):
        assert gpu_vs_gemm(X, None, k)["distinct_rows"] == np.unique(X, axis=0).shape[0]


def test_repeated_rows_all_identical_and_two_points(rng):
    """Degenerate groups: every row the same point (one distinct row, k + 1 copies needed from
    it), and two points with copies (lists cross from one group into the other)."""
    X = np.full((301, 3), 7.0, np.float32)
    for k in (1, 20, 300):
        stats, _ = gpu_equals_cpu(X, k)
        assert stats["distinct_rows"] == 1
    Y = np.where(rng.random((517, 1)) < 0.3, 0.0, 1.0).astype(np.float32) * np.ones((1, 2), np.float32)
    for k in (1, 20, 200, 516):
        stats, _ = gpu_equals_cpu(Y, k)
        assert stats["distinct_rows"] == 2


def test_duplicate_gate_auto_gpu(rng):
    """The sample gate (shared with the CPU twin) merges heavy duplicates and leaves distinct float
    rows alone; separate query sets never merge."""
    import cupy as cp

    X = rng.random((3000, 3), dtype=np.float32)
    Xd = cp.asarray(X)
    _, _, s = sweet_knn(Xd, Xd, 5, exclude_self=True)
    assert s["distinct_rows"] is None
    Y = X[rng.integers(0, 300, 3000)]
    Yd = cp.asarray(Y)
    _, _, s = sweet_knn(Yd, Yd, 5, exclude_self=True)
    assert s["distinct_rows"] == np.unique(Y, axis=0).shape[0]
    _, _, s = sweet_knn(Yd, Yd[:100] + 0.5, 5)
    assert s["distinct_rows"] is None


def _round_up_f32(d64):
    d32 = d64.astype(np.float32)
    return np.where(d32.astype(np.float64) < d64, np.nextafter(d32, np.float32(np.inf)), d32)


@pytest.mark.parametrize("dim", [1, 2, 3, 5, 40])
@pytest.mark.parametrize("rank", [True, False])
def test_clusters_gpu_equal_cpu(rng, monkeypatch, dim, rank):
    """Step 1 on the device against the CPU twin for the same seed, on integer rows (exact
    distances): same landmarks (trials scored on the device), same labels (d <= 32: both exact
    nearest with ties to the smaller landmark), and the member order (descending rounded-up centre
    distance, equal ones by index) from the in-cluster rank and from the fallback sort."""
    import cupy as cp

    if not rank:
        monkeypatch.setattr(sweet_gpu_module, "_RANK_MAX_MEAN", -1)
    X = rng.integers(0, 30, (4001, dim)).astype(np.float32)
    for count, trials in ((1, 3), (70, 10), (300, 1), (700, 4)):
        c = sweet_cpu_module._Clusters(X, count, trials, np.random.default_rng(count))
        g = sweet_gpu_module._Clusters(cp, cp.asarray(X), count, trials, np.random.default_rng(count))
        np.testing.assert_array_equal(g.L.get(), X[c.landmark_ids])
        if dim > 32:
            continue
        labels = g.labels.get()
        np.testing.assert_array_equal(labels, c.labels)
        d32 = _round_up_f32(c.dist)
        np.testing.assert_array_equal(g.size.get(), np.bincount(labels, minlength=count))
        np.testing.assert_array_equal(g.radius.get(), _round_up_f32(c.radius))
        order = np.lexsort((np.arange(X.shape[0]), -d32, labels))
        np.testing.assert_array_equal(g.order.get(), order)
        np.testing.assert_array_equal(g.dist.get(), d32[order])
        np.testing.assert_array_equal(g.off.get(), np.concatenate([[0], np.cumsum(np.bincount(labels,
                                                                                            minlength=count))]))


def _level1_reference(D, rq, Rt, qsize, tsize, off, dist, k_eff, rel, near_n):
    """The former CuPy level 1 in NumPy: stable argsort of each row, k_eff-th of the sorted pool
    over the near_n nearest data clusters (all where that is +inf), candidates in row order."""
    mq, mt = D.shape
    t = np.arange(k_eff)
    pos = off[1:, None] - 1 - t[None, :]
    small = np.where(t[None, :] < tsize[:, None], dist[np.maximum(pos, 0)].astype(np.float64), np.inf)
    order = np.argsort(D, axis=1, kind="stable")

    def pooled(rows, ncl):
        o = order[rows, :ncl]
        pool = rq[rows][:, None, None] + np.take_along_axis(D[rows], o, axis=1)[:, :, None] + small[o]
        return np.sort(pool.reshape(len(rows), -1), axis=1)[:, k_eff - 1]

    near = min(mt, near_n)
    ub = pooled(np.arange(mq), near)
    bad = np.nonzero(np.isinf(ub))[0]
    if bad.size and near < mt:
        ub[bad] = pooled(bad, mt)
    ub = np.where(qsize > 0, ub, 0.0)
    lb = D - rq[:, None] - Rt[None, :]
    keep = ~(lb > ub[:, None] + rel * (ub[:, None] + D + rq[:, None] + Rt[None, :]))
    keep &= (tsize > 0)[None, :]
    ks = np.take_along_axis(keep, order, axis=1)
    return ub, [order[a][ks[a]] for a in range(mq)]


@pytest.mark.parametrize("shared", [True, False])
def test_level1_kernel_equals_reference(rng, monkeypatch, shared):
    """sweet_level1 against the former algorithm on integer data (exact float64 centre distances,
    many equal ones, so the (distance, index) order matters): same UB bits, same candidate lists in
    the same order, same points per list; small k, k with the all-cluster fallback, both the
    shared-memory and the global-scratch variants."""
    import cupy as cp

    if not shared:
        monkeypatch.setattr(sweet_gpu_module, "_L1_SHARED_MAX", -1)
    X = cp.asarray(rng.integers(0, 12, (6001, 3)).astype(np.float32))
    Q = cp.asarray(rng.integers(0, 12, (1203, 3)).astype(np.float32))
    data = sweet_gpu_module._Clusters(cp, X, 150, 3, np.random.default_rng(1))
    query = sweet_gpu_module._Clusters(cp, Q, 70, 2, np.random.default_rng(2))
    Lq, Lt = query.L.get().astype(np.float64), data.L.get().astype(np.float64)
    D = np.sqrt(((Lq[:, None, :] - Lt[None]) ** 2).sum(-1))  # exact: small integers
    tsize, off, dist = data.size.get(), data.off.get(), data.dist.get()
    for k_eff in (1, 2, 21, 200, 3000):
        # global variant: a budget of 7 rows per launch (70 rows: several launches)
        budget = 1 << 30 if shared else 4 * 7 * (8 * 150 + 4 * 256)
        ub, ncand, cand, rowpairs = sweet_gpu_module._level1(cp, data, query, k_eff, 1e-5, budget)
        ub0, c0 = _level1_reference(D, query.radius.get().astype(np.float64), data.radius.get().astype(np.float64),
                                    query.size.get(), tsize, off, dist, k_eff, 1e-5, sweet_gpu_module._NEAREST_FOR_UB)
        np.testing.assert_array_equal(ub.get(), ub0)
        nc, cd, rp = ncand.get(), cand.get().reshape(Lq.shape[0], Lt.shape[0]), rowpairs.get()
        for a in range(Lq.shape[0]):
            np.testing.assert_array_equal(cd[a, :nc[a]], c0[a])
            assert rp[a] == tsize[c0[a]].sum()


def test_duplicate_gate_count_on_device(rng):
    """The device count of the gate equals the host's mean_copies on the same draws."""
    import cupy as cp

    from knnkit.exact.sweet._plan import mean_copies

    for X in (rng.random((5000, 3), dtype=np.float32), rng.integers(0, 9, (7000, 2)).astype(np.float32),
              rng.integers(0, 3, (3, 4)).astype(np.float32)):
        Xd = cp.asarray(X)
        assert sweet_gpu_module._mean_copies(Xd, np.random.default_rng(5)) == mean_copies(X, np.random.default_rng(5))


@pytest.mark.gpu
def test_gate_runs_or_gives_way(rng, monkeypatch):
    """gate=(min_saved, sample): Sweet KNN checks its savings on a sample after level 1 and either
    finishes (the GEMM path's answer) or returns None with the estimate, which agrees with
    estimate_savings; knnkit.knn(method="auto") then answers by GEMM (stats["sweet_gate"])."""
    import cupy as cp

    import knnkit
    from knnkit._core.prepare import prepare
    from knnkit.api.exact import exact_search

    centres = rng.standard_normal((50, 16)).astype(np.float32) * 8
    Xc = cp.asarray(centres[rng.integers(0, 50, 40_000)] + rng.standard_normal((40_000, 16)).astype(np.float32) * 0.3)
    d, i, st = sweet_knn(Xc, Xc, 10, exclude_self=True, gate=(0.95, 256))
    assert st["gate"]["passed"] and st["gate"]["saved_estimate"] >= 0.95
    assert st["gate"]["sample"] == 0  # level 1 alone saved enough: no sample run
    d2, _i2, st2 = sweet_knn(Xc, Xc, 10, exclude_self=True, gate=(0.9999, 256))  # level 1 short: the sample
    assert st2["gate"]["sample"] == 256 and (d2 is None) == (not st2["gate"]["passed"])
    d3, _i3, st3 = sweet_knn(Xc, Xc, 10, exclude_self=True, gate=(0.9999, 256, 1.0))  # under the floor
    assert d3 is None and st3["gate"]["sample"] == 0 and not st3["gate"]["passed"]
    d0, i0 = knnkit.knn(Xc, k=10, method="gemm")
    np.testing.assert_allclose(cp.asnumpy(d), cp.asnumpy(d0), rtol=1e-4, atol=1e-4)
    Xu = cp.asarray(rng.random((40_000, 16), dtype=np.float32))
    d, i, st = sweet_knn(Xu, Xu, 10, exclude_self=True, gate=(0.95, 256))
    assert d is None and i is None and not st["gate"]["passed"]
    assert abs(st["gate"]["saved_estimate"] - estimate_savings(Xu, None, 10, sample=256)) < 0.05
    from knnkit.api import exact as api_exact

    monkeypatch.setattr(api_exact, "SWEET_AUTO_GATE", True)  # (the default; set for the test)
    P = prepare(Xu, metric="sqeuclidean", device="gpu")
    d, i, st = exact_search(P, None, 10, method="auto")
    assert st.get("sweet_gate", {}).get("passed") is False
    _d1, i1 = knnkit.knn(Xu, k=10, method="gemm")
    assert float((cp.asnumpy(i) == cp.asnumpy(i1)).mean()) > 0.999
    P = prepare(Xc, metric="sqeuclidean", device="gpu")
    d, i, st = exact_search(P, None, 10, method="auto")
    assert st["gate"]["passed"]
