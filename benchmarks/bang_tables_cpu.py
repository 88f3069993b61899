"""Host-placed (BANG) search on the CPU: PQ tables by the direct kernel (``_pq.TABLE_METHOD =
"direct"``, the default) against the GEMM expansion ("gemm"), alternated on the same index and
queries; the walk and the re-rank are the same, so the difference is the table step.

    PYTHONPATH=src python benchmarks/bang_tables_cpu.py [--n 100000] [--d 96] [--queries 2000] [--reps 3]
        [--out benchmarks/results/cpu/bang_tables_<date>.json]
"""

import argparse
import datetime
import json
import os
import sys
import time


HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

import knnkit  # noqa: E402
from knnkit.datasets import suite  # noqa: E402
from knnkit.index.bang import _pq  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100000)
    ap.add_argument("--d", type=int, default=96)
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--beams", default="32,64")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "cpu",
                                                  f"bang_tables_{datetime.date.today().isoformat()}.json"))
    a = ap.parse_args()
    X, Q = suite.make_broad_clusters(a.n, a.d, n_queries=a.queries, random_state=1)
    index = knnkit.GraphIndex.build(X, placement="host", device="cpu", random_state=0)
    res = {"params": dict(vars(a), out=os.path.relpath(a.out, os.path.join(HERE, ".."))), "cpus": os.cpu_count(),
           "rows": []}
    for beam in [int(b) for b in a.beams.split(",")]:
        out = {}
        for rep in range(a.reps):
            for method in ("gemm", "direct"):
                _pq.TABLE_METHOD = method
                t = time.perf_counter()
                T = _pq.pq_tables(index._engine.pq_queries(Q), index._engine._codebook, index._engine.pq_metric)
                t_tables = time.perf_counter() - t
                t = time.perf_counter()
                _D, ids = index.search(Q, k=10, beam=beam)
                dt = time.perf_counter() - t
                out.setdefault(method, []).append({"search_s": dt, "tables_s": t_tables, "ids": ids})
                del T
        _pq.TABLE_METHOD = "direct"
        row = {"beam": beam, "same_ids": float((out["gemm"][0]["ids"] == out["direct"][0]["ids"]).mean())}
        for method, runs in out.items():
            row[f"{method}_search_s"] = [r["search_s"] for r in runs]
            row[f"{method}_tables_s"] = [r["tables_s"] for r in runs]
        res["rows"].append(row)
        print(json.dumps(row), flush=True)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
