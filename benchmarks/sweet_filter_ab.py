"""Sweet KNN's level-2 filter on the GPU: "full" against "partial" where the paper's rule
(``k / d > 8``: partial) applies, all points, median of 3 after a warm-up; ids checked equal.

    PYTHONPATH=src python benchmarks/sweet_filter_ab.py --out $OUT
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))
sys.path.insert(0, HERE)

from bench_sweet import clustered, uniform  # noqa: E402
from knnkit.exact.sweet import SweetParams, sweet_knn  # noqa: E402


def main():
    import cupy as cp

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    cases = [("uniform_d2", uniform(500_000, 2, 1)), ("clustered_d2", clustered(500_000, 2, 2)),
             ("uniform_d3", uniform(250_000, 3, 3)), ("clustered_d3", clustered(250_000, 3, 4))]
    rows = []
    for name, X in cases:
        Xd = cp.asarray(X)
        d = X.shape[1]
        for k in (17, 20, 32, 64, 100):
            if k / d <= 8:
                continue
            r = {"case": name, "n": X.shape[0], "k": k}
            ids = {}
            for f in ("full", "partial"):
                p = SweetParams(filter=f)
                sweet_knn(Xd, Xd, k, exclude_self=True, params=p)
                ts = []
                for _ in range(3):
                    cp.cuda.Device().synchronize()
                    t = time.perf_counter()
                    D, I, st = sweet_knn(Xd, Xd, k, exclude_self=True, params=p)
                    cp.cuda.Device().synchronize()
                    ts.append(time.perf_counter() - t)
                r[f + "_s"] = round(float(np.median(ts)), 4)
                ids[f] = I
            r["same_ids"] = bool((ids["full"] == ids["partial"]).all())
            print(json.dumps(r), flush=True)
            rows.append(r)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=HERE).stdout.strip()
    with open(os.path.join(a.out, "sweet_filter_ab.json"), "w") as f:
        json.dump({"gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "commit": commit, "rows": rows},
                  f, indent=1)


if __name__ == "__main__":
    main()
