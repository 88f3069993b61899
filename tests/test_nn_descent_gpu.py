"""GPU NN-Descent kernels (``knnkit.graph.nndescent._gpu.nndescent_gpu``) against exact k-NN on the CPU."""

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def _cp():
    import cupy

    return cupy


def _exact(X, k, metric):
    """Exact k-NN excluding self, float64 numpy: (indices, distances)."""
    X = X.astype(np.float64)
    if metric == "l2":
        sq = (X * X).sum(1)
        D = sq[:, None] + sq[None, :] - 2 * X @ X.T
    elif metric == "ip":
        D = -(X @ X.T)
    else:
        D = np.zeros((len(X), len(X)))
        for s in range(0, len(X), 256):
            D[s:s + 256] = np.abs(X[s:s + 256, None, :] - X[None, :, :]).sum(-1)
    np.fill_diagonal(D, np.inf)
    idx = np.argsort(D, axis=1, kind="stable")[:, :k]
    return idx, np.take_along_axis(D, idx, 1)


def _recall(idx, true_idx, k):
    idx = np.asarray(idx)[:, :k]
    hits = sum(len(np.intersect1d(a, b)) for a, b in zip(idx, true_idx[:, :k]))
    return hits / true_idx[:, :k].size


def _clustered(rng, n, d, n_clusters=20):
    latent = min(d, 8)
    centres = rng.normal(size=(n_clusters, latent)) * 3
    z = centres[rng.integers(0, n_clusters, n)] + rng.normal(size=(n, latent))
    basis = np.linalg.qr(rng.normal(size=(d, latent)))[0][:, :latent] if d > latent else np.eye(d)
    X = z @ basis.T + 0.05 * rng.normal(size=(n, d))
    return X.astype(np.float32)


def _run(X, K, **kw):
    from knnkit.graph.nndescent._gpu import nndescent_gpu

    cp = _cp()
    args = dict(sample=max(4, min(16, K // 2 + 2)), max_iters=30, delta=0.0005, metric="l2")
    args.update(kw)
    idx, dist, stats = nndescent_gpu(cp.asarray(X), K, **args)
    return cp.asnumpy(idx), cp.asnumpy(dist), stats


def _check_lists(X, idx, dist, metric):
    n, K = idx.shape
    assert idx.dtype == np.int32 and dist.dtype == np.float32
    assert ((idx >= 0) & (idx < n)).all()
    assert not (idx == np.arange(n)[:, None]).any(), "self in a list"
    s = np.sort(idx, axis=1)
    assert not (s[:, 1:] == s[:, :-1]).any(), "duplicate in a list"
    assert (np.diff(dist, axis=1) >= 0).all(), "rows not sorted"
    # distances are the true distances of the listed pairs
    rows = np.repeat(np.arange(n), K)
    a, b = X[rows].astype(np.float64), X[idx.ravel()].astype(np.float64)
    if metric == "l2":
        ref = ((a - b) ** 2).sum(1)
    elif metric == "ip":
        ref = -(a * b).sum(1)
    else:
        ref = np.abs(a - b).sum(1)
    scale = np.abs(ref).max() + 1e-6
    np.testing.assert_allclose(dist.ravel(), ref, atol=2e-5 * scale * max(1, X.shape[1] / 64), rtol=1e-3)


@pytest.mark.parametrize("distance", ["fp32", "tensor"])
@pytest.mark.parametrize("d", [2, 17, 128, 960])
@pytest.mark.parametrize("kind", ["clustered", "uniform"])
def test_recall_l2_dims(rng, d, kind, distance):
    """recall@10 of 32-lists (64-lists for uniform high-d data, the hard case of NN-Descent:
    no low intrinsic dimension). Measured on H200: clustered >= 0.997, uniform d <= 17 >= 0.995,
    uniform d = 128 0.998 with K = 64."""
    n = 3000 if d < 960 else 1500
    X = _clustered(rng, n, d) if kind == "clustered" else rng.random((n, d), dtype=np.float32)
    hard = kind == "uniform" and d >= 128
    K, p = (64, 32) if hard else (32, 16)
    idx, dist, stats = _run(X, K, sample=p, distance=distance)
    true_idx, _ = _exact(X, 10, "l2")
    r = _recall(idx, true_idx, 10)
    assert r >= (0.9 if hard else 0.98), (r, stats)
    _check_lists(X, idx, dist, "l2")


@pytest.mark.parametrize("metric", ["l2", "ip", "l1"])
@pytest.mark.parametrize("K", [10, 32, 64])
def test_metrics_and_k(rng, metric, K):
    """recall over the whole list. Selective update leaves the tail of a list (the K-th neighbours)
    least refined, and with K = 64 the two segments (v % 2) each keep their nearest 32, so recall@K
    is ~0.95 (K = 10, 32) and ~0.91 (K = 64) while recall@10 of K >= 32 lists is ~0.999."""
    X = _clustered(rng, 2500, 24)
    if metric == "ip":  # cosine through the internal 'ip' on unit rows
        X /= np.linalg.norm(X, axis=1, keepdims=True)
    idx, dist, stats = _run(X, K, metric=metric)
    true_idx, _ = _exact(X, K, metric)
    r = _recall(idx, true_idx, K)
    assert r >= {10: 0.91, 32: 0.93, 64: 0.87}[K], (r, stats)
    if K >= 32:
        r10 = _recall(idx, true_idx, 10)
        assert r10 >= 0.99, (r10, stats)
    _check_lists(X, idx, dist, metric)


@pytest.mark.parametrize("update", ["basic", "selective"])
@pytest.mark.parametrize("locks", ["segmented", "global"])
def test_update_and_locks(rng, update, locks):
    X = _clustered(rng, 3000, 32)
    idx, dist, stats = _run(X, 64, update=update, locks=locks, sample=12)
    true_idx, _ = _exact(X, 64, "l2")
    r = _recall(idx, true_idx, 64)
    assert r >= (0.93 if update == "basic" else 0.87), (r, stats)
    r10 = _recall(idx, true_idx, 10)
    assert r10 >= 0.99, (r10, stats)
    _check_lists(X, idx, dist, "l2")
    assert stats["iterations"] == len(stats["updates"]) == len(stats["time_s"])
    assert stats["updates"][0] > 0


def test_float16_input(rng):
    X = _clustered(rng, 3000, 64)
    cp = _cp()
    from knnkit.graph.nndescent._gpu import nndescent_gpu

    # 20-long internal lists, recall of the first 10 (10-long lists alone sit at ~0.95 on this data,
    # for float32 input as well: the test is about the float16 path, not the list length)
    idx, dist, _ = nndescent_gpu(cp.asarray(X.astype(np.float16)), 20, sample=8, max_iters=30, delta=0.0005,
                                 metric="l2")
    true_idx, _ = _exact(X.astype(np.float16).astype(np.float32), 10, "l2")
    assert _recall(cp.asnumpy(idx)[:, :10], true_idx, 10) >= 0.97


def test_split_merge(rng):
    """GGM (section 5): two exact half graphs, half of each list replaced by random ids of the
    other half; refining only cross pairs recovers the graph of the union."""
    n, K, s = 3000, 20, 1400
    X = _clustered(rng, n, 32)
    ia, _ = _exact(X[:s], K, "l2")
    ib, _ = _exact(X[s:], K, "l2")
    init = np.empty((n, K), np.int64)
    init[:s, :K // 2] = ia[:, :K // 2]
    init[s:, :K // 2] = ib[:, :K // 2] + s
    init[:s, K // 2:] = rng.integers(s, n, (s, K - K // 2))
    init[s:, K // 2:] = rng.integers(0, s, (n - s, K - K // 2))
    cp = _cp()
    idx, dist, stats = _run(X, K, init_indices=cp.asarray(init.astype(np.int32)), split=s, sample=10)
    true_idx, _ = _exact(X, K, "l2")
    r = _recall(idx, true_idx, 10)
    assert r >= 0.97, (r, stats)
    _check_lists(X, idx, dist, "l2")


def test_exact_init_is_kept(rng):
    X = _clustered(rng, 1500, 16)
    true_idx, true_d = _exact(X, 16, "l2")
    cp = _cp()
    # fp32 join: with fp16 products a near-tie outside the exact list may look nearer than its last
    # entry and replace it (the effect the tensor-core tests bound)
    idx, dist, stats = _run(X, 16, init_indices=cp.asarray(true_idx.astype(np.int32)),
                            init_distances=cp.asarray(true_d.astype(np.float32)), distance="fp32")
    assert _recall(idx, true_idx, 16) == 1.0
    assert stats["updates"][0] == 0


def test_tiny_and_padding(rng):
    X = rng.random((12, 3), dtype=np.float32)
    idx, dist, _ = _run(X, 11, sample=4)
    true_idx, _ = _exact(X, 11, "l2")
    assert _recall(idx, true_idx, 11) == 1.0  # every other point is a neighbour
    idx, dist, _ = _run(X, 15, sample=4)  # K > n - 1: padded
    assert (idx[:, 11:] == -1).all() and np.isinf(dist[:, 11:]).all()
    _check_lists(X, idx[:, :11], dist[:, :11], "l2")


def test_duplicates_in_data(rng):
    X = np.repeat(rng.random((300, 8), dtype=np.float32), 4, axis=0)
    idx, dist, _ = _run(X, 10)
    _check_lists(X, idx, dist, "l2")
    assert (dist[:, :3] == 0).mean() > 0.95  # the three copies are found


def test_close_to_cpu(rng):
    cpu = pytest.importorskip("knnkit.graph.nndescent._cpu")
    X = _clustered(rng, 3000, 32)
    true_idx, _ = _exact(X, 10, "l2")
    idx, _, _ = _run(X, 16, sample=8)
    ci, _, _ = cpu.nndescent_cpu(X, 16, sample=8, max_iters=30, delta=0.0005, metric="l2")
    rg, rc = _recall(idx, true_idx, 10), _recall(np.asarray(ci), true_idx, 10)
    assert rg >= rc - 0.02, (rg, rc)


# --- lists longer than 128 (8 entries per lane in the one-warp-per-list kernels) -----------------

@pytest.mark.parametrize("K", [129, 200, 256])
def test_long_lists_recall(rng, K):
    """K > 128: segments of <= 32 entries (nseg = 5, 7, 8), n = 3001 (a multiple of nothing).
    recall@64 must be near 1 (the point of long lists: recall@k for k = 64); recall over the whole
    list is limited by the selective update (the tail is refined least) and the residue-class
    segments (each keeps the nearest K/nseg of its class)."""
    X = _clustered(rng, 3001, 24)
    idx, dist, stats = _run(X, K, sample=32, delta=0.0002)
    assert idx.shape == (3001, K)
    true_idx, _ = _exact(X, K, "l2")
    r64 = _recall(idx, true_idx, 64)
    rK = _recall(idx, true_idx, K)
    assert r64 >= 0.99, (r64, rK, stats["iterations"])
    assert rK >= 0.75, (r64, rK, stats["iterations"])  # measured 0.79 for K = 256
    _check_lists(X, idx, dist, "l2")


@pytest.mark.parametrize("update,locks", [("basic", "segmented"), ("selective", "global"), ("basic", "global")])
def test_long_lists_update_and_locks(rng, update, locks):
    """The whole-warp insertion with 8 entries per lane (one lock per 200-entry list, or the basic
    update) against exact neighbours; p = 16 exercises the 128-thread join with K > 128."""
    X = _clustered(rng, 2501, 16)
    idx, dist, stats = _run(X, 200, update=update, locks=locks, sample=16, delta=0.0002)
    true_idx, _ = _exact(X, 200, "l2")
    r64, rK = _recall(idx, true_idx, 64), _recall(idx, true_idx, 200)
    assert r64 >= 0.99, (r64, rK, stats["iterations"])
    # whole-list recall: basic update refines the tail (>= 0.85 measured), selective not (0.795)
    assert rK >= (0.85 if update == "basic" else 0.75), (r64, rK, stats["iterations"])
    _check_lists(X, idx, dist, "l2")


@pytest.mark.parametrize("metric", ["ip", "l1"])
def test_long_lists_metrics(rng, metric):
    X = _clustered(rng, 2000, 12)
    if metric == "ip":
        X /= np.linalg.norm(X, axis=1, keepdims=True)
    idx, dist, stats = _run(X, 160, metric=metric, sample=32, delta=0.0002)
    true_idx, _ = _exact(X, 160, metric)
    r32 = _recall(idx, true_idx, 32)
    assert r32 >= 0.99, (r32, stats["iterations"])
    _check_lists(X, idx, dist, metric)


def test_long_lists_exact_init_and_padding(rng):
    """An exact 256-list given as the initial graph is kept unchanged (no update can improve
    it, whole-warp insertion with 8 entries per lane); K = 256 > n - 1 = 149 pads with -1 / inf and every other point is in each list."""
    X = _clustered(rng, 1500, 16)
    true_idx, true_d = _exact(X, 256, "l2")
    cp = _cp()
    # one lock per list: with residue-class segments the given list would be re-bucketed
    idx, dist, stats = _run(X, 256, sample=32, locks="global", init_indices=cp.asarray(true_idx.astype(np.int32)),
                            init_distances=cp.asarray(true_d.astype(np.float32)), distance="fp32")
    assert _recall(idx, true_idx, 256) == 1.0
    assert stats["updates"][0] == 0
    Y = X[:150]
    idx, dist, _ = _run(Y, 256, sample=32)
    assert (idx[:, 149:] == -1).all() and np.isinf(dist[:, 149:]).all()
    true_idx, _ = _exact(Y, 149, "l2")
    assert _recall(idx, true_idx, 149) == 1.0
    _check_lists(Y, idx[:, :149], dist[:, :149], "l2")


def test_k_above_limit_rejected(rng):
    from knnkit.graph.nndescent._gpu import nndescent_gpu

    cp = _cp()
    with pytest.raises(ValueError, match="exceeds"):
        nndescent_gpu(cp.asarray(rng.random((400, 4), dtype=np.float32)), 257, sample=16, max_iters=2,
                      delta=0.001, metric="l2")


# --- tensor-core join (fp16 wmma products, fp32 accumulation) -----------------------------------

@pytest.mark.parametrize("metric", ["l2", "ip"])
@pytest.mark.parametrize("K,p,d", [(32, 16, 128), (64, 32, 17), (200, 32, 40)])
def test_tensor_distance(rng, metric, K, p, d):
    """distance="tensor" against exact neighbours and against the fp32 join on the same data: fp16
    rounding of the sample vectors may swap near-ties only, so recall@10 stays >= 0.98 and within
    0.01 of fp32; the returned distances are fp32 (recomputed), hence exact. d = 17 and 40 exercise
    the zero padding of the 16-wide k-steps, p = 32 the 256-thread join, K = 200 8 entries per lane."""
    X = _clustered(rng, 2999, d)
    if metric == "ip":
        X /= np.linalg.norm(X, axis=1, keepdims=True)
    true_idx, _ = _exact(X, 10, metric)
    idx_t, dist_t, st = _run(X, K, sample=p, metric=metric, distance="tensor")
    idx_f, _, _ = _run(X, K, sample=p, metric=metric)
    rt, rf = _recall(idx_t, true_idx, 10), _recall(idx_f, true_idx, 10)
    assert rt >= 0.98 and rt >= rf - 0.01, (rt, rf, st["iterations"])
    _check_lists(X, idx_t, dist_t, metric)


def test_tensor_distance_rejects_l1(rng):
    from knnkit.graph.nndescent._gpu import nndescent_gpu

    cp = _cp()
    with pytest.raises(ValueError, match="l1"):
        nndescent_gpu(cp.asarray(rng.random((300, 8), dtype=np.float32)), 10, sample=8, max_iters=2,
                      delta=0.001, metric="l1", distance="tensor")


@pytest.mark.parametrize("transform", ["offset", "tiny", "huge", "uint8"])
def test_tensor_distance_range(rng, transform):
    """fp16 keeps ~3 significant digits of each value: without centring, an offset of 1000 would
    leave nothing of the differences between neighbours (fp16 spacing at 1000 is 0.5). Rows are
    centred and scaled by a power of two before the rounding, so recall matches exact k-NN for
    data with an offset, tiny or huge values (beyond the fp16 range), and uint8 input (exact)."""
    X = _clustered(rng, 2500, 32)
    if transform == "offset":
        X = X + np.float32(1000)
    elif transform == "tiny":
        X = X * np.float32(1e-6)
    elif transform == "huge":
        X = X * np.float32(1e6)
    else:
        X = np.clip((X - X.min()) / (X.max() - X.min()) * 255, 0, 255).astype(np.uint8)
    _, true_d = _exact(X.astype(np.float32), 10, "l2")
    idx, dist, st = _run(X, 32, sample=16, distance="tensor")
    # tie-aware recall (uint8 data has many equal distances): a found neighbour counts when its
    # exact distance is within the exact 10th
    Xf = X.astype(np.float64)
    found_d = ((Xf[:, None, :] - Xf[idx[:, :10]]) ** 2).sum(-1)
    r = float((found_d <= true_d[:, 9:10] * (1 + 1e-9)).mean())
    assert r >= 0.98, (r, st["iterations"])
    if transform != "uint8":
        _check_lists(X, idx, dist, "l2")


def _skewed_ip(rng, n=20000, d=32):
    """Clustered rows with norms spread over 1x-4x: under the raw inner product a few large-norm
    rows are everybody's neighbours (in-degree far above 2p), the case of the reverse sampling."""
    X = _clustered(rng, n, d)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    return (X * rng.uniform(1.0, 4.0, size=(n, 1))).astype(np.float32)


@pytest.mark.parametrize("update", ["basic", "selective"])
def test_reverse_sampling_inner_product(rng, update):
    """Both reverse-sampling rules give valid lists; a uniform sample of the reverse neighbours
    (the default) is at least as good as first-come on hub-heavy inner-product data."""
    X = _skewed_ip(rng)
    rows = rng.choice(len(X), 500, replace=False)
    order = np.argsort(-(X[rows].astype(np.float64) @ X.T.astype(np.float64)), axis=1)
    truth = np.array([[v for v in t[:12] if v != r][:10] for t, r in zip(order, rows)])
    out = {}
    for rev in ("random", "atomic"):
        idx, dist, stats = _run(X, 32, metric="ip", update=update, reverse=rev, sample=16, delta=0.001)
        _check_lists(X, idx, dist, "ip")
        out[rev] = (_recall(idx[rows], truth, 10), stats["iterations"])
    print("recall@10, iterations", update, out)
    assert out["random"][0] >= 0.5, out
    # on 20k points the two rules are close either way (H200, selective: 0.894 vs 0.902 and
    # 0.895 vs 0.909 in two runs; basic 0.997 vs 0.999); the gain shows at 1M (NOTES_gnnd.md v5)
    assert out["random"][0] >= out["atomic"][0] - 0.03, out


def test_reverse_rejects_unknown(rng):
    with pytest.raises(ValueError, match="reverse"):
        _run(_clustered(rng, 500, 8), 10, reverse="first")


def test_sort_rows_matches_cupy_merge(rng):
    """The warp-per-row sort of the GGM far-half merge (gnnd_prepare over row tiles) gives the
    lists of the CuPy sort path: repeats and holes dropped, (distance, id) order, first k."""
    from knnkit.graph.nndescent._gpu import sort_rows_gpu
    from knnkit.graph._merge import merge_candidates_gpu

    cp = _cp()
    X = _clustered(rng, 3000, 16)
    n = len(X)
    ids = rng.integers(0, n, size=(n, 40)).astype(np.int32)
    ids[rng.random(ids.shape) < 0.1] = -1
    ids[ids == np.arange(n)[:, None]] = -1
    ids[:, 20:30] = ids[:, :10]  # repeats across the two parts
    d = ((X[:, None, :].astype(np.float64) - X[np.maximum(ids, 0)]) ** 2).sum(-1).astype(np.float32)
    d[ids < 0] = np.inf
    a = (cp.asarray(ids[:, :25]), cp.asarray(ids[:, 25:]))
    b = (cp.asarray(d[:, :25]), cp.asarray(d[:, 25:]))
    i1, d1 = (cp.asnumpy(v) for v in sort_rows_gpu(cp.asarray(X), a, b, 10, "l2", tile=700))
    i2, d2 = (cp.asnumpy(v) for v in merge_candidates_gpu(cp, a, b, 10))
    # the kernel refills dropped slots with random points (true distances), so its lists are the
    # top-10 of a superset: never worse, and every candidate nearer than its 10th is in them
    _check_lists(X, i1, d1, "l2")
    assert (d1[:, -1] <= d2[:, -1] * (1 + 1e-6)).all()
    nearer = d2 < d1[:, -1:]
    present = (i2[:, :, None] == i1[:, None, :]).any(axis=2)
    assert present[nearer].all()
    # 30 points, 40 candidate columns: too few points to refill a row (n - 1 <= W), not applied
    assert sort_rows_gpu(cp.asarray(X[:30]), (a[0][:30], a[1][:30]), (b[0][:30], b[1][:30]), 10, "l2") is None
