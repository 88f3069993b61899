"""Would a lossy stash keep the answers? recall@10 of the host-placed (BANG) walk when the re-rank
pool (the ``beam`` PQ-best expanded nodes) is first ordered by distances to rounded vectors
(float16 with a power-of-two scale, or bfloat16), and only the ``k'`` best of that order get exact
distances; CPU twin, the suite's sets.

Why: in a GPU walk every expansion's full vector travels from the host (the stash: 384 of the 512
bytes a step moves per expansion at d = 96, and 6 of its 8 host cache lines). A 16-bit stash halves
that; the final exact re-rank then reads only ``k'`` full rows a query. This measures the recall that
costs before anything is built.

    PYTHONPATH=src python benchmarks/bang_lossy_stash_cpu.py [--n 50000] [--queries 300]
        [--beams 32,64,128] [--kprimes 10,12,16,20,32] [--out benchmarks/results/cpu/x.json]
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

from bang_bf16_cpu import recall, save, suite_indexes, walk_inputs  # noqa: E402
from knnkit.index.bang._pq import round_bf16  # noqa: E402
from knnkit.index.bang._search_cpu import search_pq_cpu  # noqa: E402


def rounded(X, kind):
    """``X`` as float64 after rounding its float32 values to ``kind`` ("f16": a power-of-two scale
    puts the largest magnitude near 2^10, then float16; "bf16": bfloat16, nearest even)."""
    X = np.asarray(X, dtype=np.float32)
    if kind == "bf16":
        return round_bf16(X.copy()).astype(np.float64)
    m = float(np.abs(X).max()) or 1.0
    s = 2.0 ** np.floor(np.log2(1024.0 / m))
    return ((X * s).astype(np.float16).astype(np.float64)) / s


def dist(Q, X, ids, metric):
    """(nq, m) distances of each query to its rows ``ids`` (float64; -1 ids get +inf)."""
    rows = X[np.maximum(ids, 0)]
    if metric == "inner_product":
        d = -np.einsum("qd,qmd->qm", Q, rows)
    else:
        d = ((rows - Q[:, None, :]) ** 2).sum(-1)
    return np.where(ids < 0, np.inf, d)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=50000)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--beams", default="32,64,128")
    ap.add_argument("--kprimes", default="10,12,16,20,32")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "cpu",
                                                  f"bang_lossy_stash_{datetime.date.today().isoformat()}.json"))
    a = ap.parse_args()
    beams = [int(b) for b in a.beams.split(",")]
    kprimes = [int(v) for v in a.kprimes.split(",")]
    res = {"params": dict(vars(a), out=os.path.relpath(a.out, os.path.join(HERE, ".."))), "rows": []}
    for name, metric, X, Q, index, build_s, td, ti in suite_indexes(a.n, a.queries, a.k):
        e, T, seeds = walk_inputs(index, Q)
        Xf = np.asarray(X, dtype=np.float64)
        Qf = np.asarray(Q, dtype=np.float64)
        lossy = {kind: rounded(X, kind) for kind in ("f16", "bf16")}
        for beam in beams:
            log_i, log_d, n_exp = search_pq_cpu(e._graph, e._codes, T, seeds, L=beam, max_iters=8 * beam, width=4)
            # the re-rank pool: the beam PQ-best logged expansions (what the stash holds rows for)
            order = np.argsort(log_d, axis=1, kind="stable")[:, :beam]
            pool = np.take_along_axis(log_i, order, axis=1)
            exact = dist(Qf, Xf, pool, metric)
            row = {"set": name, "metric": metric, "beam": beam, "build_s": round(build_s, 1),
                   "expansions_mean": float(n_exp.mean())}

            def top(d, ids, k):
                o = np.argsort(d, axis=1, kind="stable")[:, :k]
                return np.take_along_axis(ids, o, axis=1), np.take_along_axis(d, o, axis=1)

            I, D = top(exact, pool, a.k)
            row["recall_exact_rerank"] = recall(I, ti, td, D, a.k, metric)
            for kind, XL in lossy.items():
                approx = dist(Qf, XL, pool, metric)
                for kp in kprimes:
                    if kp > beam:
                        continue
                    cand, _ = top(approx, pool, kp)
                    I2, D2 = top(dist(Qf, Xf, cand, metric), cand, a.k)
                    row[f"recall_{kind}_k{kp}"] = recall(I2, ti, td, D2, a.k, metric)
            res["rows"].append(row)
            print(json.dumps(row), flush=True)
        save(res, a.out)


if __name__ == "__main__":
    main()
