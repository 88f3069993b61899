"""CPU seed selection (``select_seeds_cpu``, ``build_entry_cells``, ``EntryPoints.seeds_for``): the
two-level scan over cells of entry centroids, exact with the cells' radii (the triangle-inequality
bound) and approximate without, and an index whose entries are numerous enough to use it."""

import numpy as np
import pytest

import knnkit
from knnkit.datasets.suite import make_tight_clusters
from knnkit.evaluate import recall
from knnkit.index import _entry
from knnkit.index._entry import EntryPoints, build_entry_cells
from knnkit.index._search_cpu import cell_radii, select_seeds_cpu


def _brute(Q, C, M, s, metric):
    d = -(Q @ C.T) if metric == "ip" else ((Q[:, None, :] - C[None]) ** 2).sum(-1)
    order = np.argsort(d, axis=1, kind="stable")[:, :s]
    return M[order]


@pytest.fixture(scope="module")
def entries():
    """1,200 entry centroids around 300 separated centres, and queries near them."""
    rng = np.random.default_rng(3)
    centres = rng.standard_normal((300, 16)).astype(np.float32) * 4
    C = (centres[rng.integers(0, 300, 1200)] + 0.3 * rng.standard_normal((1200, 16))).astype(np.float32)
    M = rng.permutation(50_000)[:1200].astype(np.int32)
    Q = (C[rng.integers(0, 1200, 400)] + 0.1 * rng.standard_normal((400, 16))).astype(np.float32)
    return C, M, Q


def test_cells_partition_entries(entries):
    C, M, _ = entries
    cells, offs, C2, M2 = build_entry_cells(C, M, random_state=0)
    m = cells.shape[0]
    assert 2 <= m <= int(np.ceil(np.sqrt(len(C))))
    assert offs[0] == 0 and offs[-1] == len(C) and (np.diff(offs) > 0).all()
    # the same (centroid, medoid) pairs, grouped by cell
    assert sorted(M2.tolist()) == sorted(M.tolist())
    pos = {int(v): i for i, v in enumerate(M)}
    np.testing.assert_array_equal(C2, C[[pos[int(v)] for v in M2]])
    # every entry sits in the cell of its nearest centre
    own = np.repeat(np.arange(m), np.diff(offs))
    nearest = ((C2[:, None, :].astype(np.float64) - cells[None]) ** 2).sum(-1).argmin(1)
    assert (nearest == own).mean() >= 0.99


def test_cells_one_cell_below_min(entries):
    C, M, _ = entries
    cells, offs, C2, M2 = build_entry_cells(C[:100], M[:100])
    assert cells.shape[0] == 1 and offs.tolist() == [0, 100]
    np.testing.assert_array_equal(M2, M[:100])


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_all_cells_probed_is_exact(entries, metric):
    C, M, Q = entries
    cells, offs, C2, M2 = build_entry_cells(C, M, random_state=0)
    got = select_seeds_cpu(Q, cells, offs, C2, M2, 5, metric, probes=cells.shape[0])
    np.testing.assert_array_equal(got, _brute(Q, C, M, 5, metric))


def test_two_level_finds_the_nearest_entry(entries):
    C, M, Q = entries
    cells, offs, C2, M2 = build_entry_cells(C, M, random_state=0)
    got = select_seeds_cpu(Q, cells, offs, C2, M2, 4, "l2")
    want = _brute(Q, C, M, 4, "l2")
    assert (got[:, 0] == want[:, 0]).mean() >= 0.99
    assert len(set(got[0].tolist())) == 4  # distinct entries, nearest first
    # fewer entries than seeds: -1 padded
    one = select_seeds_cpu(Q[:2], cells[:1], np.array([0, 3]), C2[:3], M2[:3], 5, "l2")
    assert (one[:, 3:] == -1).all() and (one[:, :3] >= 0).all()


def test_select_seeds_validates():
    C = np.zeros((4, 2), np.float32)
    cells = np.zeros((1, 2), np.float32)
    q = np.zeros((1, 2), np.float32)
    M = np.arange(4, dtype=np.int32)
    with pytest.raises(ValueError):
        select_seeds_cpu(q, cells, np.array([0, 4]), C, M, 0, "l2")
    with pytest.raises(ValueError):
        select_seeds_cpu(q, cells, np.array([0, 3]), C, M, 1, "l2")
    with pytest.raises(ValueError):
        select_seeds_cpu(q, cells, np.array([0, 4]), C, M, 1, "cosine")
    with pytest.raises(ValueError):
        build_entry_cells(C, M[:3])


def test_entry_points_seeds_for_cpu(entries):
    C, M, Q = entries
    ep = EntryPoints(C, M, "l2")
    np.testing.assert_array_equal(ep.seeds_for(Q, 3, exact=True), _brute(Q, C, M, 3, "l2"))
    approx = ep.seeds_for(Q, 3)
    assert approx.shape == (len(Q), 3) and approx.dtype == np.int32
    assert (approx[:, 0] == _brute(Q, C, M, 1, "l2")[:, 0]).mean() >= 0.99
    # the cells follow the centroids: a new centroid array rebuilds them
    ep.centroids = C[:50].copy()
    ep.medoids = M[:50].copy()
    np.testing.assert_array_equal(ep.seeds_for(Q, 2), _brute(Q, C[:50], M[:50], 2, "l2"))


def test_index_with_many_entries_keeps_recall():
    """300 tight clusters: more than _CPU_CELLS_MIN entries, so the seeds are chosen through the
    cells; the default search reaches 0.95, and the approximate scan (past the exact scan's size)
    keeps the exact scan's recall at the default beam and at beam k."""
    X, Q = make_tight_clusters(9000, 32, 300, n_queries=300, random_state=1)
    _, T = knnkit.knn(X, Q, k=10, device="cpu")
    index = knnkit.GraphIndex.build(X, device="cpu", random_state=0)
    entry = index._engine._entry
    assert len(entry) >= _entry._CPU_CELLS_MIN and entry._cpu_cells()[0].shape[0] > 1
    got = {b: recall(index.search(Q, k=10, beam=b)[1], T) for b in (None, 10)}
    old = _entry._CPU_EXACT_SEEDS_MAX
    try:
        _entry._CPU_EXACT_SEEDS_MAX = 0  # the approximate scan
        approx = {b: recall(index.search(Q, k=10, beam=b)[1], T) for b in (None, 10)}
    finally:
        _entry._CPU_EXACT_SEEDS_MAX = old
    assert got[None] >= 0.95
    for b in got:
        assert approx[b] >= got[b] - 0.002


@pytest.mark.parametrize("metric", ["l2", "ip"])
@pytest.mark.parametrize("shape", [(16, 1200, 0.3, 0.1), (64, 3000, 1.0, 3.0), (32, 600, 0.5, 5.0), (2, 900, 0.05, 0.5)])
def test_bounded_scan_is_exact(metric, shape):
    """With the cells' radii the two-level scan returns the exact s nearest entries (by key; ties
    may swap ids), also for queries far from every entry and in high dimension, where the bounds
    prune little."""
    d, c, spread, qfar = shape
    rng = np.random.default_rng(d + c)
    centres = rng.standard_normal((c // 4, d)).astype(np.float32) * 4
    C = (centres[rng.integers(0, c // 4, c)] + spread * rng.standard_normal((c, d))).astype(np.float32)
    M = rng.permutation(10 * c)[:c].astype(np.int32)
    Q = (C[rng.integers(0, c, 500)] + qfar * rng.standard_normal((500, d))).astype(np.float32)
    cells, offs, C2, M2 = build_entry_cells(C, M, random_state=0)
    assert cells.shape[0] > 1
    got = select_seeds_cpu(Q, cells, offs, C2, M2, 6, metric, radii=cell_radii(cells, offs, C2))
    pos = {int(v): i for i, v in enumerate(M)}
    Q64, C64 = Q.astype(np.float64), C.astype(np.float64)

    def keys(ids):
        rows = C64[np.vectorize(pos.get)(ids)]
        return -(Q64[:, None, :] * rows).sum(-1) if metric == "ip" else ((Q64[:, None, :] - rows) ** 2).sum(-1)

    want = keys(_brute(Q, C, M, 6, metric))
    np.testing.assert_allclose(keys(got), want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


def test_cell_radii_cover_their_entries(entries):
    C, M, _ = entries
    cells, offs, C2, _ = build_entry_cells(C, M, random_state=0)
    r = cell_radii(cells, offs, C2)
    own = np.repeat(np.arange(cells.shape[0]), np.diff(offs))
    dist = np.sqrt(((C2.astype(np.float64) - cells[own]) ** 2).sum(1))
    assert (dist <= r[own]).all() and (r >= 0).all()
    with pytest.raises(ValueError, match="radii"):
        select_seeds_cpu(C[:2], cells, offs, C2, M, 2, "l2", radii=r[:-1])


def test_small_entry_sets_get_exact_seeds():
    """Up to _CPU_EXACT_SEEDS_MAX entry points EntryPoints.seeds_for is exact through
    the cells (the GPU's seeds); Zipf-sized clusters, where the approximate scan missed entries."""
    rng = np.random.default_rng(5)
    w = 1.0 / np.arange(1, 601) ** 1.2
    lab = rng.choice(600, 3000, p=w / w.sum())
    C = (rng.standard_normal((600, 32)) * 5)[lab] + rng.lognormal(-2, 1, 600)[lab, None] * rng.standard_normal((3000, 32))
    C = np.ascontiguousarray(C[:700], np.float32)
    M = np.arange(700, dtype=np.int32)
    Q = (C[rng.integers(0, 700, 400)] + rng.standard_normal((400, 32))).astype(np.float32)
    ep = EntryPoints(C, M, "l2")
    assert C.shape[0] <= _entry._CPU_EXACT_SEEDS_MAX and ep._cpu_cells()[0].shape[0] > 1
    got = ep.seeds_for(Q, 4)
    Q64 = Q.astype(np.float64)
    dist = lambda ids: ((Q64[:, None, :] - C[ids].astype(np.float64)) ** 2).sum(-1)  # noqa: E731
    np.testing.assert_allclose(dist(got), dist(_brute(Q, C, M, 4, "l2")), rtol=1e-4)


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_entries_far_from_the_origin(device):
    """Tight clusters shifted by 1e3: the k-means of the entries, the cells and the seed ranking
    were |c|^2 - 2 q.c expansions that cancelled in float32 (index recall at beam 16 0.965 on
    20k x 32 points in 800 clusters); centred, each query's seed is its nearest centroid, and the
    centroids match those of the unshifted data."""
    rng = np.random.default_rng(4)
    centres = rng.standard_normal((400, 16))
    X = centres[rng.integers(0, 400, 8000)] + 0.01 * rng.standard_normal((8000, 16))
    Q = centres[rng.integers(0, 400, 300)] + 0.01 * rng.standard_normal((300, 16))
    xp = np
    if device == "gpu":
        import cupy as xp
    ep = _entry.build_entry_points(xp.asarray((X + 1e3).astype(np.float32)), 400, "l2", random_state=0)
    base = _entry.build_entry_points(xp.asarray(X.astype(np.float32)), 400, "l2", random_state=0)
    C = np.asarray(ep.centroids.get() if device == "gpu" else ep.centroids, np.float64) - 1e3
    Cb = np.asarray(base.centroids.get() if device == "gpu" else base.centroids, np.float64)
    assert C.shape == Cb.shape and np.abs(C - Cb).max() < 0.05  # the same clustering, up to rounding
    M = np.asarray(ep.medoids.get() if device == "gpu" else ep.medoids)
    seeds = ep.seeds_for(xp.asarray((Q + 1e3).astype(np.float32)), 1, exact=True)
    seeds = np.asarray(seeds.get() if device == "gpu" else seeds)[:, 0]
    d = (((Q + 1e3)[:, None, :] - (C + 1e3)[None]) ** 2).sum(-1)
    which = np.array([int(np.flatnonzero(M == s)[0]) for s in seeds])
    chosen = d[np.arange(300), which]
    assert np.all(chosen <= d.min(axis=1) + 1e-2)
