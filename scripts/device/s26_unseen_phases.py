"""GPU index build phases on two unseen shapes whose first builds read 17-27 s at 20k (twenty-sixth
session): built twice, the second with every kernel compiled."""
import time, sys
sys.path.insert(0, "benchmarks")
import numpy as np, cupy as cp, knnkit
from unseen_shapes import sets

want = {"binary_sparse_d64", "half_near_1e-3_copies_of_50_d32", "rank3_d256_no_noise"}
for name, A, metric in sets(20_000, 400, np.random.default_rng(2026)):
    if name not in want:
        continue
    X = A[:20_000]
    for rep in range(2):
        t = time.perf_counter()
        g = knnkit.knn_graph(X, k=10, metric=metric, device="gpu", random_state=0)
        cp.cuda.Device().synchronize(); tg = time.perf_counter() - t
        t = time.perf_counter()
        idx = knnkit.GraphIndex.build(X, metric=metric, device="gpu", random_state=0)
        cp.cuda.Device().synchronize()
        print(name, rep, "graph", round(tg, 2), "index", round(time.perf_counter() - t, 2),
              {k: round(v, 2) for k, v in idx.build_timings.items() if v > 0.05}, flush=True)
