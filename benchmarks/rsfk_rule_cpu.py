"""RSFK's default stopping rule on the CPU (issue 14): ``knn_graph(method="rsfk")`` with default
parameters on the robustness generators at CPU sizes, recall@10 against exact neighbours
(``graph_recall``, 1000 sampled rows, ties by distance) and seconds; also the trees, NNE rounds and
stop reason recorded in the graph's stats. The uniform sets and the inner-product set are those where
trees alone stall; ``manifold`` and ``tight_clusters`` are sets where a few trees suffice (the rule
must not slow them).

    PYTHONPATH=src python benchmarks/rsfk_rule_cpu.py --out benchmarks/results/cpu/rsfk_rule_after.json
"""

import argparse
import json
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if os.environ.get("PYTHONPATH") is None:
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

import knnkit  # noqa: E402
from knnkit.datasets import suite  # noqa: E402
from knnkit.evaluate import graph_recall  # noqa: E402

SETS = {
    "uniform_20k_d32": (lambda: suite.make_uniform_cube(20_000, 32, random_state=1), "sqeuclidean"),
    "uniform_20k_d128": (lambda: suite.make_uniform_cube(20_000, 128, random_state=2), "sqeuclidean"),
    "uniform_10k_d960": (lambda: suite.make_uniform_cube(10_000, 960, random_state=3), "sqeuclidean"),
    "skewed_norms_ip_20k_d64": (lambda: suite.make_skewed_norms(20_000, 64, random_state=4), "inner_product"),
    "manifold_20k_d128": (lambda: suite.make_manifold(20_000, 128, intrinsic=4, random_state=5), "sqeuclidean"),
    "tight_c200_20k_d64": (lambda: suite.make_tight_clusters(20_000, 64, 200, random_state=6), "sqeuclidean"),
}
STATS = ("trees", "nne_rounds", "stop_reason", "recall_estimate", "recall_per_round", "switch", "nne_stop", "exact_fallback")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--sets", nargs="*", default=list(SETS))
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    knnkit.set_progress(False)
    rows = []
    for name in a.sets:
        make, metric = SETS[name]
        X = make()
        X = X[0] if isinstance(X, tuple) else X
        knnkit.knn_graph(X[:2000], k=10, metric=metric, method="rsfk", random_state=0)  # JIT warm-up
        t = time.perf_counter()
        g = knnkit.knn_graph(X, k=10, metric=metric, method="rsfk", random_state=0)
        secs = time.perf_counter() - t
        rec = graph_recall(X, g, sample=1000, metric=metric, random_state=0, ties=True)
        st = g.stats if isinstance(g.stats, dict) else g.stats.__dict__
        extra = st.get("extra", {}) if isinstance(st.get("extra"), dict) else {}
        info = {k: (st.get(k) if st.get(k) is not None else extra.get(k)) for k in STATS}
        row = {"set": name, "n": int(X.shape[0]), "d": int(X.shape[1]), "metric": metric,
               "seconds": round(secs, 3), "recall": round(float(rec), 4), **info}
        rows.append(row)
        print(json.dumps(row, default=str), flush=True)
    with open(a.out, "w") as f:
        json.dump({"label": a.label, "device": "cpu", "machine": platform.machine(), "cpus": os.cpu_count(),
                   "rows": rows}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
