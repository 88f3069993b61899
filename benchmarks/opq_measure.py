"""Does OPQ pay for BANG's PQ walk? (issue 16: "optional OPQ rotation if it pays (measure)").

For robustness sets (first 50,000 points, 300 held-out queries), PQ and OPQ codebooks trained on a
20,000-point sample with ``m = ceil(d / dsub)`` subspaces; for each query every point is ranked by
its PQ (asymmetric) distance, and the script reports recall@10 of the PQ top 10 and of the PQ top
100 (what a re-rank of 100 would see). CPU only (NumPy + Numba).

    PYTHONPATH=src KNNKIT_DATA=... python benchmarks/opq_measure.py --sets broad_clusters,siftsmall --dsub 8
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

import numpy as np  # noqa: E402

from knnkit.datasets.suite import robustness_sets  # noqa: E402
from knnkit.exact._cpu import knn_cpu  # noqa: E402
from knnkit.index.bang._pq import encode, pq_tables, train_opq, train_pq  # noqa: E402


def pq_top(X, Q, m, codebook, rotation, depth=100):
    codes = encode(X, codebook, rotation=rotation)
    T = pq_tables(Q, codebook, "l2", rotation)
    top = np.empty((Q.shape[0], depth), np.int64)
    cols = np.arange(m)[None, :]
    for qi in range(Q.shape[0]):
        dq = T[qi][cols, codes].sum(1)
        part = np.argpartition(dq, depth)[:depth]
        top[qi] = part[np.argsort(dq[part])]
    return top


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sets", default="broad_clusters,sift_like_u8,manifold,siftsmall")
    ap.add_argument("--dsub", type=int, default=2, help="dimensions per subspace (m = ceil(d / dsub))")
    ap.add_argument("--out", default=None, help="JSON file to write")
    a = ap.parse_args()
    rows = []
    for name, X, Q, metric in robustness_sets("small", names=a.sets.split(","), n_queries=300):
        if metric != "sqeuclidean":
            continue
        X = np.asarray(X, np.float32)[:50000]
        Q = np.asarray(Q, np.float32)[:300]
        d = X.shape[1]
        m = max(1, -(-d // a.dsub))
        _dist, truth = knn_cpu(X, Q, 10, "l2", False)
        S = X[np.random.default_rng(0).choice(len(X), min(20000, len(X)), replace=False)]
        t = time.perf_counter()
        cb = train_pq(S, m)
        t_pq = time.perf_counter() - t
        t = time.perf_counter()
        R, cbo = train_opq(S, m)
        t_opq = time.perf_counter() - t
        for label, rot, C, tt in (("pq", None, cb, t_pq), ("opq", R, cbo, t_opq)):
            top = pq_top(X, Q, m, C, rot)
            r10 = np.mean([len(set(top[i, :10]) & set(truth[i])) for i in range(len(Q))]) / 10
            r100 = np.mean([len(set(top[i, :100]) & set(truth[i])) for i in range(len(Q))]) / 10
            row = dict(set=name, d=d, m=m, dsub=-(-d // m), method=label, recall10_at10=round(float(r10), 4),
                       recall10_at100=round(float(r100), 4), train_s=round(tt, 1))
            print(json.dumps(row), flush=True)
            rows.append(row)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
