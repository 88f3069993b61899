"""How large the host-placed (BANG) walk's per-query Bloom filter must be, on the CPU twin (issue 16).

The filter (4.4) was sized, until the thirty-eighth session, for ``max_iters`` expansions (default
``max(64, 8 L)``), while a walk makes about ``L + 2 W + 16`` (``_search_gpu.stash_slots``): at beam
32 it took 32 KB of the
~86 KB of GPU search state per query, and under a memory budget that state decides how many queries
a call walks. A smaller filter only raises its false-positive rate, so that a few unvisited
neighbours are skipped (never a wrong answer): this measures what that costs in recall. The CPU twin
walks the GPU's filter bit for bit, so recall here is the GPU's.

Sizings (words, a power of two >= the need, at least 1024): ``max_iters`` ((max_iters R + s) / 2,
the sizing before the thirty-eighth session), and ``a<f>`` = the need for ``min(max_iters, f L +
4 W + 32)`` expansions, for several ``f`` (``a2`` is the library's sizing since, ``bloom_expansions``).
Per set and beam: recall@10 (ties by distance), the words and KB per query, the expansions of the
longest 1 % of walks, the fraction of queries whose ids equal the ``max_iters`` sizing's.

    PYTHONPATH=src python benchmarks/bang_bloom_cpu.py [--n 30000] [--queries 500] [--beams 16,32,64,128]
        [--factors 1,2,4] [--out benchmarks/results/cpu/bang_bloom_<date>.json]
"""

import argparse
import datetime
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "src"))

from bang_bf16_cpu import recall, save, suite_indexes, walk_inputs  # noqa: E402

from knnkit.index.bang import _search_cpu  # noqa: E402

LIBRARY = _search_cpu.bloom_words_for


def sized_for(expansions=None):
    """A ``bloom_words_for`` stand-in sized for ``min(max_iters, expansions)`` expansions (None:
    ``max_iters``, the sizing before the thirty-eighth session)."""
    def words(max_iters, R, s, **_kw):
        e = int(max_iters) if expansions is None else min(int(max_iters), int(expansions))
        return LIBRARY(e, R, s, L=e, W=0)  # (L = e: bloom_expansions(e, 0) >= e, so e rules)
    return words


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=30000)
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--beams", default="16,32,64,128")
    ap.add_argument("--factors", default="1,2,4", help="a of a L + 4 W + 32 expansions")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "cpu",
                                                  f"bang_bloom_{datetime.date.today().isoformat()}.json"))
    a = ap.parse_args()
    beams = [int(b) for b in a.beams.split(",")]
    factors = [int(f) for f in a.factors.split(",")]
    W = 4  # SearchParams' default search width
    res = {"params": dict(vars(a), out=os.path.relpath(a.out, os.path.join(HERE, ".."))), "rows": []}
    for name, metric, X, Q, index, build_s, td, ti in suite_indexes(a.n, a.queries, a.k):
        R = int(index._engine._graph.shape[1])
        for beam in beams:
            max_iters = max(64, 8 * beam)  # SearchParams.resolve's default
            row = {"set": name, "metric": metric, "beam": beam, "R": R, "build_s": build_s}
            ids = {}
            for label, fn in [("max_iters", sized_for())] + [(f"a{f}", sized_for(f * beam + 4 * W + 32))
                                                             for f in factors]:
                _search_cpu.bloom_words_for = fn
                try:
                    t = time.perf_counter()
                    D, I = index.search(Q, k=a.k, beam=beam)
                    row[f"seconds_{label}"] = time.perf_counter() - t
                finally:
                    _search_cpu.bloom_words_for = LIBRARY
                row[f"recall_{label}"] = recall(I, ti, td, D, a.k, metric)
                row[f"kb_{label}"] = fn(max_iters, R, 4) * 4 / 1024
                ids[label] = I
            for label in ids:
                row[f"same_ids_{label}"] = float((ids[label] == ids["max_iters"]).all(axis=1).mean())
            # the walk's expansions (one log per query, 4 seeds as walk_inputs makes them): how long walks are
            e, T, seeds = walk_inputs(index, Q)
            _ids, _d, n_exp = _search_cpu.search_pq_cpu(e._graph, e._codes, T, seeds, L=beam, max_iters=max_iters,
                                                        width=W)
            n_exp = np.asarray(n_exp)
            row["expansions_mean"] = float(n_exp.mean())
            row["expansions_p99"] = float(np.percentile(n_exp, 99))
            row["expansions_max"] = int(n_exp.max())
            res["rows"].append(row)
            print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
        save(res, a.out)


if __name__ == "__main__":
    main()
