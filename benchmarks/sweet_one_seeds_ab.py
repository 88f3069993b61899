"""A/B of the k = 1 Morton-neighbour seeds of Sweet KNN's CPU level 2 (``_ONE_SEEDS``), paired in one
process with scipy's cKDTree (build + query, ``workers=-1``): all-points k = 1 on clustered and
uniform 3-D 245k and skin, the three rotated each round after one untimed run each; min and
median of ``--repeats``; identical ids and distances checked between the two Sweet KNN runs.

    PYTHONPATH=src python benchmarks/sweet_one_seeds_ab.py [--repeats 7] [--cases c245k,u245k,skin]
        [--out benchmarks/results/cpu/sweet_one_seeds_<date>.json]
"""

import argparse
import datetime
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))
sys.path.insert(0, HERE)

import knnkit  # noqa: E402
from scipy.spatial import cKDTree  # noqa: E402

from bench_sweet_vs_ckdtree import CASES  # noqa: E402
import knnkit.exact.sweet._cpu as sweet_cpu  # noqa: E402


def _sweet(X, seeds):
    sweet_cpu._ONE_SEEDS = seeds
    t = time.perf_counter()
    d, i = knnkit.knn(X, k=1, method="sweet", device="cpu")
    return time.perf_counter() - t, d, i


def _tree(X):
    t = time.perf_counter()
    cKDTree(X).query(X, k=2, workers=-1)
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--cases", default="c245k,u245k,skin")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = []
    for name in a.cases.split(","):
        X = np.ascontiguousarray(CASES[name](), dtype=np.float32)
        runs = {"seeds": lambda: _sweet(X, True)[0], "no_seeds": lambda: _sweet(X, False)[0], "ckdtree": lambda: _tree(X)}
        _, d1, i1 = _sweet(X, True)
        _, d0, i0 = _sweet(X, False)
        same = bool(np.array_equal(i1, i0) and np.array_equal(d1, d0))
        _tree(X)
        times = {m: [] for m in runs}
        order = list(runs)
        load0 = os.getloadavg()[0]
        for rep in range(a.repeats):
            for m in order[rep % 3:] + order[:rep % 3]:
                times[m].append(runs[m]())
        sweet_cpu._ONE_SEEDS = True
        r = {"case": name, "n": int(X.shape[0]), "identical": same,
             "min_s": {m: round(min(v), 4) for m, v in times.items()},
             "median_s": {m: round(float(np.median(v)), 4) for m, v in times.items()},
             "load1": [round(load0, 2), round(os.getloadavg()[0], 2)]}
        r["seeds_over_ckdtree_min"] = round(r["min_s"]["seeds"] / r["min_s"]["ckdtree"], 3)
        r["no_seeds_over_ckdtree_min"] = round(r["min_s"]["no_seeds"] / r["min_s"]["ckdtree"], 3)
        rows.append(r)
        print(json.dumps(r), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"benchmark": "sweet_one_seeds_ab", "date": datetime.date.today().isoformat(),
                       "cpu_count": os.cpu_count(), "repeats": a.repeats, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
