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

:func:`parallel_for` runs a ``nogil`` kernel over chunks of work on Numba's thread count, with Python
threads: the kernels that do not need ``parallel=True`` (a prange loop whose iterations are
independent) are compiled as plain functions, which costs a third to a half of the compile time of
Numba's parallel lowering (that compiles the loop body again as a gufunc and re-generates machine
code for every callee it links); the run time of such a loop is the same.

Numba itself is imported by the first ``Family.njit`` call, i.e. when a kernel module is imported,
never by ``import knnkit``. This module imports no algorithm package (layers: ``_core`` is the base).
"""

import logging
import os
import sys
import threading
import time
import warnings

__all__ = ["Family", "compile_times", "announced", "num_threads", "parallel_for", "chunks"]

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

    def _hook(self, dispatcher, quiet_parallel=False):
        original = dispatcher.compile
        family = self

        def compile(sig):
            depth = getattr(_depth, "n", 0)
            if depth == 0 and family.name not in _announced and _cached(dispatcher, sig) is False:
                family.announce()
            from numba.core.compiler_lock import global_compiler_lock

            # under Numba's (re-entrant) compiler lock: a thread that waits for another's compile of
            # the same kernel (parallel_for tasks) does not count the wait
            with global_compiler_lock:
                _depth.n = depth + 1
                t0 = time.perf_counter()
                try:
                    if not quiet_parallel:
                        return original(sig)
                    from numba.core.errors import NumbaPerformanceWarning

                    with warnings.catch_warnings():
                        warnings.filterwarnings("ignore", category=NumbaPerformanceWarning,
                                                message=r"(?s).*no transformation for parallel execution")
                        return original(sig)
                finally:
                    _depth.n = depth
                    dt = time.perf_counter() - t0
                    if depth == 0:
                        family._record(dispatcher, sig, dt)

        dispatcher.compile = compile
        return dispatcher

    def _record(self, dispatcher, sig, dt):
        with _lock:
            _times[self.name] = _times.get(self.name, 0.0) + dt
        if dt > 0.5:
            _log.debug("compiled %s.%s%s in %.2f s", self.name, dispatcher.py_func.__name__, sig, dt)

    def kernel(self, **kwargs):
        """The decorator of a kernel run on :func:`parallel_for` tasks: ``njit(cache=True, nogil=True,
        parallel=True)`` on a function with no ``prange``. No gufunc is made (so none of the compile
        cost of a parallel loop), but Numba's parallel pipeline still runs its loop passes, which made
        the plain loops of these kernels 1.2-2x faster than ``njit`` alone (2 cores, Numba 0.6x).
        The kernel must hold no whole-array expression (``np.zeros``, ``a[:] = b``...): Numba would
        turn those into parallel loops. Numba's warning that nothing was parallelised is dropped."""
        kwargs.setdefault("cache", True)
        kwargs.setdefault("nogil", True)
        kwargs["parallel"] = True
        kwargs["_knnkit_quiet_parallel"] = True
        return self.njit(**kwargs)

    def njit(self, *args, **kwargs):
        """``numba.njit`` with the announcement hook (same arguments, bare or called)."""
        import numba

        if len(args) == 1 and callable(args[0]) and not kwargs:
            return self._hook(numba.njit(args[0]))
        quiet = kwargs.pop("_knnkit_quiet_parallel", False)

        def wrap(fn):
            return self._hook(numba.njit(*args, **kwargs)(fn), quiet)

        return wrap


# ------------------------------------------------------------------------------ threads

_pool = None
_pool_size = 0
_pool_pid = None   # a forked child inherits the pool object but not its threads: it makes its own


def num_threads():
    """Numba's thread count for the calling thread (``numba.set_num_threads`` / NUMBA_NUM_THREADS)."""
    import numba

    return max(1, int(numba.get_num_threads()))


def chunks(n, parts):
    """``parts`` contiguous ``(lo, hi)`` ranges covering ``0 .. n`` (none empty; fewer when n < parts)."""
    parts = max(1, min(int(parts), int(n)))
    return [(c * n // parts, (c + 1) * n // parts) for c in range(parts)]


def parallel_for(fn, tasks, threads=None):
    """``[fn(t) for t in range(tasks)]``, run on up to ``threads`` threads (default
    :func:`num_threads`; the calling thread is one of them), tasks handed out in order as threads
    free up. ``fn`` should spend its time in ``nogil`` Numba kernels. The first exception raised by a
    task is raised here, after every started task has finished."""
    global _pool, _pool_size, _pool_pid
    tasks = int(tasks)
    threads = num_threads() if threads is None else max(1, int(threads))
    threads = min(threads, tasks)
    # a task that itself calls parallel_for runs its inner loop serially: its inner workers would
    # queue behind the busy pool threads that wait for them (a deadlock)
    if threads <= 1 or threading.current_thread().name.startswith("knnkit"):
        return [fn(t) for t in range(tasks)]
    with _lock:
        if _pool is None or _pool_size < threads - 1 or _pool_pid != os.getpid():
            from concurrent.futures import ThreadPoolExecutor

            if _pool is not None and _pool_pid == os.getpid():
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(max_workers=threads - 1, thread_name_prefix="knnkit")
            _pool_size = threads - 1
            _pool_pid = os.getpid()
        pool = _pool
    out = [None] * tasks
    state = {"next": 0, "error": None}
    take = threading.Lock()

    def worker():
        while True:
            with take:
                t = state["next"]
                if t >= tasks or state["error"] is not None:
                    return
                state["next"] = t + 1
            try:
                out[t] = fn(t)
            except BaseException as e:  # stop handing out tasks; re-raised by the caller
                with take:
                    if state["error"] is None:
                        state["error"] = e
                return

    futures = [pool.submit(worker) for _ in range(threads - 1)]
    worker()
    for f in futures:
        f.result()
    if state["error"] is not None:
        raise state["error"]
    return out
