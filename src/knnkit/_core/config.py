"""Process-wide settings: output framework, GPU memory budget, progress bars."""

import logging
import threading

__all__ = ["set_output", "get_output", "set_memory_budget", "get_memory_budget", "set_progress", "progress"]

logger = logging.getLogger("knnkit")
logger.addHandler(logging.NullHandler())

_OUTPUTS = ("input", "numpy", "cupy", "torch")
_state = threading.local()
_globals = {"output": "input", "memory_budget": None, "memory_fraction": 0.5, "progress": True}


def set_output(kind="input"):
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
    if kind not in _OUTPUTS:
        raise ValueError(f"output must be one of {_OUTPUTS}, got {kind!r}")
    _globals["output"] = kind


def get_output():
    """The current output framework set by :func:`set_output`."""
    return _globals["output"]


def set_memory_budget(nbytes=None, *, fraction=None):
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
    if nbytes is not None:
        nbytes = int(nbytes)
        if nbytes <= 0:
            raise ValueError("memory budget must be positive")
    if fraction is not None:
        if not 0 < fraction <= 1:
            raise ValueError("fraction must be in (0, 1]")
        _globals["memory_fraction"] = float(fraction)
    _globals["memory_budget"] = nbytes


def get_memory_budget():
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


def set_progress(enabled=True):
    """Enable or disable tqdm progress bars (the CLI's ``--quiet`` turns them off)."""
    _globals["progress"] = bool(enabled)


def progress(total=None, desc=None, unit="it", enabled=True, **kw):
    """A tqdm bar that shows only when progress is on and the work lasts over ~2 s."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, delay=2.0,
                disable=not (enabled and _globals["progress"]), leave=False, **kw)
