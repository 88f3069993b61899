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


def _hits(i, I):
    return sum(len(set(a[a >= 0]) & set(b[b >= 0])) for a, b in zip(i, I)) / max(1, (I >= 0).sum())


def test_index_filter_strategies_forced(clustered_index):
    """The internal knob of the benchmarks: "exact" is exact, "graph" returns only passing points
    (fewer than k allowed: no fallback), both validated by name."""
    from knnkit.api.index import FILTER_EXACT_MAX_CPU, FILTER_FETCH_MAX_CPU, FILTER_OVERFETCH_CPU, filter_thresholds

    X, Q, index = clustered_index
    mask = np.random.default_rng(5).random(len(X)) < 0.2
    D, I = knnkit.knn(X, Q, k=10, device="cpu", filter=mask)
    d, i = index._search_filtered(Q, 10, mask, {}, strategy="exact")
    np.testing.assert_array_equal(i, I)
    np.testing.assert_allclose(d, D, rtol=1e-4, atol=1e-5)
    for f in (1, 2.5, 8):
        d, i = index._search_filtered(Q, 10, mask, {}, strategy="graph", overfetch=f)
        assert np.isin(i[i >= 0], np.flatnonzero(mask)).all()
        assert (np.isinf(d) == (i < 0)).all()
    assert _hits(i, I) >= 0.95
    assert filter_thresholds("cpu") == (FILTER_EXACT_MAX_CPU, FILTER_OVERFETCH_CPU, FILTER_FETCH_MAX_CPU)
    with pytest.raises(ValueError, match="strategy"):
        index._search_filtered(Q, 10, mask, {}, strategy="brute")
    with pytest.raises(ValueError, match="overfetch"):
        index._search_filtered(Q, 10, mask, {}, overfetch=0.5)
    with pytest.raises(TypeError, match="overfetch"):
        index._search_filtered(Q, 10, mask, {}, overfetch="2")


def test_index_filter_fewer_than_k_pass(clustered_index):
    """Nothing passing: every slot -1 / inf (no garbage); 3 passing: those 3, then -1 / inf."""
    X, Q, index = clustered_index
    for strategy in ("auto", "exact", "graph"):
        d, i = index._search_filtered(Q[:5], 10, np.zeros(len(X), bool), {}, strategy=strategy)
        assert (i == -1).all() and np.isposinf(d).all()
    d, i = index.search(Q[:5], k=10, filter=np.zeros(len(X), bool))
    assert (i == -1).all() and np.isposinf(d).all()
    ids = np.array([7, 70, 700])
    d, i = index.search(Q[:5], k=10, filter=[ids, ids, np.array([], np.int64), ids, ids])
    assert (np.sort(i[[0, 1, 3, 4], :3], axis=1) == ids).all() and (i[:, 3:] == -1).all()
    assert (i[2] == -1).all() and np.isposinf(d[:, 3:]).all() and np.isfinite(d[[0, 1, 3, 4], :3]).all()


@pytest.fixture(scope="module")
def gpu_clustered_index(clustered_index):
    X, Q, _ = clustered_index
    return X, Q, knnkit.GraphIndex.build(X, device="gpu", random_state=0)


def _filter_form(form, masks):
    """``masks`` (m, n) bool in the given form (1-D forms use row 0)."""
    if form == "mask":
        return masks[0]
    if form == "bitset32":
        b = np.packbits(masks[0], bitorder="little")
        return np.concatenate([b, np.zeros(-len(b) % 4, np.uint8)]).view(np.uint32)
    if form == "mask2d":
        return masks
    return [np.flatnonzero(r) for r in masks]


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["mask", "bitset32", "mask2d", "ids"])
@pytest.mark.parametrize("selectivity", [0.5, 0.05, 0.001])
def test_index_filter_gpu_matches_cpu(clustered_index, gpu_clustered_index, form, selectivity):
    """GPU index: only passing points, exactly min(k, passing) of them, recall >= 0.95 against
    exact search over the passing points and within 0.01 of the CPU index's, every filter form
    (0.001 of 20k: 20 points, the exact path)."""
    X, Q, cpu_index = clustered_index
    _, _, gpu_index = gpu_clustered_index
    Q = Q[:25]
    rng = np.random.default_rng(int(selectivity * 1000) + 17)
    masks = rng.random((len(Q), len(X))) < selectivity
    if form in ("mask", "bitset32"):
        masks[:] = masks[0]
    filt = _filter_form(form, masks)
    D, I = knnkit.knn(X, Q, k=10, device="cpu", filter=masks)
    d, i = gpu_index.search(Q, k=10, filter=filt)
    d, i = np.asarray(d), np.asarray(i)
    for q in range(len(Q)):
        got = i[q][i[q] >= 0]
        assert np.isin(got, np.flatnonzero(masks[q])).all()
        assert len(got) == min(10, masks[q].sum()) and len(set(got)) == len(got)
    assert (np.isinf(d) == (i < 0)).all()
    _dc, ic = cpu_index.search(Q, k=10, filter=filt)
    r_gpu, r_cpu = _hits(i, I), _hits(ic, I)
    assert r_gpu >= 0.95 and r_gpu >= r_cpu - 0.01, (r_gpu, r_cpu)


@pytest.mark.gpu
def test_index_filter_gpu_edge_cases(clustered_index, gpu_clustered_index):
    """GPU index: nothing passing gives -1 / inf only; forced strategies; exact on a GPU index
    searched on the CPU; the GPU thresholds are the GPU constants."""
    from knnkit.api.index import FILTER_EXACT_MAX_GPU, FILTER_FETCH_MAX_GPU, FILTER_OVERFETCH_GPU, filter_thresholds

    X, Q, index = gpu_clustered_index
    d, i = index.search(Q[:8], k=10, filter=np.zeros(len(X), bool))
    d, i = np.asarray(d), np.asarray(i)
    assert (i == -1).all() and np.isposinf(d).all()
    masks = np.random.default_rng(3).random((8, len(X))) < 0.3
    masks[2] = False
    d, i = index.search(Q[:8], k=10, filter=masks)
    i = np.asarray(i)
    assert (i[2] == -1).all() and (i[[0, 1, 3]] >= 0).all()
    mask = masks[0]
    D, I = knnkit.knn(X, Q, k=10, device="cpu", filter=mask)
    d, i = index._search_filtered(Q, 10, mask, {}, strategy="exact")
    np.testing.assert_array_equal(np.asarray(i), I)
    d, i = index._search_filtered(Q, 10, mask, {}, strategy="graph", overfetch=2)
    i = np.asarray(i)
    assert np.isin(i[i >= 0], np.flatnonzero(mask)).all() and _hits(i, I) >= 0.95
    d, i = index.search(Q, k=10, filter=np.arange(len(X)) < 500, device="cpu")  # exact path, on the CPU
    np.testing.assert_array_equal(np.asarray(i), knnkit.knn(X[:500], Q, k=10, device="cpu")[1])
    assert filter_thresholds("gpu")[:2] == (FILTER_EXACT_MAX_GPU, FILTER_OVERFETCH_GPU)
    assert filter_thresholds("gpu")[2] == min(FILTER_FETCH_MAX_GPU, 1024)
