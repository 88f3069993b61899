"""Sweet KNN on the CPU, all points, d <= 3: level 2 over each cluster's octants (``_octant_order``;
``_ONE_OCTANTS`` for k = 1, ``_DIRECT_OCTANTS`` above) against the one-landmark shell scan, paired
with scipy's cKDTree (build + query of k + 1, ``workers=-1``) in one process, rotated (off, on,
cKDTree) for ``--repeats`` rounds after a warm-up. Checks that both Sweet KNN runs give identical
ids and distances.

    PYTHONPATH=src python benchmarks/sweet_octants_ab.py --cases c245k,u245k --k 1,20 --repeats 7 --out F.json
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="c245k,u245k")
    ap.add_argument("--k", default="1")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from scipy.spatial import cKDTree

    import bench_sweet_vs_ckdtree as cases
    from knnkit.exact.sweet import SweetParams
    from knnkit.exact.sweet import _cpu as engine

    rows = []
    for name, k in [(c, int(kk)) for c in args.cases.split(",") for kk in args.k.split(",")]:
        X = np.ascontiguousarray(cases._data(name), dtype=np.float32)
        times = {"shell": [], "octants": [], "ckdtree": []}
        result, ndist, phases = {}, {}, {}
        for rep in range(args.repeats + 1):
            for arm in times:
                t = time.perf_counter()
                if arm == "ckdtree":
                    cKDTree(X).query(X, k=k + 1, workers=-1)
                else:
                    engine._ONE_OCTANTS = engine._DIRECT_OCTANTS = arm == "octants"
                    D, I, st = engine.sweet_cpu(X, X, k, SweetParams(), 0, True)
                    result[arm] = (D, I)
                    ndist[arm] = st["distance_computations"] / X.shape[0]
                    phases[arm] = {k: round(v, 4) for k, v in st["times"].items()}
                if rep:  # the first round warms (compiles)
                    times[arm].append(time.perf_counter() - t)
        engine._ONE_OCTANTS = engine._DIRECT_OCTANTS = True
        same = bool(np.array_equal(result["shell"][1], result["octants"][1])
                    and np.array_equal(result["shell"][0], result["octants"][0]))
        r = {"case": name, "n": int(X.shape[0]), "d": int(X.shape[1]), "k": k, "identical": same,
             "distances_per_query": {a: round(v, 2) for a, v in ndist.items()}, "last_phases": phases}
        for arm, v in times.items():
            r[f"{arm}_min_s"] = round(min(v), 4)
            r[f"{arm}_median_s"] = round(float(np.median(v)), 4)
        for arm in ("shell", "octants"):
            r[f"{arm}_over_ckdtree_min"] = round(r[f"{arm}_min_s"] / r["ckdtree_min_s"], 3)
            r[f"{arm}_over_ckdtree_median"] = round(r[f"{arm}_median_s"] / r["ckdtree_median_s"], 3)
        rows.append(r)
        print(json.dumps(r), flush=True)
    out = {"benchmark": "sweet_octants_ab", "cpu_count": os.cpu_count(), "repeats": args.repeats,
           "load1": os.getloadavg()[0], "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
