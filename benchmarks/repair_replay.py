"""The reach repair of ``GraphIndex.build`` replayed on the graph a real build hands it (issue 11:
skewed-norm inner product 1M x 96, where nearly every node is unreachable before the repair).

Builds the index of one robustness set once, capturing the arguments of
``_connect.repair_connectivity`` (the graph before the repair), then replays the repair on copies
of that graph ``--reps`` times, with wall-clock timers around its phases; prints one JSON line per
replay (seconds, statistics, timers, a hash of the repaired graph, to compare across commits).
(The eighteenth session's run, ``benchmarks/results/h200-2026-11-29-s18/repair/replay.jsonl``,
toggled a since-removed switch that marked full rows exhausted: ``mark_full``.)

    PYTHONPATH=src python benchmarks/repair_replay.py --set skewed_norms_ip --scale full > $OUT/replay.jsonl
"""

import argparse
import hashlib
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

import numpy as np  # noqa: E402

import knnkit  # noqa: E402
from knnkit.datasets.suite import robustness_sets  # noqa: E402
from knnkit.index import _connect  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", default="skewed_norms_ip")
    ap.add_argument("--scale", default="full")
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    knnkit.set_progress(False)
    (name, X, _Q, metric), = robustness_sets(a.scale, names=[a.set], real=False)
    if a.device == "gpu":
        import cupy as cp

        X = cp.asarray(X)
    captured = {}
    original = _connect.repair_connectivity

    def capture(Xc, g, **kw):
        captured.update(X=Xc, g=g.copy(), kw=kw)
        return original(Xc, g, **kw)

    _connect.repair_connectivity = capture
    t = time.perf_counter()
    knnkit.GraphIndex.build(X, metric=metric, random_state=0)
    _connect.repair_connectivity = original
    print(json.dumps({"set": name, "n": int(X.shape[0]), "build_s": round(time.perf_counter() - t, 2)}), flush=True)
    timers = {}

    def timed(nm):
        fn = getattr(_connect, nm)

        def w(*args, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                tt, c = timers.get(nm, (0.0, 0))
                timers[nm] = (tt + time.perf_counter() - t0, c + 1)
        setattr(_connect, nm, w)

    for nm in ("_link_unreachable", "_link_from_nearest_reachable", "_insert_links", "_bfs_tree"):
        timed(nm)
    for rep in range(a.reps):
        timers.clear()
        g = captured["g"].copy()
        kw = dict(captured["kw"], copy=False)
        t = time.perf_counter()
        g, st = original(captured["X"], g, **kw)
        s = time.perf_counter() - t
        gh = g.get() if hasattr(g, "get") else np.asarray(g)
        print(json.dumps({"rep": rep, "seconds": round(s, 3),
                          "stats": {k: st.get(k) for k in ("unreachable_before", "unreachable_after", "reach_rounds",
                                                           "reach_seconds", "links_added")},
                          "timers_s_calls": {k: (round(v[0], 3), v[1]) for k, v in timers.items()},
                          "graph_sha1": hashlib.sha1(gh.tobytes()).hexdigest()[:12]}), flush=True)


if __name__ == "__main__":
    main()
