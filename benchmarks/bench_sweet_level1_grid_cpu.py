"""Paired CPU timing of the grid level 1 and the straight k = 1 bands of Sweet KNN (eighteenth session).

    KNNKIT_DATA=<data dir> PYTHONPATH=src python benchmarks/bench_sweet_level1_grid_cpu.py \
        [--cases c245k,u245k,skin] [--k 1,20] [--repeats 5] [--out benchmarks/results/cpu/<name>.json]

All-points joins through ``knnkit.knn(X, k=k, method="sweet", device="cpu")`` with the new paths off
("old": ``_cpu._GRID_LEVEL1 = False``, ``_cpu._ONE_BAND = False``) and on ("new"), against
``cKDTree(X).query(X, k=k + 1, workers=-1)`` (build included), in one process, the three in rotated
order on every repeat after one untimed run each. Old and new must return identical ids and distances.
Reports min and median of the repeats and the ratios to cKDTree.
"""

import argparse
import datetime
import json
import logging
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))
sys.path.insert(0, HERE)

import knnkit  # noqa: E402
from knnkit.exact.sweet import _cpu  # noqa: E402
from scipy.spatial import cKDTree  # noqa: E402

from bench_sweet_vs_ckdtree import _data  # noqa: E402

log = logging.getLogger("bench_sweet_level1_grid_cpu")


def _set(new):
    _cpu._GRID_LEVEL1 = new
    _cpu._ONE_BAND = new


def run_case(name, X, k, repeats):
    def sweet(new):
        def fn():
            _set(new)
            r = knnkit.knn(X, k=k, method="sweet", device="cpu")
            return tuple(np.asarray(v) for v in r) if isinstance(r, tuple) else (np.asarray(r.indices), np.asarray(r.distances))
        return fn

    def tree():
        return cKDTree(X).query(X, k=k + 1, workers=-1)

    fns = {"old": sweet(False), "new": sweet(True), "ckdtree": tree}
    out = {key: fn() for key, fn in fns.items()}  # untimed: compilation, caches
    same = bool(np.array_equal(out["old"][0], out["new"][0]) and np.array_equal(out["old"][1], out["new"][1]))
    times = {key: [] for key in fns}
    keys = list(fns)
    for r in range(repeats):
        for key in keys[r % 3:] + keys[:r % 3]:
            t0 = time.perf_counter()
            fns[key]()
            times[key].append(time.perf_counter() - t0)
    _set(True)
    row = dict(case=name, n=int(X.shape[0]), d=int(X.shape[1]), k=k, identical=same,
               **{f"{key}_min": min(v) for key, v in times.items()},
               **{f"{key}_median": float(np.median(v)) for key, v in times.items()},
               times=times)
    for key in ("old", "new"):
        row[f"{key}_ratio_min"] = row[f"{key}_min"] / row["ckdtree_min"]
        row[f"{key}_ratio_median"] = row[f"{key}_median"] / row["ckdtree_median"]
    log.info("%s k=%d old %.3f/%.3f new %.3f/%.3f cKDTree %.3f/%.3f (min/median) ratio old %.2f new %.2f identical %s",
             name, k, row["old_min"], row["old_median"], row["new_min"], row["new_median"], row["ckdtree_min"],
             row["ckdtree_median"], row["old_ratio_min"], row["new_ratio_min"], same)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="c245k,u245k,skin")
    ap.add_argument("--k", default="1,20")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rows = []
    for name in a.cases.split(","):
        X = _data(name)
        for k in (int(v) for v in a.k.split(",")):
            rows.append(run_case(name, X, k, a.repeats))
    if a.out:
        import numba
        import scipy
        meta = dict(date=datetime.date.today().isoformat(), cpu_count=os.cpu_count(),
                    numba_threads=numba.get_num_threads(), scipy=scipy.__version__, numba=numba.__version__,
                    repeats=a.repeats, timing="old / new / cKDTree rotated in one process, after one untimed run "
                    "each; cKDTree includes the tree build; knnkit.knn(method='sweet', device='cpu')")
        with open(a.out, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
