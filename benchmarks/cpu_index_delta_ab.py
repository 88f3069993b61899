"""CPU index builds with NN-Descent's stop rule for the candidate lists at two values, A/B in one
process (issue 11: the CPU build against hnswlib's). ``knnkit.index._build.INDEX_DELTA_CPU``: the
descent stops once a round updates fewer than ``delta * n * K`` list entries. For each robustness
set (small scale) the default ``GraphIndex.build(device="cpu")`` runs alternately with each value
(``--rounds`` each, after a warm-up); recorded: build time and phases, the descent's iterations and
updates, the candidate method, the calibrated recall at beam 64, the default beam, and recall@10
of the suite's queries at beams 16 / 32 / 64 and the default (exact ground truth, ties forgiven).

    PYTHONPATH=src python benchmarks/cpu_index_delta_ab.py --deltas 0.01,0.04 --sets sift_like_u8,skin_u8

``--unseen N``: instead, the generators of ``benchmarks/unseen_probe.py`` (``--sets`` names them) at
N points, 300 held-out rows as queries, recall@10 (ties by float64 distance) at the default beam and
at 128, each value of delta in turn.
"""

import argparse
import json
import os
import sys
import time

import numpy as np

import knnkit
import knnkit.graph.nndescent._cpu as nd_cpu
from knnkit.datasets.suite import robustness_sets
from knnkit.evaluate import recall
from knnkit.index import _build

KEEP = _build.INDEX_DELTA_CPU  # the module's own value, restored at the end
NNDESCENT_SETS = ("uniform_d32", "tight_c1000", "broad_clusters", "duplicates", "manifold", "skewed_norms_ip",
                  "points_2d", "sift_like_u8", "skin_u8", "fashion_mnist_u8")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deltas", default="0.01,0.04")
    ap.add_argument("--sets", default=",".join(NNDESCENT_SETS))
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--unseen", type=int, default=0)
    a = ap.parse_args()
    deltas = [float(x) for x in a.deltas.split(",")]
    if a.unseen:
        return unseen(a.unseen, a.sets.split(","), deltas)
    descents = []
    orig = nd_cpu.nndescent_cpu

    def spy(*args, **kw):
        out = orig(*args, **kw)
        descents.append({"iterations": out[2]["iterations"], "updates": out[2]["updates"]})
        return out

    nd_cpu.nndescent_cpu = spy
    knnkit.GraphIndex.build(robustness_sets("ci", names=["manifold"], real=False)[0][1], device="cpu")  # compile
    for name, X, Q, metric in robustness_sets("small", names=a.sets.split(","), real=True):
        gd, gi = knnkit.knn(X, Q, k=10, metric=metric, device="cpu")
        sim = metric == "inner_product"
        for r in range(a.rounds):
            for delta in deltas:
                _build.INDEX_DELTA_CPU = delta
                descents.clear()
                t = time.perf_counter()
                idx = knnkit.GraphIndex.build(X, metric=metric, device="cpu", random_state=0)
                dt = time.perf_counter() - t
                cal = idx.calibration or {}
                curve = {}
                for beam in (16, 32, 64, None):
                    d, i = idx.search(Q, k=10, beam=beam)
                    curve["default" if beam is None else beam] = round(float(
                        recall(i, gi, found_distances=d, true_distances=gd, similarity=sim)), 4)
                print(json.dumps({"set": name, "round": r, "delta": delta, "build_s": round(dt, 3),
                                  "phases_s": {k: round(v, 3) for k, v in idx.build_timings.items()},
                                  "descents": list(descents), "candidates": idx.build_params.get("candidates"),
                                  "graph_degree": idx.graph_degree, "denser": idx.build_params.get("denser"),
                                  "calibrated_at_64": dict(zip(cal.get("beams", []), cal.get("recall", []))).get(64),
                                  "default_beam": idx.search_params.beam, "recall": curve}, default=str), flush=True)
    _build.INDEX_DELTA_CPU = KEEP


def unseen(n, names, deltas):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import unseen_probe as up

    for name, gen, metric in up.SETS + up.SETS2:
        if name not in names:
            continue
        B, Q = up.held_out_split(gen(n + 300))
        for delta in deltas:
            _build.INDEX_DELTA_CPU = delta
            t = time.perf_counter()
            idx = knnkit.GraphIndex.build(B, metric=metric, random_state=0, device="cpu")
            dt = time.perf_counter() - t
            r = up.tie_recall(B, Q, np.asarray(idx.search(Q, 10)[1]), metric)
            r128 = up.tie_recall(B, Q, np.asarray(idx.search(Q, 10, beam=128)[1]), metric)
            print(json.dumps({"set": name, "n": int(len(B)), "delta": delta, "build_s": round(dt, 3),
                              "default_beam": idx.search_params.beam, "recall_default": round(float(r), 4),
                              "recall_128": round(float(r128), 4), "graph_degree": idx.graph_degree,
                              "candidates": idx.build_params.get("candidates")}, default=str), flush=True)
    _build.INDEX_DELTA_CPU = KEEP


if __name__ == "__main__":
    sys.exit(main())
