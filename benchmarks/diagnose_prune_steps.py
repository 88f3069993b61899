"""Which build step makes the GPU search graph worse than the CPU one on tight clusters? (issue 11,
follow-up of diagnose_gpu_cpu_graph.py: tight_c10000 small, the GPU graph plateaus at 0.95, the CPU
graph reaches 1.0, with either device's search.)

From the same exact candidate lists (K = 96), the RobustPrune step (GPU kernel or CPU twin) and the
reverse-edge step (GPU or CPU) are combined four ways; each graph is searched by the CPU index
(its own entry points, graph swapped in, connectivity repaired the same way) at beams 64/256/512.

    PYTHONPATH=src python benchmarks/diagnose_prune_steps.py --out $OUT/prune_steps.json
"""

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

import knnkit  # noqa: E402
from knnkit.datasets.suite import robustness_sets  # noqa: E402
from knnkit.exact import knn_lists  # noqa: E402
from knnkit.index._connect import repair_connectivity  # noqa: E402
from knnkit.index._prune_cpu import add_reverse_edges, prune_cpu  # noqa: E402
from knnkit.index._prune_gpu import prune_gpu  # noqa: E402
from knnkit.index._reverse_gpu import add_reverse_edges_gpu  # noqa: E402


def recall(I, TI):
    return float(np.mean([len(set(a.tolist()) & set(b.tolist())) / TI.shape[1] for a, b in zip(I, TI)]))


def same_rows(a, b):
    return float(np.mean([set(x[x >= 0].tolist()) == set(y[y >= 0].tolist()) for x, y in zip(a, b)]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", default="tight_c10000")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "prune_steps.json"))
    a = ap.parse_args()
    import cupy as cp

    name, X, Q, metric = robustness_sets("small", names=[a.set], real=False, random_state=0)[0]
    X = np.ascontiguousarray(X, dtype=np.float32)
    Q = Q[:1000]
    TD, TI = knnkit.knn(X, Q, k=10)
    R, K, alpha = 64, 96, 1.0
    Xd = cp.asarray(X)
    cd, ci, _ = knn_lists(Xd, Xd, K, metric="l2", exclude_self=True)
    ci = ci.astype(cp.int32)
    ci_h, cd_h = cp.asnumpy(ci).astype(np.int64), cp.asnumpy(cd).astype(np.float32)
    res = {"set": name, "R": R, "K": K, "alpha": alpha, "rows": []}
    gp, gpd = prune_gpu(Xd, ci, cd, R, alpha, "l2", return_distances=True)
    p_gpu = cp.asnumpy(gp)
    p_cpu = prune_cpu(X, ci_h, cd_h, R, alpha, "l2")
    res["prune_same_rows"] = same_rows(p_gpu, p_cpu)
    # GPU reverse step on the CPU prune: distances of its edges
    p_cpu_d = np.where(p_cpu >= 0, ((X[:, None, :] - X[np.maximum(p_cpu, 0)]) ** 2).sum(-1), np.inf)
    graphs = {
        "gpu_prune+gpu_rev": cp.asnumpy(add_reverse_edges_gpu(Xd, gp, gpd, R, alpha, "l2")),
        "cpu_prune+cpu_rev": add_reverse_edges(X, p_cpu, R, alpha, "l2"),
        "gpu_prune+cpu_rev": add_reverse_edges(X, p_gpu, R, alpha, "l2"),
        "cpu_prune+gpu_rev": cp.asnumpy(add_reverse_edges_gpu(Xd, cp.asarray(p_cpu), cp.asarray(p_cpu_d, dtype=cp.float32),
                                                              R, alpha, "l2")),
        "gpu_prune_only": p_gpu, "cpu_prune_only": p_cpu,
    }
    res["rev_same_rows_gpu_vs_cpu"] = same_rows(graphs["gpu_prune+gpu_rev"], graphs["cpu_prune+cpu_rev"])
    idx = knnkit.GraphIndex.build(X, device="cpu", random_state=0, calibrate=False, graph_degree=R,
                                  intermediate_degree=K, alpha=alpha)
    eng = idx._engine
    for key, g in graphs.items():
        g2, st = repair_connectivity(X, np.ascontiguousarray(g, np.int32), metric="l2", entry_ids=idx.entry_points)
        eng._graph = g2
        row = {"graph": key, "links_added": st["links_added"], "components_before": st["components_before"]}
        for beam in (64, 256, 512):
            _d, I = idx.search(Q, k=10, beam=beam)
            row[f"recall@{beam}"] = recall(np.asarray(I), TI)
        res["rows"].append(row)
        print(row, flush=True)
    print({k: v for k, v in res.items() if k != "rows"})
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
