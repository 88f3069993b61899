"""A/B of the calibration's hold-out graph on the CPU: redoing only the rows the held-out points
change (``index._engine.HOLDOUT_PARTIAL``, default) against a whole second diversification.

    PYTHONPATH=src python benchmarks/holdout_partial_ab.py [--sets broad_clusters,skewed_norms_ip]
        [--scale small] [--repeats 2] [--out benchmarks/results/cpu/holdout_partial_ab_<date>.json]

Per set and arm (alternating): ``GraphIndex.build(device="cpu")``; the hold-out graph's seconds,
the whole build's, and whether the two arms' calibration curves are identical (same graph).
"""

import argparse
import datetime
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

import knnkit  # noqa: E402
from knnkit.datasets.suite import robustness_sets  # noqa: E402
from knnkit.index import _engine  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", default="broad_clusters,skewed_norms_ip")
    ap.add_argument("--scale", default="small")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    res = dict(benchmark="holdout_partial_ab", date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
               cpu_count=os.cpu_count(), sets=[])
    for name, X, _Q, metric in robustness_sets(a.scale, names=a.sets.split(","), real=False):
        runs = {"whole": [], "partial": []}
        curves = {}
        for _rep in range(a.repeats):
            for arm in ("whole", "partial"):
                _engine.HOLDOUT_PARTIAL = arm == "partial"
                t = time.perf_counter()
                idx = knnkit.GraphIndex.build(X, metric=metric, device="cpu", random_state=0)
                total = time.perf_counter() - t
                runs[arm].append(dict(build_s=round(total, 2),
                                      holdout_graph_s=round(idx.build_timings.get("holdout_graph", float("nan")), 3)))
                curves[arm] = (idx.calibration or {}).get("recall")
        row = dict(name=name, n=int(X.shape[0]), d=int(X.shape[1]), metric=metric, runs=runs,
                   same_calibration=curves["whole"] == curves["partial"], calibration=curves["partial"])
        res["sets"].append(row)
        print(json.dumps(row), flush=True)
    _engine.HOLDOUT_PARTIAL = True
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
