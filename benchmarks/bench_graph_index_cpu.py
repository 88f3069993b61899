"""CPU benchmark of knnkit.GraphIndex against hnswlib on the same machine, in the same run.

Data: clustered Gaussian blobs (``knnkit.datasets.make_clustered`` when available), 100k x 128,
1000 queries drawn from the same distribution, k=10. Prints one JSON document: build times and a
recall-QPS curve over beam/tau for knnkit, over ef for hnswlib (M=16, ef_construction=200).

    PYTHONPATH=src python3 benchmarks/bench_graph_index_cpu.py [--n 100000] [--out file.json]
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import time

import numpy as np
import numba

import knnkit
import knnkit._core.metrics
from knnkit.index._build import exact_knn_cpu
from knnkit.index._search_cpu import search_cpu


def clustered(n, nq, d, n_clusters=100, spread=0.35, seed=0):
    try:
        from knnkit.datasets import make_clustered

        X, Q = make_clustered(n, d, n_queries=nq, random_state=seed, device="cpu")
        return np.asarray(X, np.float32), np.asarray(Q, np.float32)
    except ImportError:
        pass
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((n_clusters, d)).astype(np.float32)
    lab = rng.integers(0, n_clusters, n + nq)
    scale = rng.uniform(0.5, 1.5, n_clusters).astype(np.float32)[lab, None]
    X = centers[lab] + spread * scale * rng.standard_normal((n + nq, d)).astype(np.float32)
    return X[:n].astype(np.float32), X[n:].astype(np.float32)


def recall(found, truth):
    k = truth.shape[1]
    hit = sum(len(set(a[:k].tolist()) & set(b.tolist())) for a, b in zip(found, truth))
    return hit / truth.size


def timed_search(fn, repeats=3):
    best = np.inf
    out = None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--nq", type=int, default=1000)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--degree", type=int, default=32)
    ap.add_argument("--diversify", default="prune,ggnn")
    ap.add_argument("--build-algo", default="nndescent")
    ap.add_argument("--no-hnsw", action="store_true")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    X, Q = clustered(args.n, args.nq, args.d)
    _gd, truth = exact_knn_cpu(X, Q, args.k, "l2")
    try:
        commit = subprocess.check_output(["git", "rev-parse", "HEAD"], text=True).strip()
    except Exception:
        commit = None
    res = {"benchmark": "graph_index_cpu", "date": datetime.datetime.utcnow().isoformat() + "Z",
           "git_commit": commit, "cpu": platform.processor() or platform.machine(),
           "threads": numba.get_num_threads(), "n": args.n, "d": args.d, "nq": args.nq, "k": args.k,
           "data": "clustered gaussian blobs", "knnkit": {}, "hnswlib": None}

    # warm up the Numba kernels so that compilation is not timed
    small = knnkit.GraphIndex.build(X[:3000], graph_degree=8, device="cpu")
    small.search(Q[:10], k=args.k)

    # build everything first, then time all search points in interleaved rounds (best of the
    # rounds for each point), so that load from other processes hits both libraries alike
    indexes, points = {}, [(b, None) for b in (10, 12, 16, 24, 32, 48, 64, 96, 128)]
    points += [(256, t) for t in (0.0, 0.02, 0.05, 0.1, 0.2)]  # GGNN-style: long list, slack stop
    for div in args.diversify.split(","):
        t = time.perf_counter()
        indexes[div] = knnkit.GraphIndex.build(X, graph_degree=args.degree, diversify=div,
                                               build_algo=args.build_algo, device="cpu", random_state=0)
        res["knnkit"][div] = {"build_s": round(time.perf_counter() - t, 2), "graph_degree": args.degree,
                              "repr": repr(indexes[div])}
    hnsw, efs = None, (10, 12, 16, 24, 32, 48, 64, 96, 128, 256)
    if not args.no_hnsw:
        try:
            import hnswlib

            t = time.perf_counter()
            hnsw = hnswlib.Index(space="l2", dim=args.d)
            hnsw.init_index(max_elements=args.n, M=16, ef_construction=200, random_seed=0)
            hnsw.set_num_threads(numba.get_num_threads())
            hnsw.add_items(X, np.arange(args.n))
            res["hnswlib"] = {"build_s": round(time.perf_counter() - t, 2), "M": 16, "ef_construction": 200}
        except ImportError:
            res["hnswlib"] = "not installed"

    best, found = {}, {}
    for _round in range(args.rounds):
        for div, index in indexes.items():
            for beam, tau in points:
                s, (_d, i) = timed_search(lambda: index.search(Q, k=args.k, beam=beam, tau=tau), repeats=1)
                key = (div, beam, tau)
                best[key] = min(best.get(key, np.inf), s)
                found[key] = i
        if hnsw is not None:
            for ef in efs:
                hnsw.set_ef(ef)
                s, (i, _d) = timed_search(lambda: hnsw.knn_query(Q, k=args.k), repeats=1)
                best[("hnsw", ef)] = min(best.get(("hnsw", ef), np.inf), s)
                found[("hnsw", ef)] = i

    Qp = knnkit._core.metrics.prepare_vectors(Q, "sqeuclidean")
    for div, index in indexes.items():
        curve = []
        for beam, tau in points:
            # machine-independent cost: distance evaluations and expansions per query
            _x, _y, st = search_cpu(index._X, index._graph, Qp, args.k,
                                    seeds=index._entry.seeds_for(Qp, max(4, beam // 16)), beam=max(beam, args.k),
                                    tau=np.inf if tau is None else tau, max_iters=max(64, 8 * beam),
                                    metric="l2", nn1_max=index.nn1_max, return_stats=True)
            curve.append({"beam": beam, "tau": tau, "recall": round(recall(found[(div, beam, tau)], truth), 4),
                          "qps": round(args.nq / best[(div, beam, tau)], 1),
                          "dist_evals": round(float(st[:, 1].mean()), 1),
                          "expansions": round(float(st[:, 0].mean()), 1)})
        res["knnkit"][div]["curve"] = curve
    if hnsw is not None:
        res["hnswlib"]["curve"] = [{"ef": ef, "recall": round(recall(found[("hnsw", ef)], truth), 4),
                                    "qps": round(args.nq / best[("hnsw", ef)], 1)} for ef in efs]

    # best QPS reaching each recall level, per method
    summary = {}
    curves = {f"knnkit_{div}": v["curve"] for div, v in res["knnkit"].items()}
    if isinstance(res["hnswlib"], dict):
        curves["hnswlib"] = res["hnswlib"]["curve"]
    for name, curve in curves.items():
        summary[name] = {str(r): max((c["qps"] for c in curve if c["recall"] >= r), default=None)
                         for r in (0.9, 0.95, 0.97, 0.99, 0.995)}
    res["best_qps_at_recall"] = summary
    txt = json.dumps(res, indent=1)
    print(txt)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(txt)


if __name__ == "__main__":
    main()
