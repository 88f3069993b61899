"""Index build stages with a module flag off and on, A/B in one process (issue 11, index build
<= 2 s on 1M hard data).

``--flag reverse`` (default): ``knnkit.index._reverse_gpu.FIRST_PASS_SKIPS_HUBS``: the hubs (nodes
with more new reverse edges than the first pass offers) are pruned again over their longer lists, so
their first-pass rows were thrown away. ``--flag few``: ``knnkit.index._connect.FEW_ON_DEVICE``, the
device repair of a few unreachable nodes (instead of the host copy and host BFS). Builds the default
GraphIndex on each set alternately with the flag off and on (``--rounds`` each, after a warm-up
build) and records the build time, the stage statistics and whether the graphs are identical
(``reverse``: they must be; ``few``: the repairs may differ).

    PYTHONPATH=src python benchmarks/build_flag_ab.py --sets broad_d128 --out $OUT
    PYTHONPATH=src python benchmarks/build_flag_ab.py --flag few --sets uniform_d128,sift_like_u8 --out $OUT
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

import numpy as np  # noqa: E402

import knnkit  # noqa: E402
from knnkit.datasets.suite import robustness_sets  # noqa: E402
from knnkit.index import _connect, _reverse_gpu  # noqa: E402

FLAGS = {"reverse": (_reverse_gpu, "FIRST_PASS_SKIPS_HUBS"), "few": (_connect, "FEW_ON_DEVICE")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", default="full")
    ap.add_argument("--sets", default="broad_d128")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--flag", choices=sorted(FLAGS), default="reverse")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    import cupy as cp

    sync = cp.cuda.Device().synchronize
    module, flag = FLAGS[a.flag]
    rows = []
    for name, X, _Q, metric in robustness_sets(a.scale, names=a.sets.split(","), real=False):
        Xd = cp.asarray(X)
        knnkit.GraphIndex.build(Xd, metric=metric, random_state=0)  # warm-up: kernels compiled
        sync()
        graphs = {}
        for r in range(a.rounds):
            for skip in (False, True):
                setattr(module, flag, skip)
                t = time.perf_counter()
                idx = knnkit.GraphIndex.build(Xd, metric=metric, random_state=0)
                sync()
                dt = time.perf_counter() - t
                g = idx.graph.get() if hasattr(idx.graph, "get") else np.asarray(idx.graph)
                graphs.setdefault(skip, g)
                rec = {"set": name, "n": int(X.shape[0]), "d": int(X.shape[1]), "round": r,
                       flag: skip, "index_build_s": dt, "reverse_edges": idx.build_params.get("reverse_edges"),
                       "connectivity": idx.build_params.get("connectivity"), "phases_s": idx.build_timings}
                print(json.dumps(rec, default=str), flush=True)
                rows.append(rec)
        same = bool(np.array_equal(graphs[False], graphs[True]))
        rows.append({"set": name, "graphs_identical": same})
        print(json.dumps(rows[-1]), flush=True)
    setattr(module, flag, True)
    env = {"gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
           "argv": ["$OUT" if x == a.out else x for x in sys.argv[1:]]}
    with open(os.path.join(a.out, f"build_ab_{a.flag}.json"), "w") as f:
        json.dump({"env": env, "rows": rows}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
