"""Progress bars on the long jobs and ``verbose=True`` logging without any logging setup.

Bars are recorded by replacing ``tqdm.auto.tqdm`` (``knnkit._core.config.progress`` imports it at
each call) with a subclass that keeps every bar it makes; ``set_progress(True, delay=0)`` makes
them live at once (a disabled tqdm does not count its updates)."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tqdm.auto
import tqdm.std

import knnkit
from knnkit._core import config


class _Recorder(tqdm.std.tqdm):
    made = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _Recorder.made.append(self)


@pytest.fixture
def bars(monkeypatch):
    old = dict(config._globals)
    _Recorder.made = []
    monkeypatch.setattr(tqdm.auto, "tqdm", _Recorder)
    knnkit.set_progress(True, delay=0)
    yield _Recorder.made
    config._globals.update(old)


def _data(n=1500, d=8, seed=0):
    return np.random.default_rng(seed).random((n, d), dtype=np.float32)


def _named(bars, prefix):
    found = [b for b in bars if (b.desc or "").startswith(prefix)]
    assert found, f"no bar named {prefix!r} among {[b.desc for b in bars]}"
    return found


def _full(bar):
    return bar.total is not None and bar.total > 0 and bar.n == bar.total


def test_set_progress_delay_is_checked_and_kept():
    old = dict(config._globals)
    try:
        knnkit.set_progress(True, delay=0.5)
        assert config._globals["progress_delay"] == 0.5
        knnkit.set_progress(False)  # None keeps the delay
        assert config._globals["progress_delay"] == 0.5 and not config._globals["progress"]
        with pytest.raises(ValueError):
            knnkit.set_progress(True, delay=-1)
    finally:
        config._globals.update(old)


def test_exact_knn_cpu_bar_counts_every_query(bars):
    X = _data()
    Q = _data(700, seed=1)
    knnkit.knn(X, Q, k=5, device="cpu", batch_size=128)  # several query blocks
    (bar,) = _named(bars, "exact k-NN (CPU)")
    assert bar.total == 700 and bar.n == 700


def test_exact_graph_cpu_symmetric_bar(bars, monkeypatch):
    from knnkit.exact import _cpu

    monkeypatch.setattr(_cpu, "_SYM_BLOCK", 256)  # the block-pair path at a small n
    X = _data(1000)
    knnkit.knn_graph(X, 5, method="brute", device="cpu")
    (bar,) = _named(bars, "exact k-NN graph (CPU)")
    assert bar.total == 4 * 5 // 2 and _full(bar)


def test_knn_graph_cpu_nndescent_bar_ends_full(bars):
    knnkit.knn_graph(_data(3000), 8, method="nndescent", device="cpu", random_state=0)
    (bar,) = _named(bars, "NN-Descent (CPU)")
    assert _full(bar)  # converged before max_iters: the total shrinks to the iterations run


def test_knn_graph_cpu_rsfk_bar(bars):
    knnkit.knn_graph(_data(2000), 8, method="rsfk", device="cpu", random_state=0)
    (bar,) = _named(bars, "RSFK")
    assert _full(bar)


def test_graph_index_build_cpu_stage_bar(bars):
    knnkit.GraphIndex.build(_data(1500), graph_degree=8, device="cpu", random_state=0)
    (bar,) = _named(bars, "GraphIndex.build")
    # candidates, diversify, entry points, connect, calibrate
    assert bar.total == 5 and _full(bar)


def test_graph_index_build_without_calibration(bars):
    knnkit.GraphIndex.build(_data(600), graph_degree=8, device="cpu", calibrate=False, connectivity=False)
    (bar,) = _named(bars, "GraphIndex.build")
    assert bar.total == 3 and _full(bar)


def test_progress_off_makes_silent_bars(monkeypatch, capfd):
    old = dict(config._globals)
    try:
        knnkit.set_progress(False, delay=0)
        knnkit.knn(_data(), k=3, device="cpu")
        assert "exact k-NN" not in capfd.readouterr().err
        knnkit.set_progress(True, delay=0)
        knnkit.knn(_data(), k=3, device="cpu")
        assert "exact k-NN (CPU)" in capfd.readouterr().err
    finally:
        config._globals.update(old)


_SNIPPET = """
import numpy as np, knnkit
X = np.random.default_rng(0).random((600, 6), dtype=np.float32)
knnkit.knn_graph(X, 5, method={method!r}, device="cpu", verbose=True)
"""


@pytest.mark.parametrize("method", ["nndescent", "brute"])
def test_verbose_logs_to_stderr_without_logging_setup(method):
    # a fresh interpreter: pytest itself puts handlers on the root logger
    env = dict(os.environ)
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(_SNIPPET.format(method=method))],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "knnkit: knn_graph:" in r.stderr
    assert r.stdout == ""


def test_verbose_keeps_the_applications_handlers(monkeypatch):
    """With a handler on the root logger, verbose only lowers knnkit's level (no second handler)."""
    import logging

    monkeypatch.setattr(config, "_verbose_handler", None)
    monkeypatch.setattr(config.logger, "level", config.logger.level)
    before = list(config.logger.handlers)
    root = logging.getLogger()
    h = logging.NullHandler()
    root.addHandler(h)
    try:
        config.verbose_logging()
        assert config.logger.handlers == before
        assert config.logger.getEffectiveLevel() <= logging.INFO
    finally:
        root.removeHandler(h)


def _gpu():
    return pytest.mark.skipif(not knnkit.gpu_available(), reason="needs an NVIDIA GPU and CuPy")


@_gpu()
def test_exact_knn_gpu_bar_counts_every_query(bars):
    import cupy as cp

    X = cp.asarray(_data(4000))
    Q = cp.asarray(_data(900, seed=1))
    knnkit.knn(X, Q, k=5, device="gpu", batch_size=128)
    (bar,) = _named(bars, "exact k-NN (GPU)")
    assert bar.total == 900 and bar.n == 900


@_gpu()
def test_knn_graph_gpu_nndescent_bar_ends_full(bars):
    import cupy as cp

    knnkit.knn_graph(cp.asarray(_data(20000, 16)), 10, method="nndescent", device="gpu", random_state=0)
    (bar,) = _named(bars, "NN-Descent (GPU)")
    assert _full(bar)


@_gpu()
def test_graph_index_build_gpu_stage_bar(bars):
    import cupy as cp

    knnkit.GraphIndex.build(cp.asarray(_data(6000, 16)), graph_degree=16, device="gpu", random_state=0)
    (bar,) = _named(bars, "GraphIndex.build")
    # candidates, nn1_max, prune, reverse, entry points, connect, calibrate
    assert bar.total == 7 and _full(bar)
