"""The shared layer: array plumbing, device resolution, validation, metric handling, settings."""

import numpy as np
import pytest

import knnkit
from knnkit._core import backend as _backend, validation as _validation, metrics as _metrics


def test_inspect_numpy_and_lists():
    a = np.ones((3, 2), np.float32)
    arr, info = _backend.inspect_array(a)
    assert arr is a and info.framework == "numpy" and not info.on_gpu
    arr, info = _backend.inspect_array([[1.0, 2.0]])
    assert isinstance(arr, np.ndarray) and arr.shape == (1, 2)


def test_inspect_array_interface_and_dlpack():
    class Wrapped:
        def __init__(self, a):
            self.__array_interface__ = a.__array_interface__
            self._a = a

    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    arr, info = _backend.inspect_array(Wrapped(a))
    np.testing.assert_array_equal(arr, a)

    class DL:
        def __init__(self, a):
            self._a = a

        def __dlpack__(self, **kw):
            return self._a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self._a.__dlpack_device__()

    arr, info = _backend.inspect_array(DL(a))
    np.testing.assert_array_equal(arr, a)
    with pytest.raises(TypeError):
        _backend.inspect_array(object())


def test_torch_cpu_roundtrip():
    torch = pytest.importorskip("torch")
    t = torch.ones(4, 3)
    arr, info = _backend.inspect_array(t)
    assert info.framework == "torch" and isinstance(arr, np.ndarray)
    out = _backend.wrap_output(arr * 2, info)
    assert isinstance(out, torch.Tensor)


def test_resolve_device():
    assert _backend.resolve_device("cpu") == ("cpu", None)
    kind, _ = _backend.resolve_device("auto")
    assert kind == ("gpu" if knnkit.gpu_available() else "cpu")
    with pytest.raises(ValueError):
        _backend.resolve_device("tpu")
    if not knnkit.gpu_available():
        with pytest.raises(RuntimeError):
            _backend.resolve_device("gpu")


@pytest.mark.parametrize("bad, exc", [
    (np.ones(5, np.float32), ValueError),                  # 1-D
    (np.ones((2, 2, 2), np.float32), ValueError),          # 3-D
    (np.ones((0, 4), np.float32), ValueError),             # empty
    (np.ones((3, 0), np.float32), ValueError),             # empty dims
    (np.array([[1.0, np.nan]], np.float32), ValueError),   # NaN
    (np.array([[1.0, np.inf]], np.float16), ValueError),   # Inf
    (np.ones((2, 2), np.complex64), TypeError),            # dtype
    (np.ones((2, 2), np.int64), TypeError),                # dtype
    (None, TypeError),
])
def test_check_matrix_rejects(bad, exc):
    with pytest.raises(exc):
        _validation.check_matrix(bad)


def test_check_matrix_converts():
    a = np.asfortranarray(np.random.default_rng(0).random((5, 3)))
    out, _ = _validation.check_matrix(a)
    assert out.dtype == np.float32 and out.flags.c_contiguous
    np.testing.assert_allclose(out, a.astype(np.float32))
    for dt in (np.float16, np.uint8, np.int8):
        out, _ = _validation.check_matrix(np.ones((2, 2), dt))
        assert out.dtype == dt


def test_check_k_and_metric():
    assert _validation.check_k(3, 3) == 3
    with pytest.raises(ValueError):
        _validation.check_k(3, 3, self_excluded=True)
    with pytest.raises(ValueError):
        _validation.check_k(0, 10)
    with pytest.raises(TypeError):
        _validation.check_k(2.5, 10)
    with pytest.raises(TypeError):
        _validation.check_k(True, 10)
    with pytest.raises(ValueError):
        _validation.check_metric("hamming")
    with pytest.raises(ValueError):
        _validation.check_pair(np.ones((2, 3)), np.ones((2, 4)))


def test_metric_roundtrip():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((4, 5)).astype(np.float32)
    n = _metrics.prepare_vectors(a, "cosine")
    np.testing.assert_allclose(np.linalg.norm(n, axis=1), 1, rtol=1e-6)
    d = np.array([[4.0, -1.0]], np.float32)
    np.testing.assert_allclose(_metrics.finalize_distances(d.copy(), "euclidean"), [[2.0, 0.0]])
    np.testing.assert_allclose(_metrics.finalize_distances(d.copy(), "inner_product"), [[-4.0, 1.0]])
    np.testing.assert_allclose(_metrics.finalize_distances(d.copy(), "cosine"), [[5.0, 0.0]])


def test_settings():
    knnkit.set_output("numpy")
    assert knnkit.get_output() == "numpy"
    knnkit.set_output("input")
    with pytest.raises(ValueError):
        knnkit.set_output("jax")
    knnkit.set_memory_budget(1 << 20)
    assert knnkit.get_memory_budget() == 1 << 20
    knnkit.set_memory_budget(None)
    with pytest.raises(ValueError):
        knnkit.set_memory_budget(-1)


def test_load_rejects_unknown_file(tmp_path):
    p = tmp_path / "x.bin"
    p.write_bytes(b"NOTKNNKT" + b"\0" * 10)
    with pytest.raises(ValueError, match="not a knnkit file"):
        knnkit.load(p)


def test_import_is_light():
    """``import knnkit`` loads neither Numba, scipy nor CuPy; a first CPU call loads what it needs."""
    import subprocess
    import sys

    code = ("import sys, knnkit; print(sorted(m for m in ('numba', 'scipy', 'cupy', 'sklearn', 'h5py') if m in sys.modules));"
            "import numpy as np; knnkit.knn(np.eye(3, dtype='f4'), k=1, device='cpu'); print('numba' in sys.modules)")
    import os

    import knnkit

    # the knnkit these tests import (the source tree), not another installed copy
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(knnkit.__file__)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=env).stdout.split("\n")
    assert out[0] == "[]" and out[1] == "True", out


def test_verbose_prints_without_logging_setup(capsys):
    """``verbose=True`` shows the build's progress on stderr with no logging configured."""
    import logging

    import numpy as np

    import knnkit

    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers[:] = []  # an application that configured nothing (pytest adds its own handlers)
    try:
        X = np.random.default_rng(0).random((2000, 8), dtype=np.float32)
        knnkit.knn_graph(X, k=5, method="nndescent", device="cpu", verbose=True, random_state=0)
    finally:
        root.handlers[:] = saved
    err = capsys.readouterr().err
    assert "NN-Descent" in err and "iteration 0" in err
