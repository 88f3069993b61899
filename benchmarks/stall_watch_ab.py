"""NN-Descent's stall watch and the verdict before the descent, A/B in one process (issue 11):
knn_graph and GraphIndex.build in the modes of ``--modes``: ``off`` (a descent runs to its own
stop, then the recall check sends it to the exact graph), ``watch`` (the descent stops once its
extrapolated recall stays below the level) and ``verdict`` (the library default: data whose local
intrinsic dimension is at least ``knnkit.graph.STALL_LID`` gets the exact lists without a descent,
the watch decides below it), on robustness sets.

    PYTHONPATH=src python benchmarks/stall_watch_ab.py --scale full --sets broad_d128,uniform_d128 --out $OUT

Per set and mode: wall time (synchronised), the graph's recall against exact ground truth on 1,000
rows (estimated the same way for both modes), the iterations run, the stall verdict; for the index,
build time, candidate phase and the recall at the default beam on the set's queries.
"""

import argparse
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

import numpy as np  # noqa: E402

import knnkit  # noqa: E402
import knnkit.graph as kgraph  # noqa: E402
from knnkit.datasets.suite import robustness_sets  # noqa: E402
from knnkit.graph._estimate import StallWatch  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", default="full")
    ap.add_argument("--sets", default="broad_d128,uniform_d128,broad_clusters")
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--index", action="store_true", help="also build the default GraphIndex")
    ap.add_argument("--modes", default="watch,verdict", help="comma-separated: off, watch, verdict")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    gpu = a.device == "gpu"
    if gpu:
        import cupy as cp

        sync = cp.cuda.Device().synchronize
    else:
        sync = lambda: None  # noqa: E731
    start = StallWatch.START
    stall_lid = kgraph.STALL_LID
    rows = []
    for name, X, Q, metric in robustness_sets(a.scale, names=a.sets.split(","), real=False):
        Xd = cp.asarray(X) if gpu else X
        knnkit.knn_graph(Xd[:20000], 10, metric=metric)  # compile / warm
        sync()
        sample = np.random.default_rng(0).choice(X.shape[0], 1000, replace=False)
        _d, truth = knnkit.knn(Xd, Xd[sample] if not gpu else Xd[cp.asarray(sample)], k=11, metric=metric)
        truth = truth.get() if gpu else truth
        for mode in a.modes.split(","):
            StallWatch.START = 10 ** 9 if mode == "off" else start
            kgraph.STALL_LID = stall_lid if mode == "verdict" else math.inf
            t = time.perf_counter()
            g = knnkit.knn_graph(Xd, 10, metric=metric, random_state=0)
            sync()
            dt = time.perf_counter() - t
            I = g.indices.get() if gpu else np.asarray(g.indices)
            hits = [len(set(I[r]) & (set(truth[j]) - {r})) for j, r in enumerate(sample)]
            st = g.stats
            rec = {"set": name, "n": int(X.shape[0]), "d": int(X.shape[1]), "watch": mode, "knn_graph_s": dt,
                   "recall_sample_ids": float(np.mean(hits)) / 10, "iterations": st.iterations,
                   "phase_s": st.phase_s, "extra": st.extra}
            if a.index:
                t = time.perf_counter()
                idx = knnkit.GraphIndex.build(Xd, metric=metric, random_state=0)
                sync()
                rec["index_build_s"] = time.perf_counter() - t
                rec["index_phases_s"] = idx.build_timings
                rec["index_candidates"] = idx.build_params.get("candidates")
                rec["index_reverse_edges"] = idx.build_params.get("reverse_edges")
                Qd = cp.asarray(Q) if gpu else Q
                _dq, tq = knnkit.knn(Xd, Qd, k=10, metric=metric)
                _ds, iq = idx.search(Qd, 10)
                tq = tq.get() if gpu else tq
                iq = iq.get() if gpu else iq
                rec["index_recall_default_beam"] = float(np.mean([len(set(iq[i]) & set(tq[i])) for i in range(len(tq))])) / 10
            print(json.dumps({k: rec[k] for k in rec if k not in ("phase_s",)}, default=str), flush=True)
            rows.append(rec)
    StallWatch.START = start
    kgraph.STALL_LID = stall_lid
    # the output folder is this run's own: recorded as the name it was given, not a machine path
    argv = ["$OUT" if x == a.out else x for x in sys.argv[1:]]
    env = {"device": a.device, "argv": argv}
    if gpu:
        env["gpu"] = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    with open(os.path.join(a.out, f"stall_watch_ab_{a.device}.json"), "w") as f:
        json.dump({"env": env, "rows": rows}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
