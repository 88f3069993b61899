"""GGNN layer hierarchy as the entry structure of the graph search (index/_hierarchy.py), CPU."""

import numpy as np
import pytest

import knnkit
from knnkit.datasets.suite import make_tight_clusters, make_uniform_cube
from knnkit.index._build import exact_knn_cpu
from knnkit.index._hierarchy import HierarchicalEntry, _layer_sizes, build_hierarchy
from knnkit.index._search_cpu import search_cpu


def _index(X):
    idx = knnkit.GraphIndex.build(X, device="cpu", connectivity=False, random_state=0)
    return idx._engine


def _recall(eng, Q, seeds, beam):
    _, TI = exact_knn_cpu(eng._X, Q, 10, "l2")
    _, I = search_cpu(eng._X, eng._graph, Q, 10, seeds=seeds, beam=beam, tau=None, max_iters=8 * beam,
                      metric="l2")
    return float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(I, TI)]))


@pytest.fixture(scope="module")
def tight():
    # 300 clusters of 40 points: more clusters than sqrt(n) ~ 110 k-means entries and each cluster
    # smaller than the candidate degree, so the unrepaired graph barely links clusters
    X, Q = make_tight_clusters(12_000, 32, 300, 0.01, n_queries=200, random_state=3)
    return X, Q, _index(X)


@pytest.fixture(scope="module")
def uniform():
    X, Q = make_uniform_cube(12_000, 16, n_queries=200, random_state=4)
    return X, Q, _index(X)


def test_layer_sizes():
    assert _layer_sizes(1_000_000, 16, 512, 64) == [62500, 3907, 245]
    assert _layer_sizes(100_000, 16, 512, 64) == [6250, 391]
    assert _layer_sizes(3000, 16, 512, 64) == [188]
    assert _layer_sizes(50, 16, 512, 64) == [50]
    # a top of fewer than min_top points is not made while the layer below is still small
    assert _layer_sizes(2000, 4, 64, 64) == [500, 125]


def test_structure_nested_and_valid(tight):
    X, _, eng = tight
    h = build_hierarchy(eng._X, "l2", ratio=8, top_size=64, random_state=1)
    assert h.sizes == [1500, 188]
    assert len(h.graphs) == h.n_layers - 1
    for j in range(1, h.n_layers):
        assert np.isin(h.ids[j], h.ids[j - 1]).all()
        assert np.array_equal(h.ids[j - 1][h.down[j]], h.ids[j])
    for j, g in enumerate(h.graphs):
        assert g.dtype == np.int32 and g.shape[0] == h.sizes[j]
        assert ((g >= -1) & (g < h.sizes[j])).all()
        assert not (g == np.arange(h.sizes[j])[:, None]).any()  # no self loops
    for j in range(h.n_layers):
        assert np.array_equal(h.vectors[j], eng._X[h.ids[j]])
    assert np.array_equal(h.medoids, h.ids[0]) and len(h) == 1500 and h.metric == "l2"


def test_seeds_valid_sorted_and_near(tight):
    X, Q, eng = tight
    h = build_hierarchy(eng._X, "l2", ratio=8, top_size=64, random_state=1)
    s = h.seeds_for(Q, 6)
    assert s.shape == (len(Q), 6) and s.dtype == np.int32
    assert np.isin(s, h.medoids).all()
    d = ((Q[:, None, :] - eng._X[s]) ** 2).sum(-1)
    assert (np.diff(d, axis=1) >= -1e-5).all()  # nearest first
    # the first seed is the bottom layer's exact nearest point for nearly every query
    B = eng._X[h.medoids]
    best = h.medoids[np.argmin(((Q[:, None, :] - B[None]) ** 2).sum(-1), axis=1)]
    assert np.mean(best == s[:, 0]) >= 0.95


def test_tight_clusters_recall_beats_kmeans(tight):
    X, Q, eng = tight
    h = build_hierarchy(eng._X, "l2", random_state=0)
    for beam in (32, 64):
        ns = max(4, beam // 16)
        r_h = _recall(eng, Q, h.seeds_for(Q, ns), beam)
        r_k = _recall(eng, Q, eng._entry.seeds_for(Q, ns), beam)
        # the hierarchy finds each query's cluster even where the graph does not link clusters
        assert r_h >= 0.97, (beam, r_h, r_k)
        assert r_h >= r_k - 0.005


def test_uniform_recall_comparable(uniform):
    X, Q, eng = uniform
    h = build_hierarchy(eng._X, "l2", random_state=0)
    for beam in (16, 64):
        ns = max(4, beam // 16)
        r_h = _recall(eng, Q, h.seeds_for(Q, ns), beam)
        r_k = _recall(eng, Q, eng._entry.seeds_for(Q, ns), beam)
        assert r_h >= r_k - 0.02, (beam, r_h, r_k)
    assert r_h >= 0.95


def test_deterministic(uniform):
    X, Q, eng = uniform
    a = build_hierarchy(eng._X, "l2", ratio=8, random_state=7)
    b = build_hierarchy(eng._X, "l2", ratio=8, random_state=7)
    for x, y in zip(a.ids + a.graphs, b.ids + b.graphs):
        assert np.array_equal(x, y)
    assert np.array_equal(a.seeds_for(Q, 5), b.seeds_for(Q, 5))
    c = build_hierarchy(eng._X, "l2", ratio=8, random_state=8)
    assert not np.array_equal(a.ids[0], c.ids[0])


def test_inner_product_and_ggnn_diversify(rng):
    X = rng.standard_normal((5000, 24)).astype(np.float32)
    X *= rng.lognormal(0, 0.5, (5000, 1)).astype(np.float32)
    Q = rng.standard_normal((100, 24)).astype(np.float32)
    for div in ("prune", "ggnn"):
        h = build_hierarchy(X, "ip", ratio=8, top_size=64, diversify=div, random_state=0)
        assert h.xnorm_max > 0
        s = h.seeds_for(Q, 4)
        assert np.isin(s, h.medoids).all()
        # the first seed is (nearly always) the bottom layer's best inner product
        B = X[h.medoids]
        best = h.medoids[np.argmax(Q @ B.T, axis=1)]
        assert np.mean(best == s[:, 0]) >= 0.9, div


def test_small_data_single_layer(rng):
    X = rng.random((40, 4), dtype=np.float32)
    h = build_hierarchy(X, "l2", random_state=0)
    assert h.sizes == [40] and h.graphs == []
    s = h.seeds_for(X[:3], 50)  # more seeds than points: -1 padded
    assert s.shape == (3, 50) and (s[:, 40:] == -1).all() and (s[:, 0] == [0, 1, 2]).all()


def test_arrays_roundtrip(uniform):
    X, Q, eng = uniform
    h = build_hierarchy(eng._X, "l2", ratio=8, top_size=64, random_state=2)
    arr = h.to_arrays()
    assert set(arr) == {"hier_sizes", "hier_ids", "hier_graph", "hier_params"}
    assert all(isinstance(v, np.ndarray) for v in arr.values())
    h2 = HierarchicalEntry.from_arrays(arr, "l2", X=eng._X)
    h3 = HierarchicalEntry.from_arrays(h.to_arrays(vectors=True), "l2")
    for other in (h2, h3):
        assert other.sizes == h.sizes and other.layer_beam == h.layer_beam
        assert np.array_equal(other.seeds_for(Q, 4), h.seeds_for(Q, 4))
    with pytest.raises(ValueError):
        HierarchicalEntry.from_arrays(arr, "l2")


def test_to_numpy_is_a_copy(uniform):
    X, Q, eng = uniform
    h = build_hierarchy(eng._X, "l2", random_state=0)
    h2 = h.to(np)
    assert h2 is not h and np.array_equal(h2.seeds_for(Q, 3), h.seeds_for(Q, 3))


def test_graph_index_entry_hierarchy_through_the_facade(tmp_path):
    """IndexParams(entry="hierarchy") builds, searches, saves and loads through GraphIndex; on tight
    clusters that outnumber the k-means entries it beats them at a small beam."""
    X, Q = make_tight_clusters(12000, 16, 1500, n_queries=300, random_state=3)
    _, T = knnkit.knn(X, Q, k=10, device="cpu")
    flat = knnkit.GraphIndex.build(X, device="cpu", random_state=0)
    hier = knnkit.GraphIndex.build(X, device="cpu", random_state=0, entry="hierarchy")
    assert hier.build_params["entry"] == "hierarchy"
    r_flat = knnkit.evaluate.recall(flat.search(Q, k=10, beam=16)[1], T)
    r_hier = knnkit.evaluate.recall(hier.search(Q, k=10, beam=16)[1], T)
    assert r_hier >= max(0.9, r_flat - 0.005)
    path = tmp_path / "h.knnk"
    hier.save(path)
    back = knnkit.load(path, device="cpu")
    np.testing.assert_array_equal(back.search(Q, k=10, beam=32)[1], hier.search(Q, k=10, beam=32)[1])
