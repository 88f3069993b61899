"""GPU kernels of the graph index: batched graph search (search_gpu) and RobustPrune (prune_gpu).

Graphs are built here from exact k-NN lists (CuPy matmul + argsort on a few thousand points) and
pruned with prune_gpu, so these tests do not depend on the rest of knnkit.index.
"""

import numpy as np
import pytest

import knnkit

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not knnkit.gpu_available(), reason="needs an NVIDIA GPU and CuPy")]


def _cp():
    import cupy

    return cupy


def _data(kind, n, d, rng, n_queries):
    if kind == "uniform":
        a = rng.random((n + n_queries, d), dtype=np.float32)
    else:  # clustered: 20 overlapping Gaussian blobs of different spreads
        c = rng.standard_normal((20, d)).astype(np.float32)
        lab = rng.integers(0, 20, n + n_queries)
        s = rng.uniform(0.3, 1.0, 20).astype(np.float32)
        a = c[lab] + rng.standard_normal((n + n_queries, d)).astype(np.float32) * s[lab, None]
    return a[:n], a[n:]


def _dist_matrix(cp, A, B, metric):
    if metric == "ip":
        return -(A @ B.T)
    an = (A * A).sum(1)[:, None]
    bn = (B * B).sum(1)[None, :]
    return cp.maximum(an + bn - 2 * (A @ B.T), 0)


def _exact(cp, X, Q, k, metric):
    D = _dist_matrix(cp, Q, X, metric)
    return cp.argsort(D, axis=1)[:, :k]


def _knn_graph(cp, X, K, metric):
    D = _dist_matrix(cp, X, X, metric)
    cp.fill_diagonal(D, cp.inf)
    idx = cp.argsort(D, axis=1)[:, :K].astype(cp.int32)
    return idx, cp.take_along_axis(D, idx, axis=1).astype(cp.float32)


def _search_graph(cp, X, metric, K=64, R=32, alpha=1.2):
    """k-NN candidates -> RobustPrune -> union with reverse edges -> prune again (Vamana-like)."""
    from knnkit.index._prune_gpu import prune_gpu

    ci, cd = _knn_graph(cp, X, K, metric)
    g = prune_gpu(X, ci, cd, R, alpha, metric)
    n = X.shape[0]
    src = cp.repeat(cp.arange(n, dtype=cp.int32), R)
    dst = g.ravel()
    ok = dst >= 0
    src, dst = src[ok], dst[ok]
    order = cp.argsort(dst)
    src, dst = src[order], dst[order]
    start = cp.searchsorted(dst, cp.arange(n, dtype=cp.int32))
    rank = cp.arange(dst.shape[0]) - start[dst]
    rev = cp.full((n, R), -1, dtype=cp.int32)
    keep = rank < R
    rev[dst[keep], rank[keep]] = src[keep]
    cand = cp.concatenate([g, rev], axis=1)
    D = _dist_matrix(cp, X, X, metric)
    cdist = cp.where(cand >= 0, cp.take_along_axis(D, cp.maximum(cand, 0).astype(cp.int64), 1), cp.inf)
    return prune_gpu(X, cand, cdist.astype(cp.float32), R, alpha, metric)


def _seeds(cp, X, Q, metric, rng, n_pivots=128, s=8):
    piv = cp.asarray(rng.choice(X.shape[0], n_pivots, replace=False).astype(np.int32))
    D = _dist_matrix(cp, Q, X[piv], metric)
    return piv[cp.argsort(D, axis=1)[:, :s]].astype(cp.int32)


def _recall(found, truth):
    f, t = cp_get(found), cp_get(truth)
    k = t.shape[1]
    return np.mean([len(set(f[i]) & set(t[i])) / k for i in range(t.shape[0])])


def cp_get(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def _check_rows(cp, X, Q, dist, idx, metric, exact_fp32=True):
    """Rows sorted, no repeated index, distances equal to recomputed ones."""
    d, i = cp_get(dist), cp_get(idx)
    assert np.all(np.diff(d, axis=1) >= 0)
    for r in range(i.shape[0]):
        v = i[r][i[r] >= 0]
        assert len(set(v.tolist())) == len(v)
    ok = i >= 0
    Xh, Qh = cp_get(X).astype(np.float64), cp_get(Q).astype(np.float64)
    rows = np.nonzero(ok)[0]
    x = Xh[i[ok]]
    q = Qh[rows]
    ref = -(x * q).sum(1) if metric == "ip" else ((x - q) ** 2).sum(1)
    np.testing.assert_allclose(d[ok], ref, rtol=1e-4, atol=1e-3 * max(1.0, np.abs(ref).max()))


# ------------------------------------------------------------------------------ search recall
@pytest.mark.parametrize("kind,d,metric,min_recall", [
    ("uniform", 3, "l2", 0.95), ("clustered", 3, "ip", 0.8),  # raw MIPS in 3-d: answers on the hull
    ("clustered", 128, "l2", 0.95), ("uniform", 128, "l2", 0.9), ("clustered", 128, "ip", 0.85),
    ("uniform", 128, "ip", 0.9), ("clustered", 960, "l2", 0.95), ("clustered", 960, "ip", 0.85),
])
def test_search_recall(kind, d, metric, min_recall):
    from knnkit.index._search_gpu import search_gpu

    cp = _cp()
    rng = np.random.default_rng(d * 7 + len(kind) + len(metric))
    Xh, Qh = _data(kind, 4000, d, rng, 300)
    if metric == "ip" and kind == "uniform":  # cosine-like: graphs are not made for raw MIPS on uniform
        Xh /= np.linalg.norm(Xh, axis=1, keepdims=True)
        Qh /= np.linalg.norm(Qh, axis=1, keepdims=True)
    X, Q = cp.asarray(Xh), cp.asarray(Qh)
    g = _search_graph(cp, X, metric)
    seeds = _seeds(cp, X, Q, metric, rng)
    truth = _exact(cp, X, Q, 10, metric)
    dist, idx = search_gpu(X, g, Q, 10, seeds=seeds, beam=128, tau=None, max_iters=None, metric=metric)
    assert dist.dtype == np.float32 and idx.dtype == np.int64 and idx.shape == (300, 10)
    rec = _recall(idx, truth)
    assert rec >= min_recall, rec
    _check_rows(cp, X, Q, dist, idx, metric)


@pytest.mark.parametrize("k,batch", [(1, 1), (1, 1000), (10, 7), (100, 7), (100, 1000)])
def test_search_k_and_batch(k, batch):
    from knnkit.index._search_gpu import search_gpu

    cp = _cp()
    rng = np.random.default_rng(k * 31 + batch)
    Xh, Qh = _data("clustered", 5000, 32, rng, batch)
    X, Q = cp.asarray(Xh), cp.asarray(Qh)
    g = _search_graph(cp, X, "l2")
    seeds = _seeds(cp, X, Q, "l2", rng)
    beam = max(64, 2 * k)
    dist, idx = search_gpu(X, g, Q, k, seeds=seeds, beam=beam, tau=None, max_iters=None, metric="l2")
    assert idx.shape == (batch, k)
    assert _recall(idx, _exact(cp, X, Q, k, "l2")) >= 0.95
    _check_rows(cp, X, Q, dist, idx, "l2")


def test_search_large_beam_k1000_opt_in_shared_memory():
    """beam 1024 needs > 48 KiB of shared memory per block (opt-in path)."""
    from knnkit.index._search_gpu import search_gpu

    cp = _cp()
    rng = np.random.default_rng(5)
    Xh, Qh = _data("uniform", 3000, 16, rng, 20)
    X, Q = cp.asarray(Xh), cp.asarray(Qh)
    g = _search_graph(cp, X, "l2")
    seeds = _seeds(cp, X, Q, "l2", rng)
    dist, idx = search_gpu(X, g, Q, 1000, seeds=seeds, beam=1024, tau=None, max_iters=None, metric="l2")
    assert _recall(idx, _exact(cp, X, Q, 1000, "l2")) >= 0.97
    _check_rows(cp, X, Q, dist, idx, "l2")


# ------------------------------------------------------------------------------ fp16 traversal
@pytest.mark.parametrize("metric,d,rerank", [("l2", 128, "fused"), ("ip", 64, "fused"), ("l2", 30, "fused"),
                                             ("l2", 128, "split"), ("ip", 27, "split")])
def test_search_fp16_traversal_exact_rerank(metric, d, rerank):
    from knnkit.index._search_gpu import search_gpu

    cp = _cp()
    rng = np.random.default_rng(11 + d)
    Xh, Qh = _data("clustered", 4000, d, rng, 200)
    X, Q = cp.asarray(Xh), cp.asarray(Qh)
    g = _search_graph(cp, X, metric)
    seeds = _seeds(cp, X, Q, metric, rng)
    dist, idx = search_gpu(X, g, Q, 10, seeds=seeds, beam=64, tau=None, max_iters=None, metric=metric,
                           X_fp16=X.astype(cp.float16), rerank=rerank)
    assert _recall(idx, _exact(cp, X, Q, 10, metric)) >= 0.93
    _check_rows(cp, X, Q, dist, idx, metric)  # distances are the exact fp32 ones, sorted


# ------------------------------------------------------------------------------ stopping, padding
def test_tau_reduces_work_and_keeps_recall():
    from knnkit.index._search_gpu import search_gpu

    cp = _cp()
    rng = np.random.default_rng(3)
    Xh, Qh = _data("clustered", 6000, 64, rng, 300)
    X, Q = cp.asarray(Xh), cp.asarray(Qh)
    g = _search_graph(cp, X, "l2")
    seeds = _seeds(cp, X, Q, "l2", rng)
    truth = _exact(cp, X, Q, 10, "l2")
    kw = dict(seeds=seeds, beam=128, max_iters=None, metric="l2", return_stats=True)
    _, i_inf, s_inf = search_gpu(X, g, Q, 10, tau=None, **kw)
    _, i_0, s_0 = search_gpu(X, g, Q, 10, tau=0.0, **kw)
    _, i_1, s_1 = search_gpu(X, g, Q, 10, tau=1.0, **kw)
    work = [int(s[:, 1].sum()) for s in (s_0, s_1, s_inf)]
    assert work[0] < work[1] <= work[2], work
    assert _recall(i_1, truth) >= 0.9
    assert _recall(i_inf, truth) >= _recall(i_0, truth)
    # max_iters caps expansions
    _, _, s_cap = search_gpu(X, g, Q, 10, tau=None, seeds=seeds, beam=128, max_iters=5, metric="l2",
                             return_stats=True)
    assert int(s_cap[:, 0].max()) <= 5


def test_unreachable_points_are_padded():
    """Graph with two components; seeds in the first one only; k above its size."""
    from knnkit.index._search_gpu import search_gpu

    cp = _cp()
    rng = np.random.default_rng(0)
    n1, n2, R = 30, 50, 8
    Xh = rng.standard_normal((n1 + n2, 8)).astype(np.float32)
    gh = np.full((n1 + n2, R), -1, np.int32)
    for u in range(n1):  # a ring plus chords inside component A
        gh[u, :3] = [(u + 1) % n1, (u - 1) % n1, (u + 7) % n1]
    for u in range(n2):
        gh[n1 + u, :2] = [n1 + (u + 1) % n2, n1 + (u + 3) % n2]
    X, Q = cp.asarray(Xh), cp.asarray(rng.standard_normal((7, 8)).astype(np.float32))
    seeds = cp.asarray(np.array([[0, -1, 0, 5]] * 7, np.int32))  # -1 and duplicates are skipped
    dist, idx = search_gpu(X, cp.asarray(gh), Q, 40, seeds=seeds, beam=64, tau=None, max_iters=None, metric="l2")
    i, d = cp_get(idx), cp_get(dist)
    assert np.all(i[:, n1:] == -1) and np.all(np.isinf(d[:, n1:]))
    for r in range(7):
        assert sorted(i[r, :n1].tolist()) == list(range(n1))  # every reachable point, exactly once
    truth = np.argsort(((Xh[None, :n1] - cp_get(Q)[:, None]) ** 2).sum(-1), axis=1)
    assert np.array_equal(i[:, :n1], truth)
    # no valid seed at all: everything padded
    dist, idx = search_gpu(X, cp.asarray(gh), Q, 5, seeds=cp.full((7, 2), -1, cp.int32), beam=16, tau=1.0,
                           max_iters=None, metric="l2")
    assert np.all(cp_get(idx) == -1) and np.all(np.isinf(cp_get(dist)))


def test_search_deterministic_and_width():
    from knnkit.index._search_gpu import search_gpu

    cp = _cp()
    rng = np.random.default_rng(9)
    Xh, Qh = _data("clustered", 3000, 40, rng, 100)
    X, Q = cp.asarray(Xh), cp.asarray(Qh)
    g = _search_graph(cp, X, "l2")
    seeds = _seeds(cp, X, Q, "l2", rng)
    kw = dict(seeds=seeds, beam=64, tau=None, max_iters=None, metric="l2")
    a = search_gpu(X, g, Q, 10, **kw)
    b = search_gpu(X, g, Q, 10, **kw)
    assert np.array_equal(cp_get(a[1]), cp_get(b[1])) and np.array_equal(cp_get(a[0]), cp_get(b[0]))
    d2, i2 = search_gpu(X, g, Q, 10, width=2, **kw)
    assert _recall(i2, _exact(cp, X, Q, 10, "l2")) >= 0.95
    # small hash table: the visited set is reset and refilled with the list many times per query
    d3, i3, st = search_gpu(X, g, Q, 10, hash_size=256, return_stats=True, **kw)
    _, _, st0 = search_gpu(X, g, Q, 10, return_stats=True, visited="hash", **kw)
    assert int(st[:, 1].sum()) >= int(st0[:, 1].sum())  # forgotten rejects are evaluated again
    assert _recall(i3, _exact(cp, X, Q, 10, "l2")) >= 0.95
    _check_rows(cp, X, Q, d3, i3, "l2")
    # 1-D seeds shared by all queries (uniform data: one connected graph)
    Xu, Qu = (cp.asarray(a) for a in _data("uniform", 3000, 8, rng, 100))
    gu = _search_graph(cp, Xu, "l2")
    d4, i4 = search_gpu(Xu, gu, Qu, 10, seeds=cp.asarray([0, 1, 2], cp.int32), beam=64, tau=None, max_iters=None,
                        metric="l2")
    assert _recall(i4, _exact(cp, Xu, Qu, 10, "l2")) >= 0.95


def test_default_width_follows_the_beam_with_an_fp16_copy():
    """Without a width, fp16 traversal expands 2 / 4 / 8 nodes per step by beam (default_width):
    the same lists as that width given explicitly, and at a long beam at least the recall of
    width 2; fp32 traversal keeps 1."""
    from knnkit.index._search_gpu import default_width, search_gpu

    assert [default_width(b, True) for b in (16, 255, 256, 2047, 2048, 8192)] == [2, 2, 4, 4, 8, 8]
    assert default_width(4096, False) == 1
    cp = _cp()
    rng = np.random.default_rng(4)
    Xh, Qh = _data("uniform", 6000, 32, rng, 200)
    X, Q = cp.asarray(Xh), cp.asarray(Qh)
    X16 = X.astype(cp.float16)
    g = _search_graph(cp, X, "l2")
    seeds = _seeds(cp, X, Q, "l2", rng)
    truth = _exact(cp, X, Q, 10, "l2")
    for beam, width in ((64, 2), (512, 4), (2048, 8)):
        kw = dict(seeds=seeds, beam=beam, tau=None, max_iters=None, metric="l2", X_fp16=X16)
        d0, i0 = search_gpu(X, g, Q, 10, **kw)
        d1, i1 = search_gpu(X, g, Q, 10, width=width, **kw)
        assert np.array_equal(cp_get(i0), cp_get(i1)) and np.array_equal(cp_get(d0), cp_get(d1)), beam
    _, i2 = search_gpu(X, g, Q, 10, width=2, **kw)
    assert _recall(i0, truth) >= _recall(i2, truth) - 0.002
    # the longest beam that fits shared memory still runs without a width given
    search_gpu(X, g, Q[:4], 10, seeds=seeds[:4], beam=8192, tau=None, max_iters=None, metric="l2", X_fp16=X16)


def test_search_bad_arguments():
    from knnkit.index._search_gpu import search_gpu

    cp = _cp()
    X = cp.zeros((10, 4), cp.float32)
    g = cp.zeros((10, 2), cp.int32)
    s = cp.zeros((1, 1), cp.int32)
    with pytest.raises(ValueError):
        search_gpu(X, g, X[:1], 5, seeds=s, beam=4, tau=None, max_iters=None, metric="l2")
    with pytest.raises(ValueError):
        search_gpu(X, g, X[:1], 1, seeds=s, beam=4, tau=None, max_iters=None, metric="cosine")
    with pytest.raises(ValueError):
        search_gpu(X, g, cp.zeros((1, 5), cp.float32), 1, seeds=s, beam=4, tau=None, max_iters=None, metric="l2")


# ------------------------------------------------------------------------------ RobustPrune
def _prune_ref(X, ci, cd, R, alpha, metric, fill):
    """Plain numpy statement of the rule (float64 distances)."""
    X = X.astype(np.float64)
    shift = (X * X).sum(1).max() if metric == "ip" else 0.0

    def dist(a, b):
        return -(X[a] @ X[b]) if metric == "ip" else ((X[a] - X[b]) ** 2).sum()

    out = np.full((ci.shape[0], R), -1, np.int32)
    for v in range(ci.shape[0]):
        order = np.lexsort((ci[v], cd[v]))
        seen, kept, pruned = set(), [], []
        for t in order:
            c = int(ci[v, t])
            if c < 0 or c == v or c in seen or not np.isfinite(cd[v, t]):
                continue
            seen.add(c)
            if all(alpha * alpha * (dist(p, c) + shift) > cd[v, t] + shift for p in kept):
                kept.append(c)
                if len(kept) == R:
                    break
            else:
                pruned.append(c)
        if fill:
            kept += pruned[:R - len(kept)]
        out[v, :len(kept)] = kept
    return out


@pytest.mark.parametrize("metric,d,C,R,alpha,fill", [
    ("l2", 8, 24, 8, 1.0, False), ("l2", 37, 40, 12, 1.2, True), ("l2", 128, 70, 16, 1.5, False),
    ("ip", 16, 32, 10, 1.2, True), ("ip", 5, 130, 20, 1.0, False), ("l2", 3, 200, 300, 1.2, True),
])
def test_prune_matches_numpy_reference(metric, d, C, R, alpha, fill):
    from knnkit.index._prune_gpu import prune_gpu

    cp = _cp()
    rng = np.random.default_rng(C + R + d)
    n = 300
    X = rng.standard_normal((n, d)).astype(np.float32)
    ci = rng.integers(-1, n, (n, C)).astype(np.int32)
    ci[::5, 0] = np.arange(0, n, 5)  # self loops
    ci[::7, 1] = ci[::7, 2]  # repeated candidates
    Xd = X.astype(np.float64)
    cd = np.where(ci >= 0, (-(Xd[np.arange(n)[:, None]] * Xd[np.maximum(ci, 0)]).sum(-1) if metric == "ip" else
                            ((Xd[np.arange(n)[:, None]] - Xd[np.maximum(ci, 0)]) ** 2).sum(-1)), np.inf)
    cd = cd.astype(np.float32)
    got = cp_get(prune_gpu(cp.asarray(X), cp.asarray(ci), cp.asarray(cd), R, alpha, metric, fill=fill))
    ref = _prune_ref(X, ci, cd, R, alpha, metric, fill)
    assert got.shape == (n, R) and got.dtype == np.int32
    same = (got == ref).all(axis=1)
    assert same.mean() >= 0.99, np.nonzero(~same)[0][:5]  # float32 vs float64 near-ties only


def test_prune_matches_cpu_prune_when_present():
    from knnkit.index._prune_gpu import prune_gpu

    try:
        from knnkit.index._prune_cpu import prune_cpu
    except ImportError:
        pytest.skip("CPU prune not available")
    cp = _cp()
    rng = np.random.default_rng(1)
    X = rng.standard_normal((500, 24)).astype(np.float32)
    ci, cd = _knn_graph(cp, cp.asarray(X), 40, "l2")
    got = cp_get(prune_gpu(cp.asarray(X), ci, cd, 16, 1.2, "l2"))
    ref = prune_cpu(X, cp_get(ci), cp_get(cd), 16, 1.2, "l2")
    assert (got == ref).all(axis=1).mean() >= 0.99


# ------------------------------------------------------------------------------ Bloom-filter visited set
@pytest.mark.parametrize("kind,d,metric,fp16", [("uniform", 64, "l2", False), ("clustered", 128, "l2", True),
                                                ("clustered", 48, "ip", False)])
def test_bloom_visited_recall_close_to_hash(kind, d, metric, fp16):
    from knnkit.index._search_gpu import search_gpu

    cp = _cp()
    rng = np.random.default_rng(100 + d)
    Xh, Qh = _data(kind, 5000, d, rng, 300)
    X, Q = cp.asarray(Xh), cp.asarray(Qh)
    g = _search_graph(cp, X, metric)
    seeds = _seeds(cp, X, Q, metric, rng)
    truth = _exact(cp, X, Q, 10, metric)
    kw = dict(seeds=seeds, beam=64, tau=None, max_iters=None, metric=metric, return_stats=True,
              X_fp16=X.astype(cp.float16) if fp16 else None)
    _, ih, sh = search_gpu(X, g, Q, 10, visited="hash", **kw)
    db, ib, sb = search_gpu(X, g, Q, 10, visited="bloom", **kw)
    rh, rb = _recall(ih, truth), _recall(ib, truth)
    assert rb >= rh - 0.01, (rb, rh)
    _check_rows(cp, X, Q, db, ib, metric)  # sorted, no duplicate, exact distances
    # a false positive skips a node: about the same number of distances (not more, up to the
    # different paths that skips cause)
    assert int(sb[:, 1].sum()) <= 1.02 * int(sh[:, 1].sum())
    # a tiny filter (many refills, high false-positive rate) still gives valid rows
    dt, it = search_gpu(X, g, Q, 10, visited="bloom", bloom_bits=1024,
                        **{k: v for k, v in kw.items() if k != "return_stats"})
    _check_rows(cp, X, Q, dt, it, metric)
    assert _recall(it, truth) >= rh - 0.1


def test_visited_auto_choice_and_bad_value():
    from knnkit.index._search_gpu import _visited_config, search_gpu

    # auto: Bloom filter (measured faster), hash when only a hash size is given
    assert _visited_config("auto", 32, 64, None, None)[0] == 1
    assert _visited_config("auto", 1024, 64, None, None)[0] == 1
    assert _visited_config("auto", 32, 64, 4096, None) == (0, 4096, 2048)
    assert _visited_config("hash", 1024, 64, None, None)[0] == 0
    vis, words, cap = _visited_config("bloom", 32, 64, None, None)
    assert vis == 1 and words * 32 >= 16 * cap and cap >= 2 * (32 + 64)
    # a tiny filter still takes a full list plus one expansion between refills
    assert _visited_config("bloom", 512, 64, None, 1024) == (1, 32, 576)
    cp = _cp()
    X = cp.zeros((10, 4), cp.float32)
    with pytest.raises(ValueError):
        search_gpu(X, cp.zeros((10, 2), cp.int32), X[:1], 1, seeds=cp.zeros((1, 1), cp.int32), beam=4, tau=None,
                   max_iters=None, metric="l2", visited="bitmap")


def test_bloom_large_beam_k1024_where_hash_does_not_fit():
    """beam 8192: list + hash table exceed the 227 KiB of shared memory; the Bloom filter fits."""
    from knnkit.index._search_gpu import search_gpu

    cp = _cp()
    rng = np.random.default_rng(21)
    Xh, Qh = _data("uniform", 12000, 16, rng, 16)
    X, Q = cp.asarray(Xh), cp.asarray(Qh)
    g = _search_graph(cp, X, "l2")
    seeds = _seeds(cp, X, Q, "l2", rng)
    kw = dict(seeds=seeds, beam=8192, tau=None, max_iters=None, metric="l2")
    with pytest.raises(ValueError):
        search_gpu(X, g, Q, 1024, visited="hash", **kw)
    dist, idx = search_gpu(X, g, Q, 1024, **kw)  # auto -> bloom
    assert idx.shape == (16, 1024)
    assert _recall(idx, _exact(cp, X, Q, 1024, "l2")) >= 0.97
    _check_rows(cp, X, Q, dist, idx, "l2")
    # k = 1000 with beam 2048 (auto picks the Bloom filter there too) and fp16 traversal
    dist, idx = search_gpu(X, g, Q, 1000, seeds=seeds, beam=2048, tau=None, max_iters=None, metric="l2",
                           X_fp16=X.astype(cp.float16))
    assert _recall(idx, _exact(cp, X, Q, 1000, "l2")) >= 0.97
    _check_rows(cp, X, Q, dist, idx, "l2")


def test_list_in_global_memory_walks_as_in_shared_memory():
    """list_memory="global" (the list's buffers in a per-block slab of global memory) gives the
    same ids and distances as the shared-memory list, fp32 and fp16 traversal, both metrics; a beam
    whose list does not fit in shared memory (16384) runs there on its own (it raised before) and
    its recall stays at least the largest shared-memory beam's."""
    from knnkit.index._search_gpu import search_gpu

    cp = _cp()
    rng = np.random.default_rng(33)
    for metric in ("l2", "ip"):
        Xh, Qh = _data("clustered", 5000, 24, rng, 300)
        X, Q = cp.asarray(Xh), cp.asarray(Qh)
        g = _search_graph(cp, X, metric)
        seeds = _seeds(cp, X, Q, metric, rng)
        for fp16, visited in ((False, "bloom"), (True, "bloom"), (False, "hash"), (True, "hash")):
            kw = dict(seeds=seeds, beam=256, tau=None, max_iters=None, metric=metric, visited=visited,
                      X_fp16=X.astype(cp.float16) if fp16 else None)
            d0, i0, s0 = search_gpu(X, g, Q, 10, list_memory="shared", return_stats=True, **kw)
            d1, i1, s1 = search_gpu(X, g, Q, 10, list_memory="global", return_stats=True, **kw)
            assert np.array_equal(cp_get(i0), cp_get(i1)) and np.array_equal(cp_get(d0), cp_get(d1)), (metric, fp16)
            if visited == "hash":
                # the same distances computed (with the Bloom filter, which of two nodes sharing a
                # word's bits in one step is taken depends on the threads' order, in either memory)
                assert np.array_equal(cp_get(s0), cp_get(s1))
    with pytest.raises(ValueError, match="list_memory"):
        search_gpu(X, g, Q, 10, seeds=seeds, beam=16, tau=None, max_iters=None, metric="l2", list_memory="host")
    # beam 16384 on 20k uniform points: past shared memory (4 * 16384 words of list alone)
    Xh, Qh = _data("uniform", 20000, 32, rng, 64)
    X, Q = cp.asarray(Xh), cp.asarray(Qh)
    g = _search_graph(cp, X, "l2", K=32, R=16)
    seeds = _seeds(cp, X, Q, "l2", rng, s=2)
    truth = _exact(cp, X, Q, 100, "l2")
    X16 = X.astype(cp.float16)
    rec = {}
    for beam in (8192, 16384):
        for rerank in ("fused", "split"):
            dist, idx = search_gpu(X, g, Q, 100, seeds=seeds, beam=beam, tau=None, max_iters=None, metric="l2",
                                   X_fp16=X16, rerank=rerank)
            _check_rows(cp, X, Q, dist, idx, "l2")
            rec[beam, rerank] = _recall(idx, truth)
    assert rec[16384, "fused"] == rec[16384, "split"]  # (split is fused past shared memory)
    # (a Bloom filter false positive can hide a neighbour at any beam: 0.998 at both on an H200)
    assert rec[16384, "fused"] >= max(0.99, rec[8192, "fused"] - 0.001), rec


# ------------------------------------------------------------------------------ seed selection kernel
@pytest.mark.parametrize("metric,d,c,s,nq", [("l2", 128, 1000, 4, 3), ("l2", 30, 37, 8, 700), ("ip", 64, 4096, 16, 50),
                                             ("ip", 5, 20, 32, 300), ("l2", 16, 1, 3, 10)])
@pytest.mark.parametrize("method", ["direct", "gemm"])
def test_select_seeds_matches_cpu_entry_points(metric, d, c, s, nq, method):
    from knnkit.index._entry import EntryPoints
    from knnkit.index._search_gpu import select_seeds_gpu

    cp = _cp()
    rng = np.random.default_rng(c + s + d)
    C = rng.standard_normal((c, d)).astype(np.float32)
    if metric == "ip":
        C /= np.linalg.norm(C, axis=1, keepdims=True)
    M = rng.permutation(10 * c)[:c].astype(np.int32)
    Q = rng.standard_normal((nq, d)).astype(np.float32)
    ref = EntryPoints(C, M, metric).seeds_for(Q, s, exact=True)  # numpy path, every entry scanned
    got = select_seeds_gpu(cp.asarray(Q), cp.asarray(C), cp.asarray(M), s, metric, method=method)
    got = cp_get(got)
    assert got.shape == (nq, s) and got.dtype == np.int32
    assert np.all(got[:, c:] == -1)  # fewer centroids than seeds: padded
    same = (got == ref).all(axis=1)
    assert same.mean() >= 0.98, np.nonzero(~same)[0][:5]  # float32 summation order: near-ties only
    # the GPU EntryPoints path gives the same answer (cupy queries)
    ep = EntryPoints(cp.asarray(C), cp.asarray(M), metric)
    assert np.array_equal(cp_get(ep.seeds_for(cp.asarray(Q), s)), cp_get(
        select_seeds_gpu(cp.asarray(Q), cp.asarray(C), cp.asarray(M), s, metric)))


@pytest.mark.parametrize("metric", ["l2", "ip"])
@pytest.mark.parametrize("c,s,nq", [(1, 3, 9), (37, 8, 700), (100, 64, 33), (4096, 4, 2000), (4096, 200, 64),
                                    (3000, 33, 257)])
def test_seed_select_rows_equals_shared_memory_mode(metric, c, s, nq, monkeypatch):
    """The warp-a-query selection over the GEMM's dots gives seed_select's seeds bit for bit: ties
    (repeated centroids: equal distances, smaller index first), more seeds than a lane keeps (its
    slots rescanned above the last key it gave), more seeds than centroids (-1 past c)."""
    from knnkit.index import _search_gpu as sg

    cp = _cp()
    rng = np.random.default_rng(c * 7 + s)
    C = rng.standard_normal((c, 16)).astype(np.float32)
    if c > 4:
        C[c // 2:c // 2 + 3] = C[1]  # repeated centroids: exact ties
    C = np.round(C * 4) / 4  # coarse values: many equal distances
    M = rng.permutation(10 * c)[:c].astype(np.int32)
    Q = np.round(rng.standard_normal((nq, 16)) * 4).astype(np.float32) / 4
    args = (cp.asarray(Q), cp.asarray(C), cp.asarray(M), s, metric)
    monkeypatch.setattr(sg, "SEED_SELECT_ROWS", True)
    rows = cp_get(sg.select_seeds_gpu(*args, method="gemm"))
    monkeypatch.setattr(sg, "SEED_SELECT_ROWS", False)
    shared = cp_get(sg.select_seeds_gpu(*args, method="gemm"))
    np.testing.assert_array_equal(rows, shared)
    assert np.all(rows[:, c:] == -1) and np.all(rows[:, :min(c, s)] >= 0)


@pytest.mark.parametrize("visited", ["hash", "bloom"])
def test_many_seeds_refill_visited_set_between_chunks(visited):
    """3000 seeds per query: more than the visited set holds before a refill (the seed loop refills)."""
    from knnkit.index._search_gpu import search_gpu

    cp = _cp()
    rng = np.random.default_rng(77)
    Xh, Qh = _data("uniform", 5000, 24, rng, 40)
    X, Q = cp.asarray(Xh), cp.asarray(Qh)
    g = _search_graph(cp, X, "l2")
    seeds = cp.asarray(rng.integers(-1, 5000, (40, 3000)).astype(np.int32))  # with repeats and -1
    kw = dict(seeds=seeds, beam=32, tau=None, max_iters=None, metric="l2", visited=visited)
    if visited == "hash":
        kw["hash_size"] = 2048
    else:
        kw["bloom_bits"] = 16384
    dist, idx = search_gpu(X, g, Q, 10, **kw)
    assert _recall(idx, _exact(cp, X, Q, 10, "l2")) >= 0.97
    _check_rows(cp, X, Q, dist, idx, "l2")
