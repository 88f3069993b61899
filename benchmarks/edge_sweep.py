"""Edge sweep: every public search path against float64 exact truth, on data shapes that break
float32 and float16 shortcuts (common offsets, cosine similarities near 1, huge and tiny
magnitudes, skewed norms, lattices with ties, mixed scales, int8, float16 storage, d = 1).

Recall is counted by ids: a returned neighbour counts when its float64 distance is within
1e-5 (relative) of the true k-th. Paths: ``knn`` (exact), ``knn_graph`` (auto, and NN-Descent
forced), ``GraphIndex`` device and host placement at beams 32 and 64.

Usage: ``PYTHONPATH=src python benchmarks/edge_sweep.py --device cpu|gpu [--n 3000] [--out DIR]``
"""
import argparse
import json
import warnings

import numpy as np

import knnkit
from knnkit import GraphIndex
from knnkit.evaluate import float64_distances


def dmat(X, Q, metric):
    D = float64_distances(X, Q, metric)
    return -D if metric == "inner_product" else D  # smaller is nearer here


def recall(i, D, kth):
    i = np.asarray(i.get() if hasattr(i, "get") else i)
    d = np.where(i >= 0, np.take_along_axis(D, np.maximum(i, 0), 1), np.inf)
    return round(float(np.mean(d <= kth + 1e-5 * np.abs(kth) + 1e-300)), 4)


def sets(n, rng):
    d = 24
    b = rng.standard_normal(d)
    m = n + 50
    yield "cos_near_parallel_1e-2", (b + 1e-2 * rng.standard_normal((m, d))).astype(np.float32), "cosine"
    yield "ip_skewed_norms", (rng.standard_normal((m, d)) * rng.lognormal(0, 2, (m, 1))).astype(np.float32), "inner_product"
    yield "ip_unit_shared_dir", None, "inner_product"
    yield "euclid_offset_1e3", (1e3 + rng.standard_normal((m, d))).astype(np.float32), "euclidean"
    yield "sq_offset_1e4_d16", (1e4 + rng.standard_normal((m, 16))).astype(np.float32), "sqeuclidean"
    yield "sq_tiny_1e-15", (1e-15 * rng.standard_normal((m, d))).astype(np.float32), "sqeuclidean"
    yield "sq_huge_1e15", (1e15 * rng.standard_normal((m, d))).astype(np.float32), "sqeuclidean"
    yield "d1", rng.standard_normal((m, 1)).astype(np.float32), "sqeuclidean"
    yield "lattice_ties", rng.integers(0, 4, (m, 3)).astype(np.float32), "sqeuclidean"
    yield "mixed_scale_dims", (rng.standard_normal((m, d)) * np.logspace(-3, 3, d)).astype(np.float32), "sqeuclidean"
    yield "int8_neg", rng.integers(-128, 128, (m, d)).astype(np.int8), "sqeuclidean"
    yield "fp16_offset_100", (100 + rng.standard_normal((m, d))).astype(np.float16), "sqeuclidean"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    warnings.simplefilter("ignore")
    rng = np.random.default_rng(0)
    rows = []
    k = 10
    for name, A, metric in sets(a.n, rng):
        if A is None:  # unit vectors sharing a main direction, searched by inner product
            b = rng.standard_normal(24)
            A = (b + 1e-2 * rng.standard_normal((a.n + 50, 24)))
            A = (A / np.linalg.norm(A, axis=1, keepdims=True)).astype(np.float32)
        X, Q = A[:-50], A[-50:]
        D = dmat(X, Q, metric)
        kth = np.sort(D, axis=1)[:, k - 1:k]
        Ds = dmat(X, X[:200], metric)
        Ds[np.arange(200), np.arange(200)] = np.inf
        kths = np.sort(Ds, axis=1)[:, k - 1:k]
        out = {"set": name, "metric": metric, "n": X.shape[0], "device": a.device}
        dev = a.device
        xin = X
        if dev == "gpu":
            import cupy as cp
            xin = cp.asarray(X)
        def run(key, f):
            try:
                out[key] = f()
            except Exception as e:  # a refusal is an answer too; record it
                out[key] = f"{type(e).__name__}: {str(e)[:100]}"
        run("knn", lambda: recall(knnkit.knn(xin, Q if dev == "cpu" else cp.asarray(Q), k=k, metric=metric,
                                             device=dev)[1], D, kth))
        for meth in ("auto", "nndescent"):
            run(f"graph_{meth}", lambda: recall(np.asarray(knnkit.knn_graph(
                xin, k=k, metric=metric, device=dev, method=meth, random_state=0).host_arrays()[0])[:200], Ds, kths))
        for pl in ("device", "host"):
            try:
                idx = GraphIndex.build(xin, metric=metric, device=dev, placement=pl, random_state=0)
                qin = Q if dev == "cpu" else cp.asarray(Q)
                out[f"idx_{pl}"] = recall(idx.search(qin, k=k)[1], D, kth)
                out[f"idx_{pl}_b32"] = recall(idx.search(qin, k=k, beam=32)[1], D, kth)
            except Exception as e:
                out[f"idx_{pl}"] = f"{type(e).__name__}: {str(e)[:100]}"
        rows.append(out)
        print(json.dumps(out), flush=True)
    if a.out:
        with open(f"{a.out}/edge_sweep_{a.device}.json", "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
