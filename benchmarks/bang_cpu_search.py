"""CPU search of a host-placed (BANG) index, end to end (``GraphIndex.search`` on the CPU twin: PQ
tables, seeds, walk, exact re-rank), for before/after comparisons across trees: the index is built
once and saved (``--index-dir``), and every tree loads the same file, so only the search differs.

    PYTHONPATH=src python benchmarks/bang_cpu_search.py --index-dir /tmp/bangcpu [--sets sift_like_u8,broad_96]
        [--n 100000] [--queries 2000] [--beams 32,64,256] [--reps 3] [--tag this] [--out x.json]

Prints one JSON line per (set, beam): median seconds of ``--reps`` searches after one warm-up,
recall@10 (ties by distance) and a digest of the returned ids (equal digests: equal answers).
"""

import argparse
import hashlib
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

import knnkit  # noqa: E402
from knnkit.datasets import suite  # noqa: E402

SETS = {
    "sift_like_u8": lambda n, nq: suite.make_sift_like_uint8(n, 128, n_queries=nq, random_state=4),
    "broad_96": lambda n, nq: suite.make_broad_clusters(n, 96, n_queries=nq, random_state=1),
    "manifold_128": lambda n, nq: suite.make_manifold(n, 128, n_queries=nq, random_state=3),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--index-dir", required=True)
    ap.add_argument("--sets", default="sift_like_u8,broad_96")
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--beams", default="32,64,256")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tag", default="this")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    os.makedirs(a.index_dir, exist_ok=True)
    rows = []
    for name in a.sets.split(","):
        X, Q = SETS[name](a.n, a.queries)
        path = os.path.join(a.index_dir, f"{name}_{a.n}.knnkit")
        if not os.path.exists(path):
            knnkit.GraphIndex.build(X, placement="host", device="cpu", random_state=0).save(path)
        index = knnkit.GraphIndex.load(path, device="cpu")
        td, _ti = knnkit.knn(X, Q, k=10, device="cpu")
        kth = np.asarray(td)[:, 9:10]
        for beam in [int(b) for b in a.beams.split(",")]:
            index.search(Q, k=10, beam=beam)
            times = []
            for _ in range(a.reps):
                t = time.perf_counter()
                D, I = index.search(Q, k=10, beam=beam)
                times.append(time.perf_counter() - t)
            recall = float((np.asarray(D) <= kth * (1 + 1e-5) + 1e-12).mean())
            row = {"tag": a.tag, "set": name, "beam": beam, "median_s": float(np.median(times)), "seconds": times,
                   "recall": recall, "ids_digest": hashlib.sha1(np.ascontiguousarray(I).tobytes()).hexdigest()[:12]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"params": {k: v for k, v in vars(a).items() if k not in ("out", "index_dir")}, "rows": rows},
                      f, indent=1)


if __name__ == "__main__":
    main()
