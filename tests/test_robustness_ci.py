"""The "ci" robustness suite through the public API (issue "quality on unseen data", part 5):
default graphs and indexes on data the project's own generator does not make. The index's search
graph is connected and reachable from its entries on every set (the connectivity repair of
``GraphIndex.build``); ``test_repair_is_what_connects`` builds the same data without the repair and
checks that the repair is what lifts it (tight clusters strand whole clusters otherwise)."""

import pytest

import knnkit
from knnkit.datasets.suite import robustness_sets
from knnkit.evaluate import recall
from knnkit.index._connect import components, reachable_from

K = 10
SETS = ["tight_c1000", "tight_c10000", "duplicates", "points_2d", "skewed_norms_ip", "manifold", "broad_clusters"]


_CACHE = {}


def _built(name):
    """(data, queries, metric, index, exact distances, exact ids) for one ci set, built once."""
    if name not in _CACHE:
        [(_, X, Q, metric)] = robustness_sets("ci", names=[name], real=False)
        index = knnkit.GraphIndex.build(X, metric=metric, device="cpu", random_state=0)
        TD, TI = knnkit.knn(X, Q, k=K, metric=metric, device="cpu")
        _CACHE[name] = (X, Q, metric, index, TD, TI)
    return _CACHE[name]


def _recall(index, Q, TD, TI, metric, beam):
    D, I = index.search(Q, k=K, beam=beam)
    return recall(I, TI, found_distances=D, true_distances=TD, similarity=metric == "inner_product")


@pytest.mark.parametrize("name", ["tight_c1000", "duplicates", "skewed_norms_ip"])
def test_graph_recall_defaults(name):
    X, _, metric, _, _, _ = _built(name)
    g = knnkit.knn_graph(X, k=K, metric=metric, device="cpu", random_state=0)
    assert knnkit.evaluate.graph_recall(X, g, sample=500, metric=metric, random_state=0, ties=True) >= 0.95


@pytest.mark.parametrize("name", SETS)
def test_index_graph_connected_and_reachable(name):
    X, _, _, index, _, _ = _built(name)
    G = index.graph
    assert components(G)[1] == 1
    assert reachable_from(G, index.entry_points).all()


@pytest.mark.parametrize("name", SETS)
def test_index_recall_defaults(name):
    """Default build, default beam: recall >= 0.95; a large beam: >= 0.99 (ties forgiven)."""
    X, Q, metric, index, TD, TI = _built(name)
    assert _recall(index, Q, TD, TI, metric, beam=None) >= 0.95
    assert _recall(index, Q, TD, TI, metric, beam=256) >= 0.99


@pytest.mark.parametrize("name", ["tight_c1000", "tight_c10000"])
def test_repair_is_what_connects(name):
    """Without the repair the build is cut into clusters and no beam recovers them; with it
    (the default) the default search reaches recall >= 0.99. The unrepaired build takes the
    default's parameters: left automatic, its calibration would send it to the denser tier,
    whose candidates (the first build's lists joined with a walk) now link the clusters anyway."""
    X, Q, metric, index, TD, TI = _built(name)
    bp = index.build_params
    unrepaired = knnkit.GraphIndex.build(X, metric=metric, device="cpu", random_state=0, connectivity=False,
                                         graph_degree=bp["graph_degree"], alpha=bp["alpha"],
                                         intermediate_degree=bp["intermediate_degree"])
    assert components(unrepaired.graph)[1] > 1  # the data set still shows the failure
    assert _recall(unrepaired, Q, TD, TI, metric, beam=256) < 0.99
    st = index.build_params["connectivity"]
    assert st["components_before"] > 1 and st["components_after"] == 1 and st["unreachable_after"] == 0
    assert _recall(index, Q, TD, TI, metric, beam=None) >= 0.99


_HOST_SETS = ["uniform_d32", "uniform_d128", "tight_c1000", "tight_c10000", "broad_clusters", "duplicates",
              "manifold", "skewed_norms_ip", "points_2d", "sift_like_u8"]


@pytest.mark.parametrize("name", _HOST_SETS)
def test_host_placement_recall_defaults(name):
    """GraphIndex(placement="host") (BANG: PQ walk, exact re-rank) with default parameters: the
    build's check sets the default beam, and recall there is >= 0.90 on every ci set (the GPU run
    of the small suite: >= 0.928, results/robustness/gpu_small_host_2026-12-01_s42.md)."""
    [(_, X, Q, metric)] = robustness_sets("ci", names=[name], real=False)
    index = knnkit.GraphIndex.build(X, metric=metric, device="cpu", random_state=0, placement="host")
    TD, TI = knnkit.knn(X, Q, k=K, metric=metric, device="cpu")
    D, I = index.search(Q, k=K)
    assert recall(I, TI, found_distances=D, true_distances=TD, similarity=metric == "inner_product") >= 0.90
