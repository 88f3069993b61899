"""knnkit.dask.knn_graph on ONE worker with the graph engine and the exact search replaced by stubs
(no distance computations): what the Dask path costs besides the build itself, at a GPU-sized
input (4M x 96) on a CPU box, where the real build would take minutes. The single process runs
the same stubbed build (validation, metric transform, output conversion), repeated alongside.

    PYTHONPATH=src python benchmarks/dask_plumbing.py --n 4000000 --d 96 > $OUT/dask_plumbing.json
    PYTHONPATH=src python benchmarks/dask_plumbing.py --n 4000000 --d 96 --workers 2 --slab-quantile 0.3 \
        --schedules tree > $OUT/dask_plumbing_2w.json      (the tree on two workers, cross searches stubbed too)
"""

import argparse
import json
import sys
import time

import numpy as np


def patch():
    """Stub the engine (all-ones ids, unit distances: zero distances between distinct rows would
    read as an underflow, _core/underflow.py) and the exact search in this process."""
    import knnkit.api._graphops as graphops
    import knnkit.api.exact as exact
    import knnkit.graph as graph

    def build_lists(X, k, *, metric, method, params=None, seed=0, **kw):
        n = int(X.shape[0])
        return np.ones((n, k), np.int32), np.ones((n, k), np.float32), {"method": "stub", "recall_estimate": 1.0}

    def exact_search(P, Q, k, **kw):
        m = Q.n if Q is not None else P.n
        return np.zeros((m, k), np.float32), np.tile(np.arange(k, dtype=np.int64), (m, 1)), {}

    graph.build_lists = graphops.build_lists = build_lists
    exact.exact_search = exact_search
    try:  # the cross searches (second_stage="search"): no walk, no seed selection, no sorts
        import knnkit.index._cpu as icpu
        from knnkit.index._entry import EntryPoints

        def search(X, graph, queries, k, *, seeds, **kw):
            nq, m = int(queries.shape[0]), int(X.shape[0])
            i = (np.arange(nq, dtype=np.int64)[:, None] + np.arange(k)) % m
            return np.zeros((nq, k), np.float32), i

        icpu.search = search
        EntryPoints.seeds_for = lambda self, q, s, exact=False: np.zeros((q.shape[0], s), np.int32)
        import knnkit.dask._tasks as tasks

        # the search graph's reverse edges and the reverse candidates are sorts on the GPU (the CPU
        # twin's sequential insertion is CPU-path compute): stubs of the same output sizes
        tasks.search_graph = lambda xp, I, D, width: I

        def group_topk(xp, owner, other, d, width, n_owner):
            r = min(int(n_owner), owner.size // width)
            return (np.arange(r, dtype=np.int64), other[:r * width].reshape(r, width).astype(np.int64),
                    np.sort(d[:r * width].reshape(r, width), axis=1))

        tasks._group_topk = group_topk
    except (ImportError, AttributeError):
        pass
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4_000_000)
    ap.add_argument("--d", type=int, default=96)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--workers", type=int, default=1, help="2: the tree on two workers (n_parts=2)")
    ap.add_argument("--slab-quantile", type=float, default=None,
                    help="tree on 2 workers: slab_quantile (0.30 puts ~42%% of standard normal data in the slab, "
                         "as 4M x 96 clustered on the H200s)")
    ap.add_argument("--schedules", default="rows,tree")
    args = ap.parse_args()
    import dask.array as da
    from distributed import Client, LocalCluster, get_task_stream, wait

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from dask_scaling import _busy

    import knnkit
    import knnkit.dask

    X = np.random.default_rng(0).standard_normal((args.n, args.d), dtype=np.float32)
    patch()
    out = {"n": args.n, "d": args.d, "runs": []}
    W = args.workers
    out["workers"] = W
    with LocalCluster(n_workers=W, threads_per_worker=1, processes=True, dashboard_address=None,
                      memory_limit=0) as cl, Client(cl) as c:
        c.run(patch)
        dX = c.persist(da.from_array(X, chunks=(-(-args.n // W), args.d)))
        wait(dX)
        kw = {"slab_quantile": args.slab_quantile} if args.slab_quantile else {}
        for rep in range(args.reps):
            t = time.perf_counter()
            knnkit.knn_graph(X, k=10, device="cpu", random_state=0)
            out["runs"].append({"bench": "single_process_stub", "rep": rep, "seconds": round(time.perf_counter() - t, 3)})
            for sched in args.schedules.split(","):
                t = time.perf_counter()
                with get_task_stream(client=c) as ts:
                    g = knnkit.dask.knn_graph(dX, k=10, client=c, device="cpu", partition=sched, n_parts=W,
                                              **(kw if sched == "tree" else {}))
                r = {"bench": "dask_stub", "schedule": sched, "rep": rep, "seconds": round(time.perf_counter() - t, 3),
                     "phases": g.stats.extra["phases"], "slab_fraction": g.stats.extra.get("slab_fraction"),
                     "second_stage": g.stats.extra.get("second_stage")}
                if W > 1:
                    r["tasks"] = _busy(ts.data, t)
                out["runs"].append(r)
                print(json.dumps({key: v for key, v in r.items() if key != "tasks"}), file=sys.stderr, flush=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
