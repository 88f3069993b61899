"""Run-time compilation of the CUDA kernels kept as ``.cu`` files beside the algorithm that launches
them (NVRTC through ``cupy.RawModule``; CuPy caches the compiled binary on disk keyed by source,
options and architecture), plus the out-of-memory retry every tiled GPU routine uses.

A kernel is named by its path: ``get_kernel(kernel_path(__file__, "topk.cu"), "topk_tile<...>")``.
Headers (``.cuh``) are found in the kernel's own folder."""

import functools
import os

from .config import logger

__all__ = ["PACKAGE_DIR", "kernel_path", "kernel_files", "get_module", "get_kernel", "retry_on_oom", "OutOfMemory"]

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
