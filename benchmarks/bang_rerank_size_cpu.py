"""How many expanded nodes the host-placed (BANG) walk must re-rank: recall@10 against ``rerank``
below the beam, on the CPU twin (the GPU walks and re-ranks the same values, so recall transfers).

The default re-ranks every one of the ``L`` PQ-best expanded nodes (``rerank = L``), and during a GPU
walk the host gathers the vector of every expansion for it (the stash): at large beams that is most
of the host's work. This measures, per set and beam, the recall at smaller ``rerank`` and, from the
walk's logs, how many of the expansions could never have entered the final ``rerank`` best: an
expansion whose PQ distance is larger than the ``rerank``-th best logged before it (the log only
grows, so that bound only tightens).

    PYTHONPATH=src python benchmarks/bang_rerank_size_cpu.py [--n 50000] [--queries 300]
        [--beams 16,32,64,128,256] [--reranks 10,16,24,32,64] [--out benchmarks/results/cpu/x.json]

Sets: those of ``bang_bf16_cpu.py`` (``knnkit.datasets.suite``).
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
from bang_bf16_cpu import recall, save, suite_indexes, walk_inputs  # noqa: E402
from knnkit.index.bang._search_cpu import search_pq_cpu  # noqa: E402


def never_needed(log_d, n_exp, rerank):
    """Fraction of the logged expansions whose PQ distance exceeds the ``rerank``-th smallest
    logged before them (they cannot be among the final ``rerank`` best)."""
    skip = total = 0
    for q in range(log_d.shape[0]):
        d = log_d[q, :n_exp[q]]
        total += d.size
        if d.size <= rerank:
            continue
        best = np.sort(d[:rerank])
        for j in range(rerank, d.size):
            if d[j] > best[-1]:
                skip += 1
            else:  # it enters the running top-rerank
                best = np.sort(np.append(best[:-1], d[j]))
    return skip / max(1, total)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=50000)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--beams", default="16,32,64,128,256")
    ap.add_argument("--reranks", default="10,16,24,32,64")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "cpu",
                                                  f"bang_rerank_size_{datetime.date.today().isoformat()}.json"))
    a = ap.parse_args()
    beams = [int(b) for b in a.beams.split(",")]
    reranks = [int(r) for r in a.reranks.split(",")]
    res = {"params": dict(vars(a), out=os.path.relpath(a.out, os.path.join(HERE, ".."))), "rows": []}
    for name, metric, X, Q, index, build_s, td, ti in suite_indexes(a.n, a.queries, a.k):
        e, T, seeds = walk_inputs(index, Q)
        for beam in beams:
            row = {"set": name, "metric": metric, "beam": beam, "build_s": build_s, "pq_bytes": e.pq_bytes}
            for rr in sorted(set([r for r in reranks if r <= beam] + [max(a.k, beam)])):
                D, I = index.search(Q, k=a.k, beam=beam, params=knnkit.index.SearchParams(rerank=rr))
                row[f"recall_rr{rr}"] = recall(I, ti, td, D, a.k, metric)
            if metric != "inner_product":
                _li, log_d, n_exp = search_pq_cpu(e._graph, e._codes, T, seeds, L=beam, max_iters=8 * beam, width=4)
                row["expansions_mean"] = float(n_exp.mean())
                for rr in [r for r in reranks if r < beam] + [beam]:
                    row[f"never_needed_rr{rr}"] = never_needed(log_d, n_exp, rr)
            res["rows"].append(row)
            print(json.dumps(row), flush=True)
        save(res, a.out)


if __name__ == "__main__":
    main()
