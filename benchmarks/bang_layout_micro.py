"""Host layout for the walk's gathers: a node's graph row and vector in two arrays (today's
``HostIndex``) against one record per node (vector bits then neighbour ids, 512 bytes at d = 96,
R = 32, as DiskANN lays out its nodes). Random candidates, the same rows either way, alternated.

    PYTHONPATH=src python benchmarks/bang_layout_micro.py [--n 3000000] [--nb 20000] [--reps 200]
        [--out benchmarks/results/cpu/bang_layout_<date>.json]

A measurement for the notes, not a change: a combined layout would need a second host copy of the
vectors (or the user's memory-mapped file rewritten).
"""

import argparse
import datetime
import json
import os
import time

import numba
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


@numba.njit(parallel=True, cache=True)
def gather_separate(graph, data, cand, nbr, vec):
    for i in numba.prange(cand.shape[0]):
        c = cand[i]
        for j in range(graph.shape[1]):
            nbr[i, j] = graph[c, j]
        for j in range(data.shape[1]):
            vec[i, j] = data[c, j]


@numba.njit(parallel=True, cache=True)
def gather_records(rec, cand, d, nbr, vec_bits):
    for i in numba.prange(cand.shape[0]):
        c = cand[i]
        for j in range(d):
            vec_bits[i, j] = rec[c, j]
        for j in range(rec.shape[1] - d):
            nbr[i, j] = rec[c, d + j]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=3_000_000)
    ap.add_argument("--d", type=int, default=96)
    ap.add_argument("--R", type=int, default=32)
    ap.add_argument("--nb", type=int, default=20000)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "cpu",
                                                  f"bang_layout_{datetime.date.today().isoformat()}.json"))
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    graph = rng.integers(0, a.n, (a.n, a.R), dtype=np.int32)
    data = rng.random((a.n, a.d), dtype=np.float32)
    rec = np.empty((a.n, a.d + a.R), np.int32)
    rec[:, :a.d] = data.view(np.int32)
    rec[:, a.d:] = graph
    nbr = np.empty((a.nb, a.R), np.int32)
    vec = np.empty((a.nb, a.d), np.float32)
    cands = [rng.integers(0, a.n, a.nb).astype(np.int32) for _ in range(32)]
    gather_separate(graph, data, cands[0], nbr, vec)
    gather_records(rec, cands[0], a.d, nbr, vec.view(np.int32))
    times = {"separate": [], "records": []}
    for r in range(a.reps):
        c = cands[r % len(cands)]
        t = time.perf_counter()
        gather_separate(graph, data, c, nbr, vec)
        times["separate"].append(time.perf_counter() - t)
        t = time.perf_counter()
        gather_records(rec, c, a.d, nbr, vec.view(np.int32))
        times["records"].append(time.perf_counter() - t)
    res = {"params": dict(vars(a), out=os.path.relpath(a.out, os.path.join(HERE, ".."))),
           "threads": numba.get_num_threads(), "median_s": {k: float(np.median(v)) for k, v in times.items()}}
    print(json.dumps(res), flush=True)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
