"""The guarantees of "Nothing silent, nothing lost": a changed input is refused on resume, a killed
out-of-core build resumes to the same graph, a full disk says so and leaves no partial file, a
malformed manifest is named, settings and readers fail at the call with the parameter named, and
tiny inputs leak no numpy warnings."""

import errno
import json
import os
import signal
import subprocess
import sys
import warnings

import numpy as np
import pytest

import knnkit
from helpers import gaussian_clusters
from knnkit._core.persist import read_container
from knnkit.graph import _checkpoint as checkpoint
from knnkit import knn_graph_out_of_core
from knnkit._core import vectors

SRC = os.path.dirname(os.path.dirname(knnkit.__file__))


def clustered(n, d, seed=0):
    return gaussian_clusters(n, d, seed, centres=12)


KW = dict(k=6, shard_size=300, device="cpu", random_state=5)  # 4 shards, 6 merges: 11 steps


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    d = tmp_path_factory.mktemp("guard")
    X = clustered(1200, 8, seed=3)
    path = str(d / "x.fbin")
    knnkit.io.write(path, X)
    ref = knn_graph_out_of_core(path, workdir=d / "ref", **KW)
    return path, X, np.asarray(ref.indices)


class Killed(Exception):
    pass


def _kill_at(point):
    def hook(name):
        if name == point:
            raise Killed(name)
    return hook


def _copy_input(small, tmp_path):
    path, X, ref = small
    p = str(tmp_path / "in.fbin")
    knnkit.io.write(p, X)
    return p, X, ref


# ----------------------------------------------------------------- 1. resume refuses a changed input

@pytest.mark.parametrize("change", ["row_between_samples", "all_rows", "touch"])
def test_resume_refuses_rewritten_input(small, tmp_path, change):
    p, X, ref = _copy_input(small, tmp_path)
    w = tmp_path / "w"
    with pytest.raises(Killed):
        knn_graph_out_of_core(p, workdir=w, _fault_hook=_kill_at("merge_0_2:start"), **KW)
    st = os.stat(p)
    Y = X.copy()
    if change == "row_between_samples":
        # row 1 is none of the 33 rows the old fingerprint sampled: only the block hash sees it
        Y[1] += 0.5
        what = "content"
    elif change == "all_rows":
        Y = clustered(1200, 8, seed=99)
        what = "content"
    else:
        what = "modification time"
    if change != "touch":
        knnkit.io.write(p, Y)  # same path, same size and shape
        assert os.path.getsize(p) == st.st_size
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
    with pytest.raises(ValueError) as e:
        knn_graph_out_of_core(p, workdir=w, **KW)
    msg = str(e.value)
    assert str(w) in msg and what in msg


def test_resume_with_same_input_gives_the_uninterrupted_graph(small, tmp_path):
    p, X, ref = _copy_input(small, tmp_path)
    w = tmp_path / "w"
    with pytest.raises(Killed):
        knn_graph_out_of_core(p, workdir=w, _fault_hook=_kill_at("merge_1_3:written"), **KW)
    g = knn_graph_out_of_core(p, workdir=w, **KW)
    np.testing.assert_array_equal(np.asarray(g.indices), ref)


def test_block_hash_samples_big_files(tmp_path):
    # above (64 + 2) blocks of 64 KiB the file is sampled: a change inside a sampled block is seen
    size = 100 * checkpoint._FP_BLOCK_BYTES
    p = tmp_path / "big.bin"
    data = bytearray(np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tobytes())
    p.write_bytes(bytes(data))
    h0 = checkpoint._blocks_hash(str(p), size)
    for pos in (0, size - 1, int(np.linspace(0, size - checkpoint._FP_BLOCK_BYTES, 66).astype(np.int64)[30]) + 7):
        changed = bytearray(data)
        changed[pos] ^= 0xFF
        p.write_bytes(bytes(changed))
        assert checkpoint._blocks_hash(str(p), size) != h0, pos


# ----------------------------------------------------------------- 2. SIGKILL at random points

_CHILD = r"""
import os, signal, sys, threading
import knnkit
path, workdir, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
count = [0]
lock = threading.Lock()

def hook(name):
    # hooks run in the main thread and in the writer thread: count both, die in whichever
    with lock:
        count[0] += 1
        if count[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

knnkit.knn_graph_out_of_core(path, workdir=workdir, k=6, shard_size=300, device="cpu", random_state=5,
                             _fault_hook=hook)
"""


def _child(path, workdir, kill_at, timeout=60):
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", _CHILD, path, str(workdir), str(kill_at)], env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_sigkill_at_random_points_then_resume(small, tmp_path):
    path, X, ref = small
    w = tmp_path / "w"
    rng = np.random.default_rng(2024)
    # the 11 steps call the hook about 33 times: three kills at random hook calls, each counted
    # from the start of the resumed run, so every kill lands on a different step
    kills = 0
    for kill_at in rng.integers(1, 12, size=3):
        r = _child(path, w, int(kill_at))
        assert r.returncode in (-signal.SIGKILL, 0), r.stderr[-2000:]
        kills += r.returncode == -signal.SIGKILL
    assert kills >= 2
    r = _child(path, w, 0)  # no kill: finish
    assert r.returncode == 0, r.stderr[-2000:]
    g = knn_graph_out_of_core(path, workdir=w, **KW)  # everything done: reads the outputs back
    np.testing.assert_array_equal(np.asarray(g.indices), ref)
    assert not [f for f in os.listdir(w) if ".tmp" in f]


# ----------------------------------------------------------------- 3. full disk, malformed manifest

def _only_listed_files(w):
    """Every file in the work folder is the manifest or listed in it: no partial file is left."""
    man = json.load(open(w / "manifest.json"))
    listed = {"manifest.json"}
    for v in man["done"].values():
        listed.update(v["files"])
    for v in man["running"].values():
        listed.update(v["files"])
    extra = set(os.listdir(w)) - listed
    # superseded running lists of an uncommitted step may remain until the next run cleans them;
    # what must never remain is a temporary file or a list file that does not read back
    assert not [f for f in extra if ".tmp" in f], extra
    for f in extra:
        assert f.endswith(".knnc"), extra
        read_container(w / f, kind="checkpoint")  # complete: header, arrays and checksum


@pytest.mark.parametrize("code", [errno.ENOSPC] + ([errno.EDQUOT] if hasattr(errno, "EDQUOT") else []))
@pytest.mark.parametrize("nth", [1, 3])  # the first list file; a later one
def test_disk_full_on_shard_write(small, tmp_path, monkeypatch, code, nth):
    p, X, ref = _copy_input(small, tmp_path)
    w = tmp_path / "w"
    real = checkpoint.write_container
    calls = [0]

    def full_disk(path, kind, meta, arrays, **kw):
        calls[0] += 1
        if calls[0] == nth:
            with vectors.atomic_write(path) as f:  # a real partial write, then the disk fills
                f.write(b"\0" * 100)
                raise OSError(code, os.strerror(code))
        return real(path, kind, meta, arrays, **kw)

    monkeypatch.setattr(checkpoint, "write_container", full_disk)
    with pytest.raises(OSError) as e:
        knn_graph_out_of_core(p, workdir=w, **KW)
    assert e.value.errno == code
    assert "disk full" in str(e.value) and str(w) in str(e.value)
    _only_listed_files(w)
    monkeypatch.setattr(checkpoint, "write_container", real)
    g = knn_graph_out_of_core(p, workdir=w, **KW)  # space freed: the rerun resumes and finishes
    np.testing.assert_array_equal(np.asarray(g.indices), ref)


def test_disk_full_on_manifest_write(small, tmp_path, monkeypatch):
    p, X, ref = _copy_input(small, tmp_path)
    w = tmp_path / "w"
    calls = [0]
    real_dump = json.dump

    class FullJson:
        load = staticmethod(json.load)
        loads = staticmethod(json.loads)

        @staticmethod
        def dump(obj, f, **kw):
            calls[0] += 1
            if calls[0] == 3:
                f.write("{\"version\": ")
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_dump(obj, f, **kw)

    monkeypatch.setattr(checkpoint, "json", FullJson)
    with pytest.raises(OSError, match="disk full") as e:
        knn_graph_out_of_core(p, workdir=w, **KW)
    assert str(w / "manifest.json") in str(e.value)
    json.load(open(w / "manifest.json"))  # the previous manifest is intact
    assert not [f for f in os.listdir(w) if ".tmp" in f]
    monkeypatch.setattr(checkpoint, "json", json)
    g = knn_graph_out_of_core(p, workdir=w, **KW)
    np.testing.assert_array_equal(np.asarray(g.indices), ref)


def test_disk_full_on_final_output(small, tmp_path, monkeypatch):
    p, X, ref = _copy_input(small, tmp_path)
    w = tmp_path / "w"
    real = vectors.VectorWriter.append
    calls = [0]

    def append(self, block):
        calls[0] += 1
        if calls[0] == 6:  # inside the second output file
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, block)

    monkeypatch.setattr(vectors.VectorWriter, "append", append)
    with pytest.raises(OSError, match="disk full"):
        knn_graph_out_of_core(p, workdir=w, **KW)
    names = os.listdir(w)
    assert "knn_indices.ibin" not in names and "knn_distances.fbin" not in names
    assert not [f for f in names if ".tmp" in f]
    monkeypatch.setattr(vectors.VectorWriter, "append", real)
    np.testing.assert_array_equal(np.asarray(knn_graph_out_of_core(p, workdir=w, **KW).indices), ref)


def test_other_write_errors_pass_unchanged(small, tmp_path, monkeypatch):
    p, X, ref = _copy_input(small, tmp_path)

    def denied(path, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", path)

    monkeypatch.setattr(checkpoint, "write_container", denied)
    with pytest.raises(PermissionError) as e:
        knn_graph_out_of_core(p, workdir=tmp_path / "w", **KW)
    assert "disk full" not in str(e.value)


@pytest.mark.parametrize("edit", [
    lambda m: [m],                                        # not an object
    lambda m: "manifest",
    lambda m: {k: v for k, v in m.items() if k != "done"},  # a key missing
    lambda m: {**m, "fingerprint": "x"},                  # wrong type
    lambda m: {**m, "seed": True},
    lambda m: {**m, "version": 2},                        # an older release's manifest
    lambda m: {**m, "bounds": [0, 600, 300, 1200]},
    lambda m: {**m, "done": {"graph_0": []}},
    lambda m: {**m, "done": {"graph_0": {"time_s": 1}}},
    lambda m: {**m, "running": {"0": {"stem": "../x", "files": {}}}},
    lambda m: {**m, "running": {"0": "run_0_v0"}},
])
def test_malformed_manifest_named(small, tmp_path, edit):
    p, X, ref = _copy_input(small, tmp_path)
    w = tmp_path / "w"
    with pytest.raises(Killed):
        knn_graph_out_of_core(p, workdir=w, _fault_hook=_kill_at("merge_0_1:start"), **KW)
    m = json.load(open(w / "manifest.json"))
    (w / "manifest.json").write_text(json.dumps(edit(m)))
    with pytest.raises(ValueError, match="malformed manifest") as e:
        knn_graph_out_of_core(p, workdir=w, **KW)
    assert str(w / "manifest.json") in str(e.value)


def test_unreadable_manifest_named(small, tmp_path):
    p, X, ref = _copy_input(small, tmp_path)
    w = tmp_path / "w"
    w.mkdir()
    (w / "manifest.json").write_bytes(b"\x00{not json")
    with pytest.raises(ValueError, match="unreadable manifest"):
        knn_graph_out_of_core(p, workdir=w, **KW)


# ----------------------------------------------------------------- 4. errors at the call, parameter named

@pytest.fixture
def restore_output():
    yield
    knnkit._core.config._globals["output"] = "input"  # a failing check must not leak into other tests


def test_set_output_fails_at_the_call(restore_output):
    knnkit.set_output("input")
    if not knnkit.gpu_available():
        with pytest.raises((ValueError, ImportError), match="GPU|CuPy"):
            knnkit.set_output("cupy")
        assert knnkit.get_output() == "input"  # unchanged
    try:
        import torch  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="torch|PyTorch"):
            knnkit.set_output("torch")
        assert knnkit.get_output() == "input"
    for bad in (None, 3, ["numpy"]):
        with pytest.raises(ValueError, match="output"):
            knnkit.set_output(bad)


@pytest.mark.parametrize("args,kwargs,exc,name", [
    (("abc",), {}, TypeError, "nbytes"),
    ((-1,), {}, ValueError, "nbytes"),
    ((0,), {}, ValueError, "nbytes"),
    ((1.5,), {}, TypeError, "nbytes"),
    ((True,), {}, TypeError, "nbytes"),
    ((None,), {"fraction": 2}, ValueError, "fraction"),
    ((None,), {"fraction": 0}, ValueError, "fraction"),
    ((None,), {"fraction": float("nan")}, ValueError, "fraction"),
    ((None,), {"fraction": "half"}, TypeError, "fraction"),
])
def test_set_memory_budget_names_the_parameter(args, kwargs, exc, name):
    knnkit.set_memory_budget(1 << 20)
    with pytest.raises(exc, match=name):
        knnkit.set_memory_budget(*args, **kwargs)
    assert knnkit.get_memory_budget() == 1 << 20  # a refused call changes nothing
    knnkit.set_memory_budget(None)


def test_set_memory_budget_accepts_integral_values():
    knnkit.set_memory_budget(np.int64(1 << 20))
    assert knnkit.get_memory_budget() == 1 << 20
    knnkit.set_memory_budget(2e6)  # an integral float is a whole number of bytes
    assert knnkit.get_memory_budget() == 2_000_000
    knnkit.set_memory_budget(None, fraction=0.5)


@pytest.mark.parametrize("key", ["train", "test"])
def test_hdf5_group_instead_of_dataset(tmp_path, key):
    h5py = pytest.importorskip("h5py")
    p = tmp_path / "f.hdf5"
    with h5py.File(p, "w") as f:
        f.create_dataset("train" if key == "test" else "test", data=np.ones((3, 2), np.float32))
        f.create_group(key).create_dataset("x", data=np.ones((3, 2), np.float32))
    with pytest.raises(ValueError) as e:
        knnkit.io.read_hdf5(p)
    assert str(p) in str(e.value) and repr(key) in str(e.value) and "group" in str(e.value)


def test_hdf5_train_not_a_matrix(tmp_path):
    h5py = pytest.importorskip("h5py")
    p = tmp_path / "f.hdf5"
    with h5py.File(p, "w") as f:
        f.create_dataset("train", data=np.ones(5, np.float32))
    with pytest.raises(ValueError, match="'train'.*2-D"):
        knnkit.io.read_hdf5(p)


@pytest.mark.parametrize("kwargs,name", [
    ({"cluster_std": float("nan")}, "cluster_std"),
    ({"cluster_std": float("inf")}, "cluster_std"),
    ({"cluster_std": -0.1}, "cluster_std"),
    ({"noise": float("nan")}, "noise"),
    ({"noise": -1}, "noise"),
    ({"noise": "0.1"}, "noise"),
    ({"n_clusters": 0}, "n_clusters"),
    ({"n_clusters": 2.5}, "n_clusters"),
    ({"latent_dim": 0}, "latent_dim"),
    ({"latent_dim": 9}, "latent_dim"),
    ({"n": 0}, "n"),
    ({"n": 10.0}, "n"),
    ({"d": -3}, "d"),
    ({"n_queries": -1}, "n_queries"),
])
def test_make_clustered_refuses_bad_parameters(kwargs, name):
    args = {"n": 20, "d": 8, **kwargs}
    n, d = args.pop("n"), args.pop("d")
    with pytest.raises((ValueError, TypeError), match=name):
        knnkit.datasets.make_clustered(n, d, device="cpu", random_state=0, **args)


@pytest.mark.parametrize("kwargs,name", [
    ({"low": float("nan")}, "low"),
    ({"high": float("inf")}, "high"),
    ({"low": 1.0, "high": 1.0}, "high"),
    ({"low": -1e39, "high": 0.0}, "low"),
    ({"low": 0.0, "high": 1e5, "dtype": np.float16}, "low and high"),
    ({"low": 2.5, "dtype": np.uint8}, "low"),
    ({"low": -1, "dtype": np.uint8}, "range"),
    ({"n": True}, "n"),
    ({"dtype": "complex64"}, "dtype"),
    ({"dtype": "not-a-type"}, "dtype"),
])
def test_make_uniform_refuses_bad_parameters(kwargs, name):
    args = {"n": 20, "d": 3, **kwargs}
    n, d = args.pop("n"), args.pop("d")
    with pytest.raises((ValueError, TypeError), match=name):
        knnkit.datasets.make_uniform(n, d, device="cpu", random_state=0, **args)


def test_synthetic_makers_still_finite():
    x = knnkit.datasets.make_clustered(50, 6, noise=0, cluster_std=0, device="cpu", random_state=1)
    assert np.isfinite(x).all()
    u = knnkit.datasets.make_uniform(50, 3, low=-2, high=2, dtype=np.float16, device="cpu", random_state=1)
    assert np.isfinite(u).all() and u.min() >= -2 and u.max() <= 2


# ----------------------------------------------------------------- 5. tiny inputs, no numpy warnings

@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.parametrize("metric", ["sqeuclidean", "cosine", "inner_product"])
@pytest.mark.parametrize("kind", ["distinct", "duplicates"])
def test_tiny_inputs_emit_no_warnings(n, metric, kind):
    X = np.random.default_rng(n).normal(size=(n, 4)).astype(np.float32)
    if kind == "duplicates":
        X[:] = X[0] if metric != "cosine" else X[0] * np.arange(1, n + 1)[:, None]
    ev = knnkit.evaluate
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        D, I = knnkit.knn(X, X, k=n, metric=metric, device="cpu")
        assert I.shape == (n, n) and (I >= 0).all()
        for method in ("brute", "nndescent", "auto"):
            g = knnkit.knn_graph(X, k=n - 1, method=method, metric=metric, device="cpu", random_state=0)
            assert (np.asarray(g.indices) >= 0).all()
            g.recall(np.asarray(g.indices))
        ix = knnkit.GraphIndex.build(X, metric=metric, device="cpu", random_state=0)
        Di, Ii = ix.search(X, k=n)
        assert (np.asarray(Ii) >= 0).all()
        ix.search(X[:1], k=1)
        ev.recall(Ii, I)
        ev.recall(Ii, I, found_distances=Di, true_distances=D)
        ev.ground_truth(X, X[:1], k=n, metric=metric, device="cpu")
        ev.graph_recall(X, np.asarray(g.indices), metric=metric, device="cpu", random_state=0)
