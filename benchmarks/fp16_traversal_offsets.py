"""When does the GPU walk's float16 copy stop telling distances apart? (issue 7/11, data far from
the origin).

For unit Gaussian data at several dimensions shifted by a common offset, uniform 2-D data at 1M
points and uint8-like data, it builds one index and measures recall@10 and QPS at beams 16-128
with ``traversal="fp16"`` and ``"fp32"``, next to two candidate guard ratios:

* ``err/spread``: sqrt(sum_d (amax_d 2^-11)^2) / sqrt(sum_d var_d);
* ``err/nbr``: the same error over the median distance from a point to its graph neighbours;
* ``rounding/nbr``: the largest actual rounding per dimension instead of the bound (the guard in
  ``index._engine._fp16_resolves``, fp16 kept up to 0.1; 0 for integer data); for the cosine
  sets (``--only cosine``: vectors sharing a main direction) the rounding over the inner-product
  walk's score gap ``q.q - q.x`` instead, and host placement's recall next to them.

Usage: ``PYTHONPATH=src python benchmarks/fp16_traversal_offsets.py --out DIR``
"""
import argparse
import json
import time

import cupy as cp
import numpy as np

import knnkit
from knnkit import GraphIndex


def sets(n):
    rng = np.random.default_rng(0)
    for d in (2, 16, 128):
        g = rng.standard_normal((n + 1000, d)).astype(np.float32)
        for off in (0.0, 10.0, 100.0, 1e3, 1e4):
            yield f"gauss_d{d}_off{off:g}", g + np.float32(off)
    u = rng.random((1_000_000 + 1000, 2)).astype(np.float32)
    yield "uniform2d_1M", u
    yield "uniform2d_1M_off1", u + np.float32(1.0)
    yield "uniform2d_1M_off10", u + np.float32(10.0)
    yield "uint8_d128", rng.integers(0, 256, (n + 1000, 128)).astype(np.uint8)


def cosine_sets(n):
    """Vectors sharing a main direction (cosine similarities near 1 at small ``spread``)."""
    rng = np.random.default_rng(1)
    for d in (24, 96):
        b = rng.standard_normal(d).astype(np.float32)
        for spread in (1e-2, 3e-2, 1e-1, 1.0):
            yield f"cos_d{d}_spread{spread:g}", b + np.float32(spread) * rng.standard_normal((n + 1000, d)).astype(np.float32)


def ratios(X, index):
    Xf = cp.asarray(X, dtype=cp.float32)
    if index.metric == "cosine":
        Xf = Xf / cp.linalg.norm(Xf, axis=1, keepdims=True)
    amax = cp.abs(Xf).max(axis=0)
    err = float(cp.sqrt(cp.sum((amax * 2.0 ** -11) ** 2)))
    spread = float(cp.sqrt(cp.sum(Xf.var(axis=0))))
    g = cp.asarray(index.graph)[:1024]
    rows = cp.arange(1024)[:, None]
    nb = cp.sqrt(cp.sum((Xf[g] - Xf[rows][:, :, :]) ** 2, axis=2))
    nbr = float(cp.median(nb[g >= 0]))
    worst = cp.abs(Xf - Xf.astype(cp.float16).astype(cp.float32)).max(axis=0)
    rnd = float(cp.sqrt(cp.sum(worst * worst)))
    if index.metric == "cosine":  # the 'ip' walk's ratio: rounding over the score gap q.q - q.x
        q = Xf[:1024]
        gap = cp.abs(cp.sum(q * q, axis=1)[:, None] - cp.einsum("id,ijd->ij", q, Xf[g]))[g >= 0]
        return err / spread, err / nbr, rnd / float(cp.median(gap[gap > 0]))
    return err / spread, err / nbr, rnd / nbr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--only", choices=("offsets", "cosine", "all"), default="all")
    a = ap.parse_args()
    rows = []
    todo = [(nm, A, "sqeuclidean") for nm, A in (sets(a.n) if a.only in ("offsets", "all") else ())]
    todo += [(nm, A, "cosine") for nm, A in (cosine_sets(a.n) if a.only in ("cosine", "all") else ())]
    for name, A, metric in todo:
        X, Q = A[:-1000], A[-1000:]
        Xg, Qg = cp.asarray(X), cp.asarray(Q)
        t = time.perf_counter()
        index = GraphIndex.build(Xg, metric=metric, random_state=0)
        cp.cuda.Device().synchronize()
        tb = time.perf_counter() - t
        wd, _ = knnkit.knn(Xg, Qg, k=10, metric=metric)
        rs, rn, ra = ratios(X, index)
        rec = {"set": name, "n": X.shape[0], "d": X.shape[1], "build_s": round(tb, 3),
               "err_spread": rs, "err_nbr": rn, "rounding_nbr": ra, "search_params": repr(getattr(index, "search_params", None))}
        for trav in ("fp16", "fp32"):
            for beam in (16, 32, 64, 128):
                index.search(Qg, k=10, beam=beam, traversal=trav)
                dt = np.inf
                for _rep in range(5):
                    cp.cuda.Device().synchronize()
                    t = time.perf_counter()
                    d, _i = index.search(Qg, k=10, beam=beam, traversal=trav)
                    cp.cuda.Device().synchronize()
                    dt = min(dt, time.perf_counter() - t)
                r = float(cp.mean(d <= wd[:, -1:] * (1 + 1e-6) + 1e-30))
                rec[f"{trav}_b{beam}"] = [round(r, 4), round(Q.shape[0] / dt)]
        auto_d, _ = index.search(Qg, k=10, beam=32)
        rec["auto_fp16"] = bool(index._engine._x16_cache[2])
        if metric == "cosine":  # host placement (PQ walk scored by squared L2 on unit vectors)
            host = GraphIndex.build(X, metric=metric, placement="host", device="gpu", random_state=0)
            for beam in (32, 64, 128):
                d, _i = host.search(Qg, k=10, beam=beam)
                rec[f"host_b{beam}"] = round(float(cp.mean(cp.asarray(d) <= wd[:, -1:] * (1 + 1e-6) + 1e-30)), 4)
        rows.append(rec)
        print(json.dumps(rec), flush=True)
    with open(f"{a.out}/fp16_{a.only}.json", "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
