"""Local intrinsic dimension against NN-Descent's stall: the data behind ``knnkit.graph.STALL_LID``.

    PYTHONPATH=src python benchmarks/lid_vs_stall.py --device cpu --n 30000 [--out DIR]
    PYTHONPATH=src python benchmarks/lid_vs_stall.py --device gpu --n 1000000 [--out DIR]

For each set (uniform cube, broad and tight clusters at several dimensions, ``make_clustered``,
SIFT-like uint8): the Levina-Bickel estimate at 5 and 20 neighbours, then ``knn_graph(k=10)``
twice in one process, A/B: ``descent`` with the pre-descent verdict off (``STALL_LID`` = inf:
the descent runs and its stall watch decides, as before the verdict existed) and ``verdict``
with the library default. Each row records the time, how the lists were made (descent, stall
watch -> exact, or verdict -> exact) and the recall of 1,000 rows against exact neighbours (ties
by distance). The first arm of the first set carries kernel compilation: a warm-up graph runs
before. Writes ``lid_vs_stall_<device>_<n>.json`` under ``--out`` (default ``$OUT``, else .).
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

import knnkit  # noqa: E402
import knnkit.graph as kgraph  # noqa: E402
from knnkit.datasets.suite import (make_broad_clusters, make_sift_like_uint8, make_tight_clusters,  # noqa: E402
                                   make_uniform_cube)
from knnkit.datasets.synthetic import make_clustered  # noqa: E402
from knnkit.graph._estimate import RecallProbe, estimate_intrinsic_dim  # noqa: E402


def sets(n, quick):
    dims = (32, 64, 128) if quick else (16, 32, 48, 64, 96, 128)
    out = [(f"uniform_d{d}", lambda d=d: make_uniform_cube(n, d, random_state=1)) for d in dims]
    out += [(f"broad_d{d}", lambda d=d: make_broad_clusters(n, d, random_state=1))
            for d in ((64, 128) if quick else (32, 64, 96, 128))]
    out += [(f"tight_c{n // 1000}_d{d}", lambda d=d: make_tight_clusters(n, d, max(2, n // 1000), random_state=1))
            for d in (64, 128)]
    out.append(("clustered_d128", lambda: make_clustered(n, 128, random_state=1)))
    out.append(("sift_like_u8", lambda: make_sift_like_uint8(n, random_state=1)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--n", type=int, default=30000)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sets", default=None, help="comma-separated names (default: all)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    xp = np
    if a.device == "gpu":
        import cupy as xp
    default_lid = kgraph.STALL_LID
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=HERE).stdout.strip()
    except Exception:
        commit = None
    rows = []
    warm = xp.asarray(make_uniform_cube(20000, 64, random_state=5))
    knnkit.knn_graph(warm, 10)
    names = None if a.sets is None else set(a.sets.split(","))
    for name, make in sets(a.n, a.quick):
        if names is not None and name not in names:
            continue
        X = make()
        X = X[0] if isinstance(X, tuple) else X
        X = xp.asarray(X)
        Xf = X.astype(xp.float32)
        t = time.perf_counter()
        lid5, lid20 = estimate_intrinsic_dim(Xf, random_state=0, scales=(5, 20))
        t_lid = time.perf_counter() - t
        probe = RecallProbe(Xf, 10, "l2", 1000, 12345)
        row = dict(set=name, n=int(X.shape[0]), d=int(X.shape[1]), dtype=str(X.dtype), lid20=round(lid20, 2),
                   lid5=round(lid5, 2), lid_s=round(t_lid, 4))
        for arm, lid in (("descent", math.inf), ("verdict", default_lid)):
            kgraph.STALL_LID = lid
            if a.device == "gpu":
                xp.cuda.Device().synchronize()
            t = time.perf_counter()
            g = knnkit.knn_graph(X, 10)
            if a.device == "gpu":
                xp.cuda.Device().synchronize()
            dt = time.perf_counter() - t
            st = g.stats
            stalled = st.get("stalled") or {}
            how = ("verdict -> exact" if stalled.get("before_descent") else
                   "watch -> exact" if st.get("exact_fallback") else "descent")
            row[arm] = dict(s=round(dt, 4), how=how, iterations=st.get("iterations"),
                            recall=round(probe.recall(Xf, xp.asarray(g.indices)), 5),
                            recall_estimate=st.get("recall_estimate"), stalled=st.get("stalled"))
        kgraph.STALL_LID = default_lid
        print(json.dumps(row), flush=True)
        rows.append(row)
    gpu = None
    if a.device == "gpu":
        gpu = xp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    out = dict(commit=commit, device=a.device, gpu=gpu, n=a.n, stall_lid=default_lid, rows=rows)
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, f"lid_vs_stall_{a.device}_{a.n}.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print("wrote", os.path.basename(path))


if __name__ == "__main__":
    main()
