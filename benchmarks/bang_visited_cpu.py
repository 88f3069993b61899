"""CPU cost of the order-independent visited test (issue 16, thirty-third session): the CPU twin's
walk (``_search_cpu.search_pq_cpu``) now tests a step's neighbours against the Bloom filter as it
was before the step, sorts and de-duplicates them, then marks them (``_bloom_step``); before, it
inserted them one by one. This times the walk of this tree against the walk of ``--baseline``
(its ``_search_cpu.py`` taken from git into a temporary module), same graph, codes, tables, seeds,
alternated, and reports how many logged expansions differ.

    PYTHONPATH=src python benchmarks/bang_visited_cpu.py --baseline 94ca78f --out benchmarks/results/cpu/x.json
"""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np


def load_baseline(commit):
    src = subprocess.run(["git", "show", f"{commit}:src/knnkit/index/bang/_search_cpu.py"], check=True,
                         capture_output=True, text=True).stdout
    src = src.replace("from ..._core.metrics import", "from knnkit._core.metrics import")
    d = tempfile.mkdtemp()
    path = os.path.join(d, "baseline_search_cpu.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location("baseline_search_cpu", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["baseline_search_cpu"] = mod
    spec.loader.exec_module(mod)
    return mod


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", default="94ca78f")
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--d", type=int, default=96)
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--beams", default="32,64")
    ap.add_argument("--width", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    import knnkit
    from knnkit.datasets.suite import make_broad_clusters
    from knnkit.index.bang import _search_cpu as new
    from knnkit.index.bang._pq import pq_tables

    old = load_baseline(a.baseline)
    X, Q = make_broad_clusters(a.n, a.d, n_queries=a.queries, random_state=1)
    t = time.perf_counter()
    index = knnkit.GraphIndex.build(X, placement="host", device="cpu", random_state=0)
    build_s = time.perf_counter() - t
    e = index._engine
    T = pq_tables(e.pq_queries(np.asarray(Q, np.float32)), e._codebook, e.pq_metric)
    res = {"baseline": a.baseline, "params": {k: v for k, v in vars(a).items() if k != "out"},
           "cpus": os.cpu_count(), "build_s": build_s, "rows": []}
    for L in [int(b) for b in a.beams.split(",")]:
        seeds = e._entry.seeds_for(np.asarray(Q, np.float32), 4)
        kw = dict(L=L, max_iters=8 * L, width=a.width)
        for mod in (old, new):  # compile
            mod.search_pq_cpu(e._graph, e._codes, T[:8], seeds[:8], **kw)
        times = {"baseline": [], "this": []}
        logs = {}
        for _ in range(a.reps):
            for name, mod in (("baseline", old), ("this", new)):
                t = time.perf_counter()
                logs[name] = mod.search_pq_cpu(e._graph, e._codes, T, seeds, **kw)
                times[name].append(time.perf_counter() - t)
        li_o, _, ne_o = logs["baseline"]
        li_n, _, ne_n = logs["this"]
        same = float(np.mean([np.array_equal(li_o[q, :ne_o[q]], li_n[q, :ne_n[q]]) for q in range(len(ne_o))]))
        row = {"beam": L, "baseline_s": times["baseline"], "this_s": times["this"], "queries_same_log": same,
               "expansions_mean": [float(ne_o.mean()), float(ne_n.mean())]}
        res["rows"].append(row)
        print(json.dumps(row), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
