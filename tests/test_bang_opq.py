"""OPQ for host placement (issue 16, "optional OPQ rotation if it pays"): the rotation is
orthogonal and lowers the quantisation error on correlated data; compression=None picks it only
where it was measured to pay (8+ dimensions per subspace); a host index with OPQ searches, saves
and loads; the GPU walk (rotated query tables) matches the CPU one."""

import numpy as np
import pytest

import knnkit
from knnkit.index.bang import _pq


def _correlated(n, d, seed):
    """Gaussian data whose variance is concentrated in a few mixed directions (what OPQ is for)."""
    rng = np.random.default_rng(seed)
    scales = np.geomspace(10.0, 0.1, d).astype(np.float32)
    mix, _ = np.linalg.qr(rng.standard_normal((d, d)))
    return ((rng.standard_normal((n, d)).astype(np.float32) * scales) @ mix.astype(np.float32)).astype(np.float32)


def _recall(X, Q, idx, k):
    D = ((Q[:, None, :].astype(np.float64) - X[None].astype(np.float64)) ** 2).sum(-1)
    kth = np.sort(D, axis=1)[:, k - 1]
    return float((np.take_along_axis(D, np.asarray(idx), 1) <= kth[:, None] * (1 + 1e-6)).mean())


def test_opq_rotation_is_orthogonal_and_lowers_the_error():
    X = _correlated(4000, 32, 0)
    m = 4  # 8 dimensions per subspace
    R, C = _pq.train_opq(X, m, random_state=0)
    assert R.shape == (32, 32) and C.shape == (4, 256, 8)
    np.testing.assert_allclose(R @ R.T, np.eye(32), atol=1e-4)
    err_opq = float(((X @ R - _pq.reconstruct(_pq.encode(X, C, rotation=R), C, 32)) ** 2).sum(1).mean())
    Cp = _pq.train_pq(X, m, random_state=0)
    err_pq = float(((X - _pq.reconstruct(_pq.encode(X, Cp), Cp, 32)) ** 2).sum(1).mean())
    assert err_opq < 0.9 * err_pq, (err_opq, err_pq)


def test_opq_tables_are_the_rotated_distances():
    X = _correlated(2000, 24, 1)
    Q = _correlated(7, 24, 2)
    R, C = _pq.train_opq(X, 3, random_state=1)
    codes = _pq.encode(X, C, rotation=R)
    T = _pq.pq_tables(Q, C, "l2", rotation=R, bits=32)  # float32 entries (the walk's are bfloat16-rounded)
    adc = T[:, np.arange(3)[None, :], codes.astype(np.int64)].sum(-1)  # (7, 2000)
    rec = _pq.reconstruct(codes, C, 24)
    want = (((Q @ R)[:, None, :] - rec[None]) ** 2).sum(-1)
    np.testing.assert_allclose(adc, want, rtol=1e-3, atol=1e-2)


@pytest.mark.parametrize("compression, pq_bytes, want", [(None, 4, "opq"), (None, 16, "pq"), ("pq", 4, "pq"),
                                                         ("opq", 16, "opq")])
def test_compression_choice(compression, pq_bytes, want):
    assert _pq.use_opq(compression, 32, pq_bytes) == (want == "opq")


def test_host_index_with_opq_searches_saves_and_loads(tmp_path):
    X = _correlated(6000, 32, 3)
    Q = _correlated(50, 32, 4)
    index = knnkit.GraphIndex.build(X, device="cpu", placement="host", pq_bytes=4, random_state=0)
    assert index.build_params["compression"] == "opq" and "opq" in repr(index)
    d, i = index.search(Q, k=10, beam=64)
    assert _recall(X, Q, i, 10) >= 0.95
    plain = knnkit.GraphIndex.build(X, device="cpu", placement="host", pq_bytes=4, compression="pq", random_state=0)
    assert plain.build_params["compression"] == "pq"
    path = tmp_path / "opq.knnkit"
    index.save(path)
    back = knnkit.load(path, device="cpu")
    d2, i2 = back.search(Q, k=10, beam=64)
    np.testing.assert_array_equal(i2, i)
    np.testing.assert_array_equal(d2, d)


def test_compression_validated():
    X = np.random.default_rng(0).random((500, 8), dtype=np.float32)
    with pytest.raises(ValueError, match="compression"):
        knnkit.GraphIndex.build(X, device="cpu", placement="host", compression="sq8")


@pytest.mark.gpu
def test_gpu_opq_walk_matches_cpu():
    X = _correlated(8000, 64, 5)
    Q = _correlated(100, 64, 6)
    index = knnkit.GraphIndex.build(X, device="gpu", placement="host", pq_bytes=8, random_state=0)
    assert index.build_params["compression"] == "opq"
    _d, i = index.search(Q, k=10, beam=64)
    _dc, ic = index.search(Q, k=10, beam=64, device="cpu")
    assert (np.asarray(i) == ic).mean() >= 0.98
    assert _recall(X, Q, np.asarray(i), 10) >= 0.95
