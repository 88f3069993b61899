"""GPU connectivity repair (index/_connect.py with cupy arrays) against the CPU results."""

import numpy as np
import pytest

import knnkit
from knnkit.datasets.suite import make_tight_clusters
from knnkit.index._connect import components, entry_points_per_component, reachable_from, repair_connectivity

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def data():
    X = make_tight_clusters(20_000, 32, 500, 0.01, random_state=5)
    _, idx = knnkit.knn(X, k=10, device="cpu")
    return X, idx.astype(np.int32)


def test_components_and_reach_match_cpu(data, rng):
    import cupy as cp

    X, g = data
    lab_c, c_c = components(g)
    lab_g, c_g = components(cp.asarray(g))
    assert c_g == c_c == 500 and isinstance(lab_g, cp.ndarray)
    assert np.array_equal(lab_g.get(), lab_c)
    src = rng.choice(len(g), 20, replace=False)
    assert np.array_equal(reachable_from(cp.asarray(g), src).get(), reachable_from(g, src))


@pytest.mark.parametrize("host_copy", [True, False])
def test_repair_gpu(data, host_copy, monkeypatch):
    import cupy as cp

    import knnkit.index._connect as conn

    if not host_copy:  # the path of data larger than the host-copy limit: everything on the GPU
        monkeypatch.setattr(conn, "_HOST_COPY_MAX_BYTES", 0)
    X, g = data
    _, st_c = repair_connectivity(X, g, metric="l2", entry_ids=[0])
    g2, st_g = repair_connectivity(cp.asarray(X), cp.asarray(g), metric="l2", entry_ids=[0])
    assert isinstance(g2, cp.ndarray)
    h = g2.get()
    assert st_g["components_before"] == st_c["components_before"] == 500
    assert st_g["components_after"] == 1 and st_g["unreachable_after"] == 0
    assert components(h)[1] == 1 and reachable_from(h, [0]).all()   # checked again on the CPU
    med_g, cen_g = entry_points_per_component(components(cp.asarray(g))[0], cp.asarray(X))
    med_c, cen_c = entry_points_per_component(components(g)[0], X)
    # the same medoid per component, but for points at equal distance from the centroid (float32
    # reductions in another order may pick the other one)
    assert med_g.shape == med_c.shape and (med_g.get() == med_c).mean() >= 0.98
    np.testing.assert_allclose(cen_g.get(), cen_c, rtol=1e-4, atol=1e-5)


def test_argmin_per_label_gpu_equals_host(rng):
    import cupy as cp

    from knnkit.index._connect import _argmin_per_label

    labels = rng.integers(0, 300, 50_000)
    d = rng.integers(0, 40, 50_000).astype(np.float32)  # many ties: the smaller index wins
    ref = _argmin_per_label(np, labels, d)
    got = _argmin_per_label(cp, cp.asarray(labels), cp.asarray(d)).get()
    assert np.array_equal(got, ref)


# ---------------------------------------------------------------------------------- connect.cu kernels
def _kernel_graphs(rng):
    """(name, graph): random with holes, many components, chains (long BFS), self loops, sizes that
    are no multiple of a block, rows wider than a warp, one bigger graph for the races."""
    out = []
    n = 50_001
    g = rng.integers(0, n, (n, 16)).astype(np.int32)
    g[rng.random(g.shape) < 0.3] = -1
    out.append(("random_holes", g))
    n = 30_007
    g = rng.integers(0, n, (n, 2)).astype(np.int32)
    g[rng.random(g.shape) < 0.75] = -1
    out.append(("many_components", g))
    n = 5_003
    g = np.full((n, 3), -1, np.int32)
    perm = rng.permutation(n)
    g[perm[:-1], 1] = perm[1:]
    out.append(("chain", g))
    n = 4_099
    g = np.full((n, 1), -1, np.int32)
    g[1:, 0] = np.arange(n - 1)
    out.append(("descending_chain", g))
    n = 1_025
    g = np.tile(np.arange(n, dtype=np.int32)[:, None], (1, 4))
    g[::4, 2] = (np.arange(0, n, 4) * 7 + 3) % n
    g[3, 1] = n + 100
    out.append(("self_loops", g))
    n = 3_001
    g = rng.integers(0, n, (n, 70)).astype(np.int32)
    g[rng.random(g.shape) < 0.985] = -1
    out.append(("wide_rows", g))
    n = 400_000
    g = rng.integers(0, n, (n, 32)).astype(np.int32)  # one component: every hook races to the root
    out.append(("random_400k", g))
    out.append(("no_edges", np.full((77, 5), -1, np.int32)))
    return out


def test_kernel_components_equal_union_find(rng):
    import cupy as cp

    from knnkit.index._connect import _union_find_roots
    from knnkit.index._connect_gpu import component_roots

    for name, g in _kernel_graphs(rng):
        for rep in range(2):  # the hooking order differs between runs
            roots = component_roots(cp.asarray(g)).get()
            assert np.array_equal(roots, _union_find_roots(g)), (name, rep)
        lab_g, c_g = components(cp.asarray(g))
        lab_c, c_c = components(g)
        assert c_g == c_c and np.array_equal(lab_g.get(), lab_c), name
    g = _kernel_graphs(rng)[0][1]
    assert np.array_equal(components(cp.asarray(g.astype(np.int64)))[0].get(), components(g)[0])


def test_kernel_reach_equals_host_bfs(rng):
    import cupy as cp

    from knnkit.index._connect_gpu import reach_count

    for name, g in _kernel_graphs(rng):
        n = g.shape[0]
        src = rng.choice(n, min(n, 5), replace=False)
        want = reachable_from(g, src)
        got = reachable_from(cp.asarray(g), np.concatenate([src, src]))
        assert np.array_equal(got.get(), want), name
        assert reach_count(cp.asarray(g), src) == int(want.sum()), name
    chain = dict(_kernel_graphs(rng))["chain"]
    head = np.flatnonzero(~np.isin(np.arange(chain.shape[0]), chain[:, 1]))
    assert reach_count(cp.asarray(chain), head) == chain.shape[0]
    assert reach_count(cp.asarray(chain), head, max_levels=100) is None


def test_kernel_edge_lengths_sequential_float32(rng):
    import cupy as cp

    from knnkit.index._connect_gpu import drop_long_edges, edge_sqdist

    for n, d, R in [(3_001, 128, 64), (1_000, 37, 5), (500, 960, 40)]:
        X = rng.standard_normal((n, d)).astype(np.float32)
        X[1] = X[0]
        g = rng.integers(0, n, (n, R)).astype(np.int32)
        g[rng.random(g.shape) < 0.1] = -1
        g[0, 0], g[1, 0] = 1, 0
        dist = edge_sqdist(cp.asarray(X), cp.asarray(g)).get()
        valid = g >= 0
        ref = np.zeros((n, R), np.float32)
        for k in range(d):
            t = X[np.where(valid, g, 0), k] - X[:, None, k]
            ref = ref + t * t
        assert np.isnan(dist[~valid]).all()
        assert np.array_equal(dist[valid], ref[valid]), (n, d, R)   # bit for bit
        near = np.where(dist > 0, dist, np.inf).min(axis=1)
        near = np.where(np.isfinite(near), near, 0).astype(np.float32)
        gi = np.where(valid, g, 0)
        for factor in (64.0, 1.1):
            short, n_long = drop_long_edges(cp.asarray(g), cp.asarray(dist), cp.asarray(near), factor)
            long_ = (dist > np.float32(factor) * np.maximum(near[:, None], near[gi])) & (near[:, None] > 0) \
                & (near[gi] > 0)
            assert n_long == int(long_.sum()) and np.array_equal(short.get(), np.where(long_, -1, g))


def test_kernel_short_edge_components_match_host_and_old_path(rng, monkeypatch):
    import cupy as cp

    import knnkit.index._connect as conn

    X = make_tight_clusters(20_000, 16, 400, 0.01, random_state=int(rng.integers(1 << 30)))
    _, idx = knnkit.knn(X, k=12, device="cpu")
    g = idx.astype(np.int32)
    g[rng.choice(len(g), 1500, replace=False), -1] = rng.integers(0, len(g), 1500)
    own = components(g)
    lab_h, c_h = conn.short_edge_components(X, g, components_of=own)
    lab_k, c_k = conn.short_edge_components(cp.asarray(X), cp.asarray(g), components_of=own)
    monkeypatch.setattr(conn, "GPU_KERNELS", False)
    lab_o, c_o = conn.short_edge_components(cp.asarray(X), cp.asarray(g), components_of=own)
    assert c_k == c_h == c_o > own[1]
    assert np.array_equal(cp.asnumpy(lab_k), lab_h) and np.array_equal(np.asarray(lab_o), lab_h)


@pytest.mark.parametrize("copy", [True, False])
def test_repair_gpu_fast_path_equals_old_path(copy, monkeypatch):
    """A connected, reachable graph: the kernel path returns the graph untouched without a host copy,
    with the stats of the old (host) path."""
    import cupy as cp

    import knnkit.index._connect as conn

    X = np.random.default_rng(0).standard_normal((30_000, 16)).astype(np.float32)
    _, idx = knnkit.knn(X, k=8, device="cpu")
    g = np.concatenate([idx.astype(np.int32), np.roll(idx.astype(np.int32), 1, axis=0)], axis=1)
    g[:, -1] = np.roll(np.arange(30_000, dtype=np.int32), -1)  # a cycle through every node
    _, st_old = conn.repair_connectivity(X, g, metric="l2", entry_ids=[0])
    assert st_old["components_before"] == 1 and st_old["unreachable_before"] == 0
    gets = []
    to_host = conn._to_host
    monkeypatch.setattr(conn, "_to_host", lambda a: gets.append(a.shape) or to_host(a))
    gd = cp.asarray(g)
    g2, st = conn.repair_connectivity(cp.asarray(X), gd, metric="l2", entry_ids=[0], copy=copy)
    assert g.shape not in gets and (g2 is gd) != copy and np.array_equal(g2.get(), g)
    assert {k: v for k, v in st.items() if "seconds" not in k} == \
        {k: v for k, v in st_old.items() if "seconds" not in k}


def test_repair_gpu_kernel_path_equals_old_path_when_repairing(data, monkeypatch):
    """Several components: the kernel path hands the host repair the kernels' labels; the repaired
    graph and the stats equal the old path's."""
    import cupy as cp

    import knnkit.index._connect as conn

    X, g = data
    g_new, st_new = conn.repair_connectivity(cp.asarray(X), cp.asarray(g), metric="l2", entry_ids=[0])
    monkeypatch.setattr(conn, "GPU_KERNELS", False)
    g_old, st_old = conn.repair_connectivity(cp.asarray(X), cp.asarray(g), metric="l2", entry_ids=[0])
    assert np.array_equal(g_new.get(), g_old.get())
    assert {k: v for k, v in st_new.items() if "seconds" not in k} == \
        {k: v for k, v in st_old.items() if "seconds" not in k}


@pytest.mark.parametrize("copy", [True, False])
def test_few_unreachable_repaired_on_the_device(rng, copy):
    """One component with a few unreachable nodes: repaired on the device (no host copy of the
    graph), the same links as the same rule run on numpy with the host BFS, everything reachable."""
    import cupy as cp

    from knnkit.index._connect import _repair_few_on_device

    X = rng.random((5000, 24), dtype=np.float32)
    _d, i = knnkit.knn(X, k=8, device="cpu")
    g = np.asarray(i, np.int32)
    entry = np.array([0, 1, 2], np.int64)
    m0 = int((~reachable_from(g, entry)).sum())
    assert 0 < m0 <= 4096 and components(g)[1] == 1
    ref = g.copy()
    _repair_few_on_device(ref, entry, mask_fn=reachable_from)
    gd = cp.asarray(g)
    g2, st = repair_connectivity(cp.asarray(X), gd, metric="l2", entry_ids=entry, copy=copy)
    assert st.get("reach_placement") == "device" and st["unreachable_before"] == m0
    assert st["unreachable_after"] == 0 and (g2 is gd) == (not copy)
    assert np.array_equal(g2.get(), ref)
    assert reachable_from(g2.get(), entry).all()
