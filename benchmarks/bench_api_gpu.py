"""End-to-end GPU benchmark through the PUBLIC API (what a user gets), with cuVS side by side.

    PYTHONPATH=src python benchmarks/bench_api_gpu.py --task graph|index [--n N --d D] [--clusters C
        --cluster-std S] [--cuvs] --out DIR

graph: knnkit.knn_graph (defaults) for k in --ks, recall@k on 10k sampled rows vs exact (knnkit.knn);
       cuVS nn_descent (graph_degree 64, 10 iterations) on the same data.
index: knnkit.GraphIndex.build (defaults except --degree) then index.search over a beam sweep
       (timed end to end: seeds + search + re-rank), batch-size curve; cuVS CAGRA (graph_degree 64)
       over itopk (and, with --cagra-wide, 16 random samplings x search width 8).
Times are medians of warm repeats with the GPU synchronised. Prints and writes one JSON.
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import time

import numpy as np


def sync():
    import cupy

    cupy.cuda.Device().synchronize()


def timed(fn, reps=3):
    out = fn()
    sync()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        out = fn()
        sync()
        ts.append(time.perf_counter() - t)
    return out, float(np.median(ts))


def recall(found, truth, k):
    import cupy as cp

    f = cp.asarray(found)[:, :k].astype(cp.int64)
    t = cp.asarray(truth)[:, :k].astype(cp.int64)
    hits = (f[:, :, None] == t[:, None, :]).any(axis=2).sum()
    return float(hits) / t.size


def log(obj):
    print(json.dumps(obj), file=sys.stderr, flush=True)


def task_graph(X, a, res):
    import cupy as cp
    import knnkit

    rows = cp.asarray(np.random.default_rng(0).choice(X.shape[0], 10_000, replace=False))
    runs = []
    kw = {"refine_hubs": {"auto": None, "on": True, "off": False}[a.refine_hubs]} if a.metric == "inner_product" else {}
    if a.update:
        kw["update"] = a.update
    for k in a.ks:  # compile the kernels first (lists over 128 entries use other instantiations)
        knnkit.knn_graph(X[:150_000], k=k, method="nndescent", metric=a.metric, random_state=0, **kw)
    for k in a.ks:
        _, ti = knnkit.knn(X, X[rows], k=k + 1, metric=a.metric)
        # the row itself is among its k+1 nearest (a duplicate may tie with it): drop it by id
        truth = _drop_self(cp.asarray(ti), rows, k)
        sync()
        t = time.perf_counter()
        g = knnkit.knn_graph(X, k=k, metric=a.metric, random_state=0, **kw)
        sync()
        el = time.perf_counter() - t
        r = recall(cp.asarray(g.indices)[rows], truth, k)
        runs.append({"k": k, "metric": a.metric, "update": g.stats.get("update"), "time_s": el, "recall": r, "K": g.stats.get("K"),
                     "sample": g.stats.get("sample"),
                     "iterations": g.stats.get("iterations"), "updates": g.stats.get("updates"),
                     "hubs": g.stats.get("hubs"), "phase_s": g.stats.get("phase_s")})
        log(runs[-1])
    res["knnkit_knn_graph"] = runs
    if a.cuvs and a.metric == "sqeuclidean":
        try:
            from cuvs.neighbors import nn_descent
        except Exception as e:
            res["cuvs_nn_descent"] = {"error": str(e)}
            return
        _, ti = knnkit.knn(X, X[rows], k=11)
        truth = _drop_self(cp.asarray(ti), rows, 10)
        cu = []
        for gd in (32, 64):
            p = nn_descent.IndexParams(metric="sqeuclidean", graph_degree=gd, intermediate_graph_degree=2 * gd,
                                       max_iterations=10)
            nn_descent.build(p, X[:20000])  # warm-up
            sync()
            t = time.perf_counter()
            idx = nn_descent.build(p, X)
            sync()
            el = time.perf_counter() - t
            graph = cp.asarray(np.asarray(idx.graph))
            g10 = _drop_self(graph[rows].astype(cp.int64), rows, 10)
            cu.append({"graph_degree": gd, "time_s": el, "recall_at_10": recall(g10, truth, 10)})
            log(cu[-1])
        res["cuvs_nn_descent"] = cu


def _drop_self(ti, rows, k):
    import cupy as cp

    ti = cp.asarray(ti)
    is_self = ti == rows[:, None]
    # stable push of the self column to the end
    order = cp.argsort(is_self.astype(cp.int8), axis=1, kind="stable")
    return cp.take_along_axis(ti, order, axis=1)[:, :k]


def task_index(X, Q, a, res):
    import cupy as cp
    import knnkit

    _, ti = knnkit.knn(X, Q, k=a.k)
    ti = cp.asarray(ti)
    sync()
    t = time.perf_counter()
    kw = {} if a.degree is None else {"graph_degree": a.degree}
    # compile the kernels first: over 100k points so the NN-Descent path (not brute force) runs
    warm = knnkit.GraphIndex.build(X[:200_000], random_state=0, **kw)
    warm.search(Q[:100], k=a.k)
    del warm
    sync()
    t = time.perf_counter()
    index = knnkit.GraphIndex.build(X, random_state=0, **kw)
    sync()
    res["knnkit_build_s"] = time.perf_counter() - t
    res["knnkit_build_phases_s"] = index.build_timings
    res["knnkit_index"] = repr(index)
    res["knnkit_build_params"] = index.build_params
    curve = []
    for trav in a.traversals:
        for beam in a.beams:
            (d, i), el = timed(lambda: index.search(Q, k=a.k, beam=beam, traversal=trav), a.reps)
            curve.append({"traversal": trav, "beam": beam, "recall": recall(i, ti, a.k), "qps": Q.shape[0] / el})
            log(curve[-1])
    res["knnkit_curve"] = curve
    if a.batch_curve:
        bc = []
        big = Q if Q.shape[0] >= 100_000 else cp.concatenate([Q] * (100_000 // Q.shape[0] + 1))[:100_000]
        for b in (1, 10, 100, 1000, 10_000, 100_000):
            qb = big[:b]
            _, el = timed(lambda: index.search(qb, k=a.k, beam=a.batch_beam), a.reps)
            bc.append({"batch": b, "time_ms": el * 1e3, "qps": b / el})
            log(bc[-1])
        res["knnkit_batch_curve"] = {"beam": a.batch_beam, "rows": bc}
    if a.cuvs:
        try:
            from cuvs.neighbors import cagra
        except Exception as e:
            res["cuvs_cagra"] = {"error": str(e)}
            return
        sync()
        t = time.perf_counter()
        ci = cagra.build(cagra.IndexParams(metric="sqeuclidean", graph_degree=64, intermediate_graph_degree=128), X)
        sync()
        res["cuvs_build_s"] = time.perf_counter() - t
        cu = []
        settings = [dict(itopk_size=s) for s in a.itopk]
        if a.cagra_wide:
            settings += [dict(itopk_size=s, search_width=8, num_random_samplings=16) for s in (64, 128)]
        for sp_kw in settings:
            sp = cagra.SearchParams(**sp_kw)
            (d, i), el = timed(lambda: cagra.search(sp, ci, Q, a.k), a.reps)
            cu.append(dict(sp_kw, recall=recall(cp.asarray(i), ti, a.k), qps=Q.shape[0] / el))
            log(cu[-1])
        res["cuvs_cagra_curve"] = cu


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", choices=("graph", "index"), required=True)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--queries", type=int, default=10_000)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--metric", default="sqeuclidean", help="graph task: metric of knn_graph and of the truth")
    ap.add_argument("--update", default=None, help="graph task: update rule (default: knn_graph's)")
    ap.add_argument("--refine-hubs", default="auto", choices=("auto", "on", "off"),
                    help="graph task, inner_product: knn_graph's refine_hubs (None / True / False)")
    ap.add_argument("--ks", type=lambda s: [int(v) for v in s.split(",")], default=[10])
    ap.add_argument("--clusters", type=int, default=64)
    ap.add_argument("--cluster-std", type=float, default=0.3)
    ap.add_argument("--degree", type=int, default=None)
    ap.add_argument("--beams", type=lambda s: [int(v) for v in s.split(",")], default=[16, 24, 32, 48, 64, 96])
    ap.add_argument("--traversals", type=lambda s: s.split(","), default=["fp16", "fp32"])
    ap.add_argument("--itopk", type=lambda s: [int(v) for v in s.split(",")], default=[32, 64, 128, 256])
    ap.add_argument("--cagra-wide", action="store_true")
    ap.add_argument("--batch-curve", action="store_true")
    ap.add_argument("--batch-beam", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cuvs", action="store_true")
    ap.add_argument("--tag", default="")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    import cupy as cp
    import knnkit

    res = {"task": a.task, "tag": a.tag, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
           "gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "params": vars(a)}
    t = time.perf_counter()
    X, Q = knnkit.datasets.make_clustered(a.n, a.d, n_queries=a.queries, n_clusters=a.clusters,
                                          cluster_std=a.cluster_std, random_state=0, device="gpu")
    sync()
    res["data"] = (f"make_clustered({a.n}, {a.d}, n_queries={a.queries}, n_clusters={a.clusters}, "
                   f"cluster_std={a.cluster_std}, random_state=0, device='gpu')")
    res["datagen_s"] = time.perf_counter() - t
    if a.task == "graph":
        task_graph(X, a, res)
    else:
        task_index(X, Q, a, res)
    txt = json.dumps(res, indent=1)
    print(txt)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, f"api_{a.task}{('_' + a.tag) if a.tag else ''}.json"), "w") as f:
        f.write(txt)


if __name__ == "__main__":
    main()
