"""Paired CPU timing of Sweet KNN against scipy's cKDTree (issue 13's CPU acceptance item).

    PYTHONPATH=src python benchmarks/bench_sweet_vs_ckdtree.py [--cases skin,u245k,...] [--k 20,1]
        [--repeats 3] [--out benchmarks/results/cpu/sweet_vs_ckdtree_<date>.json]

All-points joins: ``knnkit.knn(X, k=k, method="sweet", device="cpu")`` against
``cKDTree(X).query(X, k=k + 1, workers=-1)`` (tree build included; ``--threads 1``: one thread
each, self column included as
returned). The two run alternately in one process (the machine's 2 cores are shared with other
work, so runs far apart in time are not comparable), after one untimed run each; the minimum of
``--repeats`` is reported, with the 1-minute load average before and after each case. Sweet's
k-th (squared) distances are checked against cKDTree's (max relative difference).
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

import knnkit  # noqa: E402
from scipy.spatial import cKDTree  # noqa: E402

log = logging.getLogger("bench_sweet_vs_ckdtree")


def _skin():
    roots = [os.environ.get("KNNKIT_DATA"), os.path.join(HERE, "..", "..", "shared", "data")]
    for r in roots:
        p = os.path.join(r, "skin", "skin_rgb_u8.npy") if r else None
        if p and os.path.exists(p):
            return np.load(p).astype(np.float32)
    raise FileNotFoundError("skin_rgb_u8.npy not found (set KNNKIT_DATA)")


def _uniform(n):
    return knnkit.datasets.make_uniform(n, 3, random_state=0, device="cpu")


def _clustered(n):
    return knnkit.datasets.make_clustered(n, 3, random_state=0, device="cpu")


CASES = {
    "skin": _skin,
    "u245k": lambda: _uniform(245_057),
    "c245k": lambda: _clustered(245_057),
    "u1m": lambda: _uniform(1_000_000),
    "c1m": lambda: _clustered(1_000_000),
}


def _data(name):
    X = CASES[name]()
    if isinstance(X, tuple):
        X = X[0]
    return np.ascontiguousarray(np.asarray(X, dtype=np.float32))


def run_case(name, X, k, repeats, workers=-1):
    def sweet():
        return knnkit.knn(X, k=k, method="sweet", device="cpu")

    def tree():
        return cKDTree(X).query(X, k=k + 1, workers=workers)

    load0 = os.getloadavg()[0]
    rs, rt = sweet(), tree()  # untimed: compilation, caches
    ts, tt = [], []
    for _ in range(repeats):
        for fn, acc in ((sweet, ts), (tree, tt)):
            t0 = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - t0)
    ds = np.asarray(rs[0] if isinstance(rs, tuple) else rs.distances)[:, -1].astype(np.float64)
    dt = np.asarray(rt[0])[:, -1].astype(np.float64) ** 2  # knn reports squared Euclidean distances
    rel = float(np.max(np.abs(ds - dt) / np.maximum(dt, 1e-30)))
    row = dict(case=name, n=int(X.shape[0]), d=int(X.shape[1]), k=k, workers=workers, sweet_s=min(ts), ckdtree_s=min(tt),
               ratio=min(ts) / min(tt), sweet_all=ts, ckdtree_all=tt, kth_max_rel_diff=rel,
               load1_before=load0, load1_after=os.getloadavg()[0])
    log.info("%s k=%d sweet %.3f s cKDTree %.3f s ratio %.2f (load %.1f -> %.1f, kth rel diff %.1e)",
             name, k, row["sweet_s"], row["ckdtree_s"], row["ratio"], load0, row["load1_after"], rel)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="skin,u245k,c245k,u1m,c1m")
    ap.add_argument("--k", default="20,1")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--threads", type=int, default=0,
                    help="1: one thread each (numba threads 1, cKDTree workers=1), a per-core comparison "
                    "less exposed to other work on shared cores; 0: all cores")
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if a.threads:
        import numba
        numba.set_num_threads(a.threads)
    rows = []
    for name in a.cases.split(","):
        X = _data(name)
        for k in (int(v) for v in a.k.split(",")):
            rows.append(run_case(name, X, k, a.repeats, a.threads or -1))
    if a.out:
        import numba
        import scipy
        meta = dict(date=datetime.date.today().isoformat(), cpu_count=os.cpu_count(),
                    numba_threads=numba.get_num_threads(), scipy=scipy.__version__, numba=numba.__version__,
                    repeats=a.repeats, timing="alternating sweet/cKDTree in one process, min of repeats "
                    "after one untimed run each; cKDTree includes the tree build")
        with open(a.out, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
