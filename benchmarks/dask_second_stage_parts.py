"""The tree schedule's stages run one after another in ONE process (no Dask), each timed in CPU
seconds (robust on a loaded, shared box) and wall seconds: the single-process build, the two leaf
graphs, the old second stage (one graph of the whole boundary slab) and the new one (each leaf's
slab rows searched in the other leaf's graph: two cross searches, one per worker), and the final
per-leaf merges. With one device per worker, the 2-worker build takes about
``max(leaf) + second stage (the slab graph, or max(cross searches)) + max(merge)`` plus Dask's
moves; this script gives those terms and the recall of both second stages on the same leaves.

    NUMBA_NUM_THREADS=1 PYTHONPATH=src python benchmarks/dask_second_stage_parts.py --n 200000 --d 32
"""

import argparse
import json
import resource
import time

import numpy as np


def cpu_s():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--d", type=int, default=32)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--clusters", type=int, default=1000)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    import knnkit
    from knnkit.dask import _tasks as t
    from knnkit.dask._api import RADII_SAMPLE, _weighted_quantile
    from knnkit.datasets import make_clustered

    n, k, dev, metric = args.n, args.k, args.device, "sqeuclidean"
    X, _ = make_clustered(n, args.d, n_queries=10, n_clusters=args.clusters, random_state=0, device="cpu")
    X = np.ascontiguousarray(X, dtype=np.float32)
    rows = np.sort(np.random.default_rng(0).choice(n, 2000, replace=False))
    Dt, _ = knnkit.knn(X, X[rows], k=k + 1, device=dev)
    kth = np.asarray(Dt.get() if hasattr(Dt, "get") else Dt)[:, k]

    def rec(I):
        d = ((X[np.asarray(I)[rows]].astype(np.float64) - X[rows][:, None]) ** 2).sum(-1)
        return round(float(np.mean(d <= kth[:, None] * (1 + 1e-5) + 1e-12)), 5)

    out = {"label": args.label, "n": n, "d": args.d, "k": k, "device": dev, "parts": {}}

    def timed(name, fn, *a):
        if dev == "gpu":
            import cupy

            cupy.cuda.Device().synchronize()
        w, c = time.perf_counter(), cpu_s()
        r = fn(*a)
        if dev == "gpu":
            cupy.cuda.Device().synchronize()
        out["parts"][name] = {"wall_s": round(time.perf_counter() - w, 3), "cpu_s": round(cpu_s() - c, 3)}
        return r

    # warm every kernel on a slice (JIT compiles are not part of the build)
    Xw = X[:20000]
    knnkit.knn_graph(Xw, k=k, device=dev)
    lw = (np.arange(20000, dtype=np.int64), Xw, np.zeros((20000, 1), np.float32))
    lsw = t.leaf_graph(lw, k, metric, dev, 1, True)
    t.merge_leaf(lw, lsw, k, metric, t.cross_search(lw, lsw, (lw[0][:500], Xw[:500], np.arange(500)), 0, 1.0, k,
                                                    metric, dev, 1)[1])
    g = timed("single_process", lambda: knnkit.knn_graph(X, k, device=dev, random_state=0))
    out["single_recall"] = rec(g.indices)
    P = 2
    parts = [(0, X[: n // 2]), (n // 2, X[n // 2:])]
    tree = t.fit_tree(P, "pca", 0, *[t.sample_rows(x, 10000, 5 + p, False) for p, (_o, x) in enumerate(parts)])
    routed = [t.route(x, tree, P, False) for _o, x in parts]
    leaves = [t.assemble(*[t.select_leaf(x, rt, o, L) for (o, x), rt in zip(parts, routed)]) for L in range(P)]
    lists = [timed(f"leaf_graph_{L}", t.leaf_graph, leaves[L], k, metric, dev, 7919 * L + 1, True) for L in range(P)]
    needs = [t.slab_samples(leaves[L], lists[L], tree, L, P, k, metric, "projected", RADII_SAMPLE, 13 * L + 7)
             for L in range(P)]
    w = _weighted_quantile([needs[L][0] for L in range(P)], 0.99)
    sel = [t.select_slab(leaves[L], lists[L], 0, w, k, metric, "projected") for L in range(P)]
    out["leaf_sizes"] = [int(lf[0].size) for lf in leaves]
    out["slab_rows"] = [int(s[0].size) for s in sel]
    # old second stage: one graph of the slab (on one worker)
    slab = t.assemble(*sel)
    sl = timed("slab_graph", t.leaf_graph, slab, k, metric, dev, 3)
    I = np.full((n, k), -1, np.int32)
    for L in range(P):
        ids, Il, _Dl = timed(f"merge_slab_{L}", t.merge_leaf, leaves[L], lists[L], k, metric,
                             t.slab_for_leaf(slab, sl, L))
        I[ids] = Il
    out["recall_slab"] = rec(I)
    # new second stage: leaf L's slab rows searched in leaf 1 - L's graph (on leaf 1 - L's worker)
    res = [timed(f"cross_search_{1 - L}", t.cross_search, leaves[1 - L], lists[1 - L], sel[L], 0, w, k, metric, dev,
                 11 + L) for L in range(P)]
    I = np.full((n, k), -1, np.int32)
    for L in range(P):
        ids, Il, Dl = timed(f"merge_search_{L}", t.merge_leaf, leaves[L], lists[L], k, metric, res[L][0],
                            res[1 - L][1])
        assert (np.diff(Dl, axis=1) >= 0).all()
        I[ids] = Il
    out["recall_search"] = rec(I)
    p = {key: v["cpu_s"] for key, v in out["parts"].items()}
    leaf = max(p["leaf_graph_0"], p["leaf_graph_1"])
    out["model_cpu_s"] = {
        "single": p["single_process"],
        "two_workers_slab": round(leaf + p["slab_graph"] + max(p["merge_slab_0"], p["merge_slab_1"]), 3),
        "two_workers_search": round(leaf + max(p["cross_search_0"], p["cross_search_1"])
                                    + max(p["merge_search_0"], p["merge_search_1"]), 3)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
