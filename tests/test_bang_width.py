"""BANG search width W (issue 16): W = 1 is BANG's one-candidate walk unchanged; W > 1 expands the W
best unexpanded work-list entries per iteration. CPU: W = 1 against a plain-Python copy of the
one-candidate walk, a Python emulation of the GPU kernels' semantics (prefetch of W candidates by
union rank, merge, fused selection) against the CPU twin, recall at the same L, fewer iterations,
parameter validation. GPU (marker ``gpu``): the GPU walk against the CPU twin for W > 1."""

import numpy as np
import pytest

import knnkit
from knnkit.datasets import make_clustered, make_uniform
from knnkit.index.bang._pq import pq_tables
from knnkit.index.bang._search_cpu import bloom_words_for, search_pq_cpu
from _bang_fake_gpu import _bloom_step_py


def _host(a):
    a = a[0] if isinstance(a, tuple) else a
    return np.asarray(a.get() if hasattr(a, "get") else a)


def _recall(X, Q, idx, k):
    D = ((Q[:, None, :].astype(np.float64) - X[None].astype(np.float64)) ** 2).sum(2)
    kth = np.sort(D, axis=1)[:, k - 1]
    idx = _host(idx)
    assert (idx >= 0).all()
    return float((np.take_along_axis(D, idx, axis=1) <= kth[:, None] + 1e-9 * np.maximum(1, kth[:, None])).mean())


def _key(d, i):
    return (float(d), int(i) & 0xFFFFFFFF)  # id -1 sorts last, as in bang.cu


def _pq(codes, T, q, n):
    acc = np.float32(0)
    for j in range(codes.shape[1]):
        acc += T[q, j, codes[n, j]]  # float32 sums in subspace order, like the CPU twin
    return acc


def _fresh(words, words_n, nbrs):
    """A step's visited test (bang.cu, since the thirty-third session): the fake GPU's."""
    return _bloom_step_py(words, words_n - 1, nbrs)


def _walk_one(graph, codes, T, seeds, L, max_iters):
    """BANG's one-candidate walk as it was before the search width: expand the first unexpanded
    entry, insert its fresh neighbours one by one into the sorted list (plain Python); a step's
    neighbours are tested against the filter as it was before the step."""
    words_n = bloom_words_for(max_iters, graph.shape[1], seeds.shape[1], L=L, W=1)
    logs = []
    for q in range(T.shape[0]):
        words = np.zeros(words_n, np.uint32)
        wl = []  # [key, id, d, expanded]
        log = []

        def offer(n):
            d = _pq(codes, T, q, n)
            wl.append([_key(d, n), n, d, False])
            wl.sort(key=lambda e: e[0])
            del wl[L:]

        for s in _fresh(words, words_n, seeds[q]):
            offer(s)
        while len(log) < max_iters:
            e = next((e for e in wl if not e[3]), None)
            if e is None:
                break
            e[3] = True
            log.append((e[1], e[2]))
            for n in _fresh(words, words_n, graph[e[1]]):
                offer(n)
        logs.append(log)
    return logs


def _emulate_gpu(graph, codes, T, seeds, L, W, max_iters, prefetch):
    """The GPU kernels' semantics (bang.cu) in plain Python: per iteration the W*R neighbour ids go
    through the Bloom filter, survivors must beat the OLD list's worst entry; with prefetch the next
    W candidates are the W smallest unexpanded of (list + survivors) of union rank < L, chosen
    before the merge; without, the first W unexpanded of the merged list."""
    words_n = bloom_words_for(max_iters, graph.shape[1], seeds.shape[1], L=L, W=W)
    logs = []
    for q in range(T.shape[0]):
        words = np.zeros(words_n, np.uint32)
        wl = [[_key(np.inf, -1), -1, np.float32(np.inf), False] for _ in range(L)]
        log = []

        def distances(nbrs):
            worst = wl[L - 1][0]
            new = []
            for n in _fresh(words, words_n, nbrs):
                d = _pq(codes, T, q, n)
                if _key(d, n) < worst:
                    new.append([_key(d, n), n, d, False])
            return new

        def take(e):
            e[3] = True
            log.append((e[1], e[2]))
            return e[1]

        def select_prefetch(new):
            union = sorted(wl + new, key=lambda e: e[0])
            rank = {id(e): r for r, e in enumerate(union)}
            open_ = [e for e in union if e[1] >= 0 and not e[3]][:W]
            return [take(e) for e in open_ if rank[id(e)] < L][:max_iters - len(log)]

        def merge(new):
            wl[:] = sorted(wl + new, key=lambda e: e[0])[:L]

        def select_merged():
            return [take(e) for e in [e for e in wl if e[1] >= 0 and not e[3]][:W][:max_iters - len(log)]]

        nbrs = list(seeds[q])
        while True:
            new = distances(nbrs)
            if prefetch:
                cand = select_prefetch(new)
                merge(new)
            else:
                merge(new)
                cand = select_merged()
            if not cand:
                break
            nbrs = [n for c in cand for n in graph[c]]
        logs.append(log)
    return logs


def _small_index(seed, n=3000, d=8, nq=12, pq_bytes=4):
    X = _host(make_clustered(n + nq, d, random_state=seed, device="cpu"))
    X, Q = X[:n], X[n:]
    index = knnkit.GraphIndex.build(X, placement="host", device="cpu", random_state=seed, pq_bytes=pq_bytes)
    e = index._engine
    T = pq_tables(e.pq_queries(Q), e._codebook, e.pq_metric)
    return index, np.asarray(e._graph), np.asarray(e._codes), T, e._entry.seeds_for(Q, 4)


def _logs(li, ne):
    return [li[q, :ne[q]].tolist() for q in range(li.shape[0])]


# ------------------------------------------------------------------------------------------ CPU
def test_width1_is_the_one_candidate_walk(rng):
    _ix, graph, codes, T, seeds = _small_index(int(rng.integers(1 << 30)))
    for L in (8, 24):
        li, ld, ne = search_pq_cpu(graph, codes, T, seeds, L=L, max_iters=4 * L, width=1)
        ref = _walk_one(graph, codes, T, seeds, L, 4 * L)
        assert _logs(li, ne) == [[i for i, _ in r] for r in ref]
        for q, r in enumerate(ref):
            np.testing.assert_array_equal(ld[q, :ne[q]], np.array([d for _, d in r], np.float32))
        assert search_pq_cpu(graph, codes, T, seeds, L=L, max_iters=4 * L)[0].tolist() == li.tolist()  # default W = 1


@pytest.mark.parametrize("W", [2, 4, 8])
def test_gpu_semantics_match_cpu_twin(W, rng):
    """The prefetch's union-rank test matters: at L = 8 a chosen-looking entry is often pushed out
    of the list by the merge (without the test this emulation and the twin disagree)."""
    _ix, graph, codes, T, seeds = _small_index(int(rng.integers(1 << 30)))
    for L in (8, 20):
        li, _ld, ne = search_pq_cpu(graph, codes, T, seeds, L=L, max_iters=4 * L, width=W)
        want = _logs(li, ne)
        for prefetch in (True, False):
            got = _emulate_gpu(graph, codes, T, seeds, L, W, 4 * L, prefetch)
            assert [[i for i, _ in g] for g in got] == want, (L, prefetch)


def test_width_capped_by_max_iters(rng):
    _ix, graph, codes, T, seeds = _small_index(int(rng.integers(1 << 30)))
    li, _ld, ne = search_pq_cpu(graph, codes, T, seeds, L=32, max_iters=10, width=8)
    assert (ne <= 10).all() and (ne == 10).any()
    for q in range(li.shape[0]):  # no node expanded twice
        assert len(set(li[q, :ne[q]].tolist())) == ne[q]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("make", [make_clustered, make_uniform])
def test_width_recall_and_iterations(make, seed):
    """Fixed data (deterministic walk): at the same L every W in {2, 4, 8} reaches at least W = 1's
    recall (it expands a few more entries: the last iterations take whatever is unexpanded), and
    the iterations fall with every step up in W (about 1/W while W is well below L)."""
    X = _host(make(4200, 16, random_state=seed, device="cpu"))
    X, Q = X[:4000], X[4000:]
    index = knnkit.GraphIndex.build(X, placement="host", device="cpu", random_state=seed)
    e = index._engine
    Qp = Q.astype(np.float32)
    T = pq_tables(e.pq_queries(Qp), e._codebook, e.pq_metric)
    seeds = e._entry.seeds_for(Qp, 4)
    L, k = 16, 10
    base = _recall(X, Q, index.search(Q, k=k, beam=L, params=knnkit.index.SearchParams(search_width=1))[1], k)
    iters1 = search_pq_cpu(e._graph, e._codes, T, seeds, L=L, max_iters=8 * L, return_iterations=True)[3]
    prev = iters1.mean()
    for W in (2, 4, 8):
        sp = knnkit.index.SearchParams(search_width=W)
        r = _recall(X, Q, index.search(Q, k=k, beam=L, params=sp)[1], k)
        assert r >= base, (W, r, base)
        _li, _ld, ne, it = search_pq_cpu(e._graph, e._codes, T, seeds, L=L, max_iters=8 * L, width=W,
                                         return_iterations=True)
        assert it.mean() < prev, (W, it.mean(), prev)  # fewer iterations at every step up
        assert (it >= np.ceil(ne / W)).all()  # at most W expansions per iteration
        if W == 2:
            assert it.mean() <= 0.6 * iters1.mean(), (it.mean(), iters1.mean())
        prev = it.mean()


def test_search_width_validation_and_cap(rng):
    X = rng.random((600, 8), dtype=np.float32)
    index = knnkit.GraphIndex.build(X, placement="host", device="cpu", random_state=0)
    for bad, exc in ((0, ValueError), (-1, ValueError), (65, ValueError), (2.5, TypeError), (True, TypeError),
                     ("4", TypeError)):
        with pytest.raises(exc, match="search_width"):
            knnkit.index.SearchParams(search_width=bad)
        with pytest.raises(exc, match="search_width"):
            index._engine.search(X[:2], 3, beam=16, max_iters=64, n_seeds=2, device="cpu", search_width=bad)
    assert knnkit.index.SearchParams().search_width == 4
    # W > L: at most L entries are unexpanded, so W is capped at L with the same results
    a = index.search(X[:20], k=5, beam=16, params=knnkit.index.SearchParams(search_width=64))
    b = index.search(X[:20], k=5, beam=16, params=knnkit.index.SearchParams(search_width=16))
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)
    # the index's stored default is used when the call gives none
    d1, i1 = index.search(X[:20], k=5, beam=16, params=knnkit.index.SearchParams(search_width=1))
    d0, i0 = index.search(X[:20], k=5, beam=16)
    np.testing.assert_array_equal(i0, i1)


# ------------------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["clustered", "uniform"])
def test_gpu_width_matches_cpu(kind, rng):
    from knnkit.index.bang._search_gpu import last_stats

    seed = int(rng.integers(1 << 30))
    n, d, k = 20000, 32, 10
    make = make_clustered if kind == "clustered" else make_uniform
    X = _host(make(n + 500, d, random_state=seed, device="cpu"))
    X, Q = X[:n], X[n:]
    index = knnkit.GraphIndex.build(X, placement="host", device="gpu", random_state=seed)
    iters = {}
    for W in (1, 2, 4, 8):
        sp = knnkit.index.SearchParams(search_width=W)
        _dc, ic = index.search(Q, k=k, beam=64, device="cpu", params=sp)
        _dg, ig = index.search(Q, k=k, beam=64, params=sp)
        ig = _host(ig)
        st = last_stats()
        assert st["search_width"] == W
        iters[W] = st["iterations"]
        rc, rg = _recall(X, Q, ic, k), _recall(X, Q, ig, k)
        assert rg >= 0.9 and rg >= rc - 0.02, (W, rg, rc)
        assert (ig == ic).mean() >= 0.95, W  # same walk; PQ sums differ only in rounding order
        for kw in (dict(prefetch=False), dict(pipeline_batch=37)):
            _d2, i2 = index.search(Q, k=k, beam=64, params=knnkit.index.SearchParams(search_width=W, **kw))
            assert (_host(i2) == ig).mean() >= 0.99, (W, kw)
    assert iters[4] < iters[1] / 2, iters


@pytest.mark.gpu
def test_gpu_width_logs_match_cpu_logs(rng):
    """Expansion logs of the GPU walk against the CPU twin's for W > 1, prefetch on and off: the
    same nodes in the same order for nearly every query (PQ rounding order may flip a near tie)."""
    import cupy as cp

    from knnkit.index.bang import _search_gpu as sg

    seed = int(rng.integers(1 << 30))
    X = _host(make_clustered(8000 + 200, 16, random_state=seed, device="cpu"))
    X, Q = X[:8000], X[8000:]
    index = knnkit.GraphIndex.build(X, placement="host", device="gpu", random_state=seed, pq_bytes=8)
    e = index._engine
    codes, codebook, entry = e._device_arrays()
    Qd = cp.asarray(Q)
    T = pq_tables(e.pq_queries(Q), e._codebook, e.pq_metric)
    seeds = e._entry.seeds_for(Q, 4)
    L, mi = 32, 256
    captured = {}
    real = sg._Batch.bind

    def spy(self, *a, **kw):  # every batch of every call binds (the buffers themselves are reused)
        captured.setdefault("b", []).append(self)
        return real(self, *a, **kw)

    sg._Batch.bind = spy
    try:
        for W in (2, 8):
            li, _ld, ne = search_pq_cpu(e._graph, e._codes, T, seeds, L=L, max_iters=mi, width=W)
            for prefetch in (True, False):
                captured.clear()
                sg.search_host_gpu(e, Qd, 10, codes=codes, codebook=codebook, entry=entry, L=L, max_iters=mi,
                                   n_seeds=4, rerank=L, prefetch=prefetch, pipeline_batch=64, width=W)
                gl = np.concatenate([b.log_ids.get() for b in captured["b"]])
                same = [gl[q, :ne[q]].tolist() == li[q, :ne[q]].tolist() for q in range(len(Q))]
                assert np.mean(same) >= 0.9, (W, prefetch, np.mean(same))
    finally:
        sg._Batch.bind = real


def test_bloom_step_is_order_independent(rng):
    """A step's visited test marks only after testing every id, so any order of the step's ids
    gives the same fresh ids and the same filter (a small filter: many collisions)."""
    from knnkit.index.bang._search_cpu import _bloom_step, step_set

    hset, hgen, hword, hbits = step_set(200)
    gen = 0
    for trial in range(20):
        prior = rng.integers(0, 10 ** 6, 10).astype(np.int32)
        ids = np.concatenate([rng.integers(0, 10 ** 6, 60), prior[:3], [-1, -1]]).astype(np.int32)
        ids = np.concatenate([ids, ids[:7]])  # repeats within the step
        results = []
        for perm in range(4):
            words = np.zeros(4, np.uint32)
            buf = prior.copy()
            _bloom_step(words, 3, buf, len(buf), hset, hgen, gen, hword, hbits)
            order = ids if perm == 0 else ids[rng.permutation(len(ids))]
            buf = order.copy()
            k = _bloom_step(words, 3, buf, len(buf), hset, hgen, gen + 1, hword, hbits)
            gen += 2
            results.append((tuple(sorted(buf[:k])), tuple(words)))
        assert all(r == results[0] for r in results), trial
        fresh = results[0][0]
        assert len(set(fresh)) == len(fresh) and not set(prior[:3]) & set(fresh)


@pytest.mark.gpu
def test_gpu_walk_repeats_bit_for_bit():
    """Two identical GPU searches give the same bits (the Bloom filter's outcome no longer depends
    on the order of a step's concurrent inserts), mapped and gathered alike."""
    from knnkit.index.bang import _search_gpu as sg

    X = np.asarray(make_clustered(60000 + 2000, 32, random_state=21, device="cpu"))
    X, Q = np.ascontiguousarray(X[:60000]), np.ascontiguousarray(X[60000:])
    index = knnkit.GraphIndex.build(X, placement="host", device="gpu", random_state=21)
    old = sg.configure()
    try:
        knnkit.set_memory_budget(1 << 20)
        for access in ("gather", "mapped"):
            sg.configure(access=access)
            runs = [[_host(a) for a in index.search(Q, k=10, beam=64)] for _ in range(3)]
            for d, i in runs[1:]:
                np.testing.assert_array_equal(i, runs[0][1], err_msg=access)
                np.testing.assert_array_equal(d, runs[0][0], err_msg=access)
    finally:
        sg.configure(**old)
        knnkit.set_memory_budget(None)
