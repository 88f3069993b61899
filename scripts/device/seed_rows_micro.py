"""GPU time of a call's seed selection (10k queries, d = 96): the GEMM alone, then GEMM + selection
by ``seed_select``'s shared-memory mode (two queries a block at 4096 centroids) against
``seed_select_rows`` (one warp a query over the dots in place), at the entry-point counts of 3M
(1732) and 20M+ (4096) and beyond, 4 seeds (beams <= 79) and 24 (beam 384); the seeds compared."""
import json
import sys

import cupy as cp

sys.path.insert(0, "src")
from knnkit.index import _search_gpu as sg  # noqa: E402


def gpu_us(f, reps=20):
    for _ in range(3):
        f()
    a, b = cp.cuda.Event(), cp.cuda.Event()
    a.record()
    for _ in range(reps):
        f()
    b.record()
    b.synchronize()
    return round(cp.cuda.get_elapsed_time(a, b) / reps * 1e3, 1)


rs = cp.random.RandomState(0)
res = {}
for c in (1732, 4096, 16384):
    Q = rs.standard_normal((10000, 96), dtype=cp.float32)
    C = rs.standard_normal((c, 96), dtype=cp.float32)
    M = cp.arange(c, dtype=cp.int32)
    cn = (C * C).sum(axis=1)
    res[f"c{c}_gemm_us"] = gpu_us(lambda: Q @ C.T)
    for s in (4, 24):
        out = {}
        for rows in (False, True):
            if not rows and c > 8192:
                continue  # (the shared-memory mode holds one row of 4 c bytes per query: 48 KB)
            sg.SEED_SELECT_ROWS = rows
            res[f"c{c}_s{s}_{'rows' if rows else 'smem'}_us"] = gpu_us(
                lambda: sg.select_seeds_gpu(Q, C, M, s, "l2", cnorms=cn, method="gemm"))
            out[rows] = sg.select_seeds_gpu(Q, C, M, s, "l2", cnorms=cn, method="gemm")
        if len(out) == 2:
            res[f"c{c}_s{s}_same_seeds"] = bool((out[True] == out[False]).all())
sg.SEED_SELECT_ROWS = True
print(json.dumps(res, indent=1))
