"""RSFK on every robustness-suite set (issue 14): ``knn_graph(method="rsfk")`` with default
parameters (trees added until the estimated recall reaches 0.95) against ``method="nndescent"``
defaults, recall@10 on 1000 sampled rows (ties by distance) and seconds, one process.

    PYTHONPATH=src python benchmarks/rsfk_suite.py --device cpu --scale ci --out benchmarks/results/cpu/rsfk_suite_ci.json
"""

import argparse
import json
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

import knnkit  # noqa: E402
from knnkit.datasets.suite import robustness_sets  # noqa: E402
from knnkit.evaluate import graph_recall  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--scale", default="ci")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.chdir(os.path.dirname(HERE))
    knnkit.set_progress(False)
    rows = []
    for name, X, _Q, metric in robustness_sets(a.scale, random_state=0):
        row = {"set": name, "n": int(X.shape[0]), "d": int(X.shape[1]), "dtype": str(X.dtype), "metric": metric}
        for method in ("rsfk", "nndescent"):
            knnkit.knn_graph(X[:2000], k=10, metric=metric, method=method, device=a.device, random_state=0)
            t = time.perf_counter()
            g = knnkit.knn_graph(X, k=10, metric=metric, method=method, device=a.device, random_state=0)
            secs = time.perf_counter() - t
            rec = graph_recall(X, g, sample=1000, metric=metric, random_state=0, ties=True)
            row[method] = {"seconds": round(secs, 3), "recall": round(float(rec), 4),
                           "trees": g.stats.get("trees"), "recall_estimate": g.stats.get("recall_estimate"),
                           "nne_rounds": g.stats.get("nne_rounds"), "stop_reason": g.stats.get("stop_reason"),
                           "switch": g.stats.get("switch")}
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(a.out, "w") as f:
        json.dump({"device": a.device, "scale": a.scale, "machine": platform.machine(), "cpus": os.cpu_count(),
                   "knnkit": knnkit.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
