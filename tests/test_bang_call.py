"""BANG per-call costs (issue 16): the GPU search's re-rank paths ("stash": candidate vectors
gathered with the neighbour rows during the walk; "device": vectors on the GPU; "host": pinned
chunks after the walk), the cached per-call buffers, the fused PQ tables and the per-phase profile
must give the same ids and distances as the v2 path (``configure(legacy=True)``).

CPU: the helpers against plain NumPy, and the whole GPU driver over a NumPy stand-in for CuPy whose
kernels are emulated from ``bang.cu`` (``_bang_fake_gpu.py``): new paths = legacy path = CPU twin,
exactly. GPU (marker ``gpu``): the real thing, new against legacy, bit for bit."""

import itertools

import numpy as np
import pytest

import knnkit
from knnkit.datasets import make_clustered
from knnkit.index.bang import _search_gpu as sg
from knnkit.index.bang._pq import pq_tables
from knnkit.index.bang._search_cpu import gather_rows, gather_walk, search_pq_cpu

from _bang_fake_gpu import dev, install


def _host(a):
    a = a[0] if isinstance(a, tuple) else a
    return np.asarray(a.get() if hasattr(a, "get") else a)


# ------------------------------------------------------------------------------------------ helpers
def test_gather_walk_counts_slots_and_packs(rng):
    n, R, d, W, S = 50, 4, 3, 3, 5
    graph = rng.integers(0, n, (n, R)).astype(np.int32)
    data = rng.random((n, d), dtype=np.float32)
    cand = np.array([[1, 2, -1], [-1, -1, -1], [3, 4, 5], [6, -1, -1]], np.int32)
    count = np.array([0, 7, 4, 5], np.int32)  # query 2: positions 4, 5, 6 -> only 4 < S
    nb = cand.shape[0]
    nbr = np.empty((nb * W, R), np.int32)
    vec = np.full((nb * W, d), -9, np.float32)
    dst = np.full(nb * W, -9, np.int32)
    off = np.empty(nb + 1, np.int32)
    valid, kept = gather_walk(graph, data, cand.reshape(-1), W, S, count, nbr, vec, dst, True, off)
    assert (valid, kept) == (6, 3)
    np.testing.assert_array_equal(count, [2, 7, 7, 6])
    for i, c in enumerate(cand.reshape(-1)):
        np.testing.assert_array_equal(nbr[i], graph[c] if c >= 0 else -1)
    np.testing.assert_array_equal(dst[:3], [0 * S + 0, 0 * S + 1, 2 * S + 4])
    np.testing.assert_array_equal(vec[:3], data[[1, 2, 3]])
    # without the stash: rows and counts only
    count2 = np.zeros(nb, np.int32)
    valid, kept = gather_walk(graph, np.zeros((1, 1), np.float32), cand.reshape(-1), W, 0, count2, nbr,
                              np.zeros((1, 1), np.float32), np.zeros(1, np.int32), False, off)
    assert (valid, kept) == (6, 0)
    np.testing.assert_array_equal(count2, [2, 0, 3, 1])


def _random_logs(rng, nb, max_iters, ties=True):
    n_exp = rng.integers(0, max_iters // 2, nb)
    log_ids = np.full((nb, max_iters), -1, np.int32)
    log_d = np.full((nb, max_iters), np.inf, np.float32)
    for q in range(nb):
        e = int(n_exp[q])
        log_ids[q, :e] = rng.choice(10 ** 6, e, replace=False)
        vals = rng.integers(0, 6, e) if ties else rng.random(e)  # many equal PQ distances
        log_d[q, :e] = vals.astype(np.float32)
    return log_ids, log_d, n_exp


@pytest.mark.parametrize("rr", [1, 7, 40])
def test_rerank_plan_is_the_full_log_sort(rr, rng):
    log_ids, log_d, n_exp = _random_logs(rng, 30, 64)
    order = np.argsort(log_d, axis=1, kind="stable")[:, :rr]  # v2: the whole log
    want = np.take_along_axis(log_ids, order, axis=1)
    C = int(n_exp.max())
    for c in (C, C + 3, 64):
        cand, pos = sg.rerank_plan(np, log_ids, log_d, rr, c)
        np.testing.assert_array_equal(cand, want)
        ok = cand >= 0
        np.testing.assert_array_equal(pos[ok], order[ok])


def test_rows_from_slots_and_device_match_the_host_gather(rng):
    n, d, nb, max_iters, rr, S = 1000, 6, 20, 48, 16, 12
    data = rng.random((n, d), dtype=np.float32)
    log_ids, log_d, n_exp = _random_logs(rng, nb, max_iters, ties=False)
    log_ids[log_ids >= 0] %= n
    cand, pos = sg.rerank_plan(np, log_ids, log_d, rr, max_iters)
    want = gather_rows(data, cand)  # v2 (zero rows for -1)
    slots = np.zeros((nb * S, d), np.float32)
    for q in range(nb):  # what the stash holds: the first S expansions' vectors
        for p in range(min(S, int(n_exp[q]))):
            slots[q * S + p] = data[log_ids[q, p]]
    rows, missing = sg.rows_from_slots(np, slots, S, cand, pos)
    np.testing.assert_array_equal(missing, (cand >= 0) & (pos >= S))
    assert missing.any() and (~missing & (cand >= 0)).any()
    fixed = rows.copy()
    where = np.nonzero(missing.reshape(-1))[0]
    fixed[where] = gather_rows(data, cand.reshape(-1)[where])
    np.testing.assert_array_equal(fixed, want)
    np.testing.assert_array_equal(sg.rows_from_device(np, data, cand), want)


# ------------------------------------------------------------------------- the driver on a fake GPU
@pytest.fixture
def small():
    X = _host(make_clustered(2400 + 40, 16, random_state=3, device="cpu"))
    X, Q = X[:2400], X[2400:]
    index = knnkit.GraphIndex.build(X, placement="host", device="cpu", random_state=3, pq_bytes=8)
    return index, Q


def _fake_search(monkeypatch, index, Q, k=5, L=24, W=4, rerank=None, prefetch=True, pipeline_batch=None,
                 access="gather", **kw):
    """The GPU driver on the fake GPU; ``access``: the host gather (BANG's walk, what most of these
    tests check) unless asked otherwise."""
    install(monkeypatch)
    monkeypatch.setitem(sg._cfg, "access", access)
    e = index._engine
    max_iters = 8 * L
    rr = max(k, min(rerank or L, max_iters))
    return sg.search_host_gpu(e, dev(Q), k, codes=dev(e._codes), codebook=dev(e._codebook), entry=e._entry, L=L,
                              max_iters=max_iters, n_seeds=4, rerank=rr, prefetch=prefetch,
                              pipeline_batch=pipeline_batch, width=W, **kw)


@pytest.mark.parametrize("W,prefetch,pb", [(1, True, None), (4, True, 13), (4, False, None), (8, False, 7)])
def test_fake_gpu_new_paths_equal_legacy_and_cpu(W, prefetch, pb, small, monkeypatch):
    index, Q = small
    e = index._engine
    L, k = 24, 5
    dl, il = _fake_search(monkeypatch, index, Q, k, L, W, prefetch=prefetch, pipeline_batch=pb, legacy=True)
    assert sg.last_stats()["rerank_mode"] == "legacy"
    dn, i_n = _fake_search(monkeypatch, index, Q, k, L, W, prefetch=prefetch, pipeline_batch=pb)
    st = sg.last_stats()
    assert st["rerank_mode"] == "stash" and st["rerank_fallback_rows"] == 0 and st["host_gather_vec_rows"] > 0
    np.testing.assert_array_equal(i_n, il)
    np.testing.assert_array_equal(dn, dl)
    # the same walk as the CPU twin (the emulated kernels add PQ terms in the same order)
    dc, ic = e.search(Q, k, beam=L, max_iters=8 * L, n_seeds=4, device="cpu", search_width=W)
    np.testing.assert_array_equal(i_n, ic)
    np.testing.assert_allclose(dn, dc, rtol=1e-6, atol=1e-6)


def test_fake_gpu_logs_and_counts_equal_the_cpu_twin(small, monkeypatch):
    index, Q = small
    e = index._engine
    L, W = 24, 4
    _fake_search(monkeypatch, index, Q, 5, L, W, pipeline_batch=len(Q))
    (b,) = e._bang_ws["batches"]
    T = pq_tables(e.pq_queries(Q), e._codebook, e.pq_metric)
    li, ld, ne = search_pq_cpu(e._graph, e._codes, T, e._entry.seeds_for(Q, 4), L=L, max_iters=8 * L, width=W)
    np.testing.assert_array_equal(_host(b.log_ids), li)
    np.testing.assert_array_equal(_host(b.n_exp), ne)
    np.testing.assert_array_equal(b.count, ne)  # the host's count of expansions is the GPU's


def test_fake_gpu_fallback_device_and_host_modes(small, monkeypatch):
    index, Q = small
    e = index._engine
    L, k = 24, 5
    dl, il = _fake_search(monkeypatch, index, Q, k, L, legacy=True)
    monkeypatch.setattr(sg, "stash_slots", lambda *a: 9)  # most re-rank rows past the slots
    d1, i1 = _fake_search(monkeypatch, index, Q, k, L)
    st = sg.last_stats()
    assert st["rerank_mode"] == "stash" and st["stash_slots"] == 9 and st["rerank_fallback_rows"] > 0
    np.testing.assert_array_equal(i1, il)
    np.testing.assert_array_equal(d1, dl)
    monkeypatch.setattr(type(e), "_rerank_data_gpu", lambda self: dev(self._data))
    d2, i2 = _fake_search(monkeypatch, index, Q, k, L)
    assert sg.last_stats()["rerank_mode"] == "device"
    np.testing.assert_array_equal(i2, il)
    np.testing.assert_array_equal(d2, dl)
    monkeypatch.setattr(type(e), "_rerank_data_gpu", lambda self: None)
    monkeypatch.setattr(sg, "UPLOAD_CHUNK_BYTES", 1000)  # many pinned chunks in turn
    dl3, il3 = _fake_search(monkeypatch, index, Q, k, L, rerank=k, legacy=True)
    d3, i3 = _fake_search(monkeypatch, index, Q, k, L, rerank=k)
    assert sg.last_stats()["rerank_mode"] == "host"
    np.testing.assert_array_equal(i3, il3)
    np.testing.assert_array_equal(d3, dl3)


def test_fake_gpu_workspace_reuse(small, monkeypatch):
    index, Q = small
    e = index._engine
    d0, i0 = _fake_search(monkeypatch, index, Q)
    assert not sg.last_stats()["workspace_reused"]
    ws = e._bang_ws
    d1, i1 = _fake_search(monkeypatch, index, Q)
    assert sg.last_stats()["workspace_reused"] and e._bang_ws is ws and not ws["busy"]
    np.testing.assert_array_equal(i1, i0)
    np.testing.assert_array_equal(d1, d0)
    d2, i2 = _fake_search(monkeypatch, index, Q[:9])  # fewer queries: views of the same buffers
    assert sg.last_stats()["workspace_reused"]
    np.testing.assert_array_equal(i2, i0[:9])
    np.testing.assert_array_equal(d2, d0[:9])
    ws["busy"] = True  # a call in flight elsewhere: this one gets buffers of its own
    d3, i3 = _fake_search(monkeypatch, index, Q)
    assert not sg.last_stats()["workspace_reused"] and e._bang_ws is ws
    np.testing.assert_array_equal(i3, i0)
    ws["busy"] = False
    _fake_search(monkeypatch, index, Q, L=32)  # another shape: replaced
    assert not sg.last_stats()["workspace_reused"] and e._bang_ws is not ws
    e.release_gpu_buffers()
    assert e._bang_ws is None


def test_fake_gpu_calls_bounded_by_the_memory_budget(small, monkeypatch):
    """Under a budget that leaves room for few queries' search state beside the codes, the walk
    takes the queries in several consecutive calls (last_stats()["calls"]) with the same answers as
    one call; without a budget (the fake has no GPU: 0) it is one call."""
    index, Q = small
    e = index._engine
    monkeypatch.setattr(type(e), "_rerank_data_gpu", lambda self: None)  # (the vectors stay on the host)
    d0, i0 = _fake_search(monkeypatch, index, Q, W=4, pipeline_batch=3)
    assert sg.last_stats()["calls"] == 1
    monkeypatch.setattr(sg, "MIN_CALL_QUERIES", 7)
    try:
        knnkit.set_memory_budget(int(e._codes.nbytes + e._codebook.nbytes) + 1000)  # less than one query's state
        d1, i1 = _fake_search(monkeypatch, index, Q, W=4, pipeline_batch=3)
        assert sg.last_stats()["calls"] == -(-len(Q) // 7)
        np.testing.assert_array_equal(i1, i0)
        np.testing.assert_array_equal(d1, d0)
        per = sg.batch_bytes_per_query(L=24, R=e._graph.shape[1], W=4, max_iters=8 * 24, s=4, m=e._codes.shape[1],
                                       ksub=e._codebook.shape[1], S=sg.stash_slots(24, 4, 24, 8 * 24),
                                       d=e._data.shape[1], itemsize=e._data.dtype.itemsize)
        # the estimate is what a batch allocates on the device
        b = e._bang_ws["batches"][0]
        assert b.nbytes == b.cap * per
        call = sg.call_bytes_per_query(s=4, d=e._data.shape[1], m=e._codes.shape[1], dsub=e._codebook.shape[2],
                                       n_entry=len(e._entry), walk_tables=False)
        knnkit.set_memory_budget(int(e._codes.nbytes + e._codebook.nbytes) + 20 * (per + call + 24 * (16 * 8 + 12)))
        d2, i2 = _fake_search(monkeypatch, index, Q, W=4, pipeline_batch=3)
        assert sg.last_stats()["calls"] == -(-len(Q) // 20)
        np.testing.assert_array_equal(i2, i0)
    finally:
        knnkit.set_memory_budget(None)


def test_fake_gpu_seed_selection_by_the_budget(small, monkeypatch):
    """The seed GEMM's (nq, n_entry) products are counted in a call's memory: where they would cost
    a call the seeds are selected "direct" (no products) and the queries still go in one call,
    unless the index has more entry points than "direct" is worth (then by GEMM in more calls);
    where they fit, or without a budget, by GEMM ("auto")."""
    index, Q = small
    e = index._engine
    monkeypatch.setattr(type(e), "_rerank_data_gpu", lambda self: None)
    monkeypatch.setattr(sg, "MIN_CALL_QUERIES", 1)
    d0, i0 = _fake_search(monkeypatch, index, Q, W=4)
    assert sg.last_stats()["seed_method"] == "auto" and sg.last_stats()["calls"] == 1
    L, W, R, d = 24, 4, e._graph.shape[1], e._data.shape[1]
    m, ksub, s = e._codes.shape[1], e._codebook.shape[1], 4
    per = (sg.batch_bytes_per_query(L=L, R=R, W=W, max_iters=8 * L, s=s, m=m, ksub=ksub,
                                    S=sg.stash_slots(L, W, L, 8 * L), d=d, itemsize=4)
           + sg.rerank_bytes_per_query(rerank=L, d=d, itemsize=4, mode="stash"))
    call = dict(s=s, d=d, m=m, dsub=e._codebook.shape[2], n_entry=len(e._entry), walk_tables=False)
    direct, gemm = (per + sg.call_bytes_per_query(**call, seed_gemm=g) for g in (False, True))
    assert gemm - direct == 4 * len(e._entry)
    base = int(e._codes.nbytes + e._codebook.nbytes)
    try:
        knnkit.set_memory_budget(base + len(Q) * direct + (gemm - direct))  # all queries fit, not their products
        d1, i1 = _fake_search(monkeypatch, index, Q, W=4)
        assert sg.last_stats()["seed_method"] == "direct" and sg.last_stats()["calls"] == 1
        monkeypatch.setattr(sg, "SEED_DIRECT_MIN_BLOCK_QUERIES", 16)  # more than a block serves: not "direct"
        d3, i3 = _fake_search(monkeypatch, index, Q, W=4)
        assert sg.last_stats()["seed_method"] == "auto" and sg.last_stats()["calls"] == 2
        knnkit.set_memory_budget(base + len(Q) * gemm)
        d2, i2 = _fake_search(monkeypatch, index, Q, W=4)
        assert sg.last_stats()["seed_method"] == "auto" and sg.last_stats()["calls"] == 1
    finally:
        knnkit.set_memory_budget(None)
    for dd, ii in ((d1, i1), (d2, i2), (d3, i3)):
        np.testing.assert_array_equal(ii, i0)
        np.testing.assert_array_equal(dd, d0)


def test_fake_gpu_out_of_memory_retries_smaller(small, monkeypatch):
    """A CUDA out-of-memory in a call gives back the kept buffers and walks again with half as many
    queries per call (same answers); one that persists down to one query raises MemoryError."""
    from _bang_fake_gpu import FakeOutOfMemory

    index, Q = small
    e = index._engine
    d0, i0 = _fake_search(monkeypatch, index, Q, W=4)
    real = sg._search_call
    sizes, released = [], []
    monkeypatch.setattr(type(e), "release_gpu_buffers", lambda self: released.append(1))

    def tight(engine, q, *a, **kw):
        sizes.append(q.shape[0])
        if q.shape[0] > len(Q) // 4:
            raise FakeOutOfMemory("out of memory")
        return real(engine, q, *a, **kw)

    monkeypatch.setattr(sg, "_search_call", tight)
    d1, i1 = _fake_search(monkeypatch, index, Q, W=4)
    assert sizes[0] == len(Q) and max(sizes[-sg.last_stats()["calls"]:]) <= len(Q) // 4 and released
    np.testing.assert_array_equal(i1, i0)
    np.testing.assert_array_equal(d1, d0)

    def never(engine, q, *a, **kw):
        raise FakeOutOfMemory("out of memory")

    monkeypatch.setattr(sg, "_search_call", never)
    with pytest.raises(MemoryError, match="host-placed search"):
        _fake_search(monkeypatch, index, Q, W=4)


@pytest.mark.parametrize("legacy", [False, True])
def test_fake_gpu_profile_stats(legacy, small, monkeypatch):
    index, Q = small
    _fake_search(monkeypatch, index, Q, legacy=legacy, profile=True)
    st = sg.last_stats()
    assert {"setup", "walk", "rerank", "total"} <= set(st["phases"])
    assert {"tables", "seeds", "distances", "merge", "d2h_cand", "h2d_nbr"} <= set(st["gpu_s"])
    if not legacy:
        assert {"reset", "h2d_vec", "stash", "rerank_rows", "rerank_exact"} <= set(st["gpu_s"])
    assert st["launches"] > 0 and st["h2d_bytes"] > 0 and st["host_syncs"] > st["iterations"]
    _fake_search(monkeypatch, index, Q, legacy=legacy)
    assert "phases" not in sg.last_stats()


def _awkward_keys(rng, nb, ld):
    """float32 rows with many ties, -0 beside +0, infinities and NaNs (both signs)."""
    a = rng.integers(0, 5, (nb, ld)).astype(np.float32)
    a[rng.random((nb, ld)) < 0.1] = -0.0
    a[rng.random((nb, ld)) < 0.05] = np.inf
    a[rng.random((nb, ld)) < 0.05] = -np.inf
    a[rng.random((nb, ld)) < 0.05] = np.nan
    a[rng.random((nb, ld)) < 0.03] = -np.nan
    a[:, ::7] += rng.random((nb, (ld + 6) // 7)).astype(np.float32)
    return a


def test_row_argsort_keys_are_the_stable_order(rng):
    """The kernel's 64-bit keys sort exactly as a stable argsort orders the row (CuPy's and
    NumPy's kind="stable": -0 equal to +0, every NaN last, ties by column)."""
    from _bang_fake_gpu import order_keys

    a = _awkward_keys(rng, 40, 97)
    for row in a:
        got = (np.sort(order_keys(row, np.arange(row.size))) & np.uint64(0xFFFFFFFF)).astype(np.int64)
        np.testing.assert_array_equal(got, np.argsort(row, kind="stable"))


def test_configure_round_trip():
    old = sg.configure(profile=True, legacy=True, rerank_mode="host")
    try:
        assert sg._cfg == {"profile": True, "legacy": True, "rerank_mode": "host",
                           "rerank_kernels": old["rerank_kernels"], "access": old["access"],
                           "mapped_chunk": old["mapped_chunk"], "mapped_memory": old["mapped_memory"],
                           "fused_walk": old["fused_walk"], "walk_tables": old["walk_tables"]}
        with pytest.raises(ValueError, match="rerank_mode"):
            sg.configure(rerank_mode="disk")
        with pytest.raises(ValueError, match="access"):
            sg.configure(access="zero-copy")
        with pytest.raises(ValueError, match="mapped_memory"):
            sg.configure(mapped_memory="unified")
        for bad in (0, 2.0, True, "4"):
            with pytest.raises(ValueError, match="mapped_chunk"):
                sg.configure(mapped_chunk=bad)
        for bad in (0, 1, "yes"):
            with pytest.raises(ValueError, match="fused_walk"):
                sg.configure(fused_walk=bad)
        sg.configure(fused_walk=False)
        assert sg._cfg["fused_walk"] is False
        for bad in (0, 1, "yes"):
            with pytest.raises(ValueError, match="walk_tables"):
                sg.configure(walk_tables=bad)
        sg.configure(walk_tables=False)
        assert sg._cfg["walk_tables"] is False
    finally:
        sg.configure(**old)
    assert sg._cfg == old


def test_fake_gpu_forced_modes(small, monkeypatch):
    index, Q = small
    dl, il = _fake_search(monkeypatch, index, Q, legacy=True)
    for forced, rerank, want in (("host", None, "host"), ("stash", 5, "stash"), (None, 5, "host")):
        monkeypatch.setitem(sg._cfg, "rerank_mode", forced)
        d, i = _fake_search(monkeypatch, index, Q, rerank=rerank)
        assert sg.last_stats()["rerank_mode"] == want
        if rerank is None:
            np.testing.assert_array_equal(i, il)
            np.testing.assert_array_equal(d, dl)


# ----------------------------------------------------------------------- mapped access (fake GPU)
def test_whole_refuses_views_of_larger_arrays(tmp_path):
    """Registration pins exactly an array's bytes; a view of a larger array is copied instead (a
    copy from memory partly registered fails in CUDA)."""
    X = np.zeros((100, 8), np.float32)
    assert sg._whole(X) and sg._whole(np.asarray(X)) and sg._whole(X.reshape(-1))
    assert not sg._whole(X[:50]) and not sg._whole(X[10:])
    np.save(tmp_path / "x.npy", X)
    Xm = np.load(tmp_path / "x.npy", mmap_mode="r")
    assert sg._whole(Xm) and sg._whole(np.asarray(Xm)) and not sg._whole(np.asarray(Xm)[1:])


@pytest.mark.parametrize("W,prefetch,pb,chunk,fused,walk_tables",
                         [(1, True, None, 4, True, True), (4, True, 13, 1, False, True),
                          (4, False, None, 3, False, True), (4, True, None, 4, True, False),
                          (4, True, None, 4, True, True), (8, False, 7, 16, True, True)])
def test_fake_gpu_mapped_equals_gather_and_cpu(W, prefetch, pb, chunk, fused, walk_tables, small, monkeypatch):
    """access="mapped": the kernels read the graph rows and the re-rank rows from the mapped host
    arrays, the host only queues the fused walk (one launch per batch; its blocks making their
    tables, or the tables made first) or chunks of steps; same ids and distances as the host gather
    and the CPU twin, logs equal to the twin's, whatever the chunk (steps past the end change
    nothing)."""
    index, Q = small
    e = index._engine
    L, k = 24, 5
    dg, ig = _fake_search(monkeypatch, index, Q, k, L, W, prefetch=prefetch, pipeline_batch=pb)
    assert sg.last_stats()["access"] == "gather"
    monkeypatch.setitem(sg._cfg, "mapped_chunk", chunk)
    monkeypatch.setitem(sg._cfg, "fused_walk", fused)
    monkeypatch.setitem(sg._cfg, "walk_tables", walk_tables)
    dm, im = _fake_search(monkeypatch, index, Q, k, L, W, prefetch=prefetch, pipeline_batch=pb, access="auto")
    st = sg.last_stats()
    assert st["access"] == "mapped" and st["rerank_mode"] == "mapped" and st["host_gather_rows"] == 0
    assert st["fused_walk"] is fused
    b0 = e._bang_ws["batches"][0]
    if fused:  # the step kernels' state is not allocated; nor the tables when the blocks make them
        assert st["walk_plan"]["table_in_walk"] is walk_tables and b0._wl_ids is None and b0._nbr_dev is None
        assert (b0._T is None) is walk_tables
    if fused:  # one launch per batch, plus the re-rank's (which writes the call's results in place)
        assert st["launches"] == st["batches"] and st["host_syncs"] <= 1 + st["batches"]
        assert st["results_in_place"] and st["iterations"] >= 1 and st["expansions_mean"] >= 1
    assert st["h2d_bytes"] == 0 and st["stash_slots"] == 0
    np.testing.assert_array_equal(im, ig)
    np.testing.assert_array_equal(dm, dg)
    if pb is None:  # two batches: their logs against the twin's
        T = pq_tables(e.pq_queries(Q), e._codebook, e.pq_metric)
        li, _ld, ne = search_pq_cpu(e._graph, e._codes, T, e._entry.seeds_for(Q, 4), L=L, max_iters=8 * L, width=W)
        s0 = 0
        for b in e._bang_ws["batches"]:
            np.testing.assert_array_equal(_host(b.log_ids), li[s0:s0 + b.nq])
            np.testing.assert_array_equal(_host(b.n_exp), ne[s0:s0 + b.nq])
            s0 += b.nq
    # a short re-rank, and the vectors' device copy: the graph still mapped
    dg2, ig2 = _fake_search(monkeypatch, index, Q, k, L, W, rerank=k)
    dm2, im2 = _fake_search(monkeypatch, index, Q, k, L, W, rerank=k, access="mapped")
    np.testing.assert_array_equal(im2, ig2)
    np.testing.assert_array_equal(dm2, dg2)
    monkeypatch.setattr(type(e), "_rerank_data_gpu", lambda self: dev(self._data))
    dm3, im3 = _fake_search(monkeypatch, index, Q, k, L, W, access="mapped")
    assert sg.last_stats()["rerank_mode"] == "device" and sg.last_stats()["access"] == "mapped"
    np.testing.assert_array_equal(im3, ig)
    np.testing.assert_array_equal(dm3, dg)


def test_fake_gpu_wide_vectors_rerank_by_rows(small, monkeypatch):
    """Vectors wider than ``bang_rerank_exact`` takes (its query in shared memory) are re-ranked
    from gathered rows by einsum: the same answers, and their rows counted in a call's memory."""
    index, Q = small
    e = index._engine
    dm, im = _fake_search(monkeypatch, index, Q, access="mapped")
    d = e._data.shape[1]
    narrow = sg.rerank_bytes_per_query(rerank=24, d=d, itemsize=4, mode="mapped")
    monkeypatch.setattr(sg, "RERANK_EXACT_MAX_DIM", d - 1)
    assert sg.rerank_bytes_per_query(rerank=24, d=d, itemsize=4, mode="mapped") == narrow + 24 * d * 8
    dw, iw = _fake_search(monkeypatch, index, Q, access="mapped")
    np.testing.assert_array_equal(iw, im)
    np.testing.assert_array_equal(dw, dm)
    import cupy  # the fake

    with pytest.raises(ValueError, match="dimensions"):
        sg.rerank_exact_gpu(cupy, dev(Q), dev(e._data), dev(np.zeros((len(Q), 3), np.int32)), by_id=True,
                            metric="sqeuclidean", scale=1.0)


def test_walk_plan_shared_memory(monkeypatch):
    """``bang_walk``'s shared memory: table, staged code rows and Bloom filter in turn while they fit
    their limits; None (the step kernels) when the list and scratch alone do not fit."""
    install(monkeypatch)
    size = dict(L=32, W=4, R=32, s=8, m=48)
    base = sg.walk_shared_bytes(**size, tbytes=0, stage=False, bloom_words=0)
    assert base == 16 * 32 + 24 * 128 + 4 * 256 + 2 * 32
    assert sg.walk_shared_bytes(**size, tbytes=24576, stage=True, bloom_words=2048) == base + 24576 + 128 * 48 + 8192
    t, stage, b, need = sg._walk_plan(**size, tbytes=24576, bloom_words=2048, use_smem=True)
    assert t and stage and b and need == base + 24576 + 6144 + 8192
    monkeypatch.setattr(sg, "WALK_BLOOM_SMEM_MAX", 32 * 1024)
    monkeypatch.setattr(sg, "_walk_fit", {})
    assert sg._walk_plan(**size, tbytes=24576, bloom_words=2048, use_smem=True)[1:3] == (True, False)
    monkeypatch.setattr(sg, "WALK_STAGE_SMEM_MAX", 16 * 1024)
    monkeypatch.setattr(sg, "_walk_fit", {})  # decided once per sizes: the limits are constants
    assert sg._walk_plan(**size, tbytes=24576, bloom_words=2048, use_smem=True)[:3] == (True, False, False)
    assert sg._walk_plan(**size, tbytes=24576, bloom_words=2048, use_smem=False)[:3] == (False, True, True)
    assert sg._walk_plan(L=32, W=64, R=1024, s=8, m=48, tbytes=24576, bloom_words=2048, use_smem=True) is None


def test_fake_gpu_mapped_unavailable_falls_back(small, monkeypatch, caplog):
    index, Q = small
    dg, ig = _fake_search(monkeypatch, index, Q)
    monkeypatch.setitem(sg._cfg, "access", "mapped")

    def refuse(cp, arrays, memory="pinned"):
        raise RuntimeError("no registration here")

    install(monkeypatch)
    monkeypatch.setattr(sg, "_map_arrays", refuse)
    index._engine._bang_mapped = None
    e = index._engine
    with caplog.at_level("INFO", logger="knnkit"):
        dm, im = sg.search_host_gpu(e, dev(Q), 5, codes=dev(e._codes), codebook=dev(e._codebook), entry=e._entry,
                                    L=24, max_iters=192, n_seeds=4, rerank=24, prefetch=True, width=4)
    assert sg.last_stats()["access"] == "gather"
    assert "mapped access unavailable" in caplog.text and "no registration here" in caplog.text
    np.testing.assert_array_equal(im, ig)
    np.testing.assert_array_equal(dm, dg)
    caplog.clear()
    with caplog.at_level("INFO", logger="knnkit"):  # decided once per index: not tried again
        sg.search_host_gpu(e, dev(Q), 5, codes=dev(e._codes), codebook=dev(e._codebook), entry=e._entry,
                           L=24, max_iters=192, n_seeds=4, rerank=24, prefetch=True, width=4)
    assert "mapped access unavailable" not in caplog.text


def test_fake_gpu_auto_keeps_the_gather_past_the_host_share(small, monkeypatch, caplog):
    index, Q = small
    index._engine._bang_mapped = None
    monkeypatch.setattr(sg, "MAPPED_MAX_HOST_FRACTION", 1e-12)
    with caplog.at_level("INFO", logger="knnkit"):
        dg, ig = _fake_search(monkeypatch, index, Q, access="auto")
    assert sg.last_stats()["access"] == "gather" and "of the host's memory" in caplog.text
    dm, im = _fake_search(monkeypatch, index, Q, access="mapped")  # asked for: mapped all the same
    assert sg.last_stats()["access"] == "mapped"
    monkeypatch.setattr(sg, "MAPPED_MAX_HOST_FRACTION", 0.5)
    monkeypatch.setattr(sg, "MAPPED_MAX_BYTES", 1000)  # larger than this: the host gather
    index._engine._bang_mapped = None
    _fake_search(monkeypatch, index, Q, access="auto")
    assert sg.last_stats()["access"] == "gather"
    monkeypatch.setattr(sg, "MAPPED_MAX_BYTES", 1 << 40)
    index._engine._bang_mapped = None
    _fake_search(monkeypatch, index, Q, access="auto")
    assert sg.last_stats()["access"] == "mapped"
    np.testing.assert_array_equal(im, ig)
    np.testing.assert_array_equal(dm, dg)


def test_fake_gpu_mapped_bounded_calls(small, monkeypatch):
    """Under an explicit budget the mapped walk has no stash: more queries per call, same answers."""
    index, Q = small
    e = index._engine
    L, W, R, d = 24, 4, e._graph.shape[1], e._data.shape[1]
    m, ksub = e._codes.shape[1], e._codebook.shape[1]
    shape = dict(L=L, R=R, W=W, max_iters=8 * L, s=4, m=m, ksub=ksub)
    install(monkeypatch)
    use_smem = sg._tables_in_shared(m, ksub, W, R, 4)
    plan, walk_tables = sg.fused_plan(**shape, use_smem=use_smem, mapped=True)
    assert plan is not None and walk_tables  # (the fake's shared memory: the fused walk makes its tables)
    batch_mapped = sg.batch_bytes_per_query(**shape, plan=plan, walk_tables=True, dsub=e._codebook.shape[2])
    call = dict(s=4, d=d, m=m, dsub=e._codebook.shape[2], n_entry=len(e._entry))
    per_mapped = (batch_mapped + sg.rerank_bytes_per_query(rerank=L, d=d, itemsize=4, mode="mapped")
                  + sg.call_bytes_per_query(**call, walk_tables=True))
    per_gather = (sg.batch_bytes_per_query(S=sg.stash_slots(L, W, L, 8 * L), d=d, itemsize=4, **shape)
                  + sg.rerank_bytes_per_query(rerank=L, d=d, itemsize=4, mode="stash")
                  + sg.call_bytes_per_query(**call, walk_tables=False))
    assert per_gather > 3 * per_mapped  # no table, no step state, no re-rank rows
    n = 9  # queries a call with the stash (mapped: far more)
    assert (n * per_gather) // per_mapped > n
    knnkit.set_memory_budget(int(e._codes.nbytes) + int(e._codebook.nbytes) + n * per_gather)
    try:
        monkeypatch.setattr(sg, "MIN_CALL_QUERIES", 1)
        dg, ig = _fake_search(monkeypatch, index, Q)
        calls_gather = sg.last_stats()["calls"]
        dm, im = _fake_search(monkeypatch, index, Q, access="mapped")
        calls_mapped = sg.last_stats()["calls"]
    finally:
        knnkit.set_memory_budget(None)
    assert calls_gather == -(-len(Q) // n)
    assert calls_mapped == -(-len(Q) // ((n * per_gather) // per_mapped))
    b = e._bang_ws["batches"][0]  # the estimate is what a fused batch allocates
    assert b.fused and b.nbytes == b.cap * batch_mapped
    np.testing.assert_array_equal(im, ig)
    np.testing.assert_array_equal(dm, dg)


# ------------------------------------------------------------------------------------------ GPU
@pytest.fixture(scope="module")
def _gpu_built():
    X = _host(make_clustered(20000 + 500, 32, random_state=16, device="cpu"))
    X, Q = X[:20000], X[20000:]
    return knnkit.GraphIndex.build(X, placement="host", device="gpu", random_state=16), Q  # built once (~10 s)


@pytest.fixture
def gpu_index(_gpu_built):
    sg.configure(access="gather")  # BANG's host gather: the stash and host re-rank modes need it
    yield _gpu_built
    knnkit.set_memory_budget(None)
    sg.configure(legacy=False, profile=False, access="auto")


def _equal_to_rounding(d, i, d_ref, i_ref, rtol=1e-5, err_msg=""):
    """The new path's re-rank (``bang_rerank_exact``: its own order of the sums) against v2's
    (einsum): distances equal to float32 rounding, ids equal except where two neighbours' distances
    tie to that rounding (a swap) or at the last place (a tie with the first one left out)."""
    np.testing.assert_allclose(d, d_ref, rtol=rtol, atol=1e-6, err_msg=err_msg)
    near = np.zeros(i.shape, bool)
    gap = np.isclose(d_ref[:, 1:], d_ref[:, :-1], rtol=rtol, atol=1e-6)
    near[:, 1:] |= gap
    near[:, :-1] |= gap
    near[:, -1] = True
    bad = (i != i_ref) & ~near
    assert not bad.any(), (err_msg, np.argwhere(bad)[:5])
    assert (i == i_ref).mean() >= 0.99, err_msg


def _both(index, Q, **kw):
    """(legacy, new) results of the same call, host arrays."""
    sp = knnkit.index.SearchParams(**kw)
    sg.configure(legacy=True)
    dl, il = index.search(Q, k=10, beam=64, params=sp)
    sg.configure(legacy=False)
    dn, i_n = index.search(Q, k=10, beam=64, params=sp)
    return (_host(dl), _host(il)), (_host(dn), _host(i_n))


@pytest.mark.gpu
def test_gpu_queries_checked_in_one_reduction(gpu_index):
    """On the GPU one reduction is both the queries' NaN/Inf check and their largest magnitude
    (``ArrayInfo.absmax``), which the search's scale check then uses: NaN and +-Inf refused in
    float32 and float16, also where larger finite values surround them; queries beyond the
    index's scale refused by name."""
    import cupy as cp

    from knnkit._core.validation import check_matrix

    a = cp.asarray(np.random.default_rng(0).standard_normal((50, 7)).astype(np.float32))
    a[3, 2] = -9.5
    _q, info = check_matrix(a, "queries")
    assert info.absmax == 9.5
    for bad in (np.nan, np.inf, -np.inf):
        for dt in (cp.float32, cp.float16):
            b = a.astype(dt)
            b[10, 1] = bad
            b[11, 1] = -30.0
            with pytest.raises(ValueError, match="queries contains NaN or Inf"):
                check_matrix(b, "queries")
    index, Q = gpu_index
    with pytest.raises(ValueError, match="beyond what the index's stored scale"):
        index.search(cp.asarray(Q) * np.float32(1e30), k=5)


@pytest.mark.gpu
@pytest.mark.parametrize("budget", ["small", "auto"])
def test_gpu_new_equals_legacy(budget, gpu_index):
    """stash (small budget; host with a short re-rank) and device (automatic budget: the vectors
    fit) re-ranks, prefetch on and off, W = 1 and 4, several pipeline batches: v2's walk (the logs
    are compared bit for bit by the CPU tests' emulation and the width tests), and v2's re-rank up
    to the rounding of its sums (``bang_rerank_exact`` adds in another order than einsum)."""
    index, Q = gpu_index
    knnkit.set_memory_budget(1 << 20 if budget == "small" else None)
    for kw in (dict(), dict(prefetch=False), dict(search_width=1), dict(pipeline_batch=37), dict(rerank=10)):
        (dl, il), (dn, i_n) = _both(index, Q, **kw)
        st = sg.last_stats()
        want = "device" if budget == "auto" else ("host" if "rerank" in kw else "stash")
        assert st["rerank_mode"] == want, (kw, st["rerank_mode"])
        _equal_to_rounding(dn, i_n, dl, il, err_msg=str(kw))
    # the last call above had other shape parameters (rerank=10): the first call with these
    # makes the index's buffers, the second reuses them
    index.search(Q, k=10, beam=64)
    index.search(Q, k=10, beam=64)
    assert sg.last_stats()["workspace_reused"]


@pytest.mark.gpu
@pytest.mark.parametrize("budget", ["small", "auto"])
def test_gpu_mapped_equals_gather_bitwise(budget, gpu_index):
    """access="mapped" (kernels read the host graph, and the vectors for the re-rank, over PCIe,
    from managed or page-locked memory): ids and distances equal to the host gather's, bit for
    bit, every chunk size."""
    index, Q = gpu_index
    knnkit.set_memory_budget(1 << 20 if budget == "small" else None)
    old = sg.configure()
    try:
        for (kw, chunk), memory, fused in itertools.product(
                ((dict(), 4), (dict(prefetch=False), 1), (dict(search_width=1), 7),
                 (dict(pipeline_batch=37), 4), (dict(rerank=10), 2)), ("managed", "pinned"), (True, False)):
            sp = knnkit.index.SearchParams(**kw)
            sg.configure(access="gather")
            dg, ig = index.search(Q, k=10, beam=64, params=sp)
            sg.configure(access="mapped", mapped_chunk=chunk, mapped_memory=memory, fused_walk=fused)
            dm, im = index.search(Q, k=10, beam=64, params=sp)
            st = sg.last_stats()
            assert st["access"] == "mapped" and st["host_gather_rows"] == 0, st
            assert st["mapped_memory"] == memory and st["fused_walk"] is fused, st
            assert st["rerank_mode"] == ("device" if budget == "auto" else "mapped")
            np.testing.assert_array_equal(_host(im), _host(ig), err_msg=str(kw))
            np.testing.assert_array_equal(_host(dm), _host(dg), err_msg=str(kw))
    finally:
        sg.configure(**old)


@pytest.mark.gpu
@pytest.mark.parametrize("stage_max,bloom_max,bits,walk_tables", [(None, None, 16, True), (None, None, 16, False),
                                                                  (0, 0, 16, True), (None, 0, 16, True),
                                                                  (0, None, 16, False), (None, None, 32, True)])
def test_gpu_fused_walk_plans_bitwise(stage_max, bloom_max, bits, walk_tables, gpu_index, monkeypatch):
    """Every shared-memory plan of ``bang_walk`` (code rows staged or read from global memory, the
    Bloom filter in shared or global memory, bfloat16 or float32 tables, made by the blocks or
    loaded): the host gather's ids and distances bit for bit, W = 1, 4 and 8."""
    from knnkit.index.bang import _pq

    index, Q = gpu_index
    if stage_max is not None:
        monkeypatch.setattr(sg, "WALK_STAGE_SMEM_MAX", stage_max)
    if bloom_max is not None:
        monkeypatch.setattr(sg, "WALK_BLOOM_SMEM_MAX", bloom_max)
    monkeypatch.setattr(sg, "_walk_fit", {})
    monkeypatch.setattr(_pq, "TABLE_BITS", bits)
    old = sg.configure()
    try:
        for W in (1, 4, 8):
            sp = knnkit.index.SearchParams(search_width=W)
            sg.configure(access="gather")
            dg, ig = index.search(Q, k=10, beam=48, params=sp)
            sg.configure(access="mapped", fused_walk=True, walk_tables=walk_tables)
            dm, im = index.search(Q, k=10, beam=48, params=sp)
            st = sg.last_stats()
            assert st["fused_walk"], st
            plan = st["walk_plan"]
            assert plan["codes_staged"] is (stage_max != 0) and plan["bloom_smem"] is (bloom_max != 0), plan
            assert plan["table_in_walk"] is walk_tables, plan
            np.testing.assert_array_equal(_host(im), _host(ig), err_msg=str((W, plan)))
            np.testing.assert_array_equal(_host(dm), _host(dg), err_msg=str((W, plan)))
    finally:
        sg.configure(**old)


@pytest.mark.gpu
def test_gpu_mapped_saved_index_and_threads(tmp_path):
    """A saved host index loaded with mmap=True (graph, codes and vectors memory maps of one file
    set) walks mapped by default ("auto": small) with the gather's answers; two threads searching it
    at once map it once and both get the single-thread answers."""
    import threading

    X = _host(make_clustered(8000 + 300, 24, random_state=8, device="cpu"))
    X, Q = np.ascontiguousarray(X[:8000]), np.ascontiguousarray(X[8000:])
    index = knnkit.GraphIndex.build(X, placement="host", device="gpu", random_state=8)
    path = str(tmp_path / "host.knnkit")
    index.save(path)
    loaded = knnkit.GraphIndex.load(path, device="gpu", mmap=True)
    assert isinstance(loaded._engine._graph, np.memmap)
    old = sg.configure()
    try:
        sg.configure(access="gather")
        dg, ig = (_host(a) for a in loaded.search(Q, k=10, beam=48))
        sg.configure(access="auto")
        dm, im = (_host(a) for a in loaded.search(Q, k=10, beam=48))
        assert sg.last_stats()["access"] == "mapped"
        np.testing.assert_array_equal(im, ig)
        np.testing.assert_array_equal(dm, dg)
        fresh = knnkit.GraphIndex.load(path, device="gpu", mmap=True)
        got = [None, None]

        def run(j):
            got[j] = [_host(a) for a in fresh.search(Q, k=10, beam=48)]

        threads = [threading.Thread(target=run, args=(j,)) for j in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for d, i in got:
            np.testing.assert_array_equal(i, ig)
            np.testing.assert_array_equal(d, dg)
        assert fresh._engine._bang_mapped["views"] is not None
    finally:
        sg.configure(**old)


@pytest.mark.gpu
@pytest.mark.parametrize("memory", ["managed", "pinned"])
@pytest.mark.parametrize("dtype", ["uint8", "float16"])
def test_gpu_mapped_memory_map_and_dtypes(dtype, memory, tmp_path):
    """A read-only memory map (the user's file) and rows of 24 / 48 bytes: copied into managed
    memory, or registered read-only; the same answers as the host gather."""
    rng = np.random.default_rng(5)
    X = _host(make_clustered(6000 + 200, 24, random_state=5, device="cpu"))
    if dtype == "uint8":
        X = np.clip((X - X.min()) / (X.max() - X.min()) * 255, 0, 255).astype(np.uint8)
    else:
        X = X.astype(np.float16)
    np.save(tmp_path / "x.npy", X[:6000])
    Xm = np.load(tmp_path / "x.npy", mmap_mode="r")
    index = knnkit.GraphIndex.build(Xm, placement="host", device="gpu", random_state=5)
    Q = X[6000:][rng.permutation(200)]
    knnkit.set_memory_budget(1 << 20)
    old = sg.configure()
    try:
        sg.configure(access="gather")
        dg, ig = index.search(Q, k=10, beam=48)
        sg.configure(access="mapped", mapped_memory=memory)
        dm, im = index.search(Q, k=10, beam=48)
        assert sg.last_stats()["access"] == "mapped" and sg.last_stats()["mapped_memory"] == memory
        np.testing.assert_array_equal(_host(im), _host(ig))
        np.testing.assert_array_equal(_host(dm), _host(dg))
    finally:
        sg.configure(**old)
        knnkit.set_memory_budget(None)


@pytest.mark.gpu
def test_gpu_stash_fallback_and_counts(gpu_index, monkeypatch):
    import cupy as cp

    index, Q = gpu_index
    knnkit.set_memory_budget(1 << 20)
    (dl, il), _ = _both(index, Q)
    monkeypatch.setattr(sg, "stash_slots", lambda *a: 20)
    dn, i_n = index.search(Q, k=10, beam=64)
    st = sg.last_stats()
    assert st["rerank_mode"] == "stash" and st["rerank_fallback_rows"] > 0
    _equal_to_rounding(_host(dn), _host(i_n), dl, il)
    monkeypatch.setattr(sg, "stash_slots", lambda *a: 10 ** 4)  # every row stashed: the same bits
    d2, i2 = index.search(Q, k=10, beam=64)
    assert sg.last_stats()["rerank_fallback_rows"] == 0
    np.testing.assert_array_equal(_host(i2), _host(i_n))
    np.testing.assert_array_equal(_host(d2), _host(dn))
    for b in index._engine._bang_ws["batches"]:
        np.testing.assert_array_equal(b.count, cp.asnumpy(b.n_exp))


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["direct", "gemm"])
@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_gpu_tables_bit_identical(method, metric, rng, monkeypatch):
    """direct (the default): the GPU kernel's tables equal the CPU's (_pq._tables_cpu), bit for bit,
    in float32 and as bfloat16 bits. gemm: the GPU's two-pass tables equal the CuPy expression of
    pq_tables (same cuBLAS GEMM)."""
    import cupy as cp

    from knnkit.index.bang import _pq

    monkeypatch.setattr(_pq, "TABLE_METHOD", method)
    for m, dsub in ((48, 2), (16, 4), (7, 3)):
        Q = cp.asarray(rng.standard_normal((333, m * dsub), dtype=np.float32))
        cb = cp.asarray(rng.standard_normal((m, 256, dsub), dtype=np.float32))
        ref = (lambda bits: pq_tables(cp.asnumpy(Q), cp.asnumpy(cb), metric, bits=bits)) if method == "direct" \
            else (lambda bits: pq_tables(Q, cb, metric, bits=bits).get())
        out = cp.empty((333, m, 256), cp.float32)
        sg._tables_into(cp, Q, cb, (cb * cb).sum(axis=2), metric, out)
        np.testing.assert_array_equal(out.get(), ref(32), err_msg=f"{method} {metric} {m} {dsub}")
        # bfloat16 bits (the walk's tables): the values of pq_tables(bits=16), bit for bit
        out16 = cp.empty((333, m, 256), cp.uint16)
        sg._tables_into(cp, Q, cb, (cb * cb).sum(axis=2), metric, out16)
        got16 = (out16.astype(cp.uint32) << 16).view(cp.float32).get()
        np.testing.assert_array_equal(got16, ref(16), err_msg=f"{method} {metric} {m} {dsub} bf16")


@pytest.mark.gpu
def test_gpu_rerank_kernels_equal_the_cupy_path(rng):
    """``bang_rerank_rows`` gives :func:`rerank_plan` + :func:`rows_from_slots` /
    :func:`rows_from_device` exactly (ties, signed zeros, infinities and NaNs in the log; plans
    wider and narrower than the re-rank; uint8 rows copied byte by byte, float32 by 16-byte words),
    and ``bang_rerank_select`` the selection of ``exact_topk``."""
    import cupy as cp

    for nb, ld, C, rr, d, dtype in ((53, 70, 33, 10, 8, np.float32), (40, 512, 64, 64, 3, np.uint8),
                                    (17, 100, 90, 128, 5, np.float32), (9, 4096, 4096, 16, 4, np.uint8)):
        log_d = cp.asarray(_awkward_keys(rng, nb, ld))
        log_ids = cp.asarray(rng.integers(-1, 10 ** 6, (nb, ld)).astype(np.int32))
        S = max(1, C // 2)
        slots = cp.asarray((rng.random((nb * S, d)) * 200).astype(dtype))
        X = cp.asarray((rng.random((10 ** 6, d)) * 200).astype(dtype))
        cand_w, pos_w = sg.rerank_plan(cp, log_ids, log_d, rr, C)
        rows_w, miss_w = sg.rows_from_slots(cp, slots, S, cand_w, pos_w)
        cand, pos, rows, miss, nmiss = sg.rerank_rows_gpu(cp, log_ids, log_d, C, rr, slots, S, from_slots=True)
        for got, want in ((cand, cand_w), (pos, pos_w), (rows, rows_w), (miss, miss_w)):
            assert got.dtype == want.dtype and got.shape == want.shape
            assert bool((got == want).all()), (nb, ld, C, rr)
        assert int(nmiss[0]) == int(miss_w.sum())
        _c, _p, rows_d, _m, _n = sg.rerank_rows_gpu(cp, log_ids, log_d, C, rr, X)
        assert bool((rows_d == sg.rows_from_device(cp, X, cand_w)).all())
    for nq, c, k in ((31, 64, 10), (7, 5, 10), (12, 300, 100)):
        dist = cp.asarray(_awkward_keys(rng, nq, c))
        cand = cp.asarray(rng.integers(-1, 5000, (nq, c)).astype(np.int32))
        # exact_topk's selection, step by step, on these distances
        want_d = cp.where(cand >= 0, dist, cp.float32(np.inf)).astype(cp.float32)
        kk = min(k, c)
        order = cp.argsort(want_d, axis=1)[:, :kk]
        wd = cp.take_along_axis(want_d, order, axis=1)
        wi = cp.where(cp.isfinite(wd), cp.take_along_axis(cand.astype(cp.int64), order, axis=1), -1)
        D, I = sg.rerank_select_gpu(cp, dist, cand, k)
        assert bool((I[:, :kk] == wi).all()) and bool(((D[:, :kk] == wd) | (cp.isnan(wd) & cp.isnan(D[:, :kk]))).all())
        if kk < k:
            assert bool((I[:, kk:] == -1).all()) and bool(cp.isinf(D[:, kk:]).all())


@pytest.mark.gpu
def test_gpu_rerank_exact_kernel(rng):
    """``bang_rerank_exact``: the exact distances of float64 arithmetic on the prepared rows (every
    storage dtype, scaled data, l2 / inner product / cosine), +inf for -1; rows read by id and the
    same rows read by position from a buffer give the same bits; the selection on them is
    ``exact_topk``'s up to float32 rounding."""
    import cupy as cp

    from knnkit._core.metrics import prepare_vectors

    n, nq, c, d = 3000, 37, 41, 77  # d: not a multiple of the warp
    for dtype, metric, scale in ((np.float32, "sqeuclidean", 1.0), (np.float16, "inner_product", 1.0),
                                 (np.uint8, "sqeuclidean", 2.0 ** -7), (np.int8, "cosine", 1.0),
                                 (np.float32, "cosine", 2.0 ** 60), (np.float32, "euclidean", 2.0 ** -40)):
        if np.dtype(dtype).kind == "f":
            X = (rng.standard_normal((n, d)) * (1.0 / scale if scale != 1.0 else 1.0)).astype(dtype)
        else:
            info = np.iinfo(dtype)
            X = rng.integers(info.min, info.max, (n, d), endpoint=True).astype(dtype)
        X[5] = 0  # an empty row (cosine: norm 1)
        Qp = prepare_vectors(X[rng.integers(0, n, nq)].astype(np.float32) + 0.25, metric, scale)
        cand = rng.integers(-1, n, (nq, c)).astype(np.int32)
        cand[0, :3] = [5, -1, 5]
        Xd, cd, Qd = cp.asarray(X), cp.asarray(cand), cp.asarray(Qp)
        got = sg.rerank_exact_gpu(cp, Qd, Xd, cd, by_id=True, metric=metric, scale=scale).get()
        rows = sg.rows_from_device(cp, Xd, cd)
        by_pos = sg.rerank_exact_gpu(cp, Qd, rows, cd, by_id=False, metric=metric, scale=scale).get()
        np.testing.assert_array_equal(by_pos, got, err_msg=str((dtype, metric)))
        P = prepare_vectors(X, metric, scale).astype(np.float64)[np.maximum(cand, 0)]
        if metric in ("inner_product", "cosine"):
            want = -(P * Qp.astype(np.float64)[:, None, :]).sum(2)
        else:
            want = ((P - Qp.astype(np.float64)[:, None, :]) ** 2).sum(2)
        want = np.where(cand >= 0, want, np.inf)
        scale_abs = ((np.abs(P) + np.abs(Qp)[:, None, :]) ** 2).sum(2) + 1e-30
        ok = cand >= 0
        assert np.all(np.isinf(got[~ok])), (dtype, metric)
        assert np.all(np.abs(got[ok] - want[ok]) <= 1e-5 * scale_abs[ok]), (dtype, metric)
        D, I = sg.rerank_select_gpu(cp, cp.asarray(got), cd, 10)
        Dw, Iw = (a.get() for a in exact_topk_np(Qp, P.astype(np.float32), cand, metric))
        np.testing.assert_allclose(D.get(), Dw, rtol=1e-4, atol=1e-4 * float(np.abs(Dw[np.isfinite(Dw)]).max()))


def exact_topk_np(Qp, P, cand, metric):
    """exact_topk on the host, as CuPy arrays (the selection the kernel path replaces)."""
    import cupy as cp

    from knnkit.index.bang._search_cpu import exact_topk

    d, i = exact_topk(Qp, P, cand, 10, "ip" if metric in ("inner_product", "cosine") else "l2")
    return cp.asarray(d), cp.asarray(i)


@pytest.mark.gpu
def test_gpu_profile_phases(gpu_index):
    index, Q = gpu_index
    knnkit.set_memory_budget(1 << 20)
    sg.configure(profile=True)
    index.search(Q, k=10, beam=64)
    st = sg.last_stats()
    assert {"setup", "walk", "rerank", "total"} <= set(st["phases"])
    assert st["gpu_s"]["distances"] > 0 and st["gpu_s"]["stash"] > 0


class _RuntimeError(Exception):
    pass


def _fake_cp_for_mapping(calls, register_ok=True):
    """Just what ``_map_arrays`` touches of CuPy: the runtime's registration, the device, and
    device arrays over host pointers (here the host arrays themselves)."""
    from types import SimpleNamespace

    def host_register(ptr, nbytes, flags):
        calls.append(("register", nbytes))
        if not register_ok:
            raise _RuntimeError("refused")

    runtime = SimpleNamespace(deviceGetAttribute=lambda attr, dev: 1, hostRegister=host_register,
                              CUDARuntimeError=_RuntimeError, hostUnregister=lambda p: calls.append(("unregister",)))
    cuda = SimpleNamespace(runtime=runtime, Device=lambda: SimpleNamespace(id=0),
                           MemoryPointer=lambda mem, off: mem, UnownedMemory=lambda ptr, n, owner, dev: owner)
    return SimpleNamespace(cuda=cuda, ndarray=lambda shape, dtype, mem: mem)


def test_map_arrays_managed_then_pinned(monkeypatch, caplog):
    """``mapped_memory``: "managed" copies each array into managed memory (and maps nothing in
    place); when that fails the arrays are registered in place, logged; "pinned" never tries it."""
    graph, data = np.arange(12, dtype=np.int32).reshape(3, 4), np.ones((3, 2), np.float32)
    calls = []
    made = []

    def managed(cp_, a, dev_):
        made.append(a.nbytes)
        return a.copy(), 1000 + len(made)

    monkeypatch.setattr(sg, "_managed_copy", managed)
    views, held = sg._map_arrays(_fake_cp_for_mapping(calls), [graph, data], memory="managed")
    assert [k for k, _ in held] == ["managed", "managed"] and made == [48, 24] and calls == []
    np.testing.assert_array_equal(views[0], graph)
    assert views[0].ctypes.data != graph.ctypes.data  # a copy, not the index's own array

    def refuse(cp_, a, dev_):
        raise RuntimeError("no managed memory here")

    monkeypatch.setattr(sg, "_managed_copy", refuse)
    with caplog.at_level("INFO", logger="knnkit"):
        views, held = sg._map_arrays(_fake_cp_for_mapping(calls), [graph, data], memory="managed")
    assert [k for k, _ in held] == ["registered", "registered"] and calls == [("register", 48), ("register", 24)]
    assert "managed memory unavailable" in caplog.text and "no managed memory here" in caplog.text
    assert views[0] is graph
    made.clear()
    calls.clear()
    monkeypatch.setattr(sg, "_managed_copy", managed)
    views, held = sg._map_arrays(_fake_cp_for_mapping(calls), [graph, data], memory="pinned")
    assert made == [] and [k for k, _ in held] == ["registered", "registered"]


def test_mapped_memory_choice_and_auto_limits(small, monkeypatch, caplog):
    """"auto" access maps managed memory up to the host share, page-locked memory only up to
    MAPPED_MAX_BYTES as well; a managed copy that does not fit the host's available memory (half of
    it for "auto", 0.9 when mapped access is forced) becomes page-locked memory in place; the choice
    is made once per index (the copy itself lowers the available memory), and a change of the
    memory asked for remaps the index."""
    index, Q = small
    e = index._engine
    seen = []

    def fake_map(cp_, arrays, memory="pinned"):
        seen.append(memory)
        return tuple(a.view(np.ndarray) for a in arrays), [(memory if memory == "managed" else "registered", 0)]

    install(monkeypatch)
    monkeypatch.setattr(sg, "_map_arrays", fake_map)
    monkeypatch.setattr(sg, "_unmap", lambda cp_, held: None)
    monkeypatch.setattr(sg, "_managed_supported", lambda cp_, dev_: True)
    monkeypatch.setattr(sg, "MAPPED_MAX_BYTES", 1000)  # the small index is larger than this
    old = sg.configure(access="auto", mapped_memory="auto")
    try:
        e._bang_mapped = None
        assert sg.host_mapped(e) is not None and e._bang_mapped["memory"] == "managed" and seen == ["managed"]
        sg.configure(mapped_memory="pinned")  # page-locked: the 1000-byte limit holds, so the gather
        with caplog.at_level("INFO", logger="knnkit"):
            assert sg.host_mapped(e) is None
        assert "mapped pinned memory" in caplog.text and seen == ["managed"]
        sg.configure(mapped_memory="auto")
        monkeypatch.setattr(sg, "_host_available_bytes", lambda: 100)  # no room for a managed copy
        assert sg.host_mapped(e) is None  # pinned then, and past its limit
        sg.configure(access="mapped")
        assert sg.host_mapped(e) is not None and e._bang_mapped["memory"] == "pinned" and seen[-1] == "pinned"
        assert sg.host_mapped(e) is not None and len(seen) == 2  # decided once: no new mapping per call
        total = np.asarray(e._graph).nbytes + np.asarray(e._data).nbytes
        monkeypatch.setattr(sg, "_host_available_bytes", lambda: int(total / 0.7))  # 0.7 of it: forced only
        e._bang_mapped = None
        assert sg.host_mapped(e) is not None and e._bang_mapped["memory"] == "managed" and seen[-1] == "managed"
        monkeypatch.setattr(sg, "_host_available_bytes", lambda: 100)  # the copy lowered it: the mapping stays
        assert sg.host_mapped(e) is not None and e._bang_mapped["memory"] == "managed" and len(seen) == 3
        monkeypatch.setattr(sg, "_host_available_bytes", lambda: int(total / 0.7))
        sg.configure(access="auto")
        e._bang_mapped = None
        assert sg.host_mapped(e) is None  # auto keeps half the available memory free: pinned, past its limit
        sg.configure(access="mapped")
        e._bang_mapped = None
        monkeypatch.setattr(sg, "_managed_supported", lambda cp_, dev_: False)
        monkeypatch.setattr(sg, "_host_available_bytes", lambda: 1 << 40)
        assert sg.host_mapped(e) is not None and seen[-1] == "pinned"
    finally:
        sg.configure(**old)
        e._bang_mapped = None


@pytest.mark.gpu
def test_gpu_managed_mapping_takes_no_device_memory(gpu_index):
    """The managed copy stays in host memory: walking over it again and again does not move its
    pages to the GPU (device free memory within 64 MiB of the first call's, the CuPy pool emptied
    both times), and it is given back when the mapping goes."""
    import cupy as cp

    index, Q = gpu_index
    e = index._engine
    pool = cp.get_default_memory_pool()
    knnkit.set_memory_budget(1 << 20)  # the re-rank reads the mapped vectors too (no device copy)
    old = sg.configure(access="mapped", mapped_memory="managed")
    try:
        if e._bang_mapped is not None and e._bang_mapped["finalizer"] is not None:
            e._bang_mapped["finalizer"]()
        e._bang_mapped = None
        index.search(Q, k=10, beam=64)
        assert sg.last_stats()["mapped_memory"] == "managed" and sg.last_stats()["rerank_mode"] == "mapped"
        e._bang_ws = None
        pool.free_all_blocks()
        free0 = cp.cuda.runtime.memGetInfo()[0]
        for _ in range(5):
            index.search(Q, k=10, beam=64)
        e._bang_ws = None
        pool.free_all_blocks()
        assert free0 - cp.cuda.runtime.memGetInfo()[0] < 64 << 20
        held = e._bang_mapped["held"]
        assert len(held) == 2 and all(kind == "managed" for kind, _ in held)
        e._bang_mapped["finalizer"]()
    finally:
        e._bang_mapped = None
        sg.configure(**old)


def test_fake_gpu_held_out_rows_are_not_mapped(small, monkeypatch):
    """A managed mapping is a copy of the graph: while rows are held out (cut in place, the build's
    recall check) the walk gathers from the live graph, and a copy made before the cut serves
    again after the exact restore. Fake mapping here copies, as managed memory does."""
    index, Q = small
    e = index._engine
    dg, ig = _fake_search(monkeypatch, index, Q, access="gather")
    made = []

    def copying(cp_, arrays, memory="pinned"):
        made.append(1)
        return tuple(np.array(a).view(type(dev(a[:1]))) for a in arrays), [("managed", 0)]

    monkeypatch.setattr(sg, "_unmap", lambda cp_, held: None)
    e._bang_mapped = None
    install(monkeypatch)
    monkeypatch.setattr(sg, "_map_arrays", copying)
    old = sg.configure(access="mapped")
    try:
        rows = ig[:, 0]  # every query's nearest point, cut out
        restore = e.hold_out(rows)
        assert sg.host_mapped(e) is None and made == []
        restore()
        assert sg.host_mapped(e) is not None and made == [1]  # made after the restore
        restore = e.hold_out(rows)
        try:
            _dc, ic = _fake_search(monkeypatch, index, Q, access="mapped")
            assert sg.last_stats()["access"] == "gather"  # the cut graph, live
            assert not np.isin(ic, rows).any()
        finally:
            restore()
        dm, im = _fake_search(monkeypatch, index, Q, access="mapped")
        assert sg.last_stats()["access"] == "mapped" and made == [1]  # the copy made before serves again
        np.testing.assert_array_equal(im, ig)
        np.testing.assert_array_equal(dm, dg)
    finally:
        sg.configure(**old)
        e._bang_mapped = None
