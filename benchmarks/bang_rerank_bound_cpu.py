"""Could the host-placed (BANG) re-rank skip candidates and still give the answers of ``rerank = L``?
A study on the CPU twin (nothing of it is in the library).

Bound: with ``e_x = |x - c - x_hat|`` (the PQ residual of point x; c the PQ's centre) and the
query's PQ distance ``p = |q - c - x_hat|^2`` (bfloat16 tables: exact within a factor 1 + 2^-8),
the exact squared distance is at least ``(max(0, sqrt(p / (1 + 2^-7)) - e_x))^2`` (triangle
inequality, with slack). Two passes: exact distances of the ``r0`` PQ-best logged candidates give
a k-th distance D_k; only the other candidates whose bound is at most D_k can enter the top k.
This counts those rows per query and checks that the answers equal the full re-rank's.

    PYTHONPATH=src python benchmarks/bang_rerank_bound_cpu.py [--n 50000] [--queries 300]
        [--out benchmarks/results/cpu/bang_rerank_bound_<date>.json]

Sets: the squared-L2 sets of ``bang_bf16_cpu.py``.
"""

import argparse
import datetime
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "src"))

import knnkit  # noqa: E402
from bang_bf16_cpu import sets  # noqa: E402
from knnkit._core.metrics import prepare_vectors  # noqa: E402
from knnkit.index.bang._pq import pq_tables, reconstruct  # noqa: E402
from knnkit.index.bang._search_cpu import search_pq_cpu  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=50000)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--beams", default="32,64,128,256")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "cpu",
                                                  f"bang_rerank_bound_{datetime.date.today().isoformat()}.json"))
    a = ap.parse_args()
    k = a.k
    res = {"params": dict(vars(a), out=os.path.relpath(a.out, os.path.join(HERE, ".."))), "rows": []}
    for name, metric, (X, Q) in sets(a.n, a.queries):
        if metric != "sqeuclidean":
            continue
        index = knnkit.GraphIndex.build(X, placement="host", device="cpu", metric=metric, random_state=0)
        e = index._engine
        if e._rotation is not None:
            continue
        Xp = prepare_vectors(np.ascontiguousarray(X), e.metric, e.scale).astype(np.float32)
        c = e._center if e._center is not None else 0
        ex = np.sqrt(((Xp - c - reconstruct(np.asarray(e._codes), e._codebook, Xp.shape[1])) ** 2).sum(1))
        qh = prepare_vectors(np.ascontiguousarray(Q), e.metric, e.scale)
        T = pq_tables(e.pq_queries(qh), e._codebook, e.pq_metric, e._rotation)
        seeds = e._entry.seeds_for(qh, 4)
        for L in [int(b) for b in a.beams.split(",")]:
            li, ld, _ne = search_pq_cpu(e._graph, e._codes, T, seeds, L=L, max_iters=8 * L, width=4)
            order = np.argsort(ld, axis=1, kind="stable")[:, :L]
            cand = np.take_along_axis(li, order, 1)
            pqd = np.take_along_axis(ld, order, 1)
            valid = cand >= 0
            exact = np.where(valid, ((Xp[np.maximum(cand, 0)] - qh[:, None, :]) ** 2).sum(-1), np.inf)
            exact = exact.astype(np.float32)
            ref = np.sort(exact, 1)[:, :k]
            lb = np.maximum(0, np.sqrt(pqd / (1 + 2 ** -7)) - ex[np.maximum(cand, 0)]) ** 2 * (1 - 1e-5)
            row = {"set": name, "beam": L, "candidates_mean": float(valid.sum(1).mean()),
                   "residual_over_nn_distance": float(np.median(ex) / np.median(np.sqrt(ref[:, 0])))}
            for r0 in (k, 2 * k):
                Dk = np.sort(exact[:, :r0], 1)[:, k - 1]
                need = valid & (lb <= Dk[:, None])
                need[:, :r0] = valid[:, :r0]
                got = np.sort(np.where(need, exact, np.inf), 1)[:, :k]
                nrows = need.sum(1)
                row[f"r0_{r0}"] = {"rows_mean": float(nrows.mean()), "rows_p99": float(np.percentile(nrows, 99)),
                                   "same_answers": bool(np.array_equal(got, ref))}
            res["rows"].append(row)
            print(json.dumps(row), flush=True)
        os.makedirs(os.path.dirname(a.out), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
