"""End-to-end public API on the GPU, compared with the CPU path (skipped without a GPU)."""

import numpy as np
import pytest

import knnkit
from knnkit import evaluate

pytestmark = pytest.mark.gpu


def _clustered(n, d, seed, nq=0):
    return knnkit.datasets.make_clustered(n, d, n_queries=nq, random_state=seed, device="cpu")


def _exact_graph(x, k):
    _, i = knnkit.knn(x, None, k=k, device="cpu")
    return i


@pytest.mark.parametrize("metric", ["sqeuclidean", "cosine", "inner_product"])
def test_knn_graph_gpu_recall(metric, rng):
    x = _clustered(20_000, 32, seed=int(rng.integers(1 << 30)))
    g = knnkit.knn_graph(x, k=10, method="nndescent", device="gpu", metric=metric, random_state=1)
    d, i = knnkit.knn(x, None, k=10, metric=metric, device="cpu")
    assert g.indices.shape == (20_000, 10)
    assert evaluate.recall(np.asarray(g.indices), i, 10) >= 0.97
    # rows sorted in the user's metric
    dist = np.asarray(g.distances)
    if metric == "inner_product":
        assert (np.diff(dist, axis=1) <= 1e-5).all()
    else:
        assert (np.diff(dist, axis=1) >= -1e-5).all()


def test_knn_graph_gpu_cupy_in_cupy_out_and_merge(rng):
    import cupy as cp

    x = _clustered(12_000, 24, seed=int(rng.integers(1 << 30)))
    a, b = x[:7_000], x[7_000:]
    ga = knnkit.knn_graph(cp.asarray(a), k=10, method="nndescent", device="gpu", random_state=0)
    assert isinstance(ga.indices, cp.ndarray) or isinstance(np.asarray(ga.indices), np.ndarray)
    gb = knnkit.knn_graph(b, k=10, method="nndescent", device="gpu", random_state=0)
    gm = knnkit.merge_graphs(a, ga, b, gb, device="gpu", random_state=0)
    truth = _exact_graph(x, 10)
    idx = gm.indices.get() if hasattr(gm.indices, "get") else np.asarray(gm.indices)
    assert evaluate.recall(idx, truth, 10) >= 0.95


def test_graph_index_gpu_build_search_save_load_cpu(tmp_path, rng):
    x, q = _clustered(30_000, 48, seed=int(rng.integers(1 << 30)), nq=500)
    index = knnkit.GraphIndex.build(x, device="gpu", random_state=0)
    _, ti = knnkit.knn(x, q, k=10, device="cpu")
    d_gpu, i_gpu = index.search(q, k=10)
    r_gpu = evaluate.recall(np.asarray(i_gpu), ti, 10)
    assert r_gpu >= 0.95, (r_gpu, index.search_params, index.build_params.get("connectivity"))
    index.save(tmp_path / "ix.knnk")
    cpu_index = knnkit.load(tmp_path / "ix.knnk", device="cpu")
    d_cpu, i_cpu = cpu_index.search(q, k=10)
    r_cpu = evaluate.recall(np.asarray(i_cpu), ti, 10)
    assert r_cpu >= 0.95, (r_cpu, cpu_index.search_params)
    gpu_again = knnkit.load(tmp_path / "ix.knnk", device="gpu")
    d2, i2 = gpu_again.search(q, k=10)
    np.testing.assert_array_equal(np.asarray(i2), np.asarray(i_gpu), err_msg="reloaded GPU index answers differently")


def test_graph_index_gpu_large_k_and_extend(rng):
    x, q = _clustered(8_000, 16, seed=int(rng.integers(1 << 30)), nq=50)
    index = knnkit.GraphIndex.build(x[:6_000], device="gpu", random_state=0)
    index.extend(x[6_000:])
    _, ti = knnkit.knn(x, q, k=10, device="cpu")
    _, i = index.search(q, k=10)
    assert evaluate.recall(np.asarray(i), ti, 10) >= 0.9
    d, i = index.search(q, k=1024, beam=1024)
    assert np.asarray(i).shape == (50, 1024)


def test_torch_cuda_in_torch_out():
    torch = pytest.importorskip("torch")
    x = torch.rand(3000, 16, device="cuda")
    d, i = knnkit.knn(x, x[:10], k=5)
    assert isinstance(i, torch.Tensor) and i.is_cuda
    assert (i[:, 0].cpu().numpy() == np.arange(10)).all()
