"""Why does a set plateau on the GPU but not on the CPU? (issue 11: tight_c10000 at scale small
reaches recall@10 1.0 at beam 256 with the CPU-built index, 0.952 at any beam with the GPU-built one.)

Builds the index of one robustness set with default parameters on both devices, then searches each
graph with each device's search (the other engine's graph swapped in), so a gap is pinned on the
graph or on the search. Graph statistics: mean out-degree, share of "long" edges (longer than 4x the
node's nearest-neighbour distance), in-degree zeros, reverse-edge share.

    PYTHONPATH=src python benchmarks/diagnose_gpu_cpu_graph.py --set tight_c10000 --out $OUT/diag.json
"""

import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

import knnkit  # noqa: E402
from knnkit.datasets.suite import robustness_sets  # noqa: E402


def graph_stats(X, g):
    n, R = g.shape
    valid = g >= 0
    deg = valid.sum(1)
    gi = np.where(valid, g, 0)
    d = ((X[:, None, :] - X[gi]) ** 2).sum(-1)
    d = np.where(valid, d, np.inf)
    nn1 = np.min(d, axis=1)
    long_ = valid & (d > 16 * np.maximum(nn1, 1e-30)[:, None])  # 4x in Euclidean distance
    indeg = np.bincount(g[valid].ravel(), minlength=n)
    # a reverse edge: u -> v where v -> u exists too
    rows = np.repeat(np.arange(n), R)[valid.ravel()]
    cols = g[valid].ravel()
    fwd = set(zip(rows.tolist(), cols.tolist()))
    recip = np.mean([(c, r) in fwd for r, c in zip(rows[:200000].tolist(), cols[:200000].tolist())])
    return {"mean_degree": float(deg.mean()), "full_rows": float((deg == R).mean()),
            "long_edge_share": float(long_.sum() / valid.sum()), "zero_indegree": int((indeg == 0).sum()),
            "reciprocal_share": float(recip)}


def recall(I, TI):
    return float(np.mean([len(set(a.tolist()) & set(b.tolist())) / TI.shape[1] for a, b in zip(I, TI)]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", default="tight_c10000")
    ap.add_argument("--scale", default="small")
    ap.add_argument("--beams", default="64,256,512")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "diag.json"))
    a = ap.parse_args()
    import cupy as cp

    name, X, Q, metric = robustness_sets(a.scale, names=[a.set], real=False, random_state=0)[0]
    Q = Q[:1000]
    TD, TI = knnkit.knn(X, Q, k=10, metric=metric)
    res = {"set": name, "n": int(X.shape[0]), "d": int(X.shape[1]), "rows": []}
    idx = {}
    for dev in ("gpu", "cpu"):
        t = time.perf_counter()
        Xd = cp.asarray(X) if dev == "gpu" else X
        idx[dev] = knnkit.GraphIndex.build(Xd, metric=metric, device=dev, random_state=0, calibrate=False)
        res[f"{dev}_build_s"] = time.perf_counter() - t
        res[f"{dev}_build_params"] = {k: v for k, v in idx[dev].build_params.items() if not isinstance(v, dict)}
        res[f"{dev}_connectivity"] = idx[dev].build_params.get("connectivity")
        res[f"{dev}_graph"] = graph_stats(X.astype(np.float32), idx[dev].graph)
        print(dev, res[f"{dev}_graph"], flush=True)
    graphs = {dev: idx[dev].graph for dev in idx}
    for search_dev in ("gpu", "cpu"):
        eng = idx[search_dev]._engine
        own = eng._graph
        for graph_dev in ("gpu", "cpu"):
            eng._graph = cp.asarray(graphs[graph_dev]) if search_dev == "gpu" else graphs[graph_dev]
            eng._host = None
            eng._gpu = None
            for beam in [int(b) for b in a.beams.split(",")]:
                _d, I = idx[search_dev].search(cp.asarray(Q) if search_dev == "gpu" else Q, k=10, beam=beam)
                I = cp.asnumpy(I) if hasattr(I, "get") else np.asarray(I)
                row = {"search": search_dev, "graph": graph_dev, "beam": beam, "recall": recall(I, TI)}
                res["rows"].append(row)
                print(row, flush=True)
        eng._graph = own
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1, default=str)


if __name__ == "__main__":
    main()
