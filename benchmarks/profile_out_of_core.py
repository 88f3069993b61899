"""Profile of the out-of-core build's main thread (where the per-merge overhead goes).

    PYTHONPATH=src python benchmarks/profile_out_of_core.py --n 2000000 --d 96 --budget-gib 1 --out DIR

Writes make_clustered data as .fbin, runs knn_graph_out_of_core under cProfile (background
reader/writer threads are not profiled: they overlap the compute) and writes the top functions by
own and cumulative time, plus the manifest's per-step timing sums, to DIR/profile_out_of_core.txt.
"""

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import tempfile
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2_000_000)
    ap.add_argument("--d", type=int, default=96)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--budget-gib", type=float, default=1.0)
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "knnkit-prof"))
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    import cupy as cp
    import knnkit

    shutil.rmtree(a.workdir, ignore_errors=True)
    os.makedirs(a.workdir)
    path = os.path.join(a.workdir, "data.fbin")
    X = knnkit.datasets.make_clustered(a.n, a.d, random_state=0, device="gpu")
    knnkit.io.write(path, cp.asnumpy(X))
    knnkit.knn_graph(X[:200_000], k=a.k, method="nndescent")  # compile
    del X
    cp.get_default_memory_pool().free_all_blocks()
    budget = int(a.budget_gib * 2 ** 30)
    knnkit.set_memory_budget(budget)
    knnkit.set_progress(False)
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    knnkit.knn_graph_out_of_core(path, k=a.k, workdir=os.path.join(a.workdir, "w"), memory_budget=budget)
    prof.disable()
    total = time.perf_counter() - t
    s = io.StringIO()
    s.write(f"n={a.n} d={a.d} budget={a.budget_gib} GiB total {total:.2f} s\n")
    with open(os.path.join(a.workdir, "w", "manifest.json")) as f:
        man = json.load(f)
    sums = {}
    for step, rec in man["done"].items():
        kind = step.split("_")[0]
        for key, v in (rec.get("times") or rec).items():
            if isinstance(v, (int, float)):
                sums.setdefault(kind, {}).setdefault(key, 0.0)
                sums[kind][key] += v
    s.write(json.dumps(sums, indent=1) + "\n")
    for order in ("tottime", "cumulative"):
        pstats.Stats(prof, stream=s).sort_stats(order).print_stats(35)
    txt = s.getvalue()
    print(txt[:6000])
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "profile_out_of_core.txt"), "w") as f:
        f.write(txt)


if __name__ == "__main__":
    main()
