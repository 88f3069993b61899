"""BANG host placement (issue 16): PQ training/encoding, host-graph search recall against exact
ground truth (ties counted by distance), determinism, save/load with memory-mapped parts, parameter
validation; GPU tests compare the GPU loop with the CPU path."""

import os
import warnings

import numpy as np
import pytest

import knnkit
from knnkit.datasets import make_clustered, make_uniform
from knnkit.index.bang import HostIndex
from knnkit.index.bang import _pq


def _host(a):
    a = a[0] if isinstance(a, tuple) else a
    return np.asarray(a.get() if hasattr(a, "get") else a)


def _recall(X, Q, idx, k):
    """recall@k with ties: a returned id counts when its exact distance is within the k-th true one."""
    Xf, Qf = X.astype(np.float64), Q.astype(np.float64)
    D = (Qf * Qf).sum(1)[:, None] - 2 * Qf @ Xf.T + (Xf * Xf).sum(1)[None, :]
    kth = np.sort(D, axis=1)[:, k - 1]
    idx = np.asarray(idx)
    assert (idx >= 0).all()
    got = np.take_along_axis(D, idx, axis=1) <= kth[:, None] + 1e-6 * np.maximum(1.0, np.abs(kth[:, None]))
    for row in idx:  # no duplicates
        assert len(set(row.tolist())) == k
    return float(got.mean())


@pytest.fixture
def tiny_budget():
    knnkit.set_memory_budget(10_000)
    yield
    knnkit.set_memory_budget(None)


# ------------------------------------------------------------------------------------------ PQ
def test_pq_reconstruction_beats_trivial_quantiser(rng):
    X = _host(make_clustered(4000, 16, random_state=int(rng.integers(1 << 30)), device="cpu")).astype(np.float32)
    trivial = float(((X - X.mean(0)) ** 2).sum(1).mean())
    errs = []
    for m in (2, 8):
        cb = _pq.train_pq(X, m, random_state=1)
        rec = _pq.reconstruct(_pq.encode(X, cb), cb, X.shape[1])
        errs.append(float(((X - rec) ** 2).sum(1).mean()))
    assert errs[1] < errs[0] < 0.5 * trivial
    assert errs[1] < 0.1 * trivial


def test_pq_padding_and_tables(rng):
    X = rng.random((600, 10), dtype=np.float32)  # d = 10, m = 4: padded to 12
    cb = _pq.train_pq(X, 4, random_state=0)
    assert cb.shape == (4, 256, 3)
    codes = _pq.encode(X, cb)
    Q = rng.random((5, 10), dtype=np.float32)
    rec = _pq.reconstruct(codes, cb, 10)
    for metric in ("l2", "ip"):
        T = _pq.pq_tables(Q, cb, metric, bits=32)
        approx = T[np.arange(5)[:, None, None], np.arange(4)[None, None, :], codes[None, :, :].astype(np.int64)].sum(2)
        exact = ((Q[:, None, :] - rec[None]) ** 2).sum(2) if metric == "l2" else -(Q @ rec.T)
        np.testing.assert_allclose(approx, exact, rtol=1e-4, atol=1e-4)
        # the walk's tables: each entry bfloat16-rounded (8 significant bits: within 2^-8 relative)
        T16 = _pq.pq_tables(Q, cb, metric, bits=16)
        assert T16.dtype == np.float32 and not (T16.view(np.uint32) & 0xFFFF).any()
        assert np.all(np.abs(T16 - T) <= np.abs(T) * 2.0 ** -8)
        np.testing.assert_array_equal(T16, _pq.round_bf16(T))


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_direct_tables_match_the_expansion_and_the_definition(metric, rng, monkeypatch):
    """The direct tables (default) against the GEMM expansion and against float64 sums; a uint16
    ``out`` gets the bfloat16 bits of the rounded values."""
    X = rng.standard_normal((1500, 21), dtype=np.float32)  # d = 21, m = 7, dsub = 3
    cb = _pq.train_pq(X, 7, random_state=0)
    Q = rng.standard_normal((9, 21), dtype=np.float32)
    monkeypatch.setattr(_pq, "TABLE_METHOD", "gemm")
    gemm = _pq.pq_tables(Q, cb, metric, bits=32)
    monkeypatch.setattr(_pq, "TABLE_METHOD", "direct")
    direct = _pq.pq_tables(Q, cb, metric, bits=32)
    Qs = Q.reshape(9, 7, 3).astype(np.float64)
    C = cb.astype(np.float64)
    exact = (-(Qs[:, :, None, :] * C[None]).sum(-1) if metric == "ip"
             else ((Qs[:, :, None, :] - C[None]) ** 2).sum(-1))
    np.testing.assert_allclose(direct, exact, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gemm, exact, rtol=1e-4, atol=1e-4)
    bits = np.empty(direct.shape, np.uint16)
    _pq.tables_into(Q, cb, metric, bits)
    np.testing.assert_array_equal((bits.astype(np.uint32) << 16).view(np.float32), _pq.round_bf16(direct))


def test_round_bf16_nearest_ties_to_even():
    one = np.float32(1.0)
    ulp = np.float32(2.0 ** -7)  # bfloat16's spacing at 1
    x = np.array([1.0, 1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, 1 + 2.0 ** -8 + 2.0 ** -20, 1 + 2.0 ** -9, -2.5, 0.0, -0.0,
                  np.inf, -np.inf, 3.0e38], np.float32)
    want = np.array([one, one, one + 2 * ulp, one + ulp, one, -2.5, 0.0, -0.0, np.inf, -np.inf, np.nan], np.float32)
    got = _pq.round_bf16(x)
    np.testing.assert_array_equal(got[:-1], want[:-1])  # halfway: to the even neighbour (1, then 1 + 2 ulp)
    assert np.isinf(got[-1]) or abs(got[-1] - x[-1]) <= x[-1] * 2.0 ** -8  # rounds to float32's max or inf
    r = np.random.default_rng(0).standard_normal(10000).astype(np.float32) * 1e3
    g = _pq.round_bf16(r)
    assert not (g.view(np.uint32) & 0xFFFF).any() and np.all(np.abs(g - r) <= np.abs(r) * 2.0 ** -8)


def test_round_bf16_cpu_pass_equals_the_expression(rng):
    # the Numba pass adds in 64 bits where the expression wraps at 32: every bit pattern must agree,
    # NaN payloads and the patterns next to the wrap among them
    u = np.concatenate([rng.integers(0, 2 ** 32, 200_000, dtype=np.uint64).astype(np.uint32),
                        np.array([0xFFFFFFFF, 0xFFFF8000, 0xFFFF7FFF, 0x7F800001, 0x7FFFFFFF, 0x80000000, 0, 1],
                                 np.uint32)])
    want = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    np.testing.assert_array_equal(_pq.round_bf16(u.view(np.float32)).view(np.uint32), want)
    T = rng.standard_normal((3, 4, 5)).astype(np.float32)  # any shape; the input is left as it was
    before = T.copy()
    assert _pq.round_bf16(T).shape == T.shape and np.array_equal(T, before)


@pytest.mark.parametrize("dtype,metric", [(np.uint8, "l2"), (np.float32, "l2"), (np.float16, "ip"), (np.int8, "l2")])
def test_rerank_cpu_blocks_change_no_bit(rng, dtype, metric):
    from knnkit.index.bang._search_cpu import rerank_cpu

    n, d, nq, c = 3000, 24, 300, 40
    X = (rng.integers(-100, 100, (n, d)) if np.dtype(dtype).kind in "iu" else rng.standard_normal((n, d)))
    X = np.abs(X).astype(dtype) if dtype == np.uint8 else X.astype(dtype)
    Q = rng.standard_normal((nq, d)).astype(np.float32) * 10
    cand = rng.integers(-1, n, (nq, c)).astype(np.int32)  # -1: no candidate in that slot
    um = "sqeuclidean" if metric == "l2" else "inner_product"
    whole = rerank_cpu(X, Q, cand, 7, metric=metric, user_metric=um, scale=1.0, chunk=nq)
    for chunk in (None, 1, 17):
        got = rerank_cpu(X, Q, cand, 7, metric=metric, user_metric=um, scale=1.0, chunk=chunk)
        np.testing.assert_array_equal(got[0], whole[0])
        np.testing.assert_array_equal(got[1], whole[1])


@pytest.mark.parametrize("dsub,ksub", [(1, 256), (2, 256), (3, 100), (8, 256)])
def test_pq_nearest_centroid_is_the_first_smallest(dsub, ksub, rng):
    """The CPU coder (distances summed a dimension at a time, the smallest found as the smallest
    ``bits << 8 | index``) picks what a scan of float32 sums in dimension order picks: the first
    strictly smallest; exact ties (coarse values) to the smaller index; no finite distance -> 0."""
    S = (np.round(rng.standard_normal((500, 3, dsub)) * 2) / 2).astype(np.float32)
    C = (np.round(rng.standard_normal((3, ksub, dsub)) * 2) / 2).astype(np.float32)
    S[0, 0] = np.float32(3e19)  # its squared distances overflow to inf for every centroid
    S[1, 1, 0] = np.nan
    out = np.empty((500, 3), np.uint8)
    _pq._encode_cpu(S, C, out)
    for j in range(3):
        acc = np.zeros((500, ksub), np.float32)
        for t in range(dsub):  # the same float32 operations, in dimension order
            e = S[:, j, t, None] - C[None, j, :, t]
            acc += e * e
        finite = np.isfinite(acc)
        ref = np.where(finite.any(axis=1), np.argmin(np.where(finite, acc, np.inf), axis=1), 0)
        np.testing.assert_array_equal(out[:, j], ref)
    assert out[0, 0] == 0 and out[1, 1] == 0


def test_pq_deterministic(rng):
    X = rng.random((2000, 8), dtype=np.float32)
    a = _pq.train_pq(X, 4, random_state=7)
    b = _pq.train_pq(X, 4, random_state=7)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(_pq.encode(X, a), _pq.encode(X, b))
    assert not np.array_equal(a, _pq.train_pq(X, 4, random_state=8))


def test_choose_m_budget():
    assert _pq.choose_m(100, 96) == 48
    # one byte a dimension up to 8 dimensions (2-d data in one byte: 256 cells), two beyond
    assert [_pq.choose_m(100, d) for d in (1, 2, 3, 8, 9, 10, 300)] == [1, 2, 3, 8, 5, 5, 128]
    assert _pq.choose_m(100, 96, pq_bytes=12) == 12
    assert _pq.choose_m(10 ** 6, 96, budget=40 * 10 ** 6) == 20
    with pytest.raises(ValueError, match="memory budget"):
        _pq.choose_m(10 ** 6, 96, budget=1000)


# ------------------------------------------------------------------------------------------ search
@pytest.mark.parametrize("kind", ["clustered", "uniform", "uint8"])
def test_host_placement_recall(kind, rng, tiny_budget):
    seed = int(rng.integers(1 << 30))
    n, d, k = 4000, 16, 10
    if kind == "clustered":
        X = _host(make_clustered(n + 100, d, random_state=seed, device="cpu"))
    elif kind == "uniform":
        X = _host(make_uniform(n + 100, d, random_state=seed, device="cpu"))
    else:
        X = _host(make_clustered(n + 100, d, dtype=np.uint8, random_state=seed, device="cpu"))
    X, Q = X[:n], X[n:]
    index = knnkit.GraphIndex.build(X, device="cpu", random_state=seed)  # auto -> host (tiny budget)
    assert isinstance(index._engine, HostIndex)
    assert "placement='host'" in repr(index)
    # a graph build that does not fit the budget builds its candidate lists out of core
    assert "candidates_out_of_core" in index.build_timings
    _d, i = index.search(Q, k=k, beam=64)
    assert _recall(X, Q, i, k) >= 0.9
    d_off, i_off = index.search(Q, k=k, beam=64, params=knnkit.index.SearchParams(rerank=k))  # re-rank of the k PQ-best only
    assert (np.diff(d_off, axis=1) >= 0).all()
    assert _recall(X, Q, i, k) >= _recall(X, Q, i_off, k) - 0.01


def test_host_build_check_leaves_out_rows_with_copies(rng):
    """Rows with an exact copy are not held out for the build's check (cutting one also cuts the
    links its copies hang from); the check counts the others, or says it was skipped when every
    sampled row has a copy. ``kth_distances(copies=True)`` flags exactly those rows."""
    seed = int(rng.integers(1 << 30))
    base = np.random.default_rng(seed).standard_normal((2000, 8)).astype(np.float32)
    X = np.concatenate([base, base[:1000]])  # rows 0..999 and 2000..2999 have one copy each
    index = knnkit.GraphIndex.build(X, placement="host", device="cpu", random_state=seed)
    rows = np.sort(np.random.default_rng([knnkit._core.random.seed_from(seed), 11]).choice(3000, 200, replace=False))
    unique = (rows >= 1000) & (rows < 2000)
    _kth, has_copy = index._engine.kth_distances(rows, 10, device="cpu", exclude=rows, copies=True)
    partner_out = np.isin(np.where(rows < 1000, rows + 2000, rows - 2000), rows)  # its copy is held out too
    np.testing.assert_array_equal(has_copy, ~unique & ~partner_out)
    chk = index.build_params["host_check"]
    assert chk["rows"] == int((~has_copy).sum()) < 200 and chk["recall"][-1] >= 0.95
    many = knnkit.GraphIndex.build(np.repeat(base[:30], 100, axis=0), placement="host", device="cpu",
                                   random_state=seed)  # 30 rows, 100 copies of each
    assert many.build_params["host_check"]["skipped"] == "every sampled row has an exact copy"


def test_host_build_checks_its_walk(rng):
    """A host index's build measures its walk on data rows held out of the graph (no calibration):
    recall against exact distances to the other points at the default beam, more beams while
    short of 0.95, recorded in build_params; the graph and entries are restored exactly; a walk that
    stays far below (1-byte codes on 32-d data) warns instead of answering silently."""
    seed = int(rng.integers(1 << 30))
    X = _host(make_clustered(3000, 16, random_state=seed, device="cpu"))
    index = knnkit.GraphIndex.build(X, placement="host", device="cpu", random_state=seed)
    chk = index.build_params["host_check"]
    assert chk["k"] == 10 and chk["rows"] == 200 and chk["beams"][0] == 64
    assert chk["recall"][-1] >= 0.95 and "host_check" in index.build_timings
    eng = index._engine
    g0, e0 = index.graph.copy(), eng._entry
    rows = np.sort(np.random.default_rng([seed, 11]).choice(3000, 200, replace=False))
    restore = eng.hold_out(rows)
    try:
        assert (eng._graph[rows] == -1).all() and not np.isin(eng._graph, rows).any()
        _d, i = index.search(X[rows], k=10, beam=64)
        assert not np.isin(i, rows).any()  # held-out rows are never answers
    finally:
        restore()
    assert np.array_equal(index.graph, g0) and eng._entry is e0
    # the check's reference: the k-th distance among the points not held out
    kth = eng.kth_distances(rows[:20], 10, device="cpu", exclude=rows)
    keep = np.setdiff1d(np.arange(3000), rows)
    dx = ((X[rows[:20]][:, None, :].astype(np.float64) - X[keep][None].astype(np.float64)) ** 2).sum(2)
    np.testing.assert_allclose(kth, np.sort(dx, axis=1)[:, 9], rtol=1e-6, atol=1e-9)
    knnkit.set_memory_budget(4_000_000)  # a small budget: smaller chunks, the same distances
    try:
        np.testing.assert_array_equal(eng.kth_distances(rows[:20], 10, device="cpu", exclude=rows), kth)
    finally:
        knnkit.set_memory_budget(None)
    # (8,000 rows: at 3,000 the check's 16x beam, 1,024, re-ranks a third of the data exactly)
    U = rng.random((8000, 64), dtype=np.float32)
    with pytest.warns(RuntimeWarning, match="recall@10"):
        bad = knnkit.GraphIndex.build(U, placement="host", pq_bytes=1, device="cpu", random_state=seed)
    assert max(bad.build_params["host_check"]["recall"]) < 0.9
    # below the warning line at 4x: the check goes on, doubling, to 16x while below it
    assert bad.build_params["host_check"]["beams"] == [64, 128, 256, 512, 1024]
    # short of the target at every beam: the default is the best beam checked, not the first
    chk = bad.build_params["host_check"]
    best = int(np.argmax(chk["recall"]))
    assert bad.search_params.beam == (chk["beams"][best] if chk["recall"][best] > chk["recall"][0] else 64)


def test_host_build_check_stops_at_its_largest_beam(rng, monkeypatch):
    """The check's doubling past 4x stops at ``HOST_CHECK_MAX_BEAM`` and below the number of points
    (a user's default beam of 2048 must not send the GPU walk's list to 32768)."""
    seed = int(rng.integers(1 << 30))
    U = rng.random((8000, 64), dtype=np.float32)
    monkeypatch.setattr(knnkit.GraphIndex, "HOST_CHECK_MAX_BEAM", 512)
    with pytest.warns(RuntimeWarning, match="recall@10"):
        index = knnkit.GraphIndex.build(U, placement="host", pq_bytes=1, device="cpu", random_state=seed)
    assert index.build_params["host_check"]["beams"] == [64, 128, 256, 512]
    monkeypatch.setattr(knnkit.GraphIndex, "HOST_CHECK_MAX_BEAM", 4096)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (whether it warns depends on the draw)
        small = knnkit.GraphIndex.build(U[:700], placement="host", pq_bytes=1, device="cpu", random_state=seed)
    chk = small.build_params["host_check"]
    assert max(chk["beams"]) < 700  # 16x (1024) would be past the 700 points


def test_host_low_dim_codes_order_points(rng):
    """2-d data: one code byte a dimension (65,536 PQ cells) lets the walk order 40k points, so the
    default beam holds; at one byte for both dimensions (256 cells) the build's check read 0.36 at
    beam 64 and the default went to 512."""
    from knnkit.datasets.suite import make_2d

    seed = int(rng.integers(1 << 30))
    X, Q = make_2d(40000, n_queries=200, random_state=seed)
    index = knnkit.GraphIndex.build(X, placement="host", device="cpu", random_state=seed)
    assert index._engine.pq_bytes == 2
    assert index.build_params["host_check"]["recall"][0] >= 0.95 and index.build_params["host_check"]["beams"] == [64]
    TD, TI = knnkit.knn(X, Q, k=10, device="cpu")
    D, I = index.search(Q, k=10)
    assert knnkit.evaluate.recall(I, TI, found_distances=D, true_distances=TD) >= 0.95


def test_host_distances_exact_and_deterministic(rng):
    seed = int(rng.integers(1 << 30))
    X = rng.standard_normal((3000, 12)).astype(np.float32)
    Q = rng.standard_normal((50, 12)).astype(np.float32)
    for metric in ("sqeuclidean", "cosine", "inner_product"):
        a = knnkit.GraphIndex.build(X, metric=metric, placement="host", device="cpu", random_state=seed)
        b = knnkit.GraphIndex.build(X, metric=metric, placement="host", device="cpu", random_state=seed)
        da, ia = a.search(Q, k=5)
        db, ib = b.search(Q, k=5)
        np.testing.assert_array_equal(ia, ib)
        np.testing.assert_array_equal(da, db)
        Xn = X / np.linalg.norm(X, axis=1, keepdims=True) if metric == "cosine" else X
        Qn = Q / np.linalg.norm(Q, axis=1, keepdims=True) if metric == "cosine" else Q
        rows = Xn[ia]
        if metric == "sqeuclidean":
            want = ((rows - Qn[:, None]) ** 2).sum(2)
        elif metric == "cosine":
            want = 1 - (rows * Qn[:, None]).sum(2)
        else:
            want = (rows * Qn[:, None]).sum(2)
        np.testing.assert_allclose(da, want, rtol=1e-4, atol=1e-4)


def test_save_load_mmap(tmp_path, rng):
    X = rng.random((2500, 8), dtype=np.float32)
    index = knnkit.GraphIndex.build(X, placement="host", pq_bytes=4, device="cpu", random_state=3)
    assert index._engine.pq_bytes == 4
    path = os.path.join(tmp_path, "host.knnkit")
    index.save(path)
    loaded = knnkit.GraphIndex.load(path, device="cpu", mmap=True)
    assert isinstance(loaded._engine, HostIndex)
    assert isinstance(loaded._engine._graph, np.memmap) and isinstance(loaded._engine._codes, np.memmap)
    assert isinstance(loaded._engine.data, np.memmap)
    Q = rng.random((20, 8), dtype=np.float32)
    for a, b in zip(index.search(Q, k=4), loaded.search(Q, k=4)):
        np.testing.assert_array_equal(a, b)
    assert isinstance(knnkit.load(path, device="cpu")._engine, HostIndex)


def test_out_of_core_build_refused_when_the_host_cannot_hold_it(rng, tiny_budget, monkeypatch):
    """An out-of-core candidate build that the host's memory cannot hold even in the smallest
    shards is refused at once with a MemoryError that says why and what to do (it was killed by the
    operating system at 40M x 96 on a 125 GB host); with enough memory the same build goes ahead."""
    import knnkit.index.bang._engine as eng

    X = _host(make_clustered(3000, 12, random_state=int(rng.integers(1 << 30)), device="cpu"))
    monkeypatch.setattr(eng, "_host_available_bytes", lambda: 1000)
    called = []
    monkeypatch.setattr(eng, "_out_of_core_candidates", lambda *a, **k: called.append(a))
    with pytest.raises(MemoryError, match=r"out of core.*smallest shards.*host memory.*intermediate_degree"):
        knnkit.GraphIndex.build(X, placement="host", device="cpu", random_state=0)
    assert not called  # refused before any work
    monkeypatch.undo()
    monkeypatch.setattr(eng, "_host_available_bytes", lambda: 10 ** 15)
    index = knnkit.GraphIndex.build(X, placement="host", device="cpu", random_state=0)
    assert "candidates_out_of_core" in index.build_timings
    # the model: per data point and per shard point, in units of a vector and a list
    assert eng.out_of_core_host_bytes(3000, 12, 64, 2048) == int(eng.OUT_OF_CORE_HOST_FIXED + (4 * 12 + 8 * 64) * (
        eng.OUT_OF_CORE_HOST_PER_POINT * 3000 + eng.OUT_OF_CORE_HOST_PER_SHARD_POINT * 2048))
    # the measured peaks it was fitted to are below it (6M x 96 in 3 and 6 shards, 4M x 48 K = 32 in 4)
    for n, d, K, shard, peak in ((6 * 10 ** 6, 96, 64, 2 * 10 ** 6, 21.5e9), (6 * 10 ** 6, 96, 64, 10 ** 6, 14.2e9),
                                 (4 * 10 ** 6, 48, 32, 10 ** 6, 7.7e9)):
        assert peak <= eng.out_of_core_host_bytes(n, d, K, shard) <= 1.3 * peak
    # the boundary: exactly what the smallest shards need is enough
    need = eng.out_of_core_host_bytes(3000, 12, 64, eng._smallest_shard(3000, 64))
    monkeypatch.setattr(eng, "_host_available_bytes", lambda: need)
    assert eng._out_of_core_shard(3000, 12, 64, 10_000, "cpu") == eng._smallest_shard(3000, 64) == 2048
    monkeypatch.setattr(eng, "_host_available_bytes", lambda: need - 1)
    with pytest.raises(MemoryError, match="3000 x 12 points"):
        eng._out_of_core_shard(3000, 12, 64, 10_000, "cpu")
    monkeypatch.setattr(eng, "_host_available_bytes", lambda: None)  # unknown (no /proc): no refusal
    assert eng._out_of_core_shard(10 ** 9, 96, 64, 10_000, "cpu") == eng._smallest_shard(10 ** 9, 64)
    # on a GPU that could hold the in-memory build (1.5x its estimate), the message says how
    import types

    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(
        memGetInfo=lambda: (140 * 10 ** 9, 141 * 10 ** 9))))
    monkeypatch.setattr(eng, "cupy_or_none", lambda: fake)
    monkeypatch.setattr(eng, "_host_available_bytes", lambda: 30 * 10 ** 9)
    with pytest.raises(MemoryError, match=r"built in GPU memory.*set_memory_budget\(\d+\)"):
        eng._out_of_core_shard(40 * 10 ** 6, 96, 64, 70 * 10 ** 9, "gpu")
    with pytest.raises(MemoryError) as e:  # too large for the GPU too: no such advice
        eng._out_of_core_shard(100 * 10 ** 6, 96, 64, 70 * 10 ** 9, "gpu")
    assert "GPU memory" not in str(e.value)


def test_out_of_core_shards_shrink_to_fit_the_host(rng, monkeypatch):
    """Where the GPU budget's shards would need more host memory than there is, the shards are
    made smaller (more merges, the same lists) instead of refusing, down to the smallest shard."""
    import knnkit.index.bang._engine as eng

    n, d, K, budget = 40 * 10 ** 6, 96, 64, 70 * 10 ** 9
    big = eng._budget_shard(n, d, K, budget, "gpu")
    # two shards' GNND state with the merges' own lists (192 entries for K = 64) in 70 GB: ~7.8M
    # points, 6 shards, ~102 GB of host memory by the model
    assert 7 * 10 ** 6 < big < 9 * 10 ** 6
    monkeypatch.setattr(eng, "_host_available_bytes", lambda: 80 * 10 ** 9)
    shard = eng._out_of_core_shard(n, d, K, budget, "gpu")
    assert eng._smallest_shard(n, K) <= shard < big
    assert eng.out_of_core_host_bytes(n, d, K, shard) <= 80 * 10 ** 9 < eng.out_of_core_host_bytes(n, d, K, shard + 2)
    monkeypatch.setattr(eng, "_host_available_bytes", lambda: 10 ** 15)
    assert eng._out_of_core_shard(n, d, K, budget, "gpu") == big
    # the engine builds the lists in the shards it was given
    X = _host(make_clustered(7000, 12, random_state=int(rng.integers(1 << 30)), device="cpu"))
    import knnkit.graph._out_of_core as ooc

    seen, real = [], ooc.build_out_of_core
    monkeypatch.setattr(ooc, "build_out_of_core", lambda *a, **k: seen.append(k["shard_size"]) or real(*a, **k))
    ids, dist = eng._out_of_core_candidates(X, "sqeuclidean", 16, 1 << 30, "cpu", 0, shard=2500)
    assert seen == [2500] and ids.shape == (7000, 16) and ids.dtype == np.int64 and dist is None
    assert (ids >= 0).all() and not (ids == np.arange(7000)[:, None]).any()


def test_in_memory_build_out_of_gpu_memory_falls_back_out_of_core(rng, monkeypatch):
    """The automatic build budget lets the in-memory GPU build try where the shared budget would
    have gone out of core; if the device then runs out of memory, the lists are built out of core
    under the shared budget (logged), not a crash. Where the shared budget would also have built in
    memory, the error is raised as before. (A fake device: NumPy arrays, an out-of-memory build.)"""
    import types

    import knnkit.index.bang._engine as eng

    X = _host(make_clustered(5000, 8, random_state=int(rng.integers(1 << 30)), device="cpu"))
    freed = []
    fake = types.SimpleNamespace(asarray=np.asarray, asnumpy=np.asarray,
                                 get_default_memory_pool=lambda: types.SimpleNamespace(
                                     free_all_blocks=lambda: freed.append(1)))
    monkeypatch.setattr(eng, "cupy_or_none", lambda: fake)
    real_build = eng.SearchGraph.build
    tried = []

    def build(a, *args, candidates=None, **kw):
        if candidates is None:  # the in-memory build on the "device"
            tried.append(a.shape)
            raise MemoryError("Out of memory allocating 1,000,000,000 bytes")
        return real_build(a, *args, candidates=candidates, **kw)

    monkeypatch.setattr(eng.SearchGraph, "build", build)
    real_lists, lists_on = eng._out_of_core_candidates, []

    def lists(a, metric, K, budget, device, random_state, shard=None):  # the shards' graphs on the CPU
        lists_on.append((device, budget))
        return real_lists(a, metric, K, budget, "cpu", random_state, shard=shard)

    monkeypatch.setattr(eng, "_out_of_core_candidates", lists)
    bp = dict(graph_degree=8, intermediate_degree=16, alpha=1.1, build_algo="nndescent", diversify="prune", n_entry=16,
              repair=True, entry="kmeans", random_state=0)
    need = eng.build_bytes(5000, 8, 16)
    monkeypatch.setattr(eng, "_build_budget", lambda b, dev: 10 * need)  # automatic: the build may try
    graph, entry, timings = eng._build_graph(X, "sqeuclidean", bp, 0, 1.0, "gpu", need // 4)
    assert tried == [(5000, 8)] and freed  # tried in memory, gave the device memory back
    assert lists_on == [("gpu", need // 4)]  # then out of core under the shared budget
    assert "candidates_out_of_core" in timings and graph.shape == (5000, 8)
    assert (graph >= 0).sum(axis=1).min() >= 1
    tried.clear()
    with pytest.raises(MemoryError, match="Out of memory"):  # the shared budget fits it too: as before
        eng._build_graph(X, "sqeuclidean", bp, 0, 1.0, "gpu", 2 * need)
    assert tried == [(5000, 8)]


def test_whole_vector_file_read_in_place(tmp_path, rng):
    """The out-of-core build reads a memory map of a whole vector file in place (fbin, u8bin, npy,
    fvecs), not a temporary copy of the data; a slice, an in-memory copy or a map at another offset
    are not the file."""
    import knnkit.index.bang._engine as eng

    X = rng.random((500, 6), dtype=np.float32)
    U = rng.integers(0, 256, (300, 5), dtype=np.uint8)
    for name, data in (("x.fbin", X), ("x.npy", X), ("x.fvecs", X), ("u.u8bin", U)):
        p = str(tmp_path / name)
        knnkit.io.write(p, data)
        mm = knnkit.io.read(p, mmap=True)
        assert eng._whole_vector_file(mm) == p, name
        assert eng._whole_vector_file(mm[:-1]) is None
        assert eng._whole_vector_file(np.array(mm)) is None
    p = str(tmp_path / "x.npy")  # its header is longer than 8 bytes: same shape, other rows
    shifted = np.memmap(p, dtype=np.float32, mode="r", offset=8, shape=(500, 6))
    assert eng._whole_vector_file(shifted) is None


def test_build_budget_automatic_and_explicit(monkeypatch):
    """Under the automatic budget (half the free memory, for routines sharing the device) the build
    plans on the share of the free memory its measured in-memory peak may take; an explicit budget
    is kept as given, and so is any budget on the CPU."""
    import types

    import knnkit.index.bang._engine as eng
    from knnkit._core import config

    fake = types.SimpleNamespace(
        cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(memGetInfo=lambda: (130 * 10 ** 9, 141 * 10 ** 9))),
        get_default_memory_pool=lambda: types.SimpleNamespace(free_bytes=lambda: 10 * 10 ** 9))
    monkeypatch.setattr(eng, "cupy_or_none", lambda: fake)
    monkeypatch.setitem(config._globals, "memory_budget", None)
    want = int(eng.BUILD_FREE_FRACTION * 140 * 10 ** 9 / eng.IN_MEMORY_PEAK_OVER_ESTIMATE)
    assert eng._build_budget(70 * 10 ** 9, "gpu") == want == 84 * 10 ** 9
    # 40M x 96 with K = 64 (71.7 GB by the estimate) now builds in GPU memory under the automatic budget
    assert eng.build_bytes(40 * 10 ** 6, 96, 64) <= want < eng.build_bytes(50 * 10 ** 6, 96, 64)
    assert eng._build_budget(100 * 10 ** 9, "gpu") == 100 * 10 ** 9  # a larger automatic budget stays
    assert eng._build_budget(70 * 10 ** 9, "cpu") == 70 * 10 ** 9
    monkeypatch.setitem(config._globals, "memory_budget", 70 * 10 ** 9)  # explicit: the user's word
    assert eng._build_budget(70 * 10 ** 9, "gpu") == 70 * 10 ** 9
    monkeypatch.setitem(config._globals, "memory_budget", None)
    monkeypatch.setattr(eng, "cupy_or_none", lambda: None)
    assert eng._build_budget(70 * 10 ** 9, "gpu") == 70 * 10 ** 9


def test_memmap_data_input(tmp_path, rng):
    X = rng.random((2000, 8), dtype=np.float32)
    path = os.path.join(tmp_path, "x.npy")
    np.save(path, X)
    mm = np.load(path, mmap_mode="r")
    index = knnkit.GraphIndex.build(mm, placement="host", device="cpu", random_state=0)
    _d, i = index.search(X[:30], k=5)
    assert _recall(X, X[:30], i, 5) >= 0.9


def test_out_of_core_candidates_from_memmap(tmp_path, rng, tiny_budget, monkeypatch):
    """A memory map of a whole .npy is read in place (no temporary copy); 7000 points under a tiny
    budget: 4 shards of 2048, pairwise merges; the index still finds its neighbours."""
    import knnkit.index.bang._engine as eng

    X = _host(make_clustered(7000, 12, random_state=int(rng.integers(1 << 30)), device="cpu"))
    path = os.path.join(tmp_path, "x.npy")
    np.save(path, X)
    seen = []
    real = eng._out_of_core_candidates

    def spy(a, *args, **kw):
        out = real(a, *args, **kw)
        seen.append(out[0].shape)
        return out

    writes = []
    real_open = np.lib.format.open_memmap
    monkeypatch.setattr(eng, "_out_of_core_candidates", spy)
    def open_spy(*a, **kw):
        if kw.get("mode", a[1] if len(a) > 1 else "r+") == "w+":
            writes.append(a)
        return real_open(*a, **kw)

    monkeypatch.setattr(np.lib.format, "open_memmap", open_spy)
    index = knnkit.GraphIndex.build(np.load(path, mmap_mode="r"), device="cpu", random_state=1)
    assert seen and seen[0][0] == 7000 and not writes  # no temporary copy of the data
    Q = X[:60] + 0.01
    _d, i = index.search(Q, k=10, beam=64)
    assert _recall(X, Q, i, 10) >= 0.9


def test_validation(rng):
    X = rng.random((300, 8), dtype=np.float32)
    with pytest.raises(ValueError, match="placement"):
        knnkit.GraphIndex.build(X, placement="disk", device="cpu")
    with pytest.raises(ValueError, match="compression"):
        knnkit.GraphIndex.build(X, placement="host", compression="sq", device="cpu")
    with pytest.raises(ValueError, match="pq_bytes"):
        knnkit.GraphIndex.build(X, placement="host", pq_bytes=9, device="cpu")
    with pytest.raises(ValueError, match="pq_bytes"):
        knnkit.GraphIndex.build(X, placement="host", pq_bytes=0, device="cpu")
    with pytest.raises(TypeError, match="pq_bytes"):
        knnkit.GraphIndex.build(X, placement="host", pq_bytes=2.5, device="cpu")
    with pytest.raises(ValueError, match="placement='host'"):
        knnkit.GraphIndex.build(X, placement="device", compression="pq", device="cpu")
    index = knnkit.GraphIndex.build(X, placement="host", device="cpu", random_state=0)
    with pytest.raises(ValueError, match="rerank"):
        index.search(X[:2], k=3, params=knnkit.index.SearchParams(rerank=0))
    with pytest.raises(TypeError, match="prefetch"):
        knnkit.index.SearchParams(prefetch="yes")
    with pytest.raises(ValueError, match="pipeline_batch"):
        knnkit.index.SearchParams(pipeline_batch=0)
    with pytest.raises(ValueError, match="extend"):
        index.extend(X[:3])


def test_host_float16_data(rng):
    """float16 vectors (a supported storage dtype) through host placement: the host gathers move
    their bits (Numba has no float16); results as exact as float32 data's."""
    X = rng.standard_normal((2500, 16)).astype(np.float16)
    Q = rng.standard_normal((40, 16)).astype(np.float16)
    index = knnkit.GraphIndex.build(X, placement="host", device="cpu", random_state=0)
    d, i = index.search(Q, k=10)
    assert _recall(X, Q, i, 10) >= 0.95
    want, _ = knnkit.knn(X, Q, k=10, device="cpu")
    np.testing.assert_allclose(np.sort(np.asarray(d), axis=1)[:, 0], want[:, 0], rtol=1e-5, atol=1e-6)


def test_host_large_k_default_beam(rng):
    """Host placement re-ranks what its PQ walk logged: with k near the default beam the re-rank has
    no slack (k = 100 at beam 64 read 0.91), so a search without a beam walks with >= 2k. A params
    object's beam (SearchParams defaults to 64) is a default too: raised, not refused; a beam given
    to the call below k is refused."""
    X = rng.standard_normal((3000, 16)).astype(np.float32)
    Q = rng.standard_normal((40, 16)).astype(np.float32)
    index = knnkit.GraphIndex.build(X, placement="host", device="cpu", random_state=0)
    _d, i = index.search(Q, k=100)
    assert _recall(X, Q, i, 100) >= 0.97
    _d, i = index.search(Q, k=100, params=knnkit.index.SearchParams(rerank=150))
    assert _recall(X, Q, i, 100) >= 0.97
    with pytest.raises(ValueError, match="beam=50 is smaller than k=100"):
        index.search(Q, k=100, beam=50)


# ------------------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["clustered", "uniform"])
def test_gpu_matches_cpu_path(kind, rng):
    seed = int(rng.integers(1 << 30))
    n, d, k = 20000, 32, 10
    make = make_clustered if kind == "clustered" else make_uniform
    X = _host(make(n + 500, d, random_state=seed, device="cpu"))
    X, Q = X[:n], X[n:]
    index = knnkit.GraphIndex.build(X, placement="host", device="gpu", random_state=seed)
    assert index.device == "gpu"
    _dc, ic = index.search(Q, k=k, beam=64, device="cpu")
    dg, ig = index.search(Q, k=k, beam=64)
    ig = np.asarray(ig.get() if hasattr(ig, "get") else ig)
    rc, rg = _recall(X, Q, ic, k), _recall(X, Q, ig, k)
    assert rg >= 0.9 and rg >= rc - 0.02, (rg, rc)
    assert (ig == ic).mean() >= 0.95  # same algorithm; PQ sums differ only in rounding order
    for kw in (dict(prefetch=False), dict(pipeline_batch=37), dict(pipeline_batch=10 ** 6)):
        _d2, i2 = index.search(Q, k=k, beam=64, params=knnkit.index.SearchParams(**kw))
        i2 = np.asarray(i2.get() if hasattr(i2, "get") else i2)
        assert (i2 == ig).mean() >= 0.99, kw


@pytest.mark.gpu
@pytest.mark.parametrize("d,pq_bytes,bits,smem", [(96, None, 32, True), (96, None, 16, True), (256, None, 16, True),
                                                  (512, 256, 32, False), (512, 256, 16, True), (512, 512, 16, False)])
def test_gpu_table_placements(d, pq_bytes, bits, smem, rng, monkeypatch):
    """One query's table in shared memory when it fits (opt-in past 48 KB, up to 200 KB), else in
    global memory. float32 (_pq.TABLE_BITS = 32) at d = 96: m = 48, exactly 48 KB (the opt-in
    edge); bfloat16 (the default) halves it: m = 256 is 128 KB (shared, opt-in) where float32 is
    256 KB (global); m = 512 is 256 KB in bfloat16 (global). The GPU walk agrees with the CPU twin."""
    from knnkit.index.bang import _pq
    from knnkit.index.bang._search_gpu import last_stats

    monkeypatch.setattr(_pq, "TABLE_BITS", bits)
    X = rng.random((5000, d), dtype=np.float32)
    Q = rng.random((64, d), dtype=np.float32)
    index = knnkit.GraphIndex.build(X, placement="host", device="gpu", random_state=0, pq_bytes=pq_bytes)
    _d, i = index.search(Q, k=10, beam=96)
    assert isinstance(i, np.ndarray)  # numpy in, numpy out
    assert last_stats()["table_in_smem"] == smem
    _dc, ic = index.search(Q, k=10, beam=96, device="cpu")
    assert (i == ic).mean() >= 0.95


def test_host_index_refuses_delete():
    import knnkit

    X = np.random.default_rng(0).random((3000, 16), dtype=np.float32)
    ix = knnkit.GraphIndex.build(X, device="cpu", placement="host", random_state=0)
    with pytest.raises(ValueError, match="delete"):
        ix.delete([1])
    assert ix.n_deleted == 0 and ix.search(X[:2], k=1)[1][:, 0].tolist() == [0, 1]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float16, np.uint8])
def test_gpu_host_storage_dtypes(dtype, rng):
    """float16 and uint8 vectors through the GPU walk under a tiny budget (stash re-rank: the host
    gathers move the rows' bits into pinned buffers, the device prepares them) and with the vectors
    on the device: both as exact as the CPU path."""
    X = _host(make_clustered(8500, 24, random_state=3, device="cpu"))
    if dtype == np.uint8:
        X = np.clip((X - X.min()) / (X.max() - X.min()) * 255, 0, 255)
    X = X.astype(dtype)
    X, Q = X[:8000], X[8000:]
    index = knnkit.GraphIndex.build(X, placement="host", device="gpu", random_state=3)
    _dc, ic = index.search(Q, k=10, device="cpu")
    for budget in (1 << 20, None):
        knnkit.set_memory_budget(budget)
        try:
            dg, ig = index.search(Q, k=10)
        finally:
            knnkit.set_memory_budget(None)
        ig = _host(ig)
        assert _recall(X, Q, ig, 10) >= max(0.9, _recall(X, Q, ic, 10) - 0.02), budget


@pytest.mark.gpu
def test_gpu_host_check_matches_cpu_reference(rng):
    """The build's walk check on the GPU: exact k-th distances streamed in chunks on the device
    equal the CPU's, and the recorded recall is high on easy data."""
    X = _host(make_clustered(6000, 24, random_state=7, device="cpu"))
    index = knnkit.GraphIndex.build(X, placement="host", device="gpu", random_state=7)
    chk = index.build_params["host_check"]
    assert chk["recall"][-1] >= 0.95
    rows = np.arange(0, 6000, 37)
    kg = index._engine.kth_distances(rows, 10, device="gpu", chunk=1000)
    kc = index._engine.kth_distances(rows, 10, device="cpu")
    np.testing.assert_allclose(kg, kc, rtol=1e-9, atol=1e-9)


def test_host_index_never_takes_the_gpu_top_tier(monkeypatch):
    """A host-placed index builds its graph without the GPU's densest automatic tier (each
    expanded list of its walk crosses PCIe): every SearchGraph.build it runs gets top_tier=False."""
    from knnkit.index import _engine

    seen = []
    real = _engine.SearchGraph.build.__func__

    def spy(cls, *args, **kwargs):
        seen.append(kwargs.get("top_tier", True))
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(_engine.SearchGraph, "build", classmethod(spy))
    X = make_uniform(3000, 16, random_state=5, device="cpu")
    knnkit.GraphIndex.build(X, placement="host", device="cpu", random_state=0)
    assert seen == [False]


def test_host_build_disk_refused_before_the_copy(rng, monkeypatch, tmp_path):
    """The out-of-core lists of a host-placed build are refused before the data is copied when
    the temporary folder's disk cannot hold them (with the advice), not after hours."""
    import errno
    import shutil
    import tempfile
    from collections import namedtuple

    import knnkit.index.bang._engine as eng

    X = _host(make_clustered(6000, 8, random_state=int(rng.integers(1 << 30)), device="cpu"))
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(10 ** 9, 10 ** 9 - 10 ** 6, 10 ** 6))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(OSError, match="TMPDIR.*memory map of its file") as e:
        eng._out_of_core_candidates(X, "sqeuclidean", 16, 1 << 20, "cpu", 0, shard=2500)
    assert e.value.errno == errno.ENOSPC and "a copy of the data" in str(e.value)
    assert not any(os.scandir(tmp_path))  # no copy left behind, no work folder


def test_gpu_decision_uses_the_resolved_candidates(rng, monkeypatch):
    """On the GPU the automatic parameters are chosen before the build decides between GPU memory
    and the out-of-core lists, with the GPU's tiers (K = 64 at low intrinsic dimension), so a
    budget that holds the K = 64 build keeps it in GPU memory (it sent 50M x 96 out of core with
    the K = 96 it assumed). The estimate is the same as on the whole prepared array. (A fake
    device: the estimate runs on the CPU.)"""
    import knnkit.graph._estimate as est
    import knnkit.index.bang._engine as eng
    from knnkit._core.metrics import prepare_vectors
    from knnkit.index._auto import estimate_intrinsic_dim

    X = _host(make_clustered(6000, 16, random_state=int(rng.integers(1 << 30)), device="cpu"))
    real = est.estimate_intrinsic_dim_rows
    monkeypatch.setattr(est, "estimate_intrinsic_dim_rows", lambda *a, **k: real(*a, **dict(k, device="cpu")))
    lids = est.estimate_intrinsic_dim_rows(X, "sqeuclidean", 1.0, random_state=5, scales=(5, 20), chunk_bytes=10_000)
    whole = estimate_intrinsic_dim(prepare_vectors(X, "sqeuclidean"), random_state=5, scales=(5, 20))
    np.testing.assert_allclose(lids, whole, rtol=1e-4)
    bp = dict(graph_degree=None, intermediate_degree=None, alpha=None, build_algo="nndescent", diversify="prune",
              n_entry=16, repair=True, entry="kmeans", random_state=0)
    where = []
    monkeypatch.setattr(eng, "_graph_in_gpu_memory", lambda a, m, b, r, s: where.append("gpu") or (None, None, {}))
    monkeypatch.setattr(eng, "_out_of_core_candidates", lambda *a, **k: where.append("ooc") or 1 / 0)
    monkeypatch.setattr(eng, "_build_budget", lambda b, dev: b)
    budget = eng.build_bytes(6000, 16, 64)
    assert budget < eng.build_bytes(6000, 16, 96)
    graph, entry, timings = eng._build_graph(X, "sqeuclidean", bp, 5, 1.0, "gpu", budget)
    assert where == ["gpu"] and timings["prepare_auto"] > 0
    assert (bp["graph_degree"], bp["intermediate_degree"], bp["alpha"]) == (32, 64, 1.1)
    assert bp["intrinsic_dim"] == round(lids[1], 2)


@pytest.mark.gpu
def test_gpu_resolved_parameters_match_the_in_memory_build(rng, monkeypatch):
    """The parameters a GPU host build chooses before deciding where to build (intrinsic dimension
    of host rows searched chunk by chunk on the device) are the ones the in-memory GPU build chooses
    on the whole array."""
    import cupy as cp

    import knnkit.index.bang._engine as eng
    from knnkit.index import SearchGraph

    monkeypatch.setattr(eng, "_LID_CHUNK_BYTES", 1 << 20)  # 10 chunks
    for seed, d in ((3, 24), (4, 96)):
        X = _host(make_clustered(30000, d, random_state=seed, device="cpu"))
        auto = dict(graph_degree=None, intermediate_degree=None, alpha=None, build_algo="nndescent",
                    diversify="prune", n_entry=64, repair=True, entry="kmeans", random_state=seed)
        first, built = dict(auto), dict(auto)
        assert eng._resolve_params(X, "sqeuclidean", first, seed, 1.0, "gpu") > 0
        SearchGraph.build(cp.asarray(X), "sqeuclidean", built, seed, top_tier=False)
        for key in ("graph_degree", "intermediate_degree", "alpha"):
            assert first[key] == built[key], (d, key)
        assert abs(first["intrinsic_dim"] - built["intrinsic_dim"]) <= 0.02


@pytest.mark.gpu
def test_gpu_in_memory_build_out_of_memory_falls_back(rng, monkeypatch):
    """A real CuPy out-of-memory error in the in-memory GPU build (let through by the automatic build
    budget) is caught, and the lists are built out of core on the device under the shared budget."""
    import cupy as cp

    import knnkit.index.bang._engine as eng

    X = _host(make_clustered(12000, 16, random_state=int(rng.integers(1 << 30)), device="cpu"))
    real, tried = eng.SearchGraph.build, []

    def build(a, *args, candidates=None, **kw):
        if candidates is None:
            tried.append(type(a).__module__)
            cp.empty(1 << 50, dtype=cp.uint8)  # more than any device: CuPy's OutOfMemoryError
        return real(a, *args, candidates=candidates, **kw)

    monkeypatch.setattr(eng.SearchGraph, "build", build)
    bp = dict(graph_degree=16, intermediate_degree=32, alpha=1.1, build_algo="nndescent", diversify="prune",
              n_entry=32, repair=True, entry="kmeans", random_state=0)
    need = eng.build_bytes(12000, 16, 32)
    monkeypatch.setattr(eng, "_build_budget", lambda b, dev: 10 * need)
    graph, entry, timings = eng._build_graph(X, "sqeuclidean", bp, 0, 1.0, "gpu", need // 2)
    assert tried and tried[0].startswith("cupy") and "candidates_out_of_core" in timings
    assert graph.shape == (12000, 16) and (graph >= 0).sum(axis=1).min() >= 1
    # the pruned graph keeps each row's nearest neighbour (its first candidate) where the lists found it
    Xf = X.astype(np.float64)
    d2 = ((Xf[:300, None, :] - Xf[None, :, :]) ** 2).sum(-1)
    d2[np.arange(300), np.arange(300)] = np.inf
    nearest = d2.argmin(axis=1)
    assert np.mean([nearest[r] in graph[r] for r in range(300)]) >= 0.9
