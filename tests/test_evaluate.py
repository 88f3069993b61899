"""knnkit.evaluate: recall on hand-made cases, graph recall against a numpy reference, Timer."""

import time

import numpy as np
import pytest

import knnkit
from knnkit import evaluate


def _numpy_knn(data, queries=None, k=10, *, metric="sqeuclidean", device="auto"):
    """Reference exact k-NN in float64 numpy (squared L2, inner product, cosine), ties by smaller index."""
    x = np.asarray(data, np.float64)
    q = x if queries is None else np.asarray(queries, np.float64)
    if metric == "inner_product":
        dist = -(q @ x.T)
    elif metric == "cosine":
        dist = 1 - (q @ x.T) / np.outer(np.linalg.norm(q, axis=1), np.linalg.norm(x, axis=1))
    else:
        dist = ((q[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    if queries is None:
        np.fill_diagonal(dist, np.inf)
    idx = np.argsort(dist, axis=1, kind="stable")[:, :k]
    d = np.take_along_axis(dist, idx, 1)
    if metric == "inner_product":
        d = -d    # the library's convention: similarities, largest first
    return d.astype(np.float32), idx


@pytest.fixture
def numpy_knn(monkeypatch):
    """Make evaluate use the numpy reference instead of the exact engine (tests this module alone)."""
    import knnkit.api.exact

    def fake(data, queries, k, *, metric="sqeuclidean", device="auto", **_kw):
        return _numpy_knn(data, queries, k=k, metric=metric, device=device)

    monkeypatch.setattr(knnkit.api.exact, "exact_arrays", fake)
    return _numpy_knn


def test_recall_hand_made():
    true = np.array([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]])
    found = np.array([[3, 2, 1, 0],      # all four, other order
                      [4, 99, 98, 97],   # one
                      [-1, -1, 11, 8]])  # two, padding never counts
    assert evaluate.recall(found, true) == pytest.approx((1 + 0.25 + 0.5) / 3)
    np.testing.assert_allclose(evaluate.recall(found, true, average=False), [1, 0.25, 0.5])
    # recall@2 uses the first two columns of each
    np.testing.assert_allclose(evaluate.recall(found, true, k=2, average=False), [0, 0.5, 0])
    # ground truth with more columns than found: default k is found's width
    assert evaluate.recall(true[:, :2], true) == 1.0
    assert evaluate.recall([[1, 2]], [[2, 1]]) == 1.0
    # same id in two query rows must not count across rows
    assert evaluate.recall([[5], [4]], [[4], [5]]) == 0.0
    # duplicated found ids count once
    assert evaluate.recall([[7, 7]], [[7, 8]]) == 0.5
    # true rows padded with -1: denominator is the valid count
    assert evaluate.recall([[1, 2, 3]], [[1, 2, -1]]) == 1.0


def test_recall_validation():
    with pytest.raises(ValueError, match="rows"):
        evaluate.recall(np.zeros((2, 3), int), np.zeros((3, 3), int))
    with pytest.raises(ValueError, match="columns"):
        evaluate.recall(np.zeros((2, 3), int), np.zeros((2, 2), int))
    with pytest.raises(ValueError, match="columns"):
        evaluate.recall(np.zeros((2, 3), int), np.zeros((2, 5), int), k=4)
    with pytest.raises(TypeError, match="integer"):
        evaluate.recall(np.zeros((2, 3)), np.zeros((2, 3), int))
    d, i = np.zeros((1, 2), np.float32), np.zeros((1, 2), np.int64)
    with pytest.raises(TypeError, match="second item"):
        evaluate.recall((d, i), i)


def test_recall_with_ties():
    true_i = np.array([[0, 1, 2], [3, 4, 5]])
    true_d = np.array([[1.0, 2.0, 2.0], [0.0, 1.0, 5.0]])
    # row 0: 7 is as near as the true 3rd (a tie) -> found; row 1: 9 at 6.0 is farther -> not
    found_i = np.array([[0, 7, 1], [3, 4, 9]])
    found_d = np.array([[1.0, 2.0, 2.0], [0.0, 1.0, 6.0]])
    assert evaluate.recall(found_i, true_i) == pytest.approx((2 / 3 + 2 / 3) / 2)
    r = evaluate.recall(found_i, true_i, found_distances=found_d, true_distances=true_d, average=False)
    np.testing.assert_allclose(r, [1.0, 2 / 3])
    # within eps of the threshold counts, beyond does not; padding and repeats never count
    assert evaluate.recall([[3, 4, 9]], [[3, 4, 5]], found_distances=[[0, 1, 5.004]],
                           true_distances=[[0, 1, 5.0]]) == 1.0
    assert evaluate.recall([[3, 4, 9]], [[3, 4, 5]], found_distances=[[0, 1, 5.01]],
                           true_distances=[[0, 1, 5.0]]) == pytest.approx(2 / 3)
    assert evaluate.recall([[3, 3, -1]], [[3, 4, 5]], found_distances=[[0, 0, 0]],
                           true_distances=[[0, 1, 5.0]]) == pytest.approx(1 / 3)
    # similarities: larger is nearer
    assert evaluate.recall([[1, 2]], [[1, 3]], found_distances=[[9.0, 4.0]], true_distances=[[9.0, 4.0]],
                           similarity=True) == 1.0
    assert evaluate.recall([[1, 2]], [[1, 3]], found_distances=[[9.0, 3.0]], true_distances=[[9.0, 4.0]],
                           similarity=True) == 0.5
    with pytest.raises(ValueError, match="both"):
        evaluate.recall(found_i, true_i, found_distances=found_d)


def test_recall_matches_python_sets(rng):
    nq, k = 200, 10
    true = np.stack([rng.permutation(50)[:k] for _ in range(nq)])
    found = np.stack([rng.permutation(50)[:k] for _ in range(nq)])
    expected = np.mean([len(set(f) & set(t)) / k for f, t in zip(found.tolist(), true.tolist())])
    assert evaluate.recall(found, true) == pytest.approx(expected)


def test_recall_torch_inputs():
    torch = pytest.importorskip("torch")
    assert evaluate.recall(torch.tensor([[1, 2]]), np.array([[2, 3]])) == 0.5


def test_graph_recall_exact_and_perturbed(numpy_knn, rng):
    x = rng.standard_normal((300, 6)).astype(np.float32)
    _, g = _numpy_knn(x, k=8)
    assert evaluate.graph_recall(x, g, sample=50, random_state=1) == 1.0
    assert evaluate.graph_recall(x, g, sample=None) == 1.0
    # replace the last 2 of 8 neighbours of every node by far-away ids: recall@8 = 6/8
    bad = g.copy()
    far = np.argsort(((x[:, None] - x[None]) ** 2).sum(-1), axis=1)[:, -2:]
    bad[:, -2:] = far
    assert evaluate.graph_recall(x, bad, sample=100, random_state=0) == pytest.approx(0.75)
    assert evaluate.graph_recall(x, bad, sample=100, random_state=0, k=6) == 1.0

    class Graph:   # KnnGraph-like object
        indices, metric = g, "sqeuclidean"

    assert evaluate.graph_recall(x, Graph(), sample=20, random_state=0) == 1.0


def test_graph_recall_duplicates_and_metric(numpy_knn, rng):
    # every point appears 3 times: the exact neighbours of a node hold its 2 copies first
    base = rng.standard_normal((40, 3)).astype(np.float32)
    x = np.repeat(base, 3, axis=0)
    _, g = _numpy_knn(x, k=4)
    assert evaluate.graph_recall(x, g, sample=None) == 1.0
    assert set(g[4, :2]) == {3, 5}
    # inner product: neighbours by largest dot product
    y = rng.standard_normal((120, 5)).astype(np.float32)
    ip = np.argsort(-(y @ y.T), axis=1, kind="stable")
    g_ip = np.array([[j for j in row if j != i][:5] for i, row in enumerate(ip)])
    assert evaluate.graph_recall(y, g_ip, metric="inner_product", sample=None) == 1.0
    assert evaluate.graph_recall(y, g_ip, metric="sqeuclidean", sample=None) < 0.9


def test_graph_recall_ties(numpy_knn, rng):
    # integer data with many equal distances: a graph that breaks ties the other way (larger id first)
    # loses index recall but is exact under the tie rule
    x = rng.integers(0, 3, (200, 2)).astype(np.float32)
    d2 = ((x[:, None].astype(np.float64) - x[None]) ** 2).sum(-1)
    np.fill_diagonal(d2, np.inf)
    n = len(x)
    key = d2 * (n + 1) + (n - np.arange(n))[None, :]     # ties ordered by larger index
    g = np.argsort(key, axis=1)[:, :6]
    assert evaluate.graph_recall(x, g, sample=None) < 0.9
    assert evaluate.graph_recall(x, g, sample=None, ties=True) == 1.0
    # the tie rule does not forgive wrong neighbours, nor a node listing itself
    bad = g.copy()
    bad[:, -1] = np.argmax(np.where(np.isfinite(d2), d2, -1), axis=1)   # the farthest point
    assert evaluate.graph_recall(x, bad, sample=None, ties=True) < 0.95
    selfish = g.copy()
    selfish[:, 0] = np.arange(n)
    assert evaluate.graph_recall(x, selfish, sample=None, ties=True) == pytest.approx(5 / 6)
    # cosine and inner product tie distances are computed in the right direction
    y = rng.standard_normal((150, 4)).astype(np.float32)
    for metric, score in (("inner_product", -(y @ y.T)),
                          ("cosine", -(y @ y.T) / np.outer(np.linalg.norm(y, axis=1), np.linalg.norm(y, axis=1)))):
        np.fill_diagonal(score, np.inf)
        gm = np.argsort(score, axis=1)[:, :5]
        assert evaluate.graph_recall(y, gm, metric=metric, sample=None, ties=True) == 1.0
        assert evaluate.graph_recall(y, gm[:, ::-1], metric=metric, sample=None, ties=True) == 1.0
        assert evaluate.graph_recall(y, np.argsort(-score, axis=1)[:, :5], metric=metric, sample=None,
                                     ties=True) == 0.0


def test_graph_recall_validation(numpy_knn):
    x = np.zeros((10, 2), np.float32)
    with pytest.raises(ValueError, match="rows"):
        evaluate.graph_recall(x, np.zeros((9, 3), np.int64))
    with pytest.raises(ValueError, match="k="):
        evaluate.graph_recall(x, np.zeros((10, 3), np.int64), k=4)


def test_graph_recall_with_library_knn(rng):
    # the real knnkit.knn (CPU): the exact graph it builds has recall 1
    x = rng.standard_normal((400, 12)).astype(np.float32)
    try:
        _, g = knnkit.knn(x, k=10, device="cpu")
    except NotImplementedError:
        pytest.skip("knnkit.knn not implemented yet")
    assert evaluate.graph_recall(x, g, sample=200, random_state=0, device="cpu") == 1.0
    for metric in ("inner_product", "cosine", "euclidean"):
        _, gm = knnkit.knn(x, k=10, metric=metric, device="cpu")
        assert evaluate.graph_recall(x, gm, metric=metric, sample=100, random_state=0, device="cpu",
                                     ties=True) == 1.0
        assert evaluate.graph_recall(x, gm[:, ::-1], metric=metric, sample=100, device="cpu", k=5,
                                     ties=True) < 0.2
    d, i = evaluate.ground_truth(x, x[:7], 3, device="cpu")
    assert i.shape == (7, 3) and (i[:, 0] == np.arange(7)).all() and d.dtype == np.float32


def test_timer():
    with evaluate.Timer("nap") as t:
        assert t.elapsed is None
        time.sleep(0.05)
    assert 0.04 < t.elapsed < 1.0
    assert str(t).startswith("nap: ") and "running" not in repr(t)
    with pytest.raises(KeyError):
        with evaluate.Timer(sync=False) as t2:
            raise KeyError
    assert t2.elapsed is not None


@pytest.mark.gpu
def test_timer_waits_for_gpu():
    import cupy

    a = cupy.random.standard_normal((4096, 4096), dtype=cupy.float32)
    with evaluate.Timer() as t:
        for _ in range(20):
            a = a @ a
            a /= cupy.linalg.norm(a)
    # 20 GEMMs of 4096^3: at least ~1 ms each even on an H200, far longer than the launch overhead
    assert t.elapsed > 0.01
    assert evaluate.recall(cupy.asarray([[1, 2]]), cupy.asarray([[2, 3]])) == 0.5
