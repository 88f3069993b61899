"""Where the connectivity stage of ``GraphIndex.build`` spends its time (GPU or CPU): builds the
index of one robustness set with wall-clock timers (device synchronised before and after) around
the functions of the connectivity stage, then under cProfile, and prints both with the build's
connectivity statistics. (cProfile alone misleads here: GPU work shows up in whichever call
synchronises next, and Numba calls are not profiled.)

    PYTHONPATH=src python benchmarks/profile_connectivity.py --set tight_c1000 --scale full --device gpu
"""

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

import knnkit  # noqa: E402
from knnkit.datasets.suite import robustness_sets  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", default="tight_c1000")
    ap.add_argument("--scale", default="full")
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--placements", default=None,
                    help="comma-separated LINK_PLACEMENT values to time in turn (timers only, no cProfile)")
    a = ap.parse_args()
    knnkit.set_progress(False)
    (name, X, _Q, metric), = robustness_sets(a.scale, names=[a.set], real=False)
    if a.device == "gpu":
        import cupy as cp

        X = cp.asarray(X)
        knnkit.GraphIndex.build(X[:150_000], metric=metric, random_state=0)  # compile the kernels
    from knnkit.index import _connect, _engine

    timers = {}

    def sync():
        if a.device == "gpu":
            import cupy as cp

            cp.cuda.Device().synchronize()

    def timed(mod, name):
        fn = getattr(mod, name)

        def wrapper(*args, **kw):
            sync()
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                sync()
                tot, calls = timers.get(name, (0.0, 0))
                timers[name] = (tot + time.perf_counter() - t0, calls + 1)
        setattr(mod, name, wrapper)
        return fn

    names = ["components", "short_edge_components", "entry_points_per_component", "combine_entry_points",
             "repair_connectivity", "_link_components", "_nearest_members", "_bfs_tree", "_argmin_per_label",
             "_centroids", "_nearest_components", "_dist_rows", "_link_unreachable", "_link_from_nearest_reachable",
             "_insert_links", "_to_host", "_repair_few_on_device"]
    saved = {nm: timed(_connect, nm) for nm in names if hasattr(_connect, nm)}
    saved_connect = timed(_engine, "_connect")
    sync()
    t = time.perf_counter()
    index = knnkit.GraphIndex.build(X, metric=metric, random_state=0)
    sync()
    print(f"{name} {a.scale}: build {time.perf_counter() - t:.2f} s (timers)")
    print(json.dumps({"phases_s": {k: round(v, 3) for k, v in index.build_timings.items()},
                      "timers_s_calls": {k: (round(v[0], 3), v[1]) for k, v in
                                         sorted(timers.items(), key=lambda kv: -kv[1][0])}}, indent=1))
    if a.placements:
        import hashlib

        for placement in a.placements.split(",") * 2:  # each twice, alternating
            _connect.LINK_PLACEMENT = placement
            timers.clear()
            sync()
            t = time.perf_counter()
            index = knnkit.GraphIndex.build(X, metric=metric, random_state=0)
            sync()
            g = index.graph
            g = g.get() if hasattr(g, "get") else g
            print(json.dumps({"placement": placement, "build_s": round(time.perf_counter() - t, 3),
                              "connectivity_s": round(index.build_timings["connectivity"], 3),
                              "graph_sha1": hashlib.sha1(g.tobytes()).hexdigest()[:12],
                              "stats": index.build_params.get("connectivity"),
                              "timers_s_calls": {k: (round(v[0], 3), v[1]) for k, v in
                                                 sorted(timers.items(), key=lambda kv: -kv[1][0])}}), flush=True)
        return
    for nm, fn in saved.items():
        setattr(_connect, nm, fn)
    _engine._connect = saved_connect
    pr = cProfile.Profile()
    t = time.perf_counter()
    pr.enable()
    index = knnkit.GraphIndex.build(X, metric=metric, random_state=0)
    pr.disable()
    print(f"{name} {a.scale}: build {time.perf_counter() - t:.2f} s (under cProfile)")
    print(json.dumps({"phases_s": {k: round(v, 3) for k, v in index.build_timings.items()},
                      "connectivity": index.build_params.get("connectivity")}, indent=1))
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(a.top)
    print(s.getvalue())
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(a.top)
    print(s.getvalue())


if __name__ == "__main__":
    main()
