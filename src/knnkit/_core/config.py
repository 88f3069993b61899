"""Process-wide settings: output framework, GPU memory budget, progress bars."""

from __future__ import annotations

import logging
import threading

__all__ = ["set_output", "get_output", "set_memory_budget", "get_memory_budget", "set_progress", "progress",
           "finish", "verbose_logging"]

logger = logging.getLogger("knnkit")
logger.addHandler(logging.NullHandler())


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time (notebooks and test runners replace it)."""

    @property
    def stream(self):
        import sys

        return sys.stderr

    @stream.setter
    def stream(self, _value):
        pass


_verbose_handler = None


def verbose_logging():
    """``verbose=True`` must print by itself: when the application configured no logging (no
    handler on the knnkit logger or the root logger), attach one stderr handler at INFO, once."""
    global _verbose_handler
    if _verbose_handler is not None:
        return
    real = [h for h in logger.handlers if not isinstance(h, logging.NullHandler)]
    if real or logging.getLogger().handlers:
        if logger.getEffectiveLevel() > logging.INFO:
            logger.setLevel(logging.INFO)
        return
    _verbose_handler = _StderrHandler()
    _verbose_handler.setFormatter(logging.Formatter("knnkit: %(message)s"))
    logger.addHandler(_verbose_handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)

_OUTPUTS = ("input", "numpy", "cupy", "torch")
_state = threading.local()
_globals = {"output": "input", "memory_budget": None, "memory_fraction": 0.5, "progress": True,
            "progress_delay": 2.0}


def set_output(kind: str = "input") -> None:
    """Choose where results go.

    Parameters
    ----------
    kind : {"input", "numpy", "cupy", "torch"}
        ``"input"`` (default) returns results on the input's device and framework
        (numpy in, numpy out; cupy or CUDA torch in, same out).

    Examples
    --------
    >>> import knnkit
    >>> knnkit.set_output("numpy")
    >>> knnkit.get_output()
    'numpy'
    >>> knnkit.set_output("input")
    """
    if not isinstance(kind, str) or kind not in _OUTPUTS:
        raise ValueError(f"output must be one of {_OUTPUTS}, got {kind!r}")
    # refuse here rather than at the first result: the error then points at the line that asked
    if kind == "cupy":  # (backend imports this module: the check is inlined, not imported)
        try:
            import cupy
        except ImportError:
            raise ImportError('set_output("cupy") needs CuPy and an NVIDIA GPU: CuPy is not installed '
                              '(pip install cupy-cuda12x)') from None
        try:
            devices = cupy.cuda.runtime.getDeviceCount()
        except Exception:
            devices = 0
        if devices < 1:
            raise ValueError('set_output("cupy") needs an NVIDIA GPU: CuPy is installed but sees no CUDA '
                             'device; use set_output("numpy") on this machine')
    elif kind == "torch":
        try:
            import torch  # noqa: F401
        except ImportError:
            raise ImportError('set_output("torch") needs PyTorch, which is not installed '
                              '(pip install torch)') from None
    _globals["output"] = kind


def get_output() -> str:
    """The current output framework set by :func:`set_output`."""
    return _globals["output"]


def set_memory_budget(nbytes: int | None = None, *, fraction: float | None = None) -> None:
    """Limit the GPU memory a knnkit routine plans to use.

    Every GPU routine tiles its work so that its temporary buffers fit the budget.
    ``nbytes=None`` (default) uses ``fraction`` (default 0.5) of the free device memory
    at call time.

    Parameters
    ----------
    nbytes : int or None
        Budget in bytes.
    fraction : float, optional
        Fraction of free memory used when ``nbytes`` is None.
    """
    from .params import check_float, check_int

    # both checked before either is stored: a bad call changes nothing
    nbytes = check_int(nbytes, "nbytes (memory budget in bytes)", minimum=1, allow_none=True)
    fraction = check_float(fraction, "fraction (of free GPU memory)", minimum=0.0, maximum=1.0, open_min=True,
                           allow_none=True)
    if fraction is not None:
        _globals["memory_fraction"] = fraction
    _globals["memory_budget"] = nbytes


def get_memory_budget() -> int:
    """GPU memory budget in bytes for the next routine (0 when no GPU)."""
    if _globals["memory_budget"] is not None:
        return _globals["memory_budget"]
    try:
        import cupy

        free, _total = cupy.cuda.runtime.memGetInfo()
        pool = cupy.get_default_memory_pool()
        free += pool.free_bytes()
    except Exception:  # no GPU
        return 0
    return int(free * _globals["memory_fraction"])


def set_progress(enabled: bool = True, *, delay: float | None = None) -> None:
    """Enable or disable tqdm progress bars (the CLI's ``--quiet`` turns them off).

    Parameters
    ----------
    enabled : bool
        Show bars for long jobs (exact k-NN, graph builds, index builds, file reading, ...).
    delay : float, optional
        Seconds a job must run before its bar appears (default 2; 0 shows every bar at once).
        None keeps the current value.
    """
    from .params import check_float

    delay = check_float(delay, "delay (seconds before a progress bar shows)", minimum=0.0, allow_none=True)
    _globals["progress"] = bool(enabled)
    if delay is not None:
        _globals["progress_delay"] = float(delay)


def progress(total=None, desc=None, unit="it", enabled=True, **kw):
    """A tqdm bar that shows only when progress is on and the work lasts over the delay (~2 s).

    Updates are host-side counters: callers advance it once per block, tile, iteration or stage,
    never from compiled code and never with a device synchronisation of their own."""
    import sys

    from tqdm.auto import tqdm

    if not getattr(sys.stderr, "isatty", lambda: False)():
        # a log file or a pipe: a line every 30 s, not a carriage-return redraw every 0.1 s
        kw.setdefault("mininterval", 30.0)
    return tqdm(total=total, desc=desc, unit=unit, delay=_globals["progress_delay"],
                disable=not (enabled and _globals["progress"]), leave=False, **kw)


def finish(bar):
    """Mark a bar complete when the job stopped early on purpose (convergence, target recall):
    its total becomes the work actually done."""
    if bar.total is not None and bar.n < bar.total:
        bar.total = bar.n
        bar.refresh()


def host_available_bytes() -> int | None:
    """Memory the host can give this process now (``MemAvailable``: free plus reclaimable page
    cache, so a memory-mapped input counts as available), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
