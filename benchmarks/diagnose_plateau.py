"""Why does GPU index recall plateau below 0.999 on some robustness sets? (issue 11, item 4)

For each set (scale "small"): build the GPU index with defaults, then at beam 512 compare
  default search | exact hash visited set instead of the Bloom filter | 4x max_iters |
  the same index searched by the CPU twin | the hierarchy entry structure | more seeds,
so that a plateau can be put on the graph (all searches equal), the visited set, the iteration
cap, or the entry points.

    PYTHONPATH=src python benchmarks/diagnose_plateau.py --sets tight_c10000,uniform_d128 > $OUT/plateau.json
"""

import argparse
import json
import sys
import time

import numpy as np

import knnkit
from knnkit._core.metrics import prepare_vectors
from knnkit.datasets.suite import robustness_sets
from knnkit.evaluate import recall

K = 10


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sets", default="tight_c10000,uniform_d128,skin_u8,duplicates")
    ap.add_argument("--scale", default="small")
    ap.add_argument("--beam", type=int, default=512)
    args = ap.parse_args()
    import cupy as cp

    from knnkit.index._search_gpu import search_gpu

    out = []
    for name, X, Q, metric in robustness_sets(args.scale, names=args.sets.split(","), real=True):
        Xd, Qd = cp.asarray(X), cp.asarray(Q)
        _, T = knnkit.knn(X, Q, k=K, metric=metric, device="gpu")
        T = np.asarray(T.get() if hasattr(T, "get") else T)
        row = {"set": name, "n": int(X.shape[0])}
        t0 = time.perf_counter()
        ix = knnkit.GraphIndex.build(Xd, metric=metric, device="gpu", random_state=0)
        row["build_s"] = round(time.perf_counter() - t0, 2)
        row["default_beam"] = ix.search_params.beam
        row["calibration"] = ix.calibration

        def rec(i):
            return round(float(recall(np.asarray(i.get() if hasattr(i, "get") else i), T)), 4)

        b = args.beam
        row["default_search"] = rec(ix.search(Qd, k=K, beam=b)[1])
        row["max_iters_x4"] = rec(ix.search(Qd, k=K, beam=b, max_iters=32 * b)[1])
        row["more_seeds_64"] = rec(ix.search(Qd, k=K, beam=b, n_seeds=64)[1])
        # the CPU twin on the same graph (200 queries: the CPU walk is slow at beam 512)
        i_cpu = ix.search(Q[:200], k=K, beam=b, device="cpu")[1]
        i_gpu = ix.search(Qd[:200], k=K, beam=b)[1]
        row["cpu_twin_first200"] = round(float(recall(np.asarray(i_cpu), T[:200])), 4)
        row["gpu_first200"] = round(float(recall(np.asarray(i_gpu.get()), T[:200])), 4)
        eng = ix._engine
        qp = prepare_vectors(Qd, eng.metric, eng.scale)
        beam, tau, iters, seeds_n = ix.search_params.resolve(K, {"beam": b, "tau": float("inf")},
                                                            n_entry=len(eng._entry))
        seeds = eng._entry.seeds_for(qp, seeds_n)
        for vis in ("hash", "bloom"):
            _d, i = search_gpu(eng._X, eng._graph, qp, K, seeds=seeds, beam=beam, tau=tau, max_iters=iters,
                               metric=eng._imetric, visited=vis)
            row[f"visited_{vis}"] = rec(i)
        ih = knnkit.GraphIndex.build(Xd, metric=metric, device="gpu", random_state=0, entry="hierarchy")
        row["hierarchy"] = rec(ih.search(Qd, k=K, beam=b)[1])
        row["hierarchy_beam64"] = rec(ih.search(Qd, k=K, beam=64)[1])
        row["kmeans_beam64"] = rec(ix.search(Qd, k=K, beam=64)[1])
        out.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
