"""GraphIndex.delete / compact (issue 15, deletes and inserts): tombstones are never returned,
compaction keeps recall within 0.01 of a rebuild on the live points, ids stay stable, save/load
keeps tombstones, extend works after deletes."""

import numpy as np
import pytest

import knnkit
from knnkit.datasets.suite import make_tight_clusters, make_uniform_cube
from knnkit.evaluate import recall


def _data(kind, n=6000, nq=200):
    if kind == "tight":
        return make_tight_clusters(n, 24, 80, n_queries=nq, random_state=4)
    return make_uniform_cube(n, 12, n_queries=nq, random_state=4)


def _truth(X, Q, live, k=10):
    _, T = knnkit.knn(X[live], Q, k=k, device="cpu")
    return live[T]


@pytest.fixture(scope="module")
def built():
    out = {}
    for kind in ("tight", "uniform"):
        X, Q = _data(kind)
        out[kind] = (X, Q)
    return out


@pytest.mark.parametrize("kind", ["tight", "uniform"])
@pytest.mark.parametrize("frac", [0.1, 0.5])
def test_recall_after_delete_and_compact_matches_rebuild(built, kind, frac):
    X, Q = built[kind]
    n = X.shape[0]
    rng = np.random.default_rng(7)
    dele = rng.choice(n, int(frac * n), replace=False)
    live = np.setdiff1d(np.arange(n), dele)
    T = _truth(X, Q, live)
    index = knnkit.GraphIndex.build(X, device="cpu", random_state=0)
    assert index.delete(dele, compact=False) == dele.size
    _, i = index.search(Q, k=10)
    assert not np.isin(i, dele).any()
    r_tomb = recall(i, T)
    st = index.compact()
    assert st["deleted"] == dele.size and st["connectivity"]["unreachable_after"] == 0
    g = index.graph
    assert (g[dele] == -1).all() and not np.isin(g[live], dele).any()
    _, i = index.search(Q, k=10)
    assert not np.isin(i, dele).any()
    r = recall(i, T)
    rebuilt = knnkit.GraphIndex.build(X[live], device="cpu", random_state=0)
    r_re = recall(live[rebuilt.search(Q, k=10)[1]], T)
    assert r >= r_re - 0.01 and r_tomb >= r_re - 0.01, (r, r_tomb, r_re)


@pytest.mark.parametrize("frac", [0.001, 0.1, 0.5, 0.99])
@pytest.mark.parametrize("k", [1, 40])
def test_deleted_points_are_never_returned(built, frac, k):
    X, Q = built["tight"]
    n = X.shape[0]
    dele = np.random.default_rng(int(frac * 1000) + k).choice(n, max(1, int(frac * n)), replace=False)
    live = np.setdiff1d(np.arange(n), dele)
    index = knnkit.GraphIndex.build(X, device="cpu", random_state=0)
    index.delete(dele)  # automatic compaction past 20 %
    assert index.n_deleted == dele.size and (index.deleted == np.sort(dele)).all()
    d, i = index.search(Q, k=k)
    assert (i >= 0).all() and not np.isin(i, dele).any()
    assert (np.diff(d, axis=1) >= 0).all()
    T = _truth(X, Q, live, k=k)
    assert recall(i, T) >= 0.95
    assert ("n_deleted=" in repr(index))


def test_save_load_keeps_tombstones_and_ids(built, tmp_path):
    X, Q = built["uniform"]
    index = knnkit.GraphIndex.build(X, device="cpu", random_state=0)
    index.delete(np.arange(0, 6000, 7), compact=False)
    path = tmp_path / "deleted.knnkit"
    index.save(path)
    back = knnkit.GraphIndex.load(path, device="cpu")
    assert back.n == 6000 and back.n_deleted == index.n_deleted
    assert (back.deleted == index.deleted).all()
    assert (back.search(Q, k=10)[1] == index.search(Q, k=10)[1]).all()
    index.compact()
    index.save(path)
    back = knnkit.GraphIndex.load(path, device="cpu")
    assert (back.graph == index.graph).all() and back._engine.consolidated
    live_rows = np.setdiff1d(np.arange(20), index.deleted)
    _, i = back.search(X[live_rows], k=1)
    assert (i[:, 0] == live_rows).all()


def test_delete_then_extend_then_search(built):
    X, Q = built["tight"]
    base, extra = X[:5000], X[5000:]
    index = knnkit.GraphIndex.build(base, device="cpu", random_state=0)
    dele = np.arange(0, 5000, 3)
    index.delete(dele, compact=True)
    index.extend(extra)
    assert index.n == 6000 and index.n_deleted == dele.size
    live = np.setdiff1d(np.arange(6000), dele)
    _, i = index.search(Q, k=10)
    assert not np.isin(i, dele).any()
    assert recall(i, _truth(X, Q, live)) >= 0.95
    assert not np.isin(index.graph[live], dele).any()  # extend re-consolidated


def test_filter_and_tombstones_combine(built):
    X, Q = built["uniform"]
    index = knnkit.GraphIndex.build(X, device="cpu", random_state=0)
    index.delete(np.arange(0, 3000), compact=False)
    mask = np.zeros(6000, bool)
    mask[::2] = True  # even ids pass the filter; ids < 3000 are deleted
    _, i = index.search(Q, k=5, filter=mask)
    assert (i >= 3000).all() and (i % 2 == 0).all()


def test_validation(built):
    X, _ = built["uniform"]
    index = knnkit.GraphIndex.build(X[:500], device="cpu", random_state=0)
    with pytest.raises(ValueError, match="ids"):
        index.delete([500])
    with pytest.raises(ValueError, match="ids"):
        index.delete([-1])
    with pytest.raises(TypeError, match="ids"):
        index.delete([1.5])
    with pytest.raises(TypeError, match="compact"):
        index.delete([1], compact="yes")
    assert index.delete([3, 3, 4]) == 2 and index.delete(3) == 0
    index.delete(np.arange(10, 500), compact=False)
    with pytest.raises(ValueError, match="not deleted"):
        index.search(X[:2], k=10)
    index.delete(np.arange(500), compact=False)
    with pytest.raises(ValueError, match="deleted"):
        index.search(X[:2], k=1)
    with pytest.raises(ValueError, match="deleted"):
        index.compact()


@pytest.mark.gpu
def test_gpu_delete_compact(built):
    X, Q = built["tight"]
    dele = np.random.default_rng(3).choice(6000, 1500, replace=False)
    live = np.setdiff1d(np.arange(6000), dele)
    index = knnkit.GraphIndex.build(X, device="gpu", random_state=0)
    index.delete(dele)
    _, i = index.search(Q, k=10)
    i = np.asarray(i.get() if hasattr(i, "get") else i)
    assert not np.isin(i, dele).any() and recall(i, _truth(X, Q, live)) >= 0.95
