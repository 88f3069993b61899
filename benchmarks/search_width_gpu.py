"""Nodes expanded per step (``width``) of the device-placed GPU search, by beam, on robustness-suite
sets (issue 11: QPS at 0.95 / 0.99 on hard 1M data). The index is built once per set with default
parameters; every (beam, width) pair searches the same queries (best of ``--repeat`` timed calls
after one warm-up call); recall@10 with ties forgiven, against an exact search.

    PYTHONPATH=src python benchmarks/search_width_gpu.py --sets broad_d128,uniform_d128 --out DIR
"""
import argparse
import json
import os
import subprocess
import sys
import time


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
import knnkit  # noqa: E402
from knnkit.datasets.suite import robustness_sets  # noqa: E402
from knnkit.evaluate import recall  # noqa: E402
from knnkit.index import _search_gpu  # noqa: E402

K = 10


def _commit():
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except Exception:  # noqa: BLE001
        return None


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--sets", default="broad_d128,uniform_d128,broad_clusters,tight_c10000")
    ap.add_argument("--scale", default="full")
    ap.add_argument("--queries", type=int, default=10000)
    ap.add_argument("--beams", default="32,64,128,256,512,1024,2048,4096")
    ap.add_argument("--widths", default="1,2,4,8")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--out", default=".")
    args = ap.parse_args(argv)
    import cupy as cp

    os.makedirs(args.out, exist_ok=True)
    doc = {"commit": _commit(), "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
           "gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
           "params": dict(vars(args), out=os.path.basename(os.path.normpath(args.out))), "sets": {}}
    widths = [int(w) for w in args.widths.split(",")]
    beams = [int(b) for b in args.beams.split(",")]
    for name, X, Q, metric in robustness_sets(args.scale, names=args.sets.split(","), real=False,
                                              n_queries=args.queries):
        t = time.perf_counter()
        TD, TI = knnkit.knn(X, Q, k=K, metric=metric, device="gpu")
        TD, TI = cp.asnumpy(TD), cp.asnumpy(TI)
        t_truth = time.perf_counter() - t
        t = time.perf_counter()
        index = knnkit.GraphIndex.build(X, metric=metric, device="gpu", random_state=0)
        cp.cuda.get_current_stream().synchronize()
        entry = {"n": int(X.shape[0]), "d": int(X.shape[1]), "metric": metric, "truth_s": round(t_truth, 3),
                 "index_build_s": round(time.perf_counter() - t, 3), "graph_degree": index.graph_degree,
                 "default_beam": index.search_params.beam, "rows": []}
        Qd = cp.asarray(Q)
        for b in beams:
            for w in widths:
                _search_gpu.DEFAULT_WIDTH = w
                try:
                    index.search(Qd[:256], k=K, beam=b)
                except ValueError as e:  # past the shared-memory limit
                    entry["rows"].append({"beam": b, "width": w, "error": str(e)})
                    continue
                best = float("inf")
                for _ in range(args.repeat):
                    cp.cuda.get_current_stream().synchronize()
                    t = time.perf_counter()
                    D, I = index.search(Qd, k=K, beam=b)
                    cp.cuda.get_current_stream().synchronize()
                    best = min(best, time.perf_counter() - t)
                r = float(recall(cp.asnumpy(I), TI, found_distances=cp.asnumpy(D), true_distances=TD,
                                 similarity=metric == "inner_product", eps=1e-3))
                row = {"beam": b, "width": w, "recall": round(r, 4), "qps": round(len(Q) / best, 1)}
                entry["rows"].append(row)
                print(name, json.dumps(row), flush=True)
        _search_gpu.DEFAULT_WIDTH = None
        doc["sets"][name] = entry
        del index
        cp.get_default_memory_pool().free_all_blocks()
    with open(os.path.join(args.out, "search_width.json"), "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
