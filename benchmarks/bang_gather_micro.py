"""The host step of the GPU walk (``_search_cpu.gather_walk``) alone: one parallel loop (the
current code) against the two parallel loops it replaced (copied below as
``gather_walk_two_loops``), on synthetic walk candidates, same process, alternated.

    PYTHONPATH=src python benchmarks/bang_gather_micro.py [--n 3000000] [--d 96] [--R 32] [--nb 5000]
        [--width 4] [--reps 200] [--out $OUT/bang_gather_micro.json]

Candidates: half from a hot set of 100k nodes (the walks of a batch share the nodes near the
entry points), half uniform; the stash keeps every candidate (slots large). Reports the median
seconds per call of each version and the threads Numba used.
"""

import argparse
import json
import os
import sys
import time

import numba
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

from knnkit.index.bang._search_cpu import gather_walk  # noqa: E402


@numba.njit(parallel=True, cache=True)
def gather_walk_two_loops(graph, data, cand, width, slots, count, nbr_out, vec_out, dst, stash, off):
    """``gather_walk`` as it was before the thirty-second session: graph rows in one parallel loop,
    then the counts, the offsets and the vectors in a second one (same arguments and results)."""
    nb = count.shape[0]
    R = graph.shape[1]
    d = data.shape[1]
    for q in numba.prange(nb):
        nv = 0
        for c in range(width):
            i = q * width + c
            node = cand[i]
            if node >= 0:
                nv += 1
                for j in range(R):
                    nbr_out[i, j] = graph[node, j]
            else:
                for j in range(R):
                    nbr_out[i, j] = -1
        if stash:
            off[q + 1] = min(nv, max(0, slots - count[q]))  # rows of q that get a slot
        else:
            count[q] += nv
    total = 0
    for i in range(nb * width):
        if cand[i] >= 0:
            total += 1
    n_kept = 0
    if stash:
        off[0] = 0
        for q in range(nb):
            off[q + 1] += off[q]
        n_kept = off[nb]
        for q in numba.prange(nb):
            base = count[q]
            o = off[q]
            for c in range(off[q + 1] - o):
                node = cand[q * width + c]
                for j in range(d):
                    vec_out[o + c, j] = data[node, j]
                dst[o + c] = q * slots + base + c
            c = 0
            while c < width and cand[q * width + c] >= 0:  # the valid ones come first
                c += 1
            count[q] = base + c
    return total, n_kept


def synthetic_walk(n, d, R, nb, width, seed=0):
    """``(graph, data, cands)``: a random (n, R) graph, (n, d) vectors, and 16 sets of nb x width
    walk candidates, half from a hot set of 100k nodes (the walks of a batch share the nodes near
    the entry points), half uniform."""
    rng = np.random.default_rng(seed)
    graph = rng.integers(0, n, (n, R), dtype=np.int32)
    data = rng.random((n, d), dtype=np.float32)
    hot = rng.integers(0, n, 100_000)
    nbw = nb * width
    cands = []
    for _ in range(16):
        c = np.where(rng.random(nbw) < 0.5, hot[rng.integers(0, hot.size, nbw)], rng.integers(0, n, nbw))
        cands.append(c.astype(np.int32))
    return graph, data, cands


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=3_000_000)
    ap.add_argument("--d", type=int, default=96)
    ap.add_argument("--R", type=int, default=32)
    ap.add_argument("--nb", type=int, default=5000)
    ap.add_argument("--width", type=int, default=4)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "bang_gather_micro.json"))
    a = ap.parse_args()
    graph, data, cands = synthetic_walk(a.n, a.d, a.R, a.nb, a.width)
    nbw = a.nb * a.width
    nbr = np.empty((nbw, a.R), np.int32)
    vec = np.empty((nbw, a.d), np.float32)
    dst = np.empty(nbw, np.int32)
    off = np.empty(a.nb + 1, np.int32)
    slots = 1 << 20
    fns = {"one_loop": gather_walk, "two_loops": gather_walk_two_loops}
    times = {k: [] for k in fns}
    outs = {}
    for name, fn in fns.items():  # compile, and the same answers
        count = np.zeros(a.nb, np.int32)
        fn(graph, data, cands[0], a.width, slots, count, nbr, vec, dst, True, off)
        outs[name] = (nbr.copy(), vec.copy(), dst.copy(), count.copy())
    same = all(np.array_equal(x, y) for x, y in zip(outs["one_loop"], outs["two_loops"]))
    for r in range(a.reps):
        for name, fn in (fns.items() if r % 2 == 0 else reversed(list(fns.items()))):
            count = np.zeros(a.nb, np.int32)
            t = time.perf_counter()
            fn(graph, data, cands[r % len(cands)], a.width, slots, count, nbr, vec, dst, True, off)
            times[name].append(time.perf_counter() - t)
    res = {"params": dict(vars(a), out=os.path.basename(a.out)), "threads": numba.get_num_threads(),
           "threading_layer": numba.threading_layer(), "same_results": bool(same),
           "median_s": {k: float(np.median(v)) for k, v in times.items()},
           "p10_s": {k: float(np.percentile(v, 10)) for k, v in times.items()},
           "p90_s": {k: float(np.percentile(v, 90)) for k, v in times.items()}}
    print(json.dumps(res), flush=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
