"""knn(filter=...): exact search restricted to the points that pass, every filter form."""

import numpy as np
import pytest

import knnkit


def _reference(X, Q, k, rows, metric="sqeuclidean"):
    """Exact search on each query's subset, ids mapped back; -1 / inf past the passing count."""
    fill = -np.inf if metric == "inner_product" else np.inf
    D = np.full((len(Q), k), fill, np.float32)
    I = np.full((len(Q), k), -1, np.int64)
    for q, ids in enumerate(rows):
        kk = min(k, len(ids))
        if kk:
            d, i = knnkit.knn(X[ids], Q[q:q + 1], k=kk, metric=metric, device="cpu")
            D[q, :kk], I[q, :kk] = d[0], ids[i[0]]
    return D, I


@pytest.mark.parametrize("form", ["mask", "bitset8", "bitset32", "mask2d", "ids"])
@pytest.mark.parametrize("k", [1, 7])
def test_filter_forms_equal_search_on_the_subset(rng, form, k):
    X = rng.standard_normal((300, 6)).astype(np.float32)
    Q = rng.standard_normal((12, 6)).astype(np.float32)
    n = len(X)
    if form in ("mask2d", "ids"):
        masks = rng.random((len(Q), n)) < rng.uniform(0.01, 0.6, (len(Q), 1))
        masks[3] = False            # a query with nothing passing
        masks[4] = masks[5]         # two identical filters (searched together)
        filt = masks if form == "mask2d" else [np.flatnonzero(r) for r in masks]
        rows = [np.flatnonzero(r) for r in masks]
    else:
        mask = rng.random(n) < 0.2
        rows = [np.flatnonzero(mask)] * len(Q)
        if form == "mask":
            filt = mask
        else:
            filt = np.packbits(mask, bitorder="little")
            if form == "bitset32":
                filt = np.concatenate([filt, np.zeros(-len(filt) % 4, np.uint8)]).view(np.uint32)
    d, i = knnkit.knn(X, Q, k=k, device="cpu", filter=filt)
    D, I = _reference(X, Q, k, rows)
    np.testing.assert_array_equal(i, I)
    np.testing.assert_allclose(d, D, rtol=1e-5)
    for q, ids in enumerate(rows):  # nothing outside the filter, -1 only where no point exists
        got = i[q][i[q] >= 0]
        assert np.isin(got, ids).all() and len(got) == min(k, len(ids))


def test_filter_edge_cases(rng):
    X = rng.standard_normal((50, 4)).astype(np.float32)
    Q = X[:3]
    d, i = knnkit.knn(X, Q, k=5, device="cpu", filter=np.ones(50, bool))
    d0, i0 = knnkit.knn(X, Q, k=5, device="cpu")
    np.testing.assert_array_equal(i, i0)
    d, i = knnkit.knn(X, Q, k=5, device="cpu", filter=np.zeros(50, bool))
    assert (i == -1).all() and np.isinf(d).all()
    d, i = knnkit.knn(X, Q, k=3, device="cpu", metric="inner_product", filter=np.arange(50) < 2)
    assert (i[:, 2] == -1).all() and (d[:, 2] == -np.inf).all() and (d[:, 0] >= d[:, 1]).all()
    with pytest.raises(ValueError, match="filter"):
        knnkit.knn(X, Q, k=3, device="cpu", filter=np.ones(49, bool))
    with pytest.raises(ValueError, match="filter"):
        knnkit.knn(X, Q, k=3, device="cpu", filter=[np.array([0, 60])] * 3)
    with pytest.raises(TypeError, match="filter"):
        knnkit.knn(X, Q, k=3, device="cpu", filter=np.ones(50, np.float32))
    with pytest.raises(ValueError, match="filter needs queries"):
        knnkit.knn(X, k=3, device="cpu", filter=np.ones(50, bool))


@pytest.mark.gpu
@pytest.mark.skipif(not knnkit.gpu_available(), reason="needs an NVIDIA GPU and CuPy")
def test_filter_gpu_equals_cpu(rng):
    import cupy as cp

    X = rng.standard_normal((5000, 32)).astype(np.float32)
    Q = rng.standard_normal((40, 32)).astype(np.float32)
    masks = rng.random((40, 5000)) < 0.05
    d, i = knnkit.knn(cp.asarray(X), cp.asarray(Q), k=10, filter=cp.asarray(masks))
    D, I = knnkit.knn(X, Q, k=10, device="cpu", filter=masks)
    np.testing.assert_array_equal(cp.asnumpy(i), I)
    np.testing.assert_allclose(cp.asnumpy(d), D, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def clustered_index():
    from knnkit.datasets import make_clustered

    X, Q = make_clustered(20_000, 16, n_queries=100, random_state=2, device="cpu")
    return X, Q, knnkit.GraphIndex.build(X, device="cpu", random_state=0)


@pytest.mark.parametrize("selectivity", [0.5, 0.1, 0.01, 0.001])
def test_index_search_with_filter(clustered_index, selectivity):
    """GraphIndex.search(filter=): only passing points, recall >= 0.95 against exact search on the
    passing subset at every selectivity (over-fetch where many pass, exact where few do)."""
    X, Q, index = clustered_index
    rng = np.random.default_rng(int(selectivity * 1000))
    mask = rng.random(len(X)) < selectivity
    d, i = index.search(Q, k=10, filter=mask)
    D, I = knnkit.knn(X, Q, k=10, device="cpu", filter=mask)
    assert np.isin(i[i >= 0], np.flatnonzero(mask)).all()
    assert ((i >= 0).sum(axis=1) == min(10, mask.sum())).all()
    hits = sum(len(set(a[a >= 0]) & set(b[b >= 0])) for a, b in zip(i, I))
    assert hits / max(1, (I >= 0).sum()) >= 0.95
    # per-query id lists take the same path
    d2, i2 = index.search(Q[:5], k=10, filter=[np.flatnonzero(mask)] * 5)
    np.testing.assert_array_equal(i2, i[:5])
