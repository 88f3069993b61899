"""Filtered search: recall and QPS at 50 / 10 / 1 / 0.1 % selectivity, knnkit vs hnswlib's filter
(CPU) or cuVS CAGRA's bitset filter (GPU, when ``import cuvs`` works: not yet wired).

    PYTHONPATH=src python benchmarks/filter_bench.py --device cpu --n 100000 --d 32 --out benchmarks/results/filter

Recall@10 against exact search over the passing points (``knnkit.knn(filter=)``); the same random
mask for every query; knnkit at its default search parameters (the filter path chooses over-fetch
or exact by selectivity), hnswlib (M=16, ef_construction=200) at ef = 64 and 256.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

import knnkit  # noqa: E402

K = 10


def _recall(i, t):
    return sum(len(set(a[a >= 0]) & set(b[b >= 0])) for a, b in zip(i, t)) / max(1, int((t >= 0).sum()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--d", type=int, default=32)
    ap.add_argument("--nq", type=int, default=1000)
    ap.add_argument("--hnsw-queries", type=int, default=50)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    knnkit.set_progress(False)
    X, Q = knnkit.datasets.make_clustered(args.n, args.d, n_queries=args.nq, random_state=0, device="cpu")
    t0 = time.perf_counter()
    index = knnkit.GraphIndex.build(X, device=args.device, random_state=0)
    rows = []
    doc = {"benchmark": "filter_bench", "n": args.n, "d": args.d, "nq": args.nq, "device": args.device,
           "index_build_s": round(time.perf_counter() - t0, 2), "platform": platform.platform(),
           "cpu_count": os.cpu_count(),
           "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()}
    try:
        import hnswlib

        t0 = time.perf_counter()
        h = hnswlib.Index(space="l2", dim=args.d)
        h.init_index(max_elements=args.n, M=16, ef_construction=200, random_seed=0)
        h.add_items(X, np.arange(args.n))
        doc["hnswlib_build_s"] = round(time.perf_counter() - t0, 2)
    except ImportError:
        h = None
    rng = np.random.default_rng(1)
    for sel in (0.5, 0.1, 0.01, 0.001):
        mask = rng.random(args.n) < sel
        _d, T = knnkit.knn(X, Q, k=K, device=args.device, filter=mask)
        index.search(Q[:10], k=K, filter=mask)  # warm-up
        t0 = time.perf_counter()
        _d, i = index.search(Q, k=K, filter=mask)
        dt = time.perf_counter() - t0
        row = {"selectivity": sel, "passing": int(mask.sum()), "knnkit_recall": round(_recall(np.asarray(i), T), 4),
               "knnkit_qps": round(args.nq / dt, 1)}
        if h is not None:
            # its Python filter callable is slow at low selectivity: a query subset bounds the time
            nh = min(args.nq, args.hnsw_queries)
            for ef in (64, 256):
                h.set_ef(ef)
                t0 = time.perf_counter()
                hi, _hd = h.knn_query(Q[:nh], k=K, filter=lambda j: bool(mask[j]))
                dt = time.perf_counter() - t0
                row[f"hnswlib_ef{ef}_recall"] = round(_recall(hi.astype(np.int64), T[:nh]), 4)
                row[f"hnswlib_ef{ef}_qps"] = round(nh / dt, 1)
            row["hnswlib_queries"] = nh
        rows.append(row)
        print(json.dumps(row), flush=True)
        doc["rows"] = rows
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"filter_{args.device}.json"), "w") as f:  # after every row
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
