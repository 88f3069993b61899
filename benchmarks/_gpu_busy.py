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


def _trace_events(prof):
    """The chrome-trace events of a finished ``torch.profiler`` run (through a temporary file)."""
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            return json.load(f).get("traceEvents", [])
    finally:
        os.unlink(path)


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
    events = _trace_events(prof)
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


#: the host-side pieces of a host-placed search call that :func:`gpu_timeline` marks by name
#: (module path relative to ``knnkit``, attribute)
TIMELINE_MARKS = (
    ("api.index", "check_matrix"), ("api.index", "absmax"), ("api.index", "underflow_rows"),
    ("api.index", "finalize_distances"), ("index.bang._engine", "prepare_vectors"),
    ("index.bang._search_gpu", "queries_per_call"), ("index.bang._search_gpu", "_search_call"),
    ("index.bang._search_gpu", "_setup"), ("index.bang._search_gpu", "_run"),
    ("index.bang._search_gpu", "_finish"), ("index.bang._search_gpu", "_collect"),
    ("index._search_gpu", "select_seeds_gpu"), ("index.bang._search_gpu", "_padded"),
)


def _wrapped(fn, name, record_function):
    def marked(*args, **kw):
        with record_function(name):
            return fn(*args, **kw)
    return marked


def gpu_timeline(fn, sync, marks=TIMELINE_MARKS, n_warm=1):
    """One ``fn()`` under ``torch.profiler`` with CPU activities: a timeline of the call, in
    microseconds from its start. ``marks``: functions of knnkit wrapped in a ``record_function`` of
    their name for the call (their host spans appear as ``mark`` events). Returns ``{"events":
    [[kind, name, start_us, dur_us], ...], "summary": {...}}``: kinds ``kernel``, ``copy``,
    ``api`` (CUDA runtime and driver calls), ``mark``. The summary: the call's wall time, the first
    kernel named ``bang_walk``'s start, the end of the last kernel, the union of kernel time, and
    the idle gaps of the GPU longer than 20 us with the marks that were open on the host then.
    ``n_warm`` calls run under the profiler before the recorded one (the profiler's own start-up
    costs stay out)."""
    import importlib

    try:
        from torch.autograd.profiler import record_function
        from torch.profiler import ProfilerActivity, profile
    except ImportError as e:
        return {"error": f"torch.profiler unavailable: {e}"}
    saved = []
    for mod, attr in marks:
        m = importlib.import_module(f"knnkit.{mod}")
        if hasattr(m, attr):
            saved.append((m, attr, getattr(m, attr)))
            setattr(m, attr, _wrapped(getattr(m, attr), attr, record_function))
    try:
        sync()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(n_warm):
                fn()
                sync()
            with record_function("timeline_call"):
                t = time.perf_counter()
                fn()
                sync()
                wall = time.perf_counter() - t
    finally:
        for m, attr, f in saved:
            setattr(m, attr, f)
    events = _trace_events(prof)
    call = [e for e in events if e.get("name") == "timeline_call" and "ts" in e]
    if not call:
        return {"error": "no timeline_call event in the trace"}
    c0, c1 = float(call[-1]["ts"]), float(call[-1]["ts"]) + float(call[-1].get("dur", 0))
    names = {attr for _m, attr in marks}
    out = []
    for e in events:
        if "dur" not in e or "ts" not in e:
            continue
        ts, dur = float(e["ts"]), float(e["dur"])
        if ts < c0 or ts > c1:
            continue
        cat = str(e.get("cat", "")).lower()
        name = str(e.get("name", ""))
        if cat == "kernel":
            kind = "kernel"
        elif cat in ("gpu_memcpy", "gpu_memset"):
            kind = "copy"
        elif cat in ("cuda_runtime", "cuda_driver"):
            kind = "api"
        elif cat == "user_annotation" and name in names:
            kind = "mark"
        else:
            continue
        out.append([kind, name[:80], round(ts - c0, 1), round(dur, 1)])
    out.sort(key=lambda r: r[2])
    gpu = sorted((r[2], r[2] + r[3]) for r in out if r[0] in ("kernel", "copy"))
    gaps, end = [], 0.0
    for a, b in gpu:
        if a - end > 20:
            open_marks = sorted({r[1] for r in out if r[0] == "mark" and r[2] < a and r[2] + r[3] > end})
            gaps.append([round(end, 1), round(a - end, 1), open_marks])
        end = max(end, b)
    tail = (c1 - c0) - end
    walks = [r for r in out if r[0] == "kernel" and r[1].startswith("bang_walk")]
    kern = [(r[2], r[2] + r[3]) for r in out if r[0] == "kernel"]
    api = {}
    for r in out:
        if r[0] == "api":
            n, s = api.get(r[1], (0, 0.0))
            api[r[1]] = (n + 1, round(s + r[3], 1))
    summary = {"wall_us": round(wall * 1e6, 1), "traced_call_us": round(c1 - c0, 1),
               "first_walk_start_us": walks[0][2] if walks else None,
               "walk_span_us": round(max(r[2] + r[3] for r in walks) - walks[0][2], 1) if walks else None,
               "gpu_end_us": round(end, 1), "tail_us": round(tail, 1),
               "kernel_union_us": round(_union(kern), 1), "kernels": len(kern),
               "gaps": gaps, "api": dict(sorted(api.items(), key=lambda kv: -kv[1][1]))}
    return {"events": out, "summary": summary}
