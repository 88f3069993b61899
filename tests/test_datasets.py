"""knnkit.datasets: shapes, dtypes, determinism, disjoint queries, the clustered model's structure,
and the real-data loaders (skipped when the files are absent)."""

import gzip
import os

import numpy as np
import pytest

import knnkit
from knnkit import datasets
from knnkit.datasets import synthetic

DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


def _host(a):
    return a if isinstance(a, np.ndarray) else a.get()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("make", [datasets.make_clustered, datasets.make_uniform])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.uint8, np.int8])
def test_shapes_dtypes_determinism(make, dtype, device):
    x, q = make(1000, 7, n_queries=33, dtype=dtype, random_state=5, device=device)
    x, q = _host(x), _host(q)
    assert x.shape == (1000, 7) and q.shape == (33, 7)
    assert x.dtype == dtype and q.dtype == dtype and x.flags.c_contiguous
    assert np.isfinite(x.astype(np.float32)).all()
    x2 = _host(make(1000, 7, dtype=dtype, random_state=5, device=device))
    np.testing.assert_array_equal(x, x2)   # same seed, same data, with or without queries
    x3 = _host(make(1000, 7, dtype=dtype, random_state=6, device=device))
    assert not np.array_equal(x, x3)
    assert len(np.unique(x, axis=0)) > 900   # not a handful of repeated points


@pytest.mark.parametrize("make", [datasets.make_clustered, datasets.make_uniform])
def test_queries_are_new_points(make):
    x, q = make(3000, 16, n_queries=200, random_state=0, device="cpu")
    # no query equals a data row, and the queries are not the rows following the data
    d2 = ((q[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    assert d2.min() > 0
    more = make(3200, 16, random_state=0, device="cpu")
    assert not np.array_equal(more[3000:], q)


def test_result_independent_of_thread_count(monkeypatch):
    # several CPU chunks: the output depends on the seed only, not on the number of threads
    monkeypatch.setattr(synthetic, "_CPU_CHUNK", 100)
    a = datasets.make_clustered(1050, 5, random_state=3, device="cpu")
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    b = datasets.make_clustered(1050, 5, random_state=3, device="cpu")
    np.testing.assert_array_equal(a, b)
    g1, g2 = np.random.default_rng(9), np.random.default_rng(9)
    np.testing.assert_array_equal(datasets.make_uniform(10, 2, random_state=g1, device="cpu"),
                                  datasets.make_uniform(10, 2, random_state=g2, device="cpu"))


def test_clustered_structure():
    # data lies near a latent_dim-dimensional subspace: the top singular values carry nearly all variance
    x = datasets.make_clustered(4000, 40, n_clusters=10, latent_dim=5, noise=0.01, random_state=1, device="cpu")
    s = np.linalg.svd(x - x.mean(0), compute_uv=False)
    energy = (s ** 2).cumsum() / (s ** 2).sum()
    assert energy[4] > 0.99 and energy[3] < 0.995
    # clusters: a point's nearest neighbour is much closer than a random point
    sub = x[:500]
    d2 = ((sub[:, None] - sub[None]) ** 2).sum(-1)
    np.fill_diagonal(d2, np.inf)
    assert np.median(d2.min(1)) < 0.1 * np.median(d2[np.isfinite(d2)])
    # no noise and one cluster of zero spread: every point is the same
    y = datasets.make_clustered(50, 8, n_clusters=1, cluster_std=0, noise=0, random_state=2, device="cpu")
    assert np.allclose(y, y[0])


def test_uniform_ranges():
    x = datasets.make_uniform(5000, 4, low=-2, high=3, random_state=0, device="cpu")
    assert x.min() >= -2 and x.max() < 3 and abs(x.mean() - 0.5) < 0.05
    u = datasets.make_uniform(5000, 4, dtype=np.uint8, random_state=0, device="cpu")
    assert u.min() == 0 and u.max() == 255
    i = datasets.make_uniform(5000, 4, dtype=np.int8, low=-3, high=3, random_state=0, device="cpu")
    assert sorted(np.unique(i)) == list(range(-3, 4))


def test_bad_arguments():
    with pytest.raises(ValueError):
        datasets.make_clustered(0, 4)
    with pytest.raises(ValueError):
        datasets.make_clustered(10, 4, latent_dim=5)
    with pytest.raises(ValueError):
        datasets.make_uniform(10, 4, n_queries=-1)
    with pytest.raises(TypeError):
        datasets.make_uniform(10, 4, dtype=np.int64)
    with pytest.raises(TypeError):
        datasets.make_uniform(10, 4, random_state="seed")
    with pytest.raises(ValueError):
        datasets.make_uniform(10, 4, low=1, high=1)


def test_cpu_generation_speed():
    # 200k x 128 (a fifth of the 1M x 128 target of a few seconds) on the CI's 2 cores
    import time

    t = time.perf_counter()
    x = datasets.make_clustered(200_000, 128, random_state=0, device="cpu")
    assert time.perf_counter() - t < 5.0
    assert x.shape == (200_000, 128)


@pytest.mark.gpu
def test_gpu_large_fast():
    import time
    import cupy

    t = time.perf_counter()
    x = datasets.make_clustered(10_000_000, 96, random_state=0, device="gpu")
    cupy.cuda.Device().synchronize()
    elapsed = time.perf_counter() - t
    assert isinstance(x, cupy.ndarray) and x.shape == (10_000_000, 96) and x.dtype == np.float32
    assert elapsed < 10.0, elapsed
    del x


def test_load_dispatches_to_io(tmp_path):
    a = np.arange(6, dtype=np.float32).reshape(3, 2)
    knnkit.io.write(tmp_path / "a.fbin", a)
    np.testing.assert_array_equal(datasets.load(tmp_path / "a.fbin"), a)
    np.testing.assert_array_equal(datasets.load(tmp_path / "a.fbin", rows=(1, 2)), a[1:2])


def test_missing_data_message(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
        datasets.load_fashion_mnist(path=tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="siftsmall"):
        datasets.load_siftsmall(path=tmp_path)


def test_env_and_dot_data_fallbacks(tmp_path, monkeypatch, rng):
    base = rng.standard_normal((20, 4)).astype(np.float32)
    folder = tmp_path / ".data" / "siftsmall"
    folder.mkdir(parents=True)
    knnkit.io.write(folder / "siftsmall_base.fvecs", base)
    knnkit.io.write(folder / "siftsmall_query.fvecs", base[:3])
    knnkit.io.write(folder / "siftsmall_groundtruth.ivecs", np.zeros((3, 2), np.int32))
    monkeypatch.setenv("KNNKIT_DATA", str(tmp_path))   # $KNNKIT_DATA/siftsmall: absent
    monkeypatch.chdir(tmp_path)                         # .data/siftsmall: present
    monkeypatch.setitem(datasets.real._SYSTEM_DIRS, "siftsmall", str(tmp_path / "none"))
    b, q, g = datasets.load_siftsmall()
    np.testing.assert_array_equal(b, base)
    assert g.dtype == np.int64 and g.shape == (3, 2)


def test_read_idx(tmp_path):
    img = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    header = bytes([0, 0, 0x08, 3]) + np.array(img.shape, ">u4").tobytes()
    with gzip.open(tmp_path / "x-idx3-ubyte.gz", "wb") as f:
        f.write(header + img.tobytes())
    np.testing.assert_array_equal(datasets.read_idx(tmp_path / "x-idx3-ubyte.gz"), img)
    with gzip.open(tmp_path / "y.gz", "wb") as f:
        f.write(header + img.tobytes()[:-1])
    with pytest.raises(ValueError, match="truncated"):
        datasets.read_idx(tmp_path / "y.gz")


def _has(name, files):
    try:
        datasets.find_data_dir(name, files)
        return True
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not _has("siftsmall", ["siftsmall_base.fvecs", "siftsmall_query.fvecs",
                                            "siftsmall_groundtruth.ivecs"]), reason="siftsmall not present")
def test_siftsmall():
    base, queries, gt = datasets.load_siftsmall()
    assert base.shape == (10000, 128) and queries.shape == (100, 128) and gt.shape == (100, 100)
    assert base.dtype == np.float32 and gt.dtype == np.int64
    # the stored ground truth is the exact neighbour order (checked on a few queries with numpy)
    q = queries[:5].astype(np.float64)
    d2 = ((q[:, None, :] - base[None].astype(np.float64)) ** 2).sum(-1)
    top = np.argsort(d2, axis=1, kind="stable")[:, :10]
    assert (top == gt[:5, :10]).mean() > 0.95


@pytest.mark.skipif(not _has("fashion-mnist", ["train-images-idx3-ubyte.gz", "t10k-images-idx3-ubyte.gz"]),
                    reason="Fashion-MNIST not present (apt-get install dataset-fashion-mnist)")
def test_fashion_mnist():
    train, test = datasets.load_fashion_mnist()
    assert train.shape == (60000, 784) and test.shape == (10000, 784)
    assert train.dtype == np.uint8 and train.max() == 255 and train.min() == 0
    tr, te, ytr, yte = datasets.load_fashion_mnist(return_labels=True)
    assert ytr.shape == (60000,) and sorted(np.unique(yte)) == list(range(10))


class _FakeCupy:
    """numpy dressed as the parts of CuPy the generators use, to run their GPU branch on the CPU."""

    class random:
        class RandomState:
            def __init__(self, seed, method=None):
                assert 0 <= seed < 2 ** 63
                self._g = np.random.default_rng(seed)

            def standard_normal(self, size, dtype=float):
                return self._g.standard_normal(size, dtype=dtype)

            def random_sample(self, size, dtype=float):
                return self._g.random(size, dtype=dtype)

    class cuda:
        class Device:
            def __init__(self, i=None):
                self.id = i or 0

            def __enter__(self):
                return self

            def __exit__(self, *a):
                return False

    def __getattr__(self, name):
        return getattr(np, name)


@pytest.mark.parametrize("make", [datasets.make_clustered, datasets.make_uniform])
@pytest.mark.parametrize("dtype", [np.float32, np.uint8])
def test_gpu_branch_logic_with_numpy_stand_in(monkeypatch, make, dtype):
    fake = _FakeCupy()
    monkeypatch.setattr(synthetic, "cupy_or_none", lambda: fake)
    monkeypatch.setattr(synthetic, "resolve_device", lambda device, info=None: ("gpu", None))
    monkeypatch.setattr(synthetic, "_GPU_CHUNK", 256)
    x, q = make(1000, 6, n_queries=10, dtype=dtype, random_state=4)
    assert x.shape == (1000, 6) and q.shape == (10, 6) and x.dtype == dtype
    np.testing.assert_array_equal(x, make(1000, 6, dtype=dtype, random_state=4))
    assert len(np.unique(x, axis=0)) > 900
