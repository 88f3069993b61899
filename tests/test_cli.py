"""The knnkit command, run in-process through ``knnkit.cli.main``."""

import os
import subprocess
import sys

import numpy as np
import pytest

import knnkit
from knnkit import cli, io


def _numpy_knn(x, q, k):
    d2 = ((q[:, None, :].astype(np.float64) - x[None].astype(np.float64)) ** 2).sum(-1)
    idx = np.argsort(d2, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(d2, idx, 1), idx


def test_info(capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert f"knnkit {knnkit.__version__}" in out and f"numpy {np.__version__}" in out
    assert "backend:" in out
    assert ("GPU 0:" in out) if knnkit.gpu_available() else ("no GPU" in out)


def test_python_dash_m():
    env = dict(os.environ)
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-m", "knnkit", "--help"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0 and "demo" in r.stdout and "knn" in r.stdout


@pytest.mark.parametrize("ext,dist_ext", [(".ibin", ".dist.fbin"), (".ivecs", ".dist.fvecs"), (".npy", ".dist.npy")])
def test_knn_writes_files(tmp_path, rng, capsys, ext, dist_ext):
    x = rng.standard_normal((300, 9)).astype(np.float32)
    q = rng.standard_normal((17, 9)).astype(np.float32)
    io.write(tmp_path / "x.fvecs", x)
    io.write(tmp_path / "q.fbin", q)
    out = tmp_path / f"res{ext}"
    rc = cli.main(["-q", "knn", str(tmp_path / "x.fvecs"), "--queries", str(tmp_path / "q.fbin"), "-k", "5",
                   "--device", "cpu", "-o", str(out)])
    assert rc == 0, capsys.readouterr().err
    assert "wrote indices" in capsys.readouterr().out
    idx, dist = io.read(out), io.read(tmp_path / f"res{dist_ext}")
    assert idx.shape == (17, 5) and dist.shape == (17, 5) and dist.dtype == np.float32
    ref_d, ref_i = _numpy_knn(x, q, 5)
    assert (idx == ref_i).mean() > 0.98
    np.testing.assert_allclose(dist, ref_d, rtol=1e-4, atol=1e-4)
    assert cli.distances_path(out) == str(tmp_path / f"res{dist_ext}")


def test_knn_without_queries_excludes_self(tmp_path, capsys):
    x = np.arange(20, dtype=np.float32).reshape(10, 2)
    io.write(tmp_path / "x.npy", x)
    assert cli.main(["knn", str(tmp_path / "x.npy"), "-k", "2", "--device", "cpu", "-o", str(tmp_path / "g.ivecs"),
                     "--no-distances", "--quiet"]) == 0
    g = io.read(tmp_path / "g.ivecs")
    assert g[0].tolist() == [1, 2] and g[5].tolist() == [4, 6]
    assert not (tmp_path / "g.dist.fvecs").exists()


def test_knn_hdf5_input(tmp_path, rng, capsys):
    h5py = pytest.importorskip("h5py")
    x = rng.standard_normal((100, 4)).astype(np.float32)
    with h5py.File(tmp_path / "t.hdf5", "w") as f:
        f["train"], f["test"] = x, x[:3]
    assert cli.main(["knn", str(tmp_path / "t.hdf5"), "-k", "1", "--device", "cpu", "-o", str(tmp_path / "r.npy")]) == 0
    assert io.read(tmp_path / "r.npy").ravel().tolist() == [0, 1, 2]


def test_knn_errors(tmp_path, capsys):
    x = np.ones((5, 2), np.float32)
    io.write(tmp_path / "x.fbin", x)
    # bad output extension: refused before any work
    assert cli.main(["knn", str(tmp_path / "x.fbin"), "-k", "2", "-o", str(tmp_path / "r.txt")]) == 1
    assert "must end in .ibin" in capsys.readouterr().err
    assert cli.main(["knn", str(tmp_path / "missing.fbin"), "-k", "2", "-o", str(tmp_path / "r.npy")]) == 1
    assert "missing.fbin" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["knn", str(tmp_path / "x.fbin"), "-o", str(tmp_path / "r.npy")])   # -k is required
    with pytest.raises(SystemExit):
        cli.main(["knn", str(tmp_path / "x.fbin"), "-k", "0", "-o", str(tmp_path / "r.npy")])
    with pytest.raises(SystemExit):
        cli.main(["demo", "--device", "tpu"])


def test_quiet_and_verbose_restore_settings(tmp_path, capsys):
    from knnkit._core import config as _config
    import logging

    before = _config._globals["progress"]
    # the level is set here, so the test does not depend on which tests ran before in this process
    # (verbose=True leaves the knnkit logger at INFO for the process, by design)
    log = logging.getLogger("knnkit")
    level_before = log.level
    try:
        for level in (logging.NOTSET, logging.ERROR):
            log.setLevel(level)
            assert cli.main(["info", "--quiet", "--verbose"]) == 0
            assert _config._globals["progress"] == before
            assert log.level == level
    finally:
        log.setLevel(level_before)
    # --verbose re-raises errors with their traceback
    with pytest.raises(FileNotFoundError):
        cli.main(["-v", "knn", str(tmp_path / "none.fbin"), "-k", "1", "-o", str(tmp_path / "r.npy")])


def test_convert(tmp_path, rng, capsys):
    x = rng.integers(0, 256, (40, 6)).astype(np.uint8)
    io.write(tmp_path / "x.bvecs", x)
    assert cli.main(["convert", str(tmp_path / "x.bvecs"), str(tmp_path / "y.u8bin")]) == 0
    np.testing.assert_array_equal(io.read(tmp_path / "y.u8bin"), x)
    assert cli.main(["convert", str(tmp_path / "x.bvecs"), str(tmp_path / "y.fvecs"), "--rows", "7"]) == 0
    np.testing.assert_array_equal(io.read(tmp_path / "y.fvecs"), x[:7].astype(np.float32))
    assert cli.main(["convert", str(tmp_path / "y.fvecs"), str(tmp_path / "z.npy")]) == 0
    assert io.read(tmp_path / "z.npy").shape == (7, 6)


def test_demo_tiny_cpu(capsys):
    rc = cli.main(["--quiet", "demo", "--n", "600", "--d", "8", "--queries", "30", "-k", "5", "--device", "cpu",
                   "--no-warmup"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "600 x 8" in out and "exact knn" in out
    # each later step either reports a recall or says it was skipped
    for step in ("knn_graph", "search" if "index build" in out else "GraphIndex"):
        line = next(l for l in out.splitlines() if l.strip().startswith(step))
        assert "recall@5" in line or "skipped" in line, out


def test_graph(tmp_path, rng, capsys):
    x = rng.standard_normal((400, 6)).astype(np.float32)
    io.write(tmp_path / "x.fbin", x)
    rc = cli.main(["graph", str(tmp_path / "x.fbin"), "-k", "4", "--device", "cpu", "--eval", "50",
                   "-o", str(tmp_path / "g.ibin")])
    out = capsys.readouterr().out
    assert rc == 0, out
    g, d = io.read(tmp_path / "g.ibin"), io.read(tmp_path / "g.dist.fbin")
    assert g.shape == (400, 4) and d.shape == (400, 4)
    d2 = ((x[:, None].astype(np.float64) - x[None]) ** 2).sum(-1)
    np.fill_diagonal(d2, np.inf)
    true = np.argsort(d2, axis=1)[:, :4]
    assert np.mean([len(set(a) & set(b)) / 4 for a, b in zip(g.tolist(), true.tolist())]) > 0.95
    assert "recall@4" in out


def test_graph_out_of_core(tmp_path, rng, capsys):
    x = rng.standard_normal((600, 5)).astype(np.float32)
    io.write(tmp_path / "x.fbin", x)
    rc = cli.main(["graph", str(tmp_path / "x.fbin"), "-k", "3", "--device", "cpu", "--workdir",
                   str(tmp_path / "w"), "-o", str(tmp_path / "g.npy")])
    out = capsys.readouterr()
    if rc != 0 and "NotImplementedError" in out.err:
        pytest.skip("knn_graph_out_of_core not available")
    assert rc == 0, out.err
    g = io.read(tmp_path / "g.npy")
    assert g.shape == (600, 3) and io.read(tmp_path / "g.dist.npy").shape == (600, 3)
    assert (g != np.arange(600)[:, None]).all()
