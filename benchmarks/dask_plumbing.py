"""knnkit.dask.knn_graph on ONE worker with the graph engine and the exact search replaced by stubs
(no distance computations): what the Dask path costs besides the build itself, at a GPU-sized
input (4M x 96) on a CPU box, where the real build would take minutes. The single process runs
the same stubbed build (validation, metric transform, output conversion), repeated alongside.

    PYTHONPATH=src python benchmarks/dask_plumbing.py --n 4000000 --d 96 > $OUT/dask_plumbing.json
"""

import argparse
import json
import time

import numpy as np


def patch():
    """Stub the engine (all-ones ids, zero distances) and the exact search in this process."""
    import knnkit.api._graphops as graphops
    import knnkit.api.exact as exact
    import knnkit.graph as graph

    def build_lists(X, k, *, metric, method, params=None, seed=0, **kw):
        n = int(X.shape[0])
        return np.ones((n, k), np.int32), np.zeros((n, k), np.float32), {"method": "stub", "recall_estimate": 1.0}

    def exact_search(P, Q, k, **kw):
        m = Q.n if Q is not None else P.n
        return np.zeros((m, k), np.float32), np.tile(np.arange(k, dtype=np.int64), (m, 1)), {}

    graph.build_lists = graphops.build_lists = build_lists
    exact.exact_search = exact_search
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4_000_000)
    ap.add_argument("--d", type=int, default=96)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    import dask.array as da
    from distributed import Client, LocalCluster, wait

    import knnkit
    import knnkit.dask

    X = np.random.default_rng(0).standard_normal((args.n, args.d), dtype=np.float32)
    patch()
    out = {"n": args.n, "d": args.d, "runs": []}
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cl, \
            Client(cl) as c:
        c.run(patch)
        dX = c.persist(da.from_array(X, chunks=(args.n, args.d)))
        wait(dX)
        for rep in range(args.reps):
            t = time.perf_counter()
            knnkit.knn_graph(X, k=10, device="cpu", random_state=0)
            out["runs"].append({"bench": "single_process_stub", "rep": rep, "seconds": round(time.perf_counter() - t, 3)})
            for sched in ("rows", "tree"):
                t = time.perf_counter()
                g = knnkit.dask.knn_graph(dX, k=10, client=c, device="cpu", partition=sched, n_parts=1)
                out["runs"].append({"bench": "dask_stub", "schedule": sched, "rep": rep,
                                    "seconds": round(time.perf_counter() - t, 3), "phases": g.stats.extra["phases"]})
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
