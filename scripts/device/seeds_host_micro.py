"""Host microseconds of one seed selection (``select_seeds_gpu``: cuBLAS GEMM + selection kernel)
per call, on the current stream against two alternating non-blocking streams (as the host-placed
search's batches call it), and of its GEMM alone; the forty-first session's question: cProfile put
~0.5 ms of host time a batch there."""
import json
import sys
import time

import cupy as cp
import numpy as np

sys.path.insert(0, "src")
from knnkit.index._search_gpu import select_seeds_gpu  # noqa: E402

rs = cp.random.RandomState(0)
Q = rs.standard_normal((5000, 96), dtype=cp.float32)
C = rs.standard_normal((1732, 96), dtype=cp.float32)
M = cp.arange(1732, dtype=cp.int32)
cn = (C * C).sum(axis=1)
streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
res = {}


def timed(name, f, reps=200):
    for _ in range(10):
        f(0)
    cp.cuda.Device().synchronize()
    host = []
    for r in range(reps):
        t = time.perf_counter()
        f(r)
        host.append(time.perf_counter() - t)
        cp.cuda.Device().synchronize()
    res[name] = {"median_us": round(float(np.median(host)) * 1e6, 1), "p90_us": round(float(np.percentile(host, 90)) * 1e6, 1)}


timed("seeds_current_stream", lambda r: select_seeds_gpu(Q, C, M, 2, "l2", cnorms=cn))
def alt(r, f):
    with streams[r % 2]:
        return f()
timed("seeds_two_streams", lambda r: alt(r, lambda: select_seeds_gpu(Q, C, M, 2, "l2", cnorms=cn)))
timed("seeds_one_side_stream", lambda r: alt(0, lambda: select_seeds_gpu(Q, C, M, 2, "l2", cnorms=cn)))
timed("seeds_direct_two_streams", lambda r: alt(r, lambda: select_seeds_gpu(Q, C, M, 2, "l2", cnorms=cn, method="direct")))
timed("gemm_current_stream", lambda r: Q @ C.T)
timed("gemm_two_streams", lambda r: alt(r, lambda: Q @ C.T))
timed("sub_two_streams", lambda r: alt(r, lambda: Q - C[0]))
timed("fill_two_streams", lambda r: alt(r, lambda: Q.fill(0)))
print(json.dumps(res, indent=1))

# GPU time of a call's seed selection, 10k queries: GEMM + selection against the direct kernel
# (no (nq, c) products in memory), c = 1732 (3M's entry points) and 4096 (the cap, 20M on)
gpu = {}
for c in (1732, 4096):
    Qa = rs.standard_normal((10000, 96), dtype=cp.float32)
    Ca = rs.standard_normal((c, 96), dtype=cp.float32)
    Ma = cp.arange(c, dtype=cp.int32)
    cna = (Ca * Ca).sum(axis=1)
    for method in ("gemm", "direct"):
        for s in (2, 4):
            for _ in range(3):
                select_seeds_gpu(Qa, Ca, Ma, s, "l2", cnorms=cna, method=method)
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record()
            for _ in range(20):
                out = select_seeds_gpu(Qa, Ca, Ma, s, "l2", cnorms=cna, method=method)
            b.record()
            b.synchronize()
            gpu[f"c{c}_s{s}_{method}_us"] = round(cp.cuda.get_elapsed_time(a, b) / 20 * 1e3, 1)
    same = bool((select_seeds_gpu(Qa, Ca, Ma, 4, "l2", cnorms=cna, method="gemm")
                 == select_seeds_gpu(Qa, Ca, Ma, 4, "l2", cnorms=cna, method="direct")).all())
    gpu[f"c{c}_same_seeds"] = same
print(json.dumps(gpu, indent=1))
