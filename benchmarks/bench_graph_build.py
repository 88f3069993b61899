"""Benchmark of ``GraphIndex.build`` on the GPU: time per phase of the device-resident build
against the previous pipeline (candidate ids to the host, distances recomputed and reverse edges
added there), and the search recall of both graphs at a few beams.

    PYTHONPATH=src python benchmarks/bench_graph_build.py --out $OUT [--sets default,separated]
        [--skip-old] [--sweep]

Sets: ``default`` = make_clustered(1M, 128) (auto degree 32 / 64), ``separated`` =
make_clustered(1M, 96, n_clusters=100, cluster_std=0.05) (auto degree 64 / 96). Ground truth:
``knnkit.knn(X, Q, k=10, device="gpu")``. Prints one JSON document and writes it under --out.
"""

import argparse
import datetime
import json
import logging
import os
import subprocess
import time

import numpy as np


def _git_commit():
    try:
        return subprocess.check_output(["git", "rev-parse", "HEAD"], text=True,
                                       stderr=subprocess.DEVNULL).strip()
    except Exception:
        return "HEAD"


def _sync():
    import cupy as cp

    cp.cuda.Device().synchronize()


def _recall(found, truth):
    f = np.asarray(found)[:, :truth.shape[1]]
    hits = (f[:, :, None] == truth[:, None, :]).any(axis=2).sum()
    return float(hits) / truth.size


def old_build(X_user, metric, ref):
    """The pipeline before the device-resident build, phase by phase (from the same parameters
    as the new index ``ref``)."""
    import cupy as cp

    from knnkit import GraphIndex
    from knnkit._core.backend import as_host
    from knnkit._core.metrics import internal_metric, prepare_vectors
    from knnkit.index._build import _prune_dispatch, candidate_graph, nn1_max
    from knnkit.index._entry import build_entry_points
    from knnkit.index._prune_cpu import add_reverse_edges, pair_distances

    bp = dict(ref.build_params)
    im = internal_metric(metric)
    n = X_user.shape[0]
    R, K = min(bp["graph_degree"], n - 1), min(bp["intermediate_degree"], n - 1)
    t = {}
    t0 = time.perf_counter()
    X = prepare_vectors(X_user, metric)
    # the former pipeline: ids to the host, distances recomputed there
    cand, _ = candidate_graph(X, K, im, build_algo="nndescent", device="gpu", random_state=0, user_metric=metric)
    t["candidates+to_host"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    Xh = np.ascontiguousarray(as_host(X))
    cand_dist = pair_distances(Xh, cand, im)
    t["pair_distances_host"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    nn1 = nn1_max(Xh, cand_dist, im)
    t["nn1_max_host"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    g = _prune_dispatch(X, cand, cand_dist, R, bp["alpha"], im, "gpu")
    t["prune_gpu+copies"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    g = add_reverse_edges(Xh, g, R, bp["alpha"], im)
    t["reverse_host"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    entry = build_entry_points(X, bp["n_entry"], im, random_state=0)
    _sync()
    t["entry_points"] = time.perf_counter() - t0
    t["total_without_auto"] = sum(t.values())
    index = GraphIndex(X_user, cp.asarray(g), entry, metric=metric, build_params=bp,
                       search_params=dict(ref.search_params), device="gpu", nn1_max=nn1)
    return index, t


def run_set(name, X, Q, metric, beams, skip_old, reps):
    import cupy as cp

    import knnkit

    res = {"set": name, "n": int(X.shape[0]), "d": int(X.shape[1]), "metric": metric}
    truth = cp.asnumpy(knnkit.knn(X, Q, k=10, metric=metric, device="gpu")[1])
    builds = []
    index = None
    for r in range(reps):
        _sync()
        t0 = time.perf_counter()
        index = knnkit.GraphIndex.build(X, metric=metric, device="gpu", random_state=0)
        _sync()
        total = time.perf_counter() - t0
        builds.append({"total_s": total, "phases_s": index.build_timings})
        logging.getLogger("bench").info("%s new build %d: %.3f s %s", name, r, total, index.build_timings)
    res["new"] = {"builds": builds, "build_params": {k: v for k, v in index.build_params.items()
                                                     if isinstance(v, (int, float, str, type(None)))}}
    res["new"]["recall"], res["new"]["search_s"] = _search(index, Q, truth, beams)
    if not skip_old:
        old, t = old_build(X, metric, index)
        res["old"] = {"phases_s": t}
        res["old"]["recall"], res["old"]["search_s"] = _search(old, Q, truth, beams)
        gn, go = cp.asnumpy(index.graph), cp.asnumpy(old.graph)
        rows = np.random.default_rng(0).choice(gn.shape[0], 20000, replace=False)
        same = [len(set(a[a >= 0].tolist()) & set(b[b >= 0].tolist())) / max(1, (a >= 0).sum())
                for a, b in zip(gn[rows], go[rows])]
        res["edge_overlap_new_in_old"] = float(np.mean(same))
        del old
    del index
    cp.get_default_memory_pool().free_all_blocks()
    return res


def sweep_set(name, X, Q, metric, beams, configs):
    """Candidate-graph (NN-Descent) settings against build time and search recall."""
    import cupy as cp

    import knnkit
    from knnkit import GraphIndex
    from knnkit._core.metrics import internal_metric, prepare_vectors
    from knnkit.index._build import build_graph_gpu
    from knnkit.index._entry import build_entry_points

    truth = cp.asnumpy(knnkit.knn(X, Q, k=10, metric=metric, device="gpu")[1])
    ref = knnkit.GraphIndex.build(X, metric=metric, device="gpu", random_state=0)
    bp = dict(ref.build_params)
    im = internal_metric(metric)
    n = X.shape[0]
    R, K = min(bp["graph_degree"], n - 1), min(bp["intermediate_degree"], n - 1)
    rows = []
    for cfg0 in configs:
        cfg = dict(cfg0)
        cap_mult = cfg.pop("cap_mult", None)
        timings, stats = {}, {}
        _sync()
        t0 = time.perf_counter()
        Xp = prepare_vectors(X, metric)
        g, nn1 = build_graph_gpu(Xp, R, K, im, alpha=bp["alpha"], random_state=0, timings=timings,
                                 knn_params=cfg, stats=stats,
                                 reverse_cap=None if cap_mult is None else int(cap_mult * R))
        entry = build_entry_points(Xp, bp["n_entry"], im, random_state=0)
        _sync()
        total = time.perf_counter() - t0
        index = GraphIndex(X, g, entry, metric=metric, build_params=bp, search_params=dict(ref.search_params),
                           device="gpu", nn1_max=nn1)
        rec, ts = _search(index, Q, truth, beams)
        row = {"config": cfg0, "total_s": total, "phases_s": timings, "recall": rec, "search_s": ts,
               "iterations": stats.get("iterations"), "updates": stats.get("updates"),
               "iter_time_s": stats.get("time_s")}
        logging.getLogger("bench").info("%s sweep %s: %.3f s, recall %s", name, cfg, total, rec)
        rows.append(row)
        del index, g
    return {"set": name, "R": R, "K": K, "sweep": rows}


def _search(index, Q, truth, beams):
    import cupy as cp

    rec, ts = {}, {}
    for b in beams:
        index.search(Q, k=10, beam=b)
        _sync()
        t0 = time.perf_counter()
        _d, i = index.search(Q, k=10, beam=b)
        _sync()
        ts[b] = time.perf_counter() - t0
        rec[b] = _recall(cp.asnumpy(i), truth)
    return rec, ts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--sets", default="default,separated")
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--beams", default="32,64")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--skip-old", action="store_true")
    ap.add_argument("--sweep", action="store_true", help="NN-Descent settings vs time and recall instead")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    import cupy as cp

    import knnkit

    beams = [int(b) for b in args.beams.split(",")]
    out = {"gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "commit": _git_commit(),
           "sets": []}
    # warm-up: compile every kernel of both pipelines (and the Numba functions of the old one)
    Xw, Qw = knnkit.datasets.make_clustered(120_000, 32, n_queries=100, random_state=1, device="gpu")
    for deg in (None, 64):
        w = knnkit.GraphIndex.build(Xw, graph_degree=deg, device="gpu", random_state=0)
        if not args.skip_old and not args.sweep:
            old_build(Xw, "sqeuclidean", w)
    configs = [{}, {"delta": 0.003}, {"delta": 0.01}, {"delta": 0.03}, {"max_iters": 8}, {"max_iters": 6},
               {"sample": 12}, {"sample": 12, "delta": 0.01}, {"cap_mult": 2}]
    for name in args.sets.split(","):
        if name == "default":
            X, Q = knnkit.datasets.make_clustered(args.n, 128, n_queries=10_000, random_state=0, device="gpu")
        elif name == "separated":
            X, Q = knnkit.datasets.make_clustered(args.n, 96, n_queries=10_000, n_clusters=100, cluster_std=0.05,
                                                  random_state=0, device="gpu")
        else:
            raise ValueError(name)
        if args.sweep:
            out["sets"].append(sweep_set(name, X, Q, "sqeuclidean", beams, configs))
        else:
            out["sets"].append(run_set(name, X, Q, "sqeuclidean", beams, args.skip_old, args.reps))
        print(json.dumps(out["sets"][-1]), flush=True)
        del X, Q
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "graph_build.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
