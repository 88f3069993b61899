"""Where does a GPU GraphIndex build spend its time on hard data (issue 11: build <= 2 s at 1M)?

Builds the default index of one robustness set under cProfile (the GPU synchronised at the end of
each phase by the build's own timers), prints the build phases, the candidate graph's statistics
and the 40 most expensive functions by cumulative time; also times ``knnkit.knn_graph`` defaults.

    PYTHONPATH=src python benchmarks/profile_index_build.py --set broad_clusters --scale full --out $OUT
"""

import argparse
import cProfile
import dataclasses
import io
import json
import os
import pstats
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

import knnkit  # noqa: E402
from knnkit.datasets.suite import robustness_sets  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", default="broad_clusters")
    ap.add_argument("--scale", default="full")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    import cupy as cp

    (name, X, Q, metric), = robustness_sets(a.scale, names=[a.set], real=False)
    Xg = cp.asarray(X)
    knnkit.GraphIndex.build(Xg[:20000], metric=metric)  # compile the kernels
    cp.cuda.Device().synchronize()
    t = time.perf_counter()
    g = knnkit.knn_graph(Xg, k=10, metric=metric)
    cp.cuda.Device().synchronize()
    res = {"set": name, "n": int(X.shape[0]), "d": int(X.shape[1]), "knn_graph_s": round(time.perf_counter() - t, 3),
           "knn_graph_stats": dataclasses.asdict(g.stats) if g.stats is not None else None}
    pr = cProfile.Profile()
    t = time.perf_counter()
    pr.enable()
    index = knnkit.GraphIndex.build(Xg, metric=metric)
    cp.cuda.Device().synchronize()
    pr.disable()
    res["index_build_s"] = round(time.perf_counter() - t, 3)
    res["phases_s"] = {k: round(v, 4) for k, v in index.build_timings.items()}
    res["build_params"] = {k: v for k, v in index.build_params.items() if k != "random_state"}
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(45)
    # file names relative to the repository (or the site-packages folder): no path of this machine
    root = os.path.dirname(HERE) + os.sep
    res["profile_top"] = [re.sub(r"\S*site-packages/", "<site-packages>/", line.replace(root, ""))
                          for line in s.getvalue().splitlines()[:80]]
    print(json.dumps({k: v for k, v in res.items() if k != "profile_top"}, default=str, indent=1), file=sys.stderr)
    print("\n".join(res["profile_top"]), file=sys.stderr)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, f"profile_build_{name}.json"), "w") as f:
        json.dump(res, f, default=str, indent=1)


if __name__ == "__main__":
    main()
