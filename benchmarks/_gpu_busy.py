"""How busy the GPU is during one call, from a CUPTI trace taken through ``torch.profiler`` (issue 16:
"the GPU is busy (> 70 % of search time in kernels, by a profile)"). nsys is not on the GPU
machines; torch's profiler records every kernel and copy of the process, CuPy's included.

``gpu_busy(fn)`` runs ``fn()`` once under the profiler and returns the call's wall time and the
union of the intervals in which at least one kernel (``kernel_s``), one copy or memset
(``copy_s``), or either (``busy_s``) ran on the GPU, with their fractions of the wall time. The
profiler slows launches a little, so the fractions are a lower bound."""
import json
import os
import tempfile
import time


def _union(intervals):
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def gpu_busy(fn, sync):
    """Profile one ``fn()`` (``sync()`` waits for the GPU); a dict of seconds and fractions, or
    ``{"error": ...}`` where torch's profiler is missing."""
    try:
        from torch.profiler import ProfilerActivity, profile
    except ImportError as e:
        return {"error": f"torch.profiler unavailable: {e}"}
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        fn()
        sync()
        wall = time.perf_counter() - t
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f).get("traceEvents", [])
    finally:
        os.unlink(path)
    kern, copy = [], []
    for e in events:
        cat = str(e.get("cat", "")).lower()
        if "dur" not in e or "ts" not in e:
            continue
        iv = (float(e["ts"]) * 1e-6, (float(e["ts"]) + float(e["dur"])) * 1e-6)
        if cat == "kernel":
            kern.append(iv)
        elif cat in ("gpu_memcpy", "gpu_memset"):
            copy.append(iv)
    k, c, b = _union(kern), _union(copy), _union(kern + copy)
    span = (max(x[1] for x in kern + copy) - min(x[0] for x in kern + copy)) if kern or copy else 0.0
    return {"wall_s": wall, "gpu_span_s": span, "kernel_s": k, "copy_s": c, "busy_s": b,
            "kernel_frac": k / wall if wall else None, "busy_frac": b / wall if wall else None,
            "kernels": len(kern), "copies": len(copy)}
