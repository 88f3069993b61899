"""Array plumbing: where an input lives, moving it to the chosen device, returning results
on the input's device and framework."""

from __future__ import annotations

import functools

import numpy as np

from .config import get_output

__all__ = ["gpu_available", "resolve_device", "as_host", "as_device", "ArrayInfo", "inspect_array",
           "wrap_output", "cupy_or_none", "get_array_module"]


@functools.lru_cache(maxsize=1)
def cupy_or_none():
    """The cupy module when it imports and sees at least one GPU, else None."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None
        return cupy
    except Exception:
        return None


def gpu_available() -> bool:
    """True when CuPy is installed and a CUDA device is visible."""
    return cupy_or_none() is not None


class ArrayInfo:
    """Where an input came from: framework ('numpy', 'cupy', 'torch') and whether on a GPU."""

    __slots__ = ("framework", "on_gpu", "device_id", "absmax")

    def __init__(self, framework, on_gpu, device_id=None):
        self.framework, self.on_gpu, self.device_id = framework, on_gpu, device_id
        # the largest |value| of the validated array, where check_matrix found it on the way (GPU
        # float arrays: one reduction is both the NaN/Inf check and this), else None
        self.absmax = None

    def __repr__(self):
        return f"ArrayInfo(framework={self.framework!r}, on_gpu={self.on_gpu})"


def _is_torch(x):
    return type(x).__module__.startswith("torch") and hasattr(x, "is_cuda")


def inspect_array(x):
    """Return ``(array, ArrayInfo)`` with ``array`` a numpy or cupy array (no copy when possible)."""
    if isinstance(x, np.ndarray):
        return x, ArrayInfo("numpy", False)
    mod = type(x).__module__
    if mod.startswith("cupy"):
        return x, ArrayInfo("cupy", True, x.device.id)
    if _is_torch(x):
        if x.is_cuda:
            cp = cupy_or_none()
            if cp is None:
                raise RuntimeError("a CUDA torch tensor was given but CuPy cannot use the GPU")
            t = x.detach()
            if t.dtype.is_floating_point and str(t.dtype) == "torch.bfloat16":
                raise TypeError("unsupported dtype bfloat16; use float32, float16, uint8 or int8")
            return cp.asarray(t), ArrayInfo("torch", True, t.device.index)
        t = x.detach()
        if str(t.dtype) == "torch.bfloat16":
            raise TypeError("unsupported dtype bfloat16; use float32, float16, uint8 or int8")
        return t.numpy(), ArrayInfo("torch", False)
    if hasattr(x, "__cuda_array_interface__"):
        cp = cupy_or_none()
        if cp is None:
            raise RuntimeError("a CUDA array was given but CuPy cannot use the GPU")
        return cp.asarray(x), ArrayInfo("cupy", True)
    if hasattr(x, "__array_interface__") or hasattr(x, "__array__"):
        return np.asarray(x), ArrayInfo("numpy", False)
    if hasattr(x, "__dlpack__"):
        dev_type = x.__dlpack_device__()[0] if hasattr(x, "__dlpack_device__") else 1
        if dev_type == 2:  # kDLCUDA
            cp = cupy_or_none()
            if cp is None:
                raise RuntimeError("a CUDA DLPack array was given but CuPy cannot use the GPU")
            return cp.from_dlpack(x), ArrayInfo("cupy", True)
        return np.from_dlpack(x), ArrayInfo("numpy", False)
    if isinstance(x, (list, tuple)):
        return np.asarray(x), ArrayInfo("numpy", False)
    raise TypeError(f"expected an array (numpy, cupy, torch, or an object with __array_interface__, "
                    f"__cuda_array_interface__ or __dlpack__), got {type(x).__name__}")


def resolve_device(device, info=None):
    """Map ``device`` ("auto", "cpu", "gpu", int) to ``("cpu", None)`` or ``("gpu", id)``."""
    if device is None or device == "auto":
        if info is not None and info.on_gpu:
            return "gpu", info.device_id
        return ("gpu", None) if gpu_available() else ("cpu", None)
    if device == "cpu":
        return "cpu", None
    if device == "gpu" or device == "cuda" or (isinstance(device, (int, np.integer)) and not isinstance(device, bool)):
        if not gpu_available():
            raise RuntimeError("device='gpu' was asked for but no CUDA GPU is usable "
                               "(install knnkit[cuda12] or knnkit[cuda13] on a machine with an NVIDIA GPU)")
        if isinstance(device, (int, np.integer)):
            n = cupy_or_none().cuda.runtime.getDeviceCount()
            if not 0 <= int(device) < n:
                raise ValueError(f"device {device} does not exist ({n} GPU(s) visible)")
            return "gpu", int(device)
        return "gpu", None
    raise ValueError(f"device must be 'auto', 'cpu', 'gpu' or a GPU number, got {device!r}")


def as_host(a):
    """A numpy view/copy of a numpy or cupy array."""
    if isinstance(a, np.ndarray):
        return a
    return a.get()


def as_device(a):
    """A cupy array on the current device."""
    cp = cupy_or_none()
    return cp.asarray(a)


def get_array_module(a):
    """numpy or cupy, whichever owns ``a``."""
    if isinstance(a, np.ndarray):
        return np
    return cupy_or_none()


def wrap_output(a, info):
    """Return ``a`` (numpy or cupy) in the framework chosen by :func:`knnkit.set_output`."""
    target = get_output()
    if target == "input":
        target = info.framework if info is not None else "numpy"
        on_gpu = info.on_gpu if info is not None else False
        if target == "torch":
            import torch

            if on_gpu:
                return torch.as_tensor(as_device(a), device=f"cuda:{info.device_id or 0}")
            return torch.from_numpy(np.ascontiguousarray(as_host(a)))
        if target == "cupy" or on_gpu:
            return as_device(a)
        return as_host(a)
    if target == "numpy":
        return as_host(a)
    if target == "cupy":
        return as_device(a)
    import torch

    if isinstance(a, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(a))
    return torch.as_tensor(a, device="cuda")


def twin(package, device):
    """The ``_cpu`` or ``_gpu`` module of an algorithm package: the one place where a CPU/GPU twin
    is chosen. ``package`` is the package's ``__name__``; both modules define the same functions
    with the same signatures."""
    import importlib

    if device not in ("cpu", "gpu"):
        raise ValueError(f"device must be 'cpu' or 'gpu', got {device!r}")
    try:
        return importlib.import_module(f"{package}._{device}")
    except ImportError as e:  # CuPy or a kernel module missing
        if device == "gpu":
            raise RuntimeError(f"the GPU path of {package} is not available ({type(e).__name__}: {e}); "
                               f"use device='cpu'") from e
        raise


def device_of(a):
    """``"gpu"`` for a CuPy array, ``"cpu"`` for a numpy array."""
    return "cpu" if isinstance(a, np.ndarray) else "gpu"
