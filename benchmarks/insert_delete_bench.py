"""Recall after deletes (with compaction) and after inserts (extend), each against a rebuild on the
same points (issue 15, "Deletes and inserts").

For each robustness-suite set (default: tight_c1000, broad_clusters, uniform_d32 at scale "ci" x 3):
  * delete 10 % / 50 % of the points at random, compact, recall@10 of the default search vs a
    GraphIndex built on the remaining points (ground truth: exact over the remaining points);
  * build on a base part, extend by 10 % / 50 % / 100 % more points, recall vs a rebuild on all.

    PYTHONPATH=src python benchmarks/insert_delete_bench.py --device cpu > benchmarks/results/insert_delete/cpu.json
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

import knnkit
from knnkit.datasets.suite import robustness_sets
from knnkit.evaluate import recall

K = 10


def host(a):
    return np.asarray(a.get() if hasattr(a, "get") else a)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--scale", default="ci")
    ap.add_argument("--sets", default="tight_c1000,broad_clusters,uniform_d32")
    args = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = {"commit": commit, "device": args.device, "cpus": os.cpu_count(), "k": K, "rows": []}
    rng = np.random.default_rng(0)
    for name, X, Q, metric in robustness_sets(args.scale, names=args.sets.split(","), real=False):
        n = X.shape[0]

        def rec(index, Xs, ids):
            _, T = knnkit.knn(Xs, Q, k=K, metric=metric, device="cpu")
            _, i = index.search(Q, k=K)
            return float(recall(host(i), ids[T]))

        for frac in (0.1, 0.5):
            dele = rng.choice(n, int(frac * n), replace=False)
            live = np.setdiff1d(np.arange(n), dele)
            ix = knnkit.GraphIndex.build(X, metric=metric, device=args.device, random_state=0)
            t = time.perf_counter()
            ix.delete(dele, compact=False)
            r_tomb = rec(ix, X[live], live)
            ix.compact()
            t_c = time.perf_counter() - t
            r = rec(ix, X[live], live)
            rb = knnkit.GraphIndex.build(X[live], metric=metric, device=args.device, random_state=0)
            _, T = knnkit.knn(X[live], Q, k=K, metric=metric, device="cpu")
            r_re = float(recall(host(rb.search(Q, k=K)[1]), T))
            row = {"set": name, "n": n, "op": f"delete {int(frac * 100)}%", "recall_tombstones": round(r_tomb, 4),
                   "recall_after_compact": round(r, 4), "recall_rebuild": round(r_re, 4),
                   "compact_s": round(t_c, 2)}
            out["rows"].append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
        for frac in (0.1, 0.5, 1.0):
            base = int(n / (1 + frac))
            ix = knnkit.GraphIndex.build(X[:base], metric=metric, device=args.device, random_state=0)
            t = time.perf_counter()
            ix.extend(X[base:])
            t_e = time.perf_counter() - t
            r = rec(ix, X, np.arange(n))
            rb = knnkit.GraphIndex.build(X, metric=metric, device=args.device, random_state=0)
            r_re = rec(rb, X, np.arange(n))
            row = {"set": name, "n": n, "op": f"insert {int(frac * 100)}%", "recall_after_extend": round(r, 4),
                   "recall_rebuild": round(r_re, 4), "extend_s": round(t_e, 2)}
            out["rows"].append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
