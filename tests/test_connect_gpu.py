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
