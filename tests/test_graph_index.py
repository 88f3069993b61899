"""Tests of knnkit.GraphIndex (CPU path; GPU tests marked and skipped without a GPU)."""


import numpy as np
import pytest

import knnkit
from helpers import recall_at
from knnkit import GraphIndex
from knnkit._core.metrics import internal_metric, prepare_vectors
from knnkit.index._build import exact_knn_cpu
from knnkit.index._entry import EntryPoints, build_entry_points
from knnkit.index._prune_cpu import add_reverse_edges, ggnn_diversify, pair_distances, prune_cpu
from knnkit.index._search_cpu import search_cpu

METRICS = ("sqeuclidean", "euclidean", "inner_product", "cosine")


def clustered(n, d, nq, seed):
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((20, d)).astype(np.float32)
    lab = rng.integers(0, 20, n + nq)
    X = (c[lab] + 0.3 * rng.standard_normal((n + nq, d))).astype(np.float32)
    return X[:n], X[n:]


def truth(X, Q, k, metric):
    im = internal_metric(metric)
    _d, i = exact_knn_cpu(prepare_vectors(X, metric), prepare_vectors(Q, metric), k, im)
    return i


recall = recall_at


@pytest.fixture(scope="module")
def clu():
    return clustered(3000, 24, 150, seed=11)


@pytest.fixture(scope="module")
def clu_index(clu):
    return GraphIndex.build(clu[0], graph_degree=16, device="cpu", random_state=0)


# ---------------------------------------------------------------- recall
@pytest.mark.parametrize("metric", METRICS)
def test_recall_clustered(clu, metric):
    X, Q = clu
    index = GraphIndex.build(X, metric=metric, graph_degree=16, device="cpu", random_state=1)
    d, i = index.search(Q, k=10)
    r = recall(i, truth(X, Q, 10, metric))
    # maximum inner product search on a graph is harder (no triangle inequality)
    assert r >= (0.85 if metric == "inner_product" else 0.97), r
    assert i.dtype == np.int64 and d.dtype == np.float32 and d.shape == (len(Q), 10)
    # rows best first in the user's metric
    if metric == "inner_product":
        assert np.all(np.diff(d, axis=1) <= 1e-5)
    else:
        assert np.all(np.diff(d, axis=1) >= -1e-5)


@pytest.mark.parametrize("metric", METRICS)
def test_recall_uniform_and_distances(metric):
    rng = np.random.default_rng(5)
    X = rng.random((2000, 8), dtype=np.float32)
    Q = rng.random((100, 8), dtype=np.float32)
    index = GraphIndex.build(X, metric=metric, graph_degree=16, device="cpu", random_state=2)
    d, i = index.search(Q, k=5, beam=48)
    assert recall(i, truth(X, Q, 5, metric)) >= 0.97
    # reported distances are the true distances of the reported points
    x, q = X[i[:, 0]].astype(np.float64), Q.astype(np.float64)
    expect = {"sqeuclidean": ((x - q) ** 2).sum(1), "euclidean": np.sqrt(((x - q) ** 2).sum(1)),
              "inner_product": (x * q).sum(1),
              "cosine": 1 - (x * q).sum(1) / np.linalg.norm(x, axis=1) / np.linalg.norm(q, axis=1)}[metric]
    np.testing.assert_allclose(d[:, 0], expect, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("diversify", ["prune", "ggnn"])
def test_diversify_options(clu, diversify):
    X, Q = clu
    index = GraphIndex.build(X, graph_degree=16, diversify=diversify, build_algo="brute", device="cpu")
    g = index.graph
    assert g.shape == (len(X), 16) and g.dtype == np.int32
    assert g.max() < len(X) and g.min() >= -1
    assert not np.any(g == np.arange(len(X))[:, None]), "self loop"
    _d, i = index.search(Q, k=10, beam=32)
    assert recall(i, truth(X, Q, 10, "sqeuclidean")) >= 0.95


def test_beam_and_tau_knobs(clu, clu_index):
    X, Q = clu
    exact = truth(X, Q, 10, "sqeuclidean")
    r_small = recall(clu_index.search(Q, k=10, beam=10)[1], exact)
    r_big = recall(clu_index.search(Q, k=10, beam=128)[1], exact)
    assert r_big >= r_small and r_big >= 0.99
    # tau=0 stops as soon as no candidate beats the k-th best: never more work than tau=inf
    _d, _i, s0 = search_cpu(clu_index._engine._X, clu_index._engine._graph, prepare_vectors(Q, "sqeuclidean"), 10,
                            seeds=clu_index._engine._entry.seeds_for(Q, 4), beam=128, tau=0.0, max_iters=10 ** 6,
                            metric="l2", return_stats=True)
    _d, _i, s1 = search_cpu(clu_index._engine._X, clu_index._engine._graph, prepare_vectors(Q, "sqeuclidean"), 10,
                            seeds=clu_index._engine._entry.seeds_for(Q, 4), beam=128, tau=np.inf, max_iters=10 ** 6,
                            metric="l2", return_stats=True)
    assert np.all(s0[:, 1] <= s1[:, 1]) and s0[:, 1].mean() < s1[:, 1].mean()
    # max_iters caps expansions
    _d, _i, s2 = search_cpu(clu_index._engine._X, clu_index._engine._graph, prepare_vectors(Q, "sqeuclidean"), 10,
                            seeds=clu_index._engine._entry.seeds_for(Q, 4), beam=128, tau=np.inf, max_iters=3,
                            metric="l2", return_stats=True)
    assert s2[:, 0].max() <= 3


def test_self_queries_and_k_edges(clu_index, clu):
    X, _ = clu
    d, i = clu_index.search(X[:200], k=1)
    assert np.mean(i[:, 0] == np.arange(200)) >= 0.99
    assert np.allclose(d[i[:, 0] == np.arange(200)], 0, atol=1e-4)
    # large k: beam is raised to k
    d, i = clu_index.search(X[:20], k=300)
    assert i.shape == (20, 300) and np.all(i >= 0)
    assert all(len(set(r.tolist())) == 300 for r in i)
    assert recall(i, truth(X, X[:20], 300, "sqeuclidean")) >= 0.9


def test_batch_size_and_k_1024():
    X, Q = clustered(2500, 8, 30, seed=13)
    index = GraphIndex.build(X, graph_degree=16, device="cpu", random_state=0)
    d0, i0 = index.search(Q, k=10)
    d1, i1 = index.search(Q, k=10, batch_size=7)
    assert np.array_equal(i0, i1) and np.array_equal(d0, d1)
    d, i = index.search(Q[:3], k=1024)
    assert i.shape == (3, 1024) and np.all(i >= 0)
    assert recall(i, truth(X, Q[:3], 1024, "sqeuclidean")) >= 0.95


def test_tiny_inputs_and_duplicates():
    X = np.array([[0.0], [1.0], [3.0]], np.float32)
    index = GraphIndex.build(X, graph_degree=4, device="cpu")
    d, i = index.search(np.array([[0.9]], np.float32), k=3)
    assert i.tolist() == [[1, 0, 2]]
    np.testing.assert_allclose(d, [[0.01, 0.81, 4.41]], rtol=1e-5)
    index = GraphIndex.build(X[:2], device="cpu")
    assert index.search(X[:1], k=2)[1].tolist() == [[0, 1]]
    # many duplicates: every copy of the nearest point is found
    rng = np.random.default_rng(0)
    base = rng.random((50, 6), dtype=np.float32)
    D = np.repeat(base, 8, axis=0)
    index = GraphIndex.build(D, graph_degree=12, device="cpu", random_state=0)
    d, i = index.search(base[:10], k=8, beam=64)
    assert np.allclose(d, 0, atol=1e-5)
    assert np.all(i // 8 == np.arange(10)[:, None])


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.float16])
def test_storage_dtypes(dtype):
    rng = np.random.default_rng(3)
    if dtype == np.float16:
        X = rng.standard_normal((1500, 16)).astype(np.float16)
    else:
        info = np.iinfo(dtype)
        X = rng.integers(info.min, info.max, (1500, 16), endpoint=True).astype(dtype)
    Q = X[:50].astype(np.float32) + 0.25
    index = GraphIndex.build(X, graph_degree=16, device="cpu", random_state=0)
    assert index.dtype == np.dtype(dtype) and index.data.dtype == np.dtype(dtype)
    _d, i = index.search(Q, k=5)
    assert recall(i, truth(X.astype(np.float32), Q, 5, "sqeuclidean")) >= 0.95


# ---------------------------------------------------------------- padding
def test_padding_when_fewer_points_reachable():
    # two components that the graph never joins; seeds only in the first
    X = np.concatenate([np.zeros((5, 2)), np.full((5, 2), 100.0)]).astype(np.float32)
    X += np.arange(10, dtype=np.float32)[:, None] * 0.01
    g = np.full((10, 4), -1, np.int32)
    for c in (0, 5):
        for a in range(c, c + 5):
            g[a, :4] = [b for b in range(c, c + 5) if b != a]
    d, i = search_cpu(X, g, X[:1], 8, seeds=np.array([[0, -1]], np.int32), beam=16, tau=np.inf,
                      max_iters=100, metric="l2")
    assert sorted(i[0, :5].tolist()) == [0, 1, 2, 3, 4]
    assert np.all(i[0, 5:] == -1) and np.all(np.isinf(d[0, 5:]))
    # through the public API, in the user metric (inner_product pads with -inf)
    for metric, pad in (("sqeuclidean", np.inf), ("inner_product", -np.inf)):
        index = GraphIndex.build(X, metric=metric, graph_degree=4, device="cpu")
        index._engine._graph = g
        index._engine._entry = EntryPoints(X[:1].copy(), np.array([0], np.int32), internal_metric(metric))
        d, i = index.search(X[:2], k=10)
        assert np.all(i[:, 5:] == -1) and np.all(d[:, 5:] == pad)
        assert np.all(i[:, :5] >= 0) and np.all(np.isfinite(d[:, :5]))


# ---------------------------------------------------------------- bad input
def test_bad_input(clu_index, clu):
    X, Q = clu
    with pytest.raises(ValueError, match="dimension"):
        clu_index.search(Q[:, :5], k=3)
    with pytest.raises(ValueError):
        clu_index.search(Q, k=len(X) + 1)
    with pytest.raises(ValueError):
        clu_index.search(Q, k=0)
    with pytest.raises(ValueError, match="maximum"):
        clu_index.search(Q, k=1025)
    bad = Q.copy()
    bad[3, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        clu_index.search(bad, k=3)
    with pytest.raises(ValueError):
        clu_index.search(Q, k=3, beam=0)
    with pytest.raises(ValueError):
        clu_index.search(Q, k=3, tau=-1.0)
    with pytest.raises(ValueError):
        clu_index.search(Q[0], k=3)
    with pytest.raises(ValueError, match="metric"):
        GraphIndex.build(X, metric="hamming", device="cpu")
    with pytest.raises(ValueError):
        GraphIndex.build(X, graph_degree=16, intermediate_degree=8, device="cpu")
    with pytest.raises(ValueError):
        GraphIndex.build(X, diversify="random", device="cpu")
    with pytest.raises(ValueError):
        GraphIndex.build(X[:1], device="cpu")
    with pytest.raises(TypeError):
        GraphIndex.build(X.astype(np.int64), device="cpu")


# ---------------------------------------------------------------- persistence
@pytest.mark.parametrize("dtype", [np.float32, np.uint8])
def test_save_load_round_trip(tmp_path, dtype):
    rng = np.random.default_rng(7)
    X = (rng.random((800, 12)) * (255 if dtype == np.uint8 else 1)).astype(dtype)
    Q = rng.random((40, 12)).astype(np.float32) * (255 if dtype == np.uint8 else 1)
    index = GraphIndex.build(X, metric="cosine", graph_degree=12, device="cpu", random_state=0, beam=40)
    path = tmp_path / "idx.knnkit"
    index.save(path)
    with open(path, "rb") as f:
        assert f.read(8) == b"KNNKIT\x00\x01"  # the one knnkit container
    assert knnkit._core.persist.container_kind(path) == "index"
    for loaded in (GraphIndex.load(path, device="cpu"), knnkit.load(path, device="cpu")):
        assert isinstance(loaded, GraphIndex)
        assert loaded.metric == "cosine" and loaded.dtype == np.dtype(dtype)
        assert np.array_equal(loaded.data, index.data) and loaded.data.dtype == index.data.dtype
        assert np.array_equal(loaded.graph, index.graph)
        assert np.array_equal(loaded.entry_points, index.entry_points)
        assert loaded.search_params == index.search_params and loaded.search_params.beam == 40
        assert loaded.build_params == index.build_params
        d0, i0 = index.search(Q, k=7)
        d1, i1 = loaded.search(Q, k=7)
        assert np.array_equal(i0, i1) and np.array_equal(d0, d1)
        assert repr(loaded) == repr(index)
    # saving the loaded index gives the same bytes
    path2 = tmp_path / "idx2.knnkit"
    GraphIndex.load(path, device="cpu").save(path2)
    assert path.read_bytes() == path2.read_bytes()


def test_corrupted_and_truncated_files(tmp_path, clu_index):
    path = tmp_path / "idx.knnkit"
    clu_index.save(path)
    raw = path.read_bytes()
    bad = tmp_path / "bad.knnkit"
    # a flipped byte in the vectors
    b = bytearray(raw)
    b[len(raw) // 2] ^= 0x40
    bad.write_bytes(bytes(b))
    with pytest.raises(ValueError, match="corrupted"):
        GraphIndex.load(bad, device="cpu")
    # truncated at several places
    for cut in (4, 20, 200, len(raw) // 2, len(raw) - 1):
        bad.write_bytes(raw[:cut])
        with pytest.raises(ValueError):
            knnkit.load(bad, device="cpu")
    # trailing garbage, wrong version, wrong magic
    bad.write_bytes(raw + b"x")
    with pytest.raises(ValueError):
        GraphIndex.load(bad, device="cpu")
    b = bytearray(raw)
    b[8] = 99
    bad.write_bytes(bytes(b))
    with pytest.raises(ValueError, match="version"):
        GraphIndex.load(bad, device="cpu")
    bad.write_bytes(b"NOTKNNKT" + raw[8:])
    with pytest.raises(ValueError):
        knnkit.load(bad)


# ---------------------------------------------------------------- extend
def test_extend_keeps_recall():
    X, Q = clustered(3000, 16, 150, seed=21)
    index = GraphIndex.build(X[:1500], graph_degree=16, device="cpu", random_state=0)
    index.extend(X[1500:2200])
    index.extend(X[2200:], batch_size=300)
    assert index.n == 3000 and index.graph.shape == (3000, 16)
    g = index.graph
    assert g.max() < 3000 and not np.any(g == np.arange(3000)[:, None])
    _d, i = index.search(Q, k=10)
    assert recall(i, truth(X, Q, 10, "sqeuclidean")) >= 0.95
    # inserted points are found as their own nearest neighbour
    _d, i = index.search(X[2000:2300], k=1)
    assert np.mean(i[:, 0] == np.arange(2000, 2300)) >= 0.98
    with pytest.raises(ValueError):
        index.extend(X[:10, :5])


@pytest.mark.parametrize("metric", ["inner_product", "cosine"])
def test_extend_similarity_metrics(metric):
    X, Q = clustered(2000, 12, 100, seed=22)
    index = GraphIndex.build(X[:1000], metric=metric, graph_degree=16, device="cpu", random_state=0)
    index.extend(X[1000:])
    assert np.isfinite(index.nn1_max)
    _d, i = index.search(Q, k=10)
    assert recall(i, truth(X, Q, 10, metric)) >= (0.85 if metric == "inner_product" else 0.95)


def test_extend_cast_and_single_point():
    rng = np.random.default_rng(0)
    X = rng.integers(0, 255, (600, 8)).astype(np.uint8)
    index = GraphIndex.build(X, graph_degree=8, device="cpu")
    index.extend(np.full((1, 8), 7, np.int64).astype(np.float32).astype(np.uint8))
    assert index.n == 601 and index.search(np.full((1, 8), 7, np.float32), k=1)[1][0, 0] == 600
    with pytest.raises(TypeError):
        index.extend(rng.random((3, 8)).astype(np.float32))
    with pytest.raises(ValueError, match="new_data have d=4"):  # the message names the argument
        index.extend(np.zeros((2, 4), np.uint8))


# ---------------------------------------------------------------- building blocks
def test_prune_rule_and_reverse_edges():
    X = np.array([[0.0], [1.0], [2.0], [10.0]], np.float32)
    ci = np.array([[1, 2, 3], [0, 2, 3], [1, 0, 3], [2, 1, 0]])
    cd = pair_distances(X, ci, "l2")
    g = prune_cpu(X, ci, cd, 3, 1.0, "l2", fill=False)
    # 0 keeps 1; 2 and 3 are occluded by 1 (|1-2| < |0-2|)
    assert g[0].tolist() == [1, -1, -1]
    assert g[1].tolist()[:2] == [0, 2]
    g2 = add_reverse_edges(X, g, 3, 1.0, "l2", fill=False)
    # 3 -> 2 gains its reverse 2 -> 3 since 2 has room
    assert 3 in g2[2].tolist()
    # 'ip' with unit vectors follows the Euclidean rule
    ang = np.array([0.0, 0.3, 0.6, 2.0])
    U = np.stack([np.cos(ang), np.sin(ang)], 1).astype(np.float32)
    gi = prune_cpu(U, ci, pair_distances(U, ci, "ip"), 3, 1.0, "ip", fill=False)
    gl = prune_cpu(U, ci, pair_distances(U, ci, "l2"), 3, 1.0, "l2", fill=False)
    assert np.array_equal(gi, gl)


def test_ggnn_diversify_shape():
    X, _ = clustered(500, 8, 1, seed=3)
    _d, knn = exact_knn_cpu(X, X, 16, "l2", exclude_self=True)
    g = ggnn_diversify(X, knn, None, 12, "l2")
    assert g.shape == (500, 12)
    assert np.array_equal(g[:, :6], knn[:, :6])
    assert all(len(set(r[r >= 0].tolist())) == (r >= 0).sum() for r in g)


def test_entry_points():
    X, _ = clustered(2000, 8, 1, seed=4)
    ep = build_entry_points(X, 20, "l2", random_state=0)
    assert 1 <= len(ep) <= 20 and ep.medoids.dtype == np.int32
    s = ep.seeds_for(X[:10], 3)
    assert s.shape == (10, 3) and s.dtype == np.int32 and np.all(s >= 0)
    s = ep.seeds_for(X[:10], 100)
    assert s.shape == (10, 100) and np.all(s[:, len(ep):] == -1)


def test_repeatable_with_random_state(tmp_path):
    X, Q = clustered(5000, 8, 20, seed=9)  # n > 4096: the NN-Descent path
    a = GraphIndex.build(X, graph_degree=8, device="cpu", random_state=3)
    b = GraphIndex.build(X, graph_degree=8, device="cpu", random_state=3)
    assert np.array_equal(a.graph, b.graph) and np.array_equal(a.entry_points, b.entry_points)
    assert np.array_equal(a.search(Q, k=5)[1], b.search(Q, k=5)[1])
    # a Generator seed is accepted and the index still saves (the seed is recorded by its repr)
    c = GraphIndex.build(X[:500], graph_degree=8, device="cpu", random_state=np.random.default_rng(1))
    c.save(tmp_path / "c.knnkit")
    assert GraphIndex.load(tmp_path / "c.knnkit", device="cpu").n == 500


def test_repr_and_defaults(clu_index):
    r = repr(clu_index)
    assert "GraphIndex(" in r and "graph_degree=16" in r and "metric='sqeuclidean'" in r
    assert len(clu_index) == 3000


def test_intrinsic_dim_estimate_and_auto_degree():
    from knnkit.index._auto import auto_build_params, estimate_intrinsic_dim

    rng = np.random.default_rng(3)
    low = (rng.standard_normal((4000, 3)) @ rng.standard_normal((3, 64))).astype(np.float32)
    high = rng.standard_normal((4000, 64)).astype(np.float32)
    lid_low = estimate_intrinsic_dim(low, random_state=0)
    lid_high = estimate_intrinsic_dim(high, random_state=0)
    assert 2 < lid_low < 5, lid_low       # a 3-d subspace embedded in 64-d
    assert lid_high > 25, lid_high         # isotropic 64-d (the MLE underestimates at this n)
    assert auto_build_params(lid_low) == (32, 64, 1.1)
    assert auto_build_params(lid_low, device="cpu") == (32, 48, 1.1)  # fewer candidates on the CPU
    assert auto_build_params(lid_high)[0] >= 48
    # the middle tier: fewer candidates on the CPU (same graph degree and alpha)
    assert auto_build_params(35.0) == (48, 96, 1.0) and auto_build_params(35.0, device="cpu") == (48, 64, 1.0)
    assert auto_build_params(45.0, device="cpu") == auto_build_params(45.0) == (64, 96, 1.0)
    assert auto_build_params(2.0, 20.0) == auto_build_params(2.0, 20.0, device="cpu") == (64, 96, 1.0)
    # the GPU's top tier from LID 50 (not on the CPU, not for a host-placed index, not below 50)
    from knnkit.index._auto import GPU_TOP_TIER, GPU_TOP_TIER_LID

    assert auto_build_params(float(GPU_TOP_TIER_LID)) == auto_build_params(69.0) == GPU_TOP_TIER == (128, 128, 1.0)
    assert auto_build_params(GPU_TOP_TIER_LID - 0.5) == (64, 96, 1.0)
    assert auto_build_params(69.0, device="cpu") == auto_build_params(69.0, top_tier=False) == (64, 96, 1.0)
    assert auto_build_params(2.0, 200.0) == (64, 96, 1.0)  # clusters of few points keep their tier
    # the estimate takes float32 answers (no float64 pass over rows the certificate rejects): the
    # same value as the certified lists on data whose norms spread widely (many rejected rows)
    import knnkit.exact as exact_pkg
    from knnkit.datasets.suite import make_skewed_norms

    S = make_skewed_norms(6000, 32, random_state=3)
    fast = estimate_intrinsic_dim(S, random_state=0, scales=(5, 20))
    orig = exact_pkg.knn_lists
    try:
        exact_pkg.knn_lists = lambda *a, **kw: orig(*a, **dict(kw, certify=True))
        slow = estimate_intrinsic_dim(S, random_state=0, scales=(5, 20))
    finally:
        exact_pkg.knn_lists = orig
    np.testing.assert_allclose(fast, slow, rtol=1e-4)
    import knnkit.exact._cpu as exact_cpu

    recomputed = []
    within = exact_cpu._rows_within64

    def spy(X, Q, rows, *a, **kw):
        recomputed.append(len(rows))
        return within(X, Q, rows, *a, **kw)

    # tight clusters: gaps between neighbours below the keys' rounding bound, so the certificate
    # rejects rows (the skewed norms above no longer make it: its bound counts only the points
    # within the k-th's reach since the twenty-sixth session)
    from knnkit.datasets.suite import make_tight_clusters

    T = make_tight_clusters(6000, 32, 60, 0.01, random_state=3)
    exact_cpu._rows_within64 = spy
    try:
        d_slow, i_slow, _ = orig(T, T[:200], 11, metric="l2", exclude_self=False)
        assert recomputed and recomputed[0] > 0  # this data has rows the certificate rejects
        recomputed.clear()
        d_fast, i_fast, _ = orig(T, T[:200], 11, metric="l2", exclude_self=False, certify=False)
        assert not recomputed  # ... which certify=False leaves in float32
    finally:
        exact_cpu._rows_within64 = within
    np.testing.assert_allclose(d_fast, d_slow, rtol=1e-5, atol=1e-6)
    dup = np.repeat(low[:10], 5, axis=0)   # only duplicates at distance 0: no estimate, defaults
    assert auto_build_params(estimate_intrinsic_dim(dup, random_state=0)) == (32, 64, 1.1)


def test_auto_build_params_on_noise_dominated_clusters():
    # well separated clusters whose inside is isotropic noise in 96-d (the hard case):
    # the estimated LID is high, so the default build uses a wider graph and alpha 1.0
    X, Q = knnkit.datasets.make_clustered(12000, 96, n_queries=200, n_clusters=3, cluster_std=0.05,
                                          random_state=1, device="cpu")
    index = GraphIndex.build(X, device="cpu", random_state=0)
    bp = index.build_params
    assert bp["intrinsic_dim"] > 40 and index.graph_degree == 64 and bp["alpha"] == 1.0
    assert bp["intermediate_degree"] == 96
    _d, i = index.search(Q, k=10)
    assert recall(i, truth(X, Q, 10, "sqeuclidean")) >= 0.97  # 0.94 with degree 32, alpha 1.1
    # explicit values are kept; only the missing ones are filled
    index2 = GraphIndex.build(X[:3000], graph_degree=24, device="cpu", random_state=0)
    assert index2.graph_degree == 24 and index2.build_params["intermediate_degree"] == 48
    assert index2.build_params["alpha"] == 1.0


def test_auto_build_params_on_clusters_of_few_points():
    """Clusters of fewer points than the graph's degree: the LID estimate collapses between 5 and
    20 neighbours, the build takes the wide graph, and the default search reaches 0.95 (the narrow
    graph got 0.90 at beam 64 on this shape)."""
    from knnkit.datasets.suite import make_tight_clusters
    from knnkit.index._auto import auto_build_params, estimate_intrinsic_dim

    X, Q = make_tight_clusters(12000, 64, 1200, spread=0.01, n_queries=300, random_state=4)
    small, large = estimate_intrinsic_dim(X, random_state=0, scales=(5, 20))
    assert large < 0.5 * small, (small, large)
    assert auto_build_params(large, small) == (64, 96, 1.0)
    index = GraphIndex.build(X, device="cpu", random_state=0)
    assert index.graph_degree == 64
    _d, i = index.search(Q, k=10)
    assert recall(i, truth(X, Q, 10, "sqeuclidean")) >= 0.95


def test_clusters_of_few_points_take_exact_candidates_on_the_cpu(monkeypatch):
    """The clusters-of-few-points tier builds exact candidate lists on the CPU up to
    CPU_SCALE_GAP_EXACT_MAX_N points (NN-Descent converges slowly there); other tiers keep the
    descent. The exact-below-20k rule is lowered here so that the tier rule is what decides."""
    from knnkit.datasets.suite import make_tight_clusters
    from knnkit.index import _build, _engine

    monkeypatch.setattr(_build, "INDEX_BRUTE_MAX_N", {"cpu": 4096, "gpu": 4096})
    X, Q = make_tight_clusters(6000, 64, 700, spread=0.01, n_queries=200, random_state=5)
    index = GraphIndex.build(X, device="cpu", random_state=0)
    bp = index.build_params
    assert bp["intrinsic_dim"] < 0.5 * bp["intrinsic_dim_5nn"], bp  # the tier
    assert bp["candidates"]["method"] == "brute", bp["candidates"]
    assert bp["intermediate_degree"] == _engine.CPU_SCALE_GAP_EXACT_K == 64  # exact lists: 64, not 96
    _d, i = index.search(Q, k=10)
    assert recall(i, truth(X, Q, 10, "sqeuclidean")) >= 0.95
    # a given intermediate degree is kept
    given = GraphIndex.build(X, device="cpu", random_state=0, intermediate_degree=80)
    assert given.build_params["intermediate_degree"] == 80
    monkeypatch.setattr(_engine, "CPU_SCALE_GAP_EXACT_MAX_N", 0)
    index = GraphIndex.build(X, device="cpu", random_state=0)
    assert index.build_params["candidates"]["method"] != "brute", index.build_params["candidates"]
    assert index.build_params["intermediate_degree"] == 96  # NN-Descent's lists keep the tier's 96
    # another tier at the same size keeps the descent
    Xu = np.random.default_rng(0).random((6000, 16), dtype=np.float32)
    assert GraphIndex.build(Xu, device="cpu", random_state=0).build_params["candidates"]["method"] != "brute"


# ---------------------------------------------------------------- GPU
gpu = pytest.mark.skipif(not knnkit.gpu_available(), reason="needs an NVIDIA GPU and CuPy")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("metric", ["sqeuclidean", "cosine"])
def test_gpu_build_and_search_match_cpu(clu, metric):
    import cupy as cp

    X, Q = clu
    index = GraphIndex.build(cp.asarray(X), metric=metric, graph_degree=16, random_state=0)
    assert index.device == "gpu"
    d, i = index.search(cp.asarray(Q), k=10)
    assert isinstance(i, cp.ndarray)
    exact = truth(X, Q, 10, metric)
    r_gpu = recall(cp.asnumpy(i), exact)
    r_cpu = recall(index.search(Q, k=10, device="cpu")[1], exact)
    assert r_gpu >= 0.97 and abs(r_gpu - r_cpu) <= 0.02


@pytest.mark.gpu
@gpu
def test_gpu_low_tier_kept_after_a_paused_calibration(monkeypatch):
    """A GPU build's low tier pauses its calibration at beam 64 for the denser-tier decision; kept,
    its curve is measured to the end with the same deferral of the largest beams as one sweep."""
    import cupy as cp

    import knnkit.api.index as api_index
    from knnkit.index._calibrate import calibrate

    X = cp.asarray(np.random.default_rng(3).random((12_000, 12), dtype=np.float32))
    monkeypatch.setattr(api_index, "DENSER_BELOW", 1.01)  # every low tier is "short" ...
    monkeypatch.setattr(api_index, "DENSER", (12, 24, 1.1))  # ... and the "denser" one is worse
    index = GraphIndex.build(X, random_state=0)
    assert index.graph_degree == 32 and index.build_params["denser"]["kept"] is False
    cal = index.calibration
    full = calibrate(index._engine, index.search_params, defer=True)
    assert "paused" not in cal and cal["beams"] == full["beams"] and cal["recall"] == full["recall"]
    assert cal.get("deferred") == full.get("deferred")


@pytest.mark.gpu
@gpu
def test_gpu_saved_index_loads_on_cpu(tmp_path, clu):
    import cupy as cp

    X, Q = clu
    index = GraphIndex.build(cp.asarray(X), graph_degree=16, random_state=0)
    index.save(tmp_path / "g.knnkit")
    cpu = GraphIndex.load(tmp_path / "g.knnkit", device="cpu")
    assert np.array_equal(cpu.graph, index.graph)
    assert recall(cpu.search(Q, k=10)[1], truth(X, Q, 10, "sqeuclidean")) >= 0.97


@pytest.mark.gpu
@gpu
def test_gpu_float16_inner_product_and_cpu_index_on_gpu(clu):
    import cupy as cp

    X, Q = clu
    X16 = X.astype(np.float16)
    for metric in ("sqeuclidean", "inner_product"):
        index = GraphIndex.build(cp.asarray(X16), metric=metric, graph_degree=16, random_state=0)
        _d, i = index.search(Q, k=10)  # numpy queries -> numpy results
        assert isinstance(i, np.ndarray)
        assert recall(i, truth(X16.astype(np.float32), Q, 10, metric)) >= (0.85 if metric == "inner_product"
                                                                            else 0.97)
    cpu_index = GraphIndex.build(X, graph_degree=16, device="cpu", random_state=0)
    d_gpu, i_gpu = cpu_index.search(Q, k=10, device="gpu", tau=0.1, beam=128)
    d_cpu, i_cpu = cpu_index.search(Q, k=10, device="cpu", tau=0.1, beam=128)
    assert recall(i_gpu, i_cpu) >= 0.98
    np.testing.assert_allclose(d_gpu[:, 0], d_cpu[:, 0], rtol=1e-3, atol=1e-3)


def test_calibration_and_target_recall():
    """The build measures a recall-vs-beam curve; search(target_recall=) picks a beam from it and
    reaches the target on held-out queries; the largest beam does not plateau below 0.999."""
    from knnkit.datasets.suite import make_tight_clusters

    X, Q = make_tight_clusters(8000, 16, 400, n_queries=300, random_state=2)
    _, T = knnkit.knn(X, Q, k=10, device="cpu")
    index = GraphIndex.build(X, device="cpu", random_state=0)
    cal = index.calibration
    assert cal["k"] == 10 and len(cal["beams"]) == len(cal["recall"]) and cal["recall"][-1] >= 0.99
    assert all(b >= a - 0.01 for a, b in zip(cal["recall"], cal["recall"][1:]))  # rises with the beam
    for target in (0.9, 0.95):
        _, i = index.search(Q, k=10, target_recall=target)
        assert recall(i, T) >= target - 0.01
    assert recall(index.search(Q, k=10, beam=512)[1], T) >= 0.999
    with pytest.raises(ValueError, match="not both"):
        index.search(Q, k=10, beam=32, target_recall=0.9)
    assert GraphIndex.build(X, device="cpu", random_state=0, calibrate=False).calibration is None


def test_target_recall_beyond_calibration_is_exact(caplog):
    """A target that no calibrated beam reached (the graph cannot be trusted to deliver it) is
    answered by an exact scan, and says so; a reachable one still walks the graph."""
    import logging

    rng = np.random.default_rng(5)
    X = rng.random((3000, 24), dtype=np.float32)
    Q = rng.random((60, 24), dtype=np.float32)
    D_true, T = knnkit.knn(X, Q, k=7, device="cpu")
    index = GraphIndex.build(X, graph_degree=8, device="cpu", random_state=0)
    # a curve that stops short: as measured on 1M x 128 uniform data (0.955 at beam 2048)
    index.build_params["calibration"] = dict(k=10, beams=[16, 32], recall=[0.5, 0.6], queries=100)
    assert index.reaches(0.59) and not index.reaches(0.9)
    with caplog.at_level(logging.INFO, logger="knnkit"):
        d, i = index.search(Q, k=7, target_recall=0.9)
    assert "searching exactly" in caplog.text
    np.testing.assert_array_equal(i, T)
    np.testing.assert_allclose(d, D_true, rtol=1e-5)
    walked = index.search(Q, k=7, target_recall=0.55)  # beam 32 from the curve, a walk
    np.testing.assert_array_equal(walked[1], index.search(Q, k=7, beam=32)[1])
    with pytest.raises(ValueError, match="target_recall"):
        index.reaches(1.5)


def test_calibration_holds_out_its_queries_and_restores_the_graph():
    """Calibration hides its sample from the graph (unseen-query difficulty) and puts the graph
    back exactly: a calibrated and an uncalibrated build of the same seed have equal graphs; on
    uniform 64-d data the calibrated curve is within 0.05 of held-out queries' recall (data-point
    queries overstated it by far more)."""
    from knnkit.datasets.suite import make_uniform_cube

    X, Q = make_uniform_cube(6000, 64, n_queries=300, random_state=3)
    _, T = knnkit.knn(X, Q, k=10, device="cpu")
    a = GraphIndex.build(X, device="cpu", random_state=0)
    b = GraphIndex.build(X, device="cpu", random_state=0, calibrate=False)
    np.testing.assert_array_equal(a.graph, b.graph)
    cal = a.calibration
    assert cal["queries"] >= 100
    for beam, r in zip(cal["beams"], cal["recall"]):
        if beam in (16, 32, 64):
            got = recall(a.search(Q, k=10, beam=beam)[1], T)
            assert abs(got - r) < 0.05, (beam, got, r)


def test_calibration_estimates_a_graph_built_without_its_queries():
    """The calibration walks the graph diversified without its held-out rows (their candidates
    taken out before RobustPrune and the reverse edges), so its curve is the recall those rows get
    from a graph built without them. Cutting the rows out of the finished graph instead left their
    neighbourhoods without the links the rows had occluded: on uniform 128-d data the curve was
    0.02-0.06 below that recall at beams 16-48 (uniform 960-d, 50k: 0.9884 at beam 2048 against
    0.9957 for unseen queries, so search(target_recall=0.99) scanned exactly)."""
    from knnkit.datasets.suite import make_uniform_cube

    X = make_uniform_cube(3000, 128, random_state=3)
    n = X.shape[0]
    # the calibration's rows (its seeded choice of min(500, n // 50) rows)
    rs = np.random.default_rng(np.random.SeedSequence([0x5AFE, 0xCA1B]))
    rows = np.sort(rs.choice(n, size=min(500, n // 50), replace=False))
    keep = np.setdiff1d(np.arange(n), rows)
    a = GraphIndex.build(X, device="cpu", random_state=0)
    cal = dict(zip(a.calibration["beams"], a.calibration["recall"]))
    b = GraphIndex.build(X[keep], device="cpu", random_state=0, calibrate=False)
    _, T = knnkit.knn(X[keep], X[rows], k=10, device="cpu")
    gaps = [abs(cal[beam] - recall(b.search(X[rows], k=10, beam=beam)[1], T)) for beam in (16, 24, 32, 48, 64)]
    assert np.mean(gaps) < 0.015 and max(gaps) < 0.03, gaps


def test_calibration_never_seeds_a_held_out_query_with_itself():
    """A held-out row that is an entry medoid must not seed its own walk (found at distance 0 from
    a dead row, one of its k slots lost): 1,000 tight clusters of 10 points have ~1,100 entries,
    and the curve stopped at 0.9845 at every beam while unseen queries got 1.0 (so
    search(target_recall=0.99) scanned exactly)."""
    from knnkit.datasets.suite import make_tight_clusters

    X, Q = make_tight_clusters(10000, 16, 1000, 0.01, n_queries=100, random_state=1)
    _, T = knnkit.knn(X, Q, k=10, device="cpu")
    index = GraphIndex.build(X, device="cpu", random_state=0)
    assert len(index.entry_points) > 500
    assert min(index.calibration["recall"]) >= 0.999, index.calibration
    assert index.reaches(0.99) and recall(index.search(Q, k=10, target_recall=0.99)[1], T) >= 0.99


def test_target_recall_scans_exactly_where_the_calibrated_walk_is_slower(caplog):
    """A CPU calibration times its walks and an exact search of its rows; a target reached only at
    a beam that walked more than EXACT_FASTER times slower is answered by the exact scan."""
    import logging

    from knnkit.index._calibrate import EXACT_FASTER, exact_is_faster

    rng = np.random.default_rng(6)
    X = rng.random((3000, 24), dtype=np.float32)
    Q = rng.random((40, 24), dtype=np.float32)
    D_true, T = knnkit.knn(X, Q, k=10, device="cpu")
    index = GraphIndex.build(X, graph_degree=16, device="cpu", random_state=0)
    cal = index.calibration
    assert len(cal["seconds"]) == len(cal["beams"]) and cal["exact_seconds"] > 0
    slow = dict(beams=[16, 32], recall=[0.9, 0.999], seconds=[0.01, 1.0], exact_seconds=0.1)
    assert exact_is_faster(slow, 32) and not exact_is_faster(slow, 16)
    assert not exact_is_faster(dict(slow, seconds=[0.01, 0.1 * EXACT_FASTER]), 32)
    assert not exact_is_faster({k: v for k, v in slow.items() if k != "seconds"}, 32)  # GPU / older
    index.build_params["calibration"] = dict(slow, k=10, queries=100)
    with caplog.at_level(logging.INFO, logger="knnkit"):
        d, i = index.search(Q, k=10, target_recall=0.99)
    assert "walked slower" in caplog.text
    np.testing.assert_array_equal(i, T)
    walked = index.search(Q, k=10, target_recall=0.85)  # beam 16: faster than the scan, a walk
    np.testing.assert_array_equal(walked[1], index.search(Q, k=10, beam=16)[1])


def test_calibration_stops_where_walking_costs_more_than_the_scan(monkeypatch):
    """Past the fixed beams, a CPU calibration tries larger ones only while the default target is
    unmet or its walk still beats the exact scan of the same rows (uniform 960-d, 50k: beams 1536
    and 2048 cost ~11 s of a 77 s build and could only ever lose to the scan)."""
    from knnkit.index import _calibrate

    rng = np.random.default_rng(8)
    X = rng.random((3000, 48), dtype=np.float32)
    monkeypatch.setitem(_calibrate.calibrate.__kwdefaults__, "beams", (16,))
    monkeypatch.setitem(_calibrate.calibrate.__kwdefaults__, "extra_beams", (24, 32, 48, 64, 96, 128, 192, 256))
    monkeypatch.setattr(_calibrate, "EXTEND_UNTIL", 1.01)  # never satisfied: only the time rule stops it
    monkeypatch.setattr(_calibrate, "EXACT_FASTER", float("inf"))  # no walk "slower than the scan"
    index = GraphIndex.build(X, graph_degree=16, device="cpu", random_state=0)
    full = index.calibration
    assert "stopped_at" not in full and full["beams"][-1] == 256
    monkeypatch.setattr(_calibrate, "EXACT_FASTER", -1.0)  # every walk "slower than the scan"
    index = GraphIndex.build(X, graph_degree=16, device="cpu", random_state=0)
    cal = index.calibration
    # settled: the default's rule (raised_default_beam -> first_beam_reaching) has a beam for it
    target = _calibrate.DEFAULT_TARGET + _calibrate.DEFAULT_MARGIN + 0.005
    assert cal["stopped_at"] == cal["beams"][-1] and cal["recall"][-1] >= target
    assert all(r < target for r in cal["recall"][:-1])  # it went on while the default was unsettled
    assert len(cal["beams"]) < len(full["beams"])


def test_cpu_calibration_stops_once_saturated(monkeypatch):
    """A CPU sweep stops after two beams in a row read recall 1.0 from beam 64 on (saturated_at):
    the default beam and the beams below it are measured, larger ones would give the same curve,
    and search(target_recall=) still finds its beam on the shorter curve."""
    from knnkit.datasets.suite import make_tight_clusters
    from knnkit.index import _calibrate

    X, Q = make_tight_clusters(6000, 16, 60, 0.01, n_queries=50, random_state=2)
    index = GraphIndex.build(X, device="cpu", random_state=0)
    cal = index.calibration
    assert min(cal["recall"][-2:]) == 1.0 and cal["saturated_at"] == cal["beams"][-1] >= 64
    assert cal["beams"][-1] < max(_calibrate.BEAMS) and "stopped_at" not in cal
    assert index.beam_for(0.999) <= cal["beams"][-1] and index.reaches(0.999)
    _, T = knnkit.knn(X, Q, k=10, device="cpu")
    assert recall(index.search(Q, k=10, target_recall=0.99)[1], T) >= 0.99
    monkeypatch.setattr(_calibrate, "SATURATED", 2.0)  # never: the whole sweep
    full = GraphIndex.build(X, device="cpu", random_state=0).calibration
    assert full["beams"][-1] == max(_calibrate.BEAMS) and "saturated_at" not in full
    assert full["beams"][:len(cal["beams"])] == cal["beams"] and full["recall"][:len(cal["recall"])] == cal["recall"]


def test_candidate_fallback_budget_is_knn_graphs():
    """Stalled NN-Descent candidates are rebuilt exactly up to knn_graph's own CPU budget: the CPU
    index had its own 2e11 (15k x 960 was past it, 50k x 960 uniform kept candidates of recall@10
    0.56 and its search stopped at 0.989); now both limits are one."""
    from knnkit.graph import EXACT_FALLBACK_MAX_WORK
    from knnkit.index._build import CANDIDATE_EXACT_MAX_WORK, _candidates_stalled

    assert CANDIDATE_EXACT_MAX_WORK["cpu"] == EXACT_FALLBACK_MAX_WORK["cpu"]
    rng = np.random.default_rng(3)
    X = rng.random((15000, 960), dtype=np.float32)  # n * n * d = 2.2e11
    est, stalled = _candidates_stalled(X, rng.integers(0, 15000, size=(15000, 12)), "l2", 0)
    assert stalled and est < 0.05


def test_candidate_stall_detector():
    """The index build's candidate check: exact lists pass, random lists are flagged (and then
    built exactly), small sets are not estimated."""
    from knnkit.index._build import _candidates_stalled, exact_knn_cpu

    rng = np.random.default_rng(2)
    X = rng.random((5000, 16), dtype=np.float32)
    _, exact_ids = exact_knn_cpu(X, X, 12, "l2", exclude_self=True)
    est, stalled = _candidates_stalled(X, exact_ids, "l2", 0)
    assert est >= 0.999 and not stalled
    random_ids = rng.integers(0, 5000, size=(5000, 12))
    est, stalled = _candidates_stalled(X, random_ids, "l2", 0)
    assert est < 0.1 and stalled
    assert _candidates_stalled(X[:3000], exact_ids[:3000] % 3000, "l2", 0) == (None, False)


def test_calibration_extends_past_its_ladder_only_while_recall_is_low():
    """Beams after the ladder are tried only while the last recall is below EXTEND_UNTIL (high-d
    data keeps gaining past 512), never beyond n, and the default beam may be raised onto them."""
    from knnkit.datasets.suite import make_uniform_cube
    from knnkit.index._calibrate import EXTEND_UNTIL, calibrate, raised_default_beam

    X, _ = make_uniform_cube(3000, 64, n_queries=10, random_state=4)
    index = GraphIndex.build(X, device="cpu", random_state=0, graph_degree=8, calibrate=False)
    cal = calibrate(index._engine, index.search_params, beams=(10,), extra_beams=(12, 16, 64, 512, 4096))
    beams, rec = cal["beams"], cal["recall"]
    assert beams[0] == 10 and 4096 not in beams  # larger than n
    for j in range(1, len(beams)):  # an extra beam only after a recall below the bar
        assert rec[j - 1] < EXTEND_UNTIL
    assert rec[-1] >= EXTEND_UNTIL or beams[-1] == 512
    assert rec[0] < 0.95  # degree 8 on uniform 64-d data: the first beam is far from the target
    better = raised_default_beam(cal, 10)
    assert better is not None and better > 10 and better in beams


def test_deferred_calibration_beams_are_measured_when_a_target_needs_them(monkeypatch):
    """A (GPU) build leaves its largest calibration beams for later once the default beam is
    settled; the first search(target_recall=) that the curve misses measures them on the same
    held-out rows, with the recall a full sweep gets, and keeps them."""
    from knnkit.index import _calibrate

    rng = np.random.default_rng(9)
    X = rng.random((4000, 32), dtype=np.float32)
    Q = rng.random((50, 32), dtype=np.float32)
    monkeypatch.setattr(_calibrate, "_deferrable", lambda engine: (48, 64))  # as GPU_EXTRA_BEAMS on the GPU
    monkeypatch.setattr(_calibrate, "EXTEND_UNTIL", 1.01)
    monkeypatch.setattr(_calibrate, "DEFAULT_TARGET", 0.0)  # the default is settled at the first beam
    # no CPU time rule (a walk slower than the scan stops the sweep): the GPU sweep has none, and on
    # a loaded machine it stopped this one before the beams it was to defer
    monkeypatch.setattr(_calibrate, "EXACT_FASTER", float("inf"))
    monkeypatch.setitem(_calibrate.calibrate.__kwdefaults__, "beams", (16, 24))
    monkeypatch.setitem(_calibrate.calibrate.__kwdefaults__, "extra_beams", (32,))
    index = GraphIndex.build(X, graph_degree=8, device="cpu", random_state=0)
    cal = index.calibration
    assert cal["beams"] == [16, 24, 32] and cal["deferred"] == [48, 64]
    full = _calibrate.calibrate(index._engine, index.search_params)  # the whole sweep, nothing deferred
    assert full["beams"] == [16, 24, 32, 48, 64] and "deferred" not in full
    assert index.reaches(cal["recall"][0] - 0.01) and "deferred" in index.calibration  # reached: not extended
    grown = _calibrate.extend(index._engine, index.search_params, cal)  # every deferred beam
    assert grown["beams"] == full["beams"] and grown["recall"] == full["recall"] and "deferred" not in grown
    # through the index: a target the curve so far misses measures the deferred beams in order, up
    # to the first that reaches it (capped curve: every measured beam misses 0.95 + 0.005)
    index.build_params["calibration"] = dict(cal, recall=[min(r, 0.5) for r in cal["recall"]])
    graph_before = np.array(index._engine._graph, copy=True)
    intact = []
    sweep = _calibrate._sweep

    def watched(*args, **kwargs):  # while the held-out rows are cut out of the graph being walked
        intact.append(np.array_equal(index._engine._graph, graph_before))
        return sweep(*args, **kwargs)

    monkeypatch.setattr(_calibrate, "_sweep", watched)
    index.beam_for(0.5)
    monkeypatch.setattr(_calibrate, "_sweep", sweep)
    # measured on a copy: a search on another thread meanwhile walks the whole graph
    assert intact == [True], intact
    now = index.calibration
    got = dict(zip(now["beams"], now["recall"]))
    assert now["beams"][:3] == [16, 24, 32] and now["beams"][3] == 48 and got[48] == full["recall"][3]
    assert (now["beams"] == full["beams"]) == (full["recall"][3] < 0.505)
    assert now.get("deferred", []) == [b for b in (48, 64) if b not in now["beams"]]
    d, i = index.search(Q, k=10, target_recall=0.2)
    assert i.shape == (50, 10)
    # moved to a device that cannot defer (a GPU build's index on the CPU): the deferred beams are
    # dropped, not walked, and a target the curve misses is answered exactly
    index.build_params["calibration"] = dict(cal)
    monkeypatch.setattr(_calibrate, "_deferrable", lambda engine: ())
    assert not index.reaches(0.9999) and "deferred" not in index.calibration
    assert index.calibration["beams"] == [16, 24, 32]


def test_default_beam_raised_unless_calibration_clears_the_margin():
    """A default beam whose calibrated recall only just reaches 0.95 is raised (held-out rows
    estimate unseen queries within about 0.01); one that clears 0.95 + DEFAULT_MARGIN is kept."""
    from knnkit.index._calibrate import DEFAULT_MARGIN, DEFAULT_TARGET, raised_default_beam

    cal = {"k": 10, "beams": [16, 32, 64, 128, 256], "recall": [0.90, 0.94, 0.952, 0.962, 0.975]}
    assert DEFAULT_TARGET + DEFAULT_MARGIN > 0.952
    assert raised_default_beam(cal, 64) == 256      # 0.952 at 64: raised to the first beam >= 0.965
    assert raised_default_beam(cal, 256) is None    # 0.975 clears 0.96
    assert raised_default_beam(dict(cal, recall=[0.9, 0.94, 0.97, 0.98, 0.99]), 64) is None


def test_many_copies_reachable():
    """Rows with many identical copies (skin: 245k RGB points, 51k distinct): the candidate lists
    come from the distinct rows and every group is linked as a cycle, so a walk that reaches a
    group lists its copies. Without it, 100 copies per point filled every candidate list with
    copies, groups were islands, and the default search missed most queries' neighbours."""
    rng = np.random.default_rng(11)
    distinct = rng.integers(0, 60, size=(300, 3)).astype(np.float32)
    X = np.repeat(distinct, 100, axis=0)[rng.permutation(30_000)]
    Q = rng.integers(0, 60, size=(200, 3)).astype(np.float32) + 0.25
    D_true, _ = knnkit.knn(X, Q, k=10, device="cpu")
    index = GraphIndex.build(X, device="cpu", random_state=0)
    d, i = index.search(Q, k=10)
    Xd = X.astype(np.float64)
    got = ((Xd[i] - Q[:, None, :].astype(np.float64)) ** 2).sum(-1)
    hits = (got <= D_true[:, -1:] * (1 + 1e-6) + 1e-9).sum(1).clip(max=10)
    assert hits.mean() / 10 >= 0.95, hits.mean() / 10
    from knnkit.evaluate import recall
    from knnkit.index._connect import components

    # the same for the similarity metrics (inner product: 46 components, recall 0.895 before)
    Y = np.repeat(rng.standard_normal((300, 8)).astype(np.float32), 100, axis=0)[rng.permutation(30_000)]
    Qy = rng.standard_normal((200, 8)).astype(np.float32)
    for metric in ("inner_product", "cosine"):
        Dt, Tt = knnkit.knn(Y, Qy, k=10, metric=metric, device="cpu")
        ix = GraphIndex.build(Y, metric=metric, device="cpu", random_state=0)
        dy, iy = ix.search(Qy, k=10)
        assert components(ix.graph)[1] == 1, metric
        assert recall(iy, Tt, found_distances=dy, true_distances=Dt, similarity=True) >= 0.95, metric

    assert components(index.graph)[1] == 1
    # every copy is reachable through its group's cycle: each row with copies links to a copy
    same = (X[index.graph[:, -1]] == X).all(axis=1)
    assert same.mean() > 0.99


def test_visited_stamps_kept_between_calls(rng):
    """The CPU walk's visited stamps persist between calls (no O(n) clearing per call): concurrent
    searches from several threads, and stamp rows near their epoch wrap-around, give the same
    results as fresh ones."""
    import threading

    from knnkit.index import _search_cpu as S

    X = rng.random((3000, 8), dtype=np.float32)
    Q = rng.random((400, 8), dtype=np.float32)
    index = knnkit.GraphIndex.build(X, device="cpu", random_state=0)
    ref = [index.search(Q[j:j + 1], k=5)[1] for j in range(40)]
    ref_all = index.search(Q, k=5)[1]
    # rows about to wrap: every stamp row in the pool at epoch 65530
    with S._SCRATCH_LOCK:
        for slot in S._SCRATCH_FREE:
            slot[1] = 65530
            slot[0][:] = 65530
    assert all((index.search(Q[j:j + 1], k=5)[1] == ref[j]).all() for j in range(40))
    out = [None] * 4
    errors = []

    def worker(t):
        try:
            out[t] = [index.search(Q[j:j + 1], k=5)[1] for j in range(40)] + [index.search(Q, k=5)[1]]
        except Exception as e:  # pragma: no cover - surfaced below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    for res in out:
        assert all((a == b).all() for a, b in zip(res[:40], ref))
        assert (res[40] == ref_all).all()


def test_denser_tier_when_the_low_tier_walk_stays_short(rng, monkeypatch):
    """Automatic parameters put low-LID data in the degree-32 tier; when the calibration then
    measures the walk short of DENSER_BELOW at beam 64, the index is built again one tier denser
    and the better calibrated one is kept (recorded in build_params["denser"]). Given parameters
    are never second-guessed."""
    import knnkit.api.index as api_index

    X = rng.random((10_000, 12), dtype=np.float32)
    monkeypatch.setattr(api_index, "DENSER_BELOW", 1.01)  # every low-tier calibration is "short"
    index = knnkit.GraphIndex.build(X, device="cpu", random_state=0)
    rec = index.build_params["denser"]
    assert rec["from"][0] == 32 and len(rec["recall_at_64"]) == 2
    assert index.graph_degree == (48 if rec["kept"] else 32)
    assert rec["kept"] == (rec["recall_at_64"][1] > rec["recall_at_64"][0])
    # on the CPU the denser graph's candidates are the low tier's own, pruned to the denser degree,
    # or (when that pruning gains too little) the low tier's walk for every row joined with them
    if rec["kept"]:
        method = index.build_params["candidates"]["method"]
        assert method == {"reprune": "first", "walk": "search+first"}[rec["step"]]
    assert rec["progress_32_64"] <= 1.0  # the low tier's gain from beam 32 to 64 (the step's reason)
    # a re-prune that closes no gap leads to the walk, recorded with the re-prune's recall
    monkeypatch.setattr(api_index, "WALK_FIRST_BELOW", -1.0)
    monkeypatch.setattr(api_index, "REPRUNE_MIN_MISS16", -1.0)
    monkeypatch.setattr(api_index, "REPRUNE_ENOUGH", 2.0)
    walked = knnkit.GraphIndex.build(X, device="cpu", random_state=0)
    rw = walked.build_params["denser"]
    assert rw["step"] == "walk" and "reprune_recall_at_64" in rw
    if rw["kept"]:
        assert walked.build_params["candidates"]["method"] == "search+first"
    # a low tier whose walk gains little from more beam walks at once (no re-prune)
    monkeypatch.setattr(api_index, "WALK_FIRST_BELOW", 2.0)
    direct = knnkit.GraphIndex.build(X, device="cpu", random_state=0)
    rd = direct.build_params["denser"]
    assert rd["step"] == "walk" and "reprune_recall_at_64" not in rd
    assert direct.graph_degree == walked.graph_degree
    np.testing.assert_array_equal(direct.graph, walked.graph)  # the same walk, the same graph
    # ... and so does one whose walk misses little at beam 16 (a high, flat curve), whatever it gains
    monkeypatch.setattr(api_index, "WALK_FIRST_BELOW", -1.0)
    monkeypatch.setattr(api_index, "REPRUNE_MIN_MISS16", 2.0)
    flat = knnkit.GraphIndex.build(X, device="cpu", random_state=0)
    assert flat.build_params["denser"]["step"] == "walk" and "reprune_recall_at_64" not in flat.build_params["denser"]
    np.testing.assert_array_equal(flat.graph, walked.graph)
    monkeypatch.setattr(api_index, "REPRUNE_ENOUGH", 0.5)
    monkeypatch.setattr(api_index, "WALK_FIRST_BELOW", 0.25)
    monkeypatch.setattr(api_index, "REPRUNE_MIN_MISS16", 0.15)
    Q = rng.random((200, 12), dtype=np.float32)
    _d, i = index.search(Q, k=10)
    assert recall(i, truth(X, Q, 10, "sqeuclidean")) >= 0.95
    # a sparser "denser" tier cannot be better: the first index is kept
    monkeypatch.setattr(api_index, "DENSER", (12, 24, 1.1))
    index = knnkit.GraphIndex.build(X, device="cpu", random_state=0)
    assert index.graph_degree == 32 and index.build_params["denser"]["kept"] is False
    given = knnkit.GraphIndex.build(X, graph_degree=32, device="cpu", random_state=0)
    assert "denser" not in given.build_params
    # the kept low tier's calibration stopped at beam 64 for the decision and was measured to its
    # end after it: the curve of an uninterrupted sweep of the same graph
    from knnkit.index._calibrate import calibrate

    cal = index.calibration
    assert cal["held_out"] == "cut"  # (the low tier's alpha 1.1: the same sweep again below)
    full = calibrate(index._engine, index.search_params)
    assert "paused" not in cal and cal["beams"] == full["beams"] and cal["recall"] == full["recall"]
    assert cal["beams"][-1] >= 64


def test_calibration_pause_and_resume(rng, monkeypatch):
    """A sweep paused below a recall at a beam holds the curve up to that beam; resume() measures
    the rest: the same beams and recall as one sweep (the hold-out graph kept for it)."""
    from knnkit.index._calibrate import calibrate, resume

    X = rng.random((6000, 24), dtype=np.float32)
    # the build makes its hold-out graph (alpha <= 1) but does not calibrate: the sweeps below do
    monkeypatch.setattr(knnkit.GraphIndex, "_calibrate", lambda self, pause=False: None)
    for alpha, how in ((1.0, "holdout"), (1.2, "cut")):
        index = knnkit.GraphIndex.build(X, graph_degree=16, intermediate_degree=24, alpha=alpha, device="cpu",
                                        random_state=0)
        eng = index._engine
        held = eng._holdout
        assert (held is not None) == (how == "holdout")
        full = calibrate(eng, index.search_params)
        assert full["held_out"] == how and full["beams"][-1] > 64
        eng._holdout = held  # (a sweep uses it once)
        paused = calibrate(eng, index.search_params, pause=(64, 1.01))
        assert paused["paused"] and paused["beams"][-1] == 64 and paused["held_out"] == how
        assert (eng._holdout is not None) == (how == "holdout")  # kept for resume()
        assert paused["recall"] == full["recall"][:len(paused["recall"])]
        done = resume(eng, index.search_params, paused)
        assert "paused" not in done and done["beams"] == full["beams"] and done["recall"] == full["recall"]
        assert resume(eng, index.search_params, done) is done
        assert eng._holdout is None
        eng._holdout = held
        kept = calibrate(eng, index.search_params, pause=(64, 0.0))  # recall above the bar: no pause
        assert "paused" not in kept and kept["beams"] == full["beams"] and kept["recall"] == full["recall"]


def test_own_neighbour_lists_and_copies(rng, monkeypatch):
    """The denser tier's search-based candidates: each row's K nearest other rows from the low
    tier's walk (itself left out, whatever its position), near the exact lists; data whose copies
    the build merged keeps the NN-Descent candidates (a walk would list a row's copies)."""
    import knnkit.api.index as api_index

    X = rng.random((3000, 8), dtype=np.float32)
    index = knnkit.GraphIndex.build(X, device="cpu", random_state=0)
    eng = index._engine
    assert eng.merged_copies is False
    ids = eng.own_neighbour_lists(20, beam=64, tau=float("inf"), max_iters=10_000, n_seeds=4)
    assert ids.shape == (3000, 20) and ids.dtype == np.int64
    assert not (ids == np.arange(3000)[:, None]).any()
    assert recall(ids, truth(X, X, 21, "sqeuclidean")[:, 1:]) >= 0.95
    assert eng.first_candidates is None  # kept during the build for the denser rebuild only
    ids2, dist2 = eng.own_neighbour_lists(20, beam=64, tau=float("inf"), max_iters=10_000, n_seeds=4,
                                          with_distances=True)
    np.testing.assert_array_equal(ids2, ids)
    from knnkit.index._prune_cpu import joined_lists, pair_distances

    np.testing.assert_allclose(dist2, pair_distances(X, ids, "l2"), rtol=1e-6, atol=1e-7)
    # joined with another list and its distances: each id once, b's distance kept, rows sorted by
    # (distance, id), the rest -1 / inf
    other = np.asarray(truth(X, X, 9, "sqeuclidean")[:, 1:], np.int64)
    other[::7, -3:] = -1
    od = np.where(other >= 0, pair_distances(X, np.maximum(other, 0), "l2") + np.float32(1e-3), np.inf)
    ji, jd = joined_lists(ids2, dist2, other, od.astype(np.float32))
    assert ji.shape == (3000, 28)
    for r in (0, 7, 1234, 2999):
        want = {int(v): float(d) for v, d in zip(ids2[r], dist2[r])}
        want.update({int(v): float(d) for v, d in zip(other[r], od[r]) if v >= 0})
        got = [(int(v), float(d)) for v, d in zip(ji[r], jd[r]) if v >= 0]
        assert dict(got) == pytest.approx(want) and len(got) == len(want)
        assert got == sorted(got, key=lambda t: (t[1], t[0]))
        assert (ji[r, len(got):] == -1).all() and np.isinf(jd[r, len(got):]).all()
    # the walk's lists joined with the first build's: each id once per row, -1 for the rest
    from knnkit.index._engine import merged_candidates

    m = merged_candidates(np.array([[4, 2, -1], [0, 1, 2]]), np.array([[2, 7], [3, 0]]))
    assert m.shape == (2, 5)
    assert [sorted(v for v in row if v >= 0) for row in m.tolist()] == [[2, 4, 7], [0, 1, 2, 3]]
    # many copies: merged at build, and the denser rebuild takes NN-Descent's lists
    base = rng.random((2000, 12), dtype=np.float32)
    Xc = np.concatenate([base] * 6)
    monkeypatch.setattr(api_index, "DENSER_BELOW", 1.01)
    idx = knnkit.GraphIndex.build(Xc, device="cpu", random_state=0)
    assert idx.build_params["denser"]["from"][0] == 32
    if idx.build_params["denser"]["kept"]:
        assert idx.build_params["candidates"].get("method") != "search"
    assert idx._engine.merged_copies is True or idx.graph_degree == 32


@pytest.mark.parametrize("kind", ["l2", "ip", "clusters"])
def test_holdout_graph_partial_equals_whole(kind, rng):
    """The calibration's hold-out graph from the build's first prune and result, redoing only the
    rows the held-out points change, equals a whole diversification of the reduced lists."""
    from knnkit.datasets.suite import make_skewed_norms, make_tight_clusters
    from knnkit.index._build import diversify, diversify_without
    from knnkit.index._engine import _without
    from knnkit.index._prune_cpu import pair_distances

    seed = int(rng.integers(1 << 30))
    if kind == "ip":
        X, metric = make_skewed_norms(3000, 16, random_state=seed), "ip"
    elif kind == "clusters":
        X, metric = make_tight_clusters(3000, 16, 40, 0.05, random_state=seed), "l2"
    else:
        X, metric = rng.standard_normal((3000, 16)).astype(np.float32), "l2"
    X = np.ascontiguousarray(X, np.float32)
    _d, cand = knnkit.knn(X, k=40, metric="inner_product" if metric == "ip" else "sqeuclidean", device="cpu")
    cand = np.asarray(cand, np.int64)
    cand_dist = pair_distances(X, cand, metric)
    rows = np.sort(rng.choice(3000, 60, replace=False))
    first = {}
    full = diversify(X, cand, 16, metric, alpha=1.0, cand_dist=cand_dist, first_out=first)
    hc, hd = _without(cand, cand_dist, rows)
    whole = diversify(X, hc, 16, metric, alpha=1.0, cand_dist=hd)
    part = diversify_without(X, cand, cand_dist, rows, first["graph"], full, 16, metric, alpha=1.0)
    np.testing.assert_array_equal(part, whole)
    assert (part[rows] == -1).all() and not np.isin(part, rows).any()
    assert not np.array_equal(part, full)  # the held-out rows changed something


def test_top_tier_only_where_its_graph_fits_the_budget():
    """The GPU's top tier (degree 128) is taken only when vectors plus its graph fit the memory
    budget, the quantity placement="auto" compared (assuming degree 64) when it kept the index
    on the device."""
    from knnkit.index._engine import _top_tier_fits

    a = np.zeros((1000, 32), np.float32)
    need = 1000 * 32 * 4 + 1000 * 128 * 4
    try:
        knnkit.set_memory_budget(need)
        assert _top_tier_fits(a)
        knnkit.set_memory_budget(need - 1)
        assert not _top_tier_fits(a)
    finally:
        knnkit.set_memory_budget(None)


def test_sorted_rows_matches_lexsort(rng):
    """RobustPrune's row sort (a row-parallel merge sort) orders each row exactly as
    ``np.lexsort((idx, dist), axis=1)``: by distance, ties by id, ``-1`` / inf last."""
    from knnkit.index._prune_cpu import sorted_rows

    idx = rng.integers(-1, 500, (3000, 37)).astype(np.int64)
    dist = rng.integers(0, 20, (3000, 37)).astype(np.float32)  # many ties
    dist[idx < 0] = np.inf
    dist[0, :3] = [-0.0, 0.0, -0.0]
    order = np.lexsort((idx, dist), axis=1)
    si, sd = sorted_rows(idx, dist)
    assert np.array_equal(si, np.take_along_axis(idx, order, axis=1))
    assert np.array_equal(sd, np.take_along_axis(dist, order, axis=1))


def test_denser_reuses_first_entry_points(rng, monkeypatch):
    """The CPU denser rebuild takes the first build's k-means entry points (made before its
    connectivity repair) instead of running the k-means again."""
    import knnkit.api.index as api_index
    from knnkit.index import _engine

    X = rng.random((12000, 8), dtype=np.float32)
    monkeypatch.setattr(api_index, "DENSER_BELOW", 1.01)
    calls = []
    real = _engine._entry_structure
    monkeypatch.setattr(_engine, "_entry_structure", lambda *a, **k: calls.append(1) or real(*a, **k))
    index = knnkit.GraphIndex.build(X, device="cpu", random_state=0)
    assert index.build_params["denser"]["from"][0] == 32
    assert len(calls) == 1  # the k-means ran once, for both builds
    assert index._engine.first_entry is None and index._engine.first_candidates is None


def test_changed_without_matches_without(rng):
    """The hold-out graph's changed rows (row-parallel) are the rows ``_without`` changes, with the
    same entries in the same order, the dropped ones moved to the end (a sorted row stays sorted);
    a held-out row with an empty list is not changed."""
    from knnkit.index._build import _without
    from knnkit.index._prune_cpu import changed_without

    cand = rng.integers(-1, 1500, (1500, 24))
    cand[7] = -1
    dist = rng.random((1500, 24), dtype=np.float32)
    dist[cand < 0] = np.inf
    rows = np.sort(rng.choice(np.arange(8, 1500), 40, replace=False))
    rows = np.concatenate([[3, 7], rows])
    hc, hd = _without(cand, dist, rows)
    changed = np.flatnonzero((hc != cand).any(axis=1))
    c2, h2, d2 = changed_without(cand, dist, rows)
    assert 7 not in c2 and 3 in c2
    assert np.array_equal(changed, c2)
    for r, u in enumerate(changed):
        keep = hc[u] >= 0
        m = int(keep.sum())
        assert np.array_equal(h2[r, :m], hc[u][keep]) and np.array_equal(d2[r, :m], hd[u][keep])
        assert (h2[r, m:] == -1).all() and np.isinf(d2[r, m:]).all()
    order = np.lexsort((cand, dist), axis=1)  # sorted rows stay sorted
    cs, ds = np.take_along_axis(cand, order, axis=1), np.take_along_axis(dist, order, axis=1)
    _c, h3, d3 = changed_without(cs, ds, rows)
    from knnkit.index._prune_cpu import _rows_sorted, mark_row_differences

    assert _rows_sorted(d3, h3)
    # the points whose in-links change between two sets of lists: ids in exactly one row of a pair
    a = rng.integers(-1, 300, (50, 12))
    b = np.where(rng.random((50, 12)) < 0.3, rng.integers(-1, 300, (50, 12)), a[:, ::-1])
    mark = np.zeros(300, dtype=bool)
    mark_row_differences(a, b, mark)
    want = np.zeros(300, dtype=bool)
    for ra, rb in zip(a, b):
        want[sorted(set(ra[ra >= 0]) ^ set(rb[rb >= 0]))] = True
    assert np.array_equal(mark, want) and want.any()


def test_search_batch_merge_equals_sequential_inserts(rng):
    """The CPU walk merges an expansion's candidates into its list in one pass: the same list
    (ids, distances, expanded flags, size) and the same first new position as inserting them one
    by one, with ties (a listed entry first, batch entries in their order) and a full list."""
    from knnkit.index._search_cpu import _insert_call, _merge_batch

    for trial in range(300):
        beam = int(rng.integers(1, 12))
        size = int(rng.integers(0, beam + 1))
        cd = np.sort(rng.integers(0, 6, beam).astype(np.float32))
        ci = rng.permutation(1000)[:beam].astype(np.int64)
        ce = rng.integers(0, 2, beam).astype(np.uint8)
        m = int(rng.integers(1, 9))
        bd = rng.integers(0, 7, m).astype(np.float32)
        bi = (1000 + np.arange(m)).astype(np.int64)
        a = [cd.copy(), ci.copy(), ce.copy()]
        s1, first1 = size, beam
        for j in range(m):
            if s1 == beam and bd[j] >= a[0][beam - 1]:
                continue
            s1, pos = _insert_call(a[0], a[1], a[2], s1, beam, bd[j], bi[j])
            first1 = min(first1, pos)
        keep = np.ones(m, bool) if size < beam else bd < cd[beam - 1]
        b = [cd.copy(), ci.copy(), ce.copy()]
        s2, first2 = _merge_batch(b[0], b[1], b[2], size, beam, bd[keep].copy(), bi[keep].copy(), int(keep.sum())) \
            if keep.any() else (size, beam)
        assert (s1, first1) == (s2, first2), trial
        for x, y in zip(a, b):
            assert np.array_equal(x[:s1], y[:s2]), trial


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("placement", ["device", "host"])
def test_index_on_data_far_from_the_origin(placement, device):
    """A common offset large against the spread (every coordinate + 1e4 on unit Gaussian data):
    the exact candidate lists were a GEMM expansion of their own that cancelled in float32 (almost
    every list wrong, recall 0.64 at beam 64), and host placement's PQ tables cancelled the same
    way (recall 0.03-0.19) until the PQ worked on centred vectors. On the GPU, the walk's float16
    copy would round every coordinate to a multiple of 8; the walk reads float32 there. All as
    good as centred data."""
    rng = np.random.default_rng(21)
    X = rng.standard_normal((3000, 16)).astype(np.float32) + np.float32(1e4)
    Q = rng.standard_normal((40, 16)).astype(np.float32) + np.float32(1e4)
    index = GraphIndex.build(X, placement=placement, device=device, random_state=0)
    want, _ = knnkit.knn(X, Q, k=10, device="cpu")
    for beam in (32, 64):
        d, _i = index.search(Q, k=10, beam=beam)
        d = np.asarray(d.get() if hasattr(d, "get") else d)
        assert np.mean(d <= want[:, -1:] * (1 + 1e-6) + 1e-6) >= 0.95, beam


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("placement", ["device", "host"])
def test_cosine_on_vectors_sharing_a_main_direction(placement, device):
    """Cosine similarities near 1 (every vector = one direction + 1 % noise): two neighbours'
    distances differ at second order in the noise. Host placement's PQ walk scored codes by inner
    product, where a code's error counts at first order (recall 0.03-0.17 at beams 32-256); it now
    scores unit vectors by squared L2. The GPU's float16 walk of the inner product has the same
    first-order error and keeps float32 there."""
    rng = np.random.default_rng(8)
    b = rng.standard_normal(24)
    A = (b + 1e-2 * rng.standard_normal((3040, 24))).astype(np.float32)
    X, Q = A[:3000], A[3000:]
    Xn = X / np.linalg.norm(X.astype(np.float64), axis=1, keepdims=True)
    Qn = Q / np.linalg.norm(Q.astype(np.float64), axis=1, keepdims=True)
    D = 1.0 - Qn @ Xn.T
    kth = np.sort(D, axis=1)[:, 9:10]
    index = GraphIndex.build(X, metric="cosine", placement=placement, device=device, random_state=0)
    for beam in (32, 64):
        _d, i = index.search(Q, k=10, beam=beam)
        i = np.asarray(i.get() if hasattr(i, "get") else i)
        assert np.mean(np.take_along_axis(D, i, 1) <= kth * (1 + 1e-4)) >= 0.95, beam


def test_host_inner_product_on_rows_of_one_norm(tmp_path):
    """Inner product on unit vectors sharing a main direction (the user normalised them): the
    build sees every row's norm equal and scores the PQ walk as for cosine (recall 0.13 at beam 32
    before); rows of different norms keep the inner-product scores; a saved index keeps its choice."""
    rng = np.random.default_rng(9)
    b = rng.standard_normal(24)
    A = b + 1e-2 * rng.standard_normal((3040, 24))
    A = (A / np.linalg.norm(A, axis=1, keepdims=True)).astype(np.float32)
    X, Q = A[:3000], A[3000:]
    D = -(Q.astype(np.float64) @ X.astype(np.float64).T)
    kth = np.sort(D, axis=1)[:, 9:10]
    index = GraphIndex.build(X, metric="inner_product", placement="host", device="cpu", random_state=0)
    assert index._engine.pq_metric == "l2"
    _d, i = index.search(Q, k=10, beam=32)
    assert np.mean(np.take_along_axis(D, i, 1) <= kth + 1e-6) >= 0.95
    index.save(tmp_path / "ip.knnkit")
    assert knnkit.load(tmp_path / "ip.knnkit")._engine.pq_metric == "l2"
    X2 = X * rng.uniform(0.5, 2.0, (3000, 1)).astype(np.float32)
    other = GraphIndex.build(X2, metric="inner_product", placement="host", device="cpu", random_state=0)
    assert other._engine.pq_metric == "ip"


@pytest.mark.gpu
@gpu
def test_fp16_traversal_kept_where_it_resolves_the_distances():
    """The float16 copy is walked while its rounding is small against the graph's edges (unit
    Gaussian and uint8-like data) and not when a common offset dwarfs them; ``traversal="fp16"``
    asked for explicitly is still honoured there, and a float32 walk gives the same recall."""
    import cupy as cp

    rng = np.random.default_rng(5)
    g = rng.standard_normal((5000, 32)).astype(np.float32)
    u8 = rng.integers(0, 256, (5000, 128)).astype(np.float32)
    for X, walks_fp16 in ((g, True), (u8, True), (g + np.float32(1e3), False), (g + np.float32(1e4), False)):
        index = GraphIndex.build(cp.asarray(X[:4800]), random_state=0)
        Q = cp.asarray(X[4800:])
        d, _ = index.search(Q, k=10, beam=64)
        assert index._engine._x16_cache[2] is walks_fp16
        want, _ = knnkit.knn(cp.asarray(X[:4800]), Q, k=10)
        assert float(cp.mean(d <= want[:, -1:] * (1 + 1e-6) + 1e-6)) >= 0.95
        d16, _ = index.search(Q, k=10, beam=64, traversal="fp16")
        assert d16.shape == (200, 10)


def test_two_hop_lists_are_the_nearest_of_the_neighbourhood():
    """``two_hop_lists``: each row's K nearest among its first list, its graph neighbours and
    theirs: no self, no repeats, -1 only where the neighbourhood is smaller than K, and the same
    ids as a direct computation."""
    from knnkit.index._prune_cpu import two_hop_lists

    rng = np.random.default_rng(12)
    X = rng.standard_normal((400, 6)).astype(np.float32)
    graph = rng.integers(-1, 400, (400, 5)).astype(np.int32)
    first = rng.integers(-1, 400, (400, 4)).astype(np.int64)
    for metric in ("l2", "ip"):
        out = two_hop_lists(X, graph, first, 12, metric)
        for r in range(400):
            pool = set(first[r][first[r] >= 0].tolist()) | set(graph[r][graph[r] >= 0].tolist())
            for u in graph[r][graph[r] >= 0]:
                pool |= set(graph[u][graph[u] >= 0].tolist())
            pool.discard(r)
            pool = np.array(sorted(pool), np.int64)
            d = ((X[pool] - X[r]) ** 2).sum(1) if metric == "l2" else -(X[pool] @ X[r])
            want = set(pool[np.argsort(d, kind="stable")[:12]].tolist())
            got = out[r][out[r] >= 0]
            assert len(got) == min(12, len(pool)) and len(set(got.tolist())) == len(got) and r not in got
            if len(pool) > 12:  # ties at the 12th aside, the same set
                kth = np.sort(d)[11]
                gd = ((X[got] - X[r]) ** 2).sum(1) if metric == "l2" else -(X[got] @ X[r])
                assert np.all(gd <= kth + 1e-5), r
            else:
                assert set(got.tolist()) == want
