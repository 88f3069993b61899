"""Numba compilation with a first-run announcement.

Every CPU kernel module declares its kernels through a :class:`Family`::

    _jit = Family("rsfk", "RSFK forest", seconds=3)

    @_jit.njit(parallel=True, cache=True)
    def kernel(...): ...

``Family.njit`` is ``numba.njit`` plus a hook on the dispatcher's ``compile``: the first time a
kernel of the family has to be compiled in this process (no usable entry in Numba's on-disk cache),
one line is logged at INFO level on the ``knnkit`` logger and, when progress output is on and stderr
is a terminal, printed to stderr: ``knnkit: compiling CPU kernels for RSFK forest (first run only,
~3 s)...``. Cache hits stay silent. The seconds spent compiling are recorded per family
(:func:`compile_times`), for the cold-start benchmark and ``--verbose`` logs.

Numba itself is imported by the first ``Family.njit`` call, i.e. when a kernel module is imported,
never by ``import knnkit``. This module imports no algorithm package (layers: ``_core`` is the base).
"""

import logging
import sys
import threading
import time

__all__ = ["Family", "compile_times", "announced"]

_log = logging.getLogger("knnkit")
_lock = threading.Lock()
_announced = set()     # families announced in this process
_times = {}            # family -> seconds spent in top-level compiles (cache loads included)
_depth = threading.local()


def compile_times():
    """``{family: seconds}`` spent compiling (or loading from the cache) in this process."""
    with _lock:
        return dict(_times)


def announced():
    """Families whose first-run compile was announced in this process."""
    with _lock:
        return set(_announced)


def _cached(dispatcher, sig):
    """True when Numba's on-disk cache holds an entry for ``sig`` (a cheap index read, no load);
    None when that cannot be told (no cache, or a Numba whose internals differ)."""
    cache = getattr(dispatcher, "_cache", None)
    cache_file = getattr(cache, "_cache_file", None)
    if cache_file is None or not hasattr(cache_file, "_load_index"):
        return None
    try:
        from numba.core import sigutils

        args, _ret = sigutils.normalize_signature(sig)
        index = cache_file._load_index()   # {} when missing or stale (source changed, reinstall)
        return any(key[0] == args for key in index)
    except Exception:
        return None


def _progress_on():
    from .config import _globals

    return bool(_globals.get("progress", True))


class Family:
    """A group of Numba kernels announced together (one line per family and process).

    ``name``: short key (``compile_times`` uses it); ``label``: what the line says is compiling;
    ``seconds``: the announced estimate of a cold compile of the family on two CPU cores.
    """

    def __init__(self, name, label, seconds):
        self.name = name
        self.label = label
        self.seconds = seconds

    def announce(self):
        with _lock:
            if self.name in _announced:
                return
            _announced.add(self.name)
        msg = f"knnkit: compiling CPU kernels for {self.label} (first run only, ~{self.seconds:.0f} s)..."
        _log.info(msg)
        try:
            if _progress_on() and sys.stderr is not None and sys.stderr.isatty():
                print(msg, file=sys.stderr, flush=True)
        except Exception:  # a closed or odd stderr never breaks a computation
            pass

    def _hook(self, dispatcher):
        original = dispatcher.compile
        family = self

        def compile(sig):
            depth = getattr(_depth, "n", 0)
            if depth == 0 and family.name not in _announced and _cached(dispatcher, sig) is False:
                family.announce()
            _depth.n = depth + 1
            t0 = time.perf_counter()
            try:
                return original(sig)
            finally:
                _depth.n = depth
                if depth == 0:
                    dt = time.perf_counter() - t0
                    with _lock:
                        _times[family.name] = _times.get(family.name, 0.0) + dt
                    if dt > 0.5:
                        _log.debug("compiled %s.%s%s in %.2f s", family.name,
                                   dispatcher.py_func.__name__, sig, dt)

        dispatcher.compile = compile
        return dispatcher

    def njit(self, *args, **kwargs):
        """``numba.njit`` with the announcement hook (same arguments, bare or called)."""
        import numba

        if len(args) == 1 and callable(args[0]) and not kwargs:
            return self._hook(numba.njit(args[0]))

        def wrap(fn):
            return self._hook(numba.njit(*args, **kwargs)(fn))

        return wrap
