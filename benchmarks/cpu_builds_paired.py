"""CPU index builds against hnswlib, paired: for each robustness-suite set (small scale), knnkit's
``GraphIndex.build`` with default parameters and hnswlib (M 16, ef_construction 200, every core)
alternate ``REPS`` times in one process (default 3), so a slow phase of a shared machine hits both;
the medians and their ratio are reported, with knnkit's build phases of its median run. Both are
warmed on a small slice first (compiles). Build times only: recall and QPS are the suite's
(``benchmarks/robustness.py``).

    PYTHONPATH=src python benchmarks/cpu_builds_paired.py [set ...] > benchmarks/results/robustness/cpu_builds_paired_<date>.json
"""

import json
import os
import subprocess
import sys
import time

import numpy as np

import knnkit
from knnkit.datasets.suite import robustness_sets

DEFAULT_SETS = ("tight_c10000", "broad_clusters", "skewed_norms_ip", "sift_like_u8", "siftsmall")


def hnswlib_build(X, metric, seed=0):
    import hnswlib

    t = time.perf_counter()
    p = hnswlib.Index(space="ip" if metric == "inner_product" else "l2", dim=X.shape[1])
    p.init_index(max_elements=X.shape[0], M=16, ef_construction=200, random_seed=seed)
    p.add_items(X, np.arange(X.shape[0]), num_threads=os.cpu_count())
    return time.perf_counter() - t


def knnkit_build(X, metric):
    t = time.perf_counter()
    ix = knnkit.GraphIndex.build(X, metric=metric, device="cpu", random_state=0)
    return time.perf_counter() - t, {k: round(v, 3) for k, v in (ix._engine.build_timings or {}).items()}


def main():
    names = sys.argv[1:] or list(DEFAULT_SETS)
    reps = int(os.environ.get("REPS", 3))
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = {"commit": commit, "cpus": os.cpu_count(), "reps": reps, "hnswlib": "M=16 ef_construction=200",
           "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "sets": []}
    knnkit.set_progress(False)
    for name, X, _Q, metric in robustness_sets("small", names=names):
        X = np.ascontiguousarray(X, dtype=np.float32)
        knnkit_build(X[:3000], metric)
        hnswlib_build(X[:3000], metric)
        ours, theirs, phases = [], [], []
        for _ in range(reps):
            s, ph = knnkit_build(X, metric)
            ours.append(round(s, 3))
            phases.append(ph)
            theirs.append(round(hnswlib_build(X, metric), 3))
        mk, mh = float(np.median(ours)), float(np.median(theirs))
        row = {"name": name, "n": int(X.shape[0]), "d": int(X.shape[1]), "metric": metric,
               "knnkit_s": ours, "hnswlib_s": theirs, "knnkit_median_s": mk, "hnswlib_median_s": mh,
               "ratio": round(mk / mh, 3), "knnkit_phases_median_run": phases[int(np.argsort(ours)[len(ours) // 2])]}
        out["sets"].append(row)
        print(f"{name:18s} knnkit {ours} hnswlib {theirs} ratio of medians {row['ratio']}", file=sys.stderr, flush=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
