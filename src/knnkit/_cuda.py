"""Run-time compilation of the CUDA kernels kept as ``.cu`` files in ``knnkit/kernels``
(NVRTC through ``cupy.RawModule``; CuPy caches the compiled binary on disk keyed by source,
options and architecture), plus the out-of-memory retry every tiled GPU routine uses."""

import functools
import os

from ._config import logger

__all__ = ["KERNEL_DIR", "get_module", "get_kernel", "retry_on_oom", "OutOfMemory"]

KERNEL_DIR = os.path.join(os.path.dirname(__file__), "kernels")


def _source(filename):
    with open(os.path.join(KERNEL_DIR, filename)) as f:
        return f.read()


@functools.lru_cache(maxsize=None)
def _module(filename, options, name_expressions, device_id):
    import cupy

    opts = ("--std=c++17", "-I" + KERNEL_DIR) + tuple(options)
    logger.debug("compiling %s with %s", filename, opts)
    return cupy.RawModule(code=_source(filename), options=opts,
                          name_expressions=list(name_expressions) if name_expressions else None)


def get_module(filename, options=(), name_expressions=()):
    """The compiled ``cupy.RawModule`` of ``kernels/filename`` (compiled once per process and device)."""
    import cupy

    return _module(filename, tuple(options), tuple(name_expressions), cupy.cuda.Device().id)


@functools.lru_cache(maxsize=None)
def _function(filename, name, options, name_expressions, device_id):
    return _module(filename, options, name_expressions, device_id).get_function(name)


def get_kernel(filename, name, options=(), name_expressions=()):
    """One kernel of a module; ``name`` may be a template instantiation listed in name_expressions.

    The function handle is cached per device too: looking it up again on every call cost a
    measurable share of a one-query search (NOTES_search.md)."""
    import cupy

    return _function(filename, name, tuple(options), tuple(name_expressions), cupy.cuda.Device().id)


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
