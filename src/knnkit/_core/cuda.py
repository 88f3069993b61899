"""Run-time compilation of the CUDA kernels kept as ``.cu`` files beside the algorithm that launches
them (NVRTC through ``cupy.RawModule``; CuPy caches the compiled binary on disk keyed by source,
options and architecture), plus the out-of-memory retry every tiled GPU routine uses.

A kernel is named by its path: ``get_kernel(kernel_path(__file__, "topk.cu"), "topk_tile<...>")``.
Headers (``.cuh``) are found in the kernel's own folder."""

import functools
import os

from .config import logger

__all__ = ["PACKAGE_DIR", "kernel_path", "kernel_files", "get_module", "get_kernel", "retry_on_oom", "OutOfMemory",
           "PreparedLaunch"]

#: The knnkit package folder (kernel files live in its algorithm subpackages).
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def kernel_path(module_file, filename):
    """Absolute path of the kernel ``filename`` beside the Python module ``module_file``."""
    return os.path.join(os.path.dirname(os.path.abspath(module_file)), filename)


def kernel_files():
    """Every ``.cu`` file shipped with the package (the compile test builds each)."""
    out = []
    for root, _dirs, files in os.walk(PACKAGE_DIR):
        out += [os.path.join(root, f) for f in files if f.endswith(".cu")]
    return sorted(out)


def _source(path):
    with open(path) as f:
        return f.read()


@functools.lru_cache(maxsize=None)
def _module(path, options, name_expressions, device_id):
    import cupy

    opts = ("--std=c++17", "-I" + os.path.dirname(path)) + tuple(options)
    logger.debug("compiling %s with %s", os.path.relpath(path, PACKAGE_DIR), opts)
    return cupy.RawModule(code=_source(path), options=opts,
                          name_expressions=list(name_expressions) if name_expressions else None)


def get_module(path, options=(), name_expressions=()):
    """The compiled ``cupy.RawModule`` of the kernel file ``path`` (compiled once per process and device)."""
    import cupy

    return _module(path, tuple(options), tuple(name_expressions), cupy.cuda.Device().id)


@functools.lru_cache(maxsize=None)
def _function(path, name, options, name_expressions, device_id):
    return _module(path, options, name_expressions, device_id).get_function(name)


def get_kernel(path, name, options=(), name_expressions=()):
    """One kernel of a module; ``name`` may be a template instantiation listed in name_expressions.

    The function handle is cached per device too: looking it up again on every call cost a
    measurable share of a one-query search (NOTES_search.md)."""
    import cupy

    return _function(path, name, tuple(options), tuple(name_expressions), cupy.cuda.Device().id)


class PreparedLaunch:
    """One kernel launch whose argument block is packed once, for a launch repeated many times with
    the same arguments (every step of a walk): calling it is one ``cuLaunchKernel`` with the
    packed block, where a ``RawKernel`` call converts each argument again (the BANG walk's steps
    have 17-30 arguments).

    ``args`` are typed: CuPy arrays (passed as their data pointer, as ``RawKernel`` passes them),
    NumPy scalars (``np.int32``, ``np.uint32``, ``np.int64``, ``np.uint64``, ``np.float32``,
    ``np.float64``); a Python ``int``/``float``/``bool`` is refused, its C type being ambiguous.
    :meth:`set` changes one scalar in place between launches (the driver copies the block at
    launch). Kernels that are not CuPy ``RawKernel`` objects (the tests' stand-ins) are called as
    ``kernel(grid, block, args, shared_mem=)`` inside the stream."""

    __slots__ = ("kernel", "grid", "block", "args", "shared_mem", "_fn", "_values", "_block", "_launch")

    def __init__(self, kernel, grid, block, args, shared_mem=0):
        self.kernel = kernel
        self.grid = _dim3(grid, "grid")
        self.block = _dim3(block, "block")
        self.args = list(args)
        self.shared_mem = int(shared_mem)
        self._launch = self._fn = self._values = self._block = None
        fn = _function_pointer(kernel)
        if fn is None:
            return
        import ctypes

        from cupy.cuda import driver

        self._values = [_c_value(a, i) for i, a in enumerate(self.args)]
        self._block = (ctypes.c_void_p * max(1, len(self._values)))(
            *[ctypes.addressof(v) for v in self._values])
        self._fn = fn
        self._launch = driver.launchKernel

    def set(self, index, value):
        """Argument ``index`` (a scalar) becomes ``value`` for the next launches."""
        self.args[index] = value
        if self._values is not None:
            self._values[index].value = value

    def __call__(self, stream, grid=None):
        """Queue the launch on ``stream`` (a ``cupy.cuda.Stream``); ``grid`` overrides the grid."""
        g = self.grid if grid is None else _dim3(grid, "grid")
        if self._launch is None:
            with stream:
                self.kernel(g, self.block, tuple(self.args), shared_mem=self.shared_mem)
            return
        import ctypes

        b = self.block
        self._launch(self._fn, g[0], g[1], g[2], b[0], b[1], b[2], self.shared_mem, stream.ptr,
                     ctypes.addressof(self._block), 0)


def _dim3(dims, what):
    dims = tuple(int(x) for x in dims)
    if not 1 <= len(dims) <= 3 or min(dims) < 1:
        raise ValueError(f"{what} must be 1-3 positive sizes, got {dims}")
    return dims + (1,) * (3 - len(dims))


def _function_pointer(kernel):
    """The ``CUfunction`` of a CuPy ``RawKernel`` (compiled on first use), else None."""
    try:
        import cupy
    except ImportError:
        return None
    raw = getattr(cupy, "RawKernel", None)
    if raw is None or not isinstance(kernel, raw):
        return None
    return int(kernel.kernel.ptr)


def _c_value(a, index):
    import ctypes

    import numpy as np

    ptr = getattr(getattr(a, "data", None), "ptr", None)
    if ptr is not None and not isinstance(a, np.generic):
        return ctypes.c_void_p(int(ptr))
    kinds = {np.dtype(np.int32): ctypes.c_int32, np.dtype(np.uint32): ctypes.c_uint32,
             np.dtype(np.int64): ctypes.c_int64, np.dtype(np.uint64): ctypes.c_uint64,
             np.dtype(np.float32): ctypes.c_float, np.dtype(np.float64): ctypes.c_double}
    if isinstance(a, np.generic) and a.dtype in kinds:
        return kinds[a.dtype](a.item())
    raise TypeError(f"PreparedLaunch argument {index}: a CuPy array or a NumPy scalar of a fixed C type, "
                    f"got {type(a).__name__}")


def OutOfMemory():
    """The CuPy out-of-memory exception class (a tuple of classes to catch)."""
    import cupy

    return (cupy.cuda.memory.OutOfMemoryError,)


def retry_on_oom(fn, tile, *, min_tile=1, what="this operation", hint="lower the memory budget "
                 "(knnkit.set_memory_budget) or the batch size"):
    """Call ``fn(tile)``; on CUDA out-of-memory free the pool, halve ``tile`` and retry.

    Raises MemoryError with advice once ``tile`` would fall below ``min_tile``.
    """
    import cupy

    while True:
        try:
            return fn(tile)
        except OutOfMemory() as e:
            cupy.get_default_memory_pool().free_all_blocks()
            if tile // 2 < min_tile:
                raise MemoryError(f"GPU out of memory in {what} even with tile size {tile}: {e}. "
                                  f"Free GPU memory, {hint}, or use device='cpu'.") from None
            logger.info("GPU out of memory in %s with tile %d; retrying with %d", what, tile, tile // 2)
            tile //= 2
