"""Candidates of the CPU's denser tier: the low tier's walk for every row (``"walk"``) against each
row's two-hop graph neighbourhood (``"two_hop"``), paired in one process on the suite sets that
take the denser tier (uniform 32-d, SIFT-like uint8; 100k, 1,000 queries, k = 10).

Records the build time, the denser step's seconds, the calibrated recall at beam 64, and recall
against exact neighbours of the generated queries at beams 32 / 64 / 128 with QPS.

Usage: ``PYTHONPATH=src python benchmarks/denser_candidates_cpu.py --out FILE.json [--n 100000]
[--modes walk,two_hop,walk@97]`` (``walk@B``: the walk at beam B).
"""
import argparse
import json
import time

import numpy as np

import knnkit
from knnkit import GraphIndex
from knnkit.api import index as api_index
from knnkit.datasets.suite import make_sift_like_uint8, make_uniform_cube


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--modes", default="walk,two_hop")
    a = ap.parse_args()
    sets = {"uniform_d32": make_uniform_cube(a.n, 32, n_queries=1000, random_state=0),
            "sift_like_u8": make_sift_like_uint8(a.n, n_queries=1000, random_state=0)}
    rows = []
    for name, (X, Q) in sets.items():
        want_d, _ = knnkit.knn(X, Q, k=10, device="cpu")
        for mode in a.modes.split(","):
            # "walk@B": the walk at beam B (default DENSER_SEARCH_BEAM)
            api_index.DENSER_CANDIDATES, _, beam = mode.partition("@")
            api_index.DENSER_SEARCH_BEAM = int(beam) if beam else 128
            t = time.perf_counter()
            index = GraphIndex.build(X, device="cpu", random_state=0)
            tb = time.perf_counter() - t
            rec = {"set": name, "mode": mode, "build_s": round(tb, 3),
                   "denser": index.build_params.get("denser"),
                   "candidates": index.build_params.get("candidates"),
                   "phases": {k: round(v, 3) for k, v in index._engine.build_timings.items()}}
            for beam in (32, 64, 128):
                index.search(Q[:50], k=10, beam=beam)
                t = time.perf_counter()
                d, _i = index.search(Q, k=10, beam=beam)
                dt = time.perf_counter() - t
                r = float(np.mean(d <= want_d[:, -1:] * (1 + 1e-6) + 1e-12))
                rec[f"b{beam}"] = [round(r, 4), round(Q.shape[0] / dt)]
            rows.append(rec)
            print(json.dumps(rec), flush=True)
    with open(a.out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
