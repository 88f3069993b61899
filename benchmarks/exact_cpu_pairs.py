"""The CPU all-points exact graph: block pairs in a locality order (``_knn_cpu_symmetric``) against
the query-tile path (``_gemm_select``, forced by a zero heap budget), same process, alternated, the
first call of each path on a small set excluded (compiles). Ids and distances are compared.

    PYTHONPATH=src python benchmarks/exact_cpu_pairs.py > benchmarks/results/cpu/exact_pairs_<date>.txt
"""

import os
import subprocess
import time

import numpy as np

from knnkit.datasets.suite import make_broad_clusters, make_tight_clusters
from knnkit.exact import _cpu

CASES = [("tight clusters of 10", 100_000, 64, 64), ("broad clusters", 100_000, 64, 64),
         ("uniform", 100_000, 128, 96), ("uniform", 50_000, 16, 48), ("uniform", 50_000, 32, 48),
         ("uniform", 50_000, 3, 16), ("uniform", 20_000, 128, 10)]


def data(kind, n, d):
    if kind.startswith("tight"):
        return make_tight_clusters(n, d, n // 10, random_state=0)
    if kind.startswith("broad"):
        return make_broad_clusters(n, d, random_state=0)
    return np.random.default_rng(0).random((n, d), dtype=np.float32)


def run(X, K, pairs):
    saved = _cpu._SYMMETRIC_HEAP_BYTES
    _cpu._SYMMETRIC_HEAP_BYTES = saved if pairs else 0
    try:
        t = time.perf_counter()
        out = _cpu.knn_cpu(X, X, K, "l2", True)
        return out, time.perf_counter() - t
    finally:
        _cpu._SYMMETRIC_HEAP_BYTES = saved


def main():
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    reps = int(os.environ.get("REPS", 1))
    print(f"commit {commit}, {os.cpu_count()} CPUs, {reps} alternated round(s), seconds per call")
    warm = np.random.default_rng(1).random((5000, 8), dtype=np.float32)
    run(warm, 8, True), run(warm, 8, False)
    for kind, n, d, K in CASES:
        X = np.ascontiguousarray(data(kind, n, d), dtype=np.float32)
        times = {True: [], False: []}
        outs = {}
        for _ in range(reps):
            for pairs in (True, False):
                outs[pairs], s = run(X, K, pairs)
                times[pairs].append(round(s, 2))
        same_i = np.array_equal(outs[True][1], outs[False][1])
        same_d = np.array_equal(outs[True][0], outs[False][0])
        print(f"{kind} {n} x {d}, K {K}: block pairs {times[True]} s, query tiles {times[False]} s, "
              f"ids equal {same_i}, distances equal {same_d}", flush=True)


if __name__ == "__main__":
    main()
