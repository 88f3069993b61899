"""Where the connectivity stage of ``GraphIndex.build`` spends its time (GPU or CPU): builds the
index of one robustness set under cProfile and prints the functions of the repair by cumulative
time, with the build's connectivity statistics.

    PYTHONPATH=src python benchmarks/profile_connectivity.py --set tight_c1000 --scale full --device gpu
"""

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

import knnkit  # noqa: E402
from knnkit.datasets.suite import robustness_sets  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", default="tight_c1000")
    ap.add_argument("--scale", default="full")
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    knnkit.set_progress(False)
    (name, X, _Q, metric), = robustness_sets(a.scale, names=[a.set], real=False)
    if a.device == "gpu":
        import cupy as cp

        X = cp.asarray(X)
        knnkit.GraphIndex.build(X[:150_000], metric=metric, random_state=0)  # compile the kernels
    pr = cProfile.Profile()
    t = time.perf_counter()
    pr.enable()
    index = knnkit.GraphIndex.build(X, metric=metric, random_state=0)
    pr.disable()
    print(f"{name} {a.scale}: build {time.perf_counter() - t:.2f} s (under cProfile)")
    print(json.dumps({"phases_s": {k: round(v, 3) for k, v in index.build_timings.items()},
                      "connectivity": index.build_params.get("connectivity")}, indent=1))
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(a.top)
    print(s.getvalue())
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(a.top)
    print(s.getvalue())


if __name__ == "__main__":
    main()
