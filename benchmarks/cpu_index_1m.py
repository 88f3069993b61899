"""CPU GraphIndex at 1M points (issue 11: "CPU indexes past ~1M points were not measured"; past
1,024 entry points the CPU's seeds are approximate). Builds the default CPU index of each set on
every core of the machine, then walks 1,000 unseen queries at beams 16-256 with the approximate
seeds (the default past 1,024 entries) and with exact seeds (``_entry._CPU_EXACT_SEEDS_MAX``
raised), recall@10 against exact neighbours (GPU ``knnkit.knn`` when there is one, ties forgiven
by distance). One JSON line per set and seed mode.

    PYTHONPATH=src python benchmarks/cpu_index_1m.py [n] > out.json
"""

import json
import os
import sys
import time

import numpy as np

import knnkit
from knnkit.datasets.suite import make_tight_clusters, make_uniform_cube
from knnkit.evaluate import recall
from knnkit.index import _entry

BEAMS = (16, 32, 64, 128, 256)


def sets(n):
    yield "tight_3000_d32", *make_tight_clusters(n, 32, 3000, 0.01, n_queries=1000, random_state=1)
    yield "uniform_d16", *make_uniform_cube(n, 16, n_queries=1000, random_state=2)


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    dev = "gpu" if knnkit.gpu_available() else "cpu"
    knnkit.GraphIndex.build(np.random.default_rng(0).random((5000, 16), dtype=np.float32), device="cpu")  # compile
    for name, X, Q in sets(n):
        gd, gi = knnkit.knn(X, Q, k=10, device=dev)
        gd, gi = np.asarray(gd.get() if hasattr(gd, "get") else gd), np.asarray(gi.get() if hasattr(gi, "get") else gi)
        t = time.perf_counter()
        index = knnkit.GraphIndex.build(X, device="cpu", random_state=0)
        build_s = time.perf_counter() - t
        n_entry = int(len(index._engine._entry))
        base = {"set": name, "n": int(X.shape[0]), "d": int(X.shape[1]), "threads": os.cpu_count(),
                "build_s": round(build_s, 2), "entries": n_entry, "graph_degree": index.graph_degree,
                "phases_s": {k: round(v, 3) for k, v in index.build_timings.items()},
                "calibration": index.calibration and dict(zip(index.calibration["beams"], index.calibration["recall"]))}
        for mode in ("approximate", "exact"):
            keep = _entry._CPU_EXACT_SEEDS_MAX
            if mode == "exact":
                _entry._CPU_EXACT_SEEDS_MAX = 1 << 30
            try:
                curve = []
                for beam in BEAMS:
                    index.search(Q[:50], k=10, beam=beam)  # warm
                    t = time.perf_counter()
                    d, i = index.search(Q, k=10, beam=beam)
                    s = time.perf_counter() - t
                    r = recall(i, gi, found_distances=d, true_distances=gd)
                    curve.append({"beam": beam, "recall": round(float(r), 4), "qps": round(len(Q) / s, 1)})
            finally:
                _entry._CPU_EXACT_SEEDS_MAX = keep
            print(json.dumps(dict(base, seeds=mode, curve=curve)), flush=True)


if __name__ == "__main__":
    main()
