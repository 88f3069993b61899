"""The exact GEMM path on low-dimensional data where the float32 certificate fails (GPU).

On 2-D / 3-D clustered data nearly every row's neighbour gaps are below the rounding bound of
the float32 GEMM keys, so the rows are recomputed in float64. This times ``knnkit.knn(X, k=k,
method="gemm")`` (all points) with the float64 threshold lists (``topk_rows_within_f64``, the
default) and with the former sorting fallback (``_rows_float64``: forced by setting
``_WITHIN_MAX_DIM = 0``), checks that both return the same ids and distances, and records how
many rows failed the certificate. cuVS brute_force (when it imports) and ``method="auto"``
(Sweet KNN here) in the same run.

    PYTHONPATH=src python benchmarks/gemm_lowd_fallback.py --out $OUT
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

import knnkit  # noqa: E402
from bench_sweet import clustered  # noqa: E402


def _timed(fn, reps=3):
    import cupy as cp

    fn()
    cp.cuda.Device().synchronize()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        out = fn()
        cp.cuda.Device().synchronize()
        best = min(best, time.perf_counter() - t)
    return best, out


def main():
    import cupy as cp

    from knnkit.exact import _gpu

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--old-max-n", type=int, default=250_000, help="largest n timed with the former fallback")
    a = ap.parse_args()
    knnkit.set_progress(False)
    try:
        from cuvs.neighbors import brute_force
    except Exception:
        brute_force = None
    rng = np.random.default_rng(0)
    cases = [("clustered_d2", lambda n: clustered(n, 2, 2)), ("clustered_d3", lambda n: clustered(n, 3, 3)),
             ("uniform_d2", lambda n: rng.random((n, 2), dtype=np.float32))]
    rows = []
    for name, gen in cases:
        for n in (250_000, 500_000):
            Xd = cp.asarray(gen(n))
            for k in (1, 20):
                r = {"case": name, "n": n, "k": k}
                t, (d, i) = _timed(lambda: knnkit.knn(Xd, k=k, method="gemm"))
                r["gemm_s"], r["fallback_rows"] = round(t, 4), int(_gpu.knn_gpu.last_fallback)
                if n <= a.old_max_n:
                    keep = _gpu._WITHIN_MAX_DIM
                    _gpu._WITHIN_MAX_DIM = 0
                    try:
                        t2, (d2, i2) = _timed(lambda: knnkit.knn(Xd, k=k, method="gemm"), reps=1)
                    finally:
                        _gpu._WITHIN_MAX_DIM = keep
                    r["gemm_former_fallback_s"] = round(t2, 4)
                    r["same_ids"] = bool((i == i2).all())
                    r["same_distances"] = bool((d == d2).all())
                t3, _ = _timed(lambda: knnkit.knn(Xd, k=k))
                r["auto_s"] = round(t3, 4)
                if brute_force is not None:
                    idx = brute_force.build(Xd)
                    t4, _ = _timed(lambda: brute_force.search(idx, Xd, k + 1))
                    r["cuvs_brute_force_s"] = round(t4, 4)
                print(json.dumps(r), flush=True)
                rows.append(r)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=HERE).stdout.strip()
    doc = {"gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "commit": commit, "rows": rows}
    with open(os.path.join(a.out, "gemm_lowd_fallback.json"), "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
