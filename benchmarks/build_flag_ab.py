"""Index build stages with a module flag off and on, A/B in one process (issue 11, index build
<= 2 s on 1M hard data).

``--flag reverse`` (default): ``knnkit.index._reverse_gpu.FIRST_PASS_SKIPS_HUBS``: the hubs (nodes
with more new reverse edges than the first pass offers) are pruned again over their longer lists, so
their first-pass rows were thrown away. ``--flag few``: ``knnkit.index._connect.FEW_ON_DEVICE``, the
device repair of a few unreachable nodes (instead of the host copy and host BFS). Builds the default
GraphIndex on each set alternately with the flag off and on (``--rounds`` each, after a warm-up
build) and records the build time, the stage statistics and whether the graphs are identical
(``reverse``: they must be; ``few``: the repairs may differ). ``--flag tc``:
``knnkit.index._prune_gpu.USE_TENSOR_CORES``, RobustPrune's pairwise distances on tensor cores (fp16,
bands skipped once R are kept) against the fp32 kernel: graphs differ on near-ties, so ``--beams``
adds each build's recall@10 on the suite's queries (exact ground truth, ties forgiven) at those
beams and the share of edges the two graphs have in common. ``--flag allkept``:
``knnkit.index._build.SKIP_PRUNE_WHEN_ALL_KEPT``, the first prune skipped when no candidate list is
longer than R (the GPU's top tier): graphs must be identical. ``--flag defer``:
``knnkit.index._calibrate.DEFER_AT_BUILD``, the GPU calibration's beams 3072 / 4096 left for the
first ``search(target_recall=)`` that needs them: graphs identical; each build also records its
calibration and the time of its first ``search(target_recall=0.99)`` over the suite's queries
(which measures the deferred beams first).

    PYTHONPATH=src python benchmarks/build_flag_ab.py --sets broad_d128 --out $OUT
    PYTHONPATH=src python benchmarks/build_flag_ab.py --flag few --sets uniform_d128,sift_like_u8 --out $OUT
    PYTHONPATH=src python benchmarks/build_flag_ab.py --flag tc --sets broad_d128 --beams 64,256,1024 --out $OUT
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
from knnkit.evaluate import recall  # noqa: E402
from knnkit.index import _build, _calibrate, _connect, _prune_gpu, _reverse_gpu  # noqa: E402

FLAGS = {"reverse": (_reverse_gpu, "FIRST_PASS_SKIPS_HUBS"), "few": (_connect, "FEW_ON_DEVICE"),
         "tc": (_prune_gpu, "USE_TENSOR_CORES"), "allkept": (_build, "SKIP_PRUNE_WHEN_ALL_KEPT"),
         "defer": (_calibrate, "DEFER_AT_BUILD")}


def _edge_agreement(a, b):
    """Mean over rows of |row_a & row_b| / |row_a| (valid ids only)."""
    same = tot = 0
    for ra, rb in zip(a, b):
        sa = set(ra[ra >= 0].tolist())
        same += len(sa & set(rb[rb >= 0].tolist()))
        tot += len(sa)
    return same / max(tot, 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", default="full")
    ap.add_argument("--sets", default="broad_d128")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--flag", choices=sorted(FLAGS), default="reverse")
    ap.add_argument("--beams", default="", help="comma-separated beams: recall@10 of each build")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    beams = [int(b) for b in a.beams.split(",") if b]
    import cupy as cp

    sync = cp.cuda.Device().synchronize
    module, flag = FLAGS[a.flag]
    rows = []
    for name, X, Q, metric in robustness_sets(a.scale, names=a.sets.split(","), real=False):
        Xd = cp.asarray(X)
        if beams:
            Qd = cp.asarray(Q)
            gt_d, gt_i = knnkit.knn(Xd, Qd, k=10, metric=metric)
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
                curve = {}
                for beam in beams:
                    D, I = idx.search(Qd, 10, beam=beam)
                    curve[beam] = round(float(recall(I, gt_i, found_distances=D, true_distances=gt_d,
                                                     similarity=metric == "inner_product")), 4)
                if a.flag == "defer":
                    cal0 = dict(idx.calibration or {})
                    Qd = cp.asarray(Q)
                    t = time.perf_counter()
                    idx.search(Qd, 10, target_recall=0.99)
                    sync()
                    curve["first_target_0.99_s"] = round(time.perf_counter() - t, 4)
                    curve["calibration_at_build"] = cal0
                    curve["calibration_after"] = idx.calibration
                rec = {"set": name, "n": int(X.shape[0]), "d": int(X.shape[1]), "round": r,
                       flag: skip, "index_build_s": dt, "reverse_edges": idx.build_params.get("reverse_edges"),
                       "connectivity": idx.build_params.get("connectivity"), "phases_s": idx.build_timings,
                       "recall_at_beam": curve}
                print(json.dumps(rec, default=str), flush=True)
                rows.append(rec)
        same = bool(np.array_equal(graphs[False], graphs[True]))
        rows.append({"set": name, "graphs_identical": same,
                     "edge_agreement": None if same else round(_edge_agreement(graphs[True], graphs[False]), 5)})
        print(json.dumps(rows[-1]), flush=True)
    setattr(module, flag, True)
    env = {"gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
           "argv": ["$OUT" if x == a.out else x for x in sys.argv[1:]]}
    with open(os.path.join(a.out, f"build_ab_{a.flag}.json"), "w") as f:
        json.dump({"env": env, "rows": rows}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
