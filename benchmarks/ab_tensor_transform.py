"""A/B of the tensor-join transform statistics (gnnd_col_stats kernel vs the CuPy column reductions it
replaced), alone and inside knn_graph at 10M x 96 (same process, alternating). Prints lines.

    PYTHONPATH=src python benchmarks/ab_tensor_transform.py
"""
import math
import time

import cupy as cp

import knnkit
import knnkit.graph.nndescent._gpu as G
def old_transform(X, metric, stats=None):
    if X.dtype.kind in "iu":
        return None, 1.0
    mu = X.mean(axis=0, dtype=cp.float32) if metric == "l2" else None
    lo = X.min(axis=0).astype(cp.float32)
    hi = X.max(axis=0).astype(cp.float32)
    if mu is not None:
        lo, hi = lo - mu, hi - mu
    bound = float(cp.maximum(cp.abs(lo), cp.abs(hi)).max())
    scale = 1.0
    if 0.0 < bound < float("inf"):
        scale = float(2.0 ** min(60, max(-60, round(math.log2(1024.0 / bound)))))
    return (None if mu is None else cp.ascontiguousarray(mu)), scale
new_transform = G._tensor_transform
X = cp.asarray(knnkit.datasets.make_clustered(10_000_000, 96, random_state=0, device="gpu"), dtype=cp.float32)
knnkit.knn_graph(X[:200000], k=10, method="nndescent")
stats_k = G._kernels(X.dtype, "l2", 32, 4, 8, None, True)[5]
for name, f in [("new", new_transform), ("old", old_transform), ("new", new_transform), ("old", old_transform)]:
    cp.cuda.Device().synchronize(); t = time.perf_counter(); r = f(X, "l2", stats_k); cp.cuda.Device().synchronize()
    print(name, "transform alone", round(time.perf_counter() - t, 4), r[1], float(r[0][:3].sum()))
for name, f in [("new", new_transform), ("old", old_transform), ("new", new_transform), ("old", old_transform)]:
    G._tensor_transform = f
    cp.cuda.Device().synchronize(); t = time.perf_counter()
    g = knnkit.knn_graph(X, k=10, random_state=0); cp.cuda.Device().synchronize()
    print(name, round(time.perf_counter() - t, 3), g.stats["iterations"], [round(v, 3) for v in g.stats["time_s"][:4]], round(sum(g.stats["time_s"]), 3), {k: round(v, 3) for k, v in g.stats["phase_s"].items()}, flush=True)
    del g
G._tensor_transform = new_transform
