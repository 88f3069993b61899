"""Twenty-sixth session: where tight_c1000 1M's GPU index build time goes (s24: 2.9 s; s25/s26: 6.8-9.6 s,
entry points 1.8-3.0 s and connectivity 3.1-4.6 s against 0.04 / 1.2 s). Builds twice (the second
with every kernel compiled) and profiles the second."""
import cProfile, io, pstats, sys, time
import cupy as cp, numpy as np
import knnkit
from knnkit.datasets.suite import make_tight_clusters

X = cp.asarray(make_tight_clusters(1_000_000, 128, 1000, 0.01, random_state=0))
for rep in range(2):
    cp.cuda.Device().synchronize(); t = time.perf_counter()
    if rep == 1:
        pr = cProfile.Profile(); pr.enable()
    idx = knnkit.GraphIndex.build(X, metric="sqeuclidean", device="gpu", random_state=0)
    cp.cuda.Device().synchronize()
    if rep == 1:
        pr.disable()
    print(rep, round(time.perf_counter() - t, 3), {k: round(v, 3) for k, v in idx.build_timings.items()},
          idx.build_params.get("connectivity"), flush=True)
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(45); print(s.getvalue()[:9000])
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25); print(s.getvalue()[:5000])
