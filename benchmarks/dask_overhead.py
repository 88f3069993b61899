"""Single-worker overhead of knnkit.dask.knn_graph (issue 17): the single-process
``knnkit.knn_graph`` against ``knnkit.dask.knn_graph`` on ONE Dask worker (a separate process, as
one worker per GPU), same data, k and seed; then W workers. Besides wall seconds, every run records CPU seconds
(user + system, all threads) of the single process, or of the client and the workers: on a
shared, loaded machine the wall clock is noisy, the CPU seconds a build costs are not. Repetitions are interleaved (single,
then each schedule) and each run records the client's ``phases`` and the per-worker task stream.

    PYTHONPATH=src python benchmarks/dask_overhead.py --n 150000 --d 64 --device cpu > $OUT/dask_overhead.json
    PYTHONPATH=src python benchmarks/dask_overhead.py --n 4000000 --d 96 --device gpu --device-blocks > $OUT/o.json

The data is persisted on the workers before the clock starts (as in dask_scaling.py); kernels
are warmed on a 20k-row slice first in every process.
"""

import argparse
import json
import sys
import time

import numpy as np


def cpu_s():
    """CPU seconds (user + system) this process has used so far, all its threads."""
    import resource

    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=150_000)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--workers", default="1", help="comma separated worker counts")
    ap.add_argument("--partition", default="rows,tree")
    ap.add_argument("--device-blocks", action="store_true",
                    help="gpu: the persisted blocks are cupy arrays on the workers' GPUs (else host numpy)")
    args = ap.parse_args()
    import dask.array as da
    from distributed import Client, LocalCluster, get_task_stream, wait

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from dask_scaling import _busy

    import knnkit
    import knnkit.dask
    from knnkit.datasets import make_clustered

    dev = args.device
    X, _ = make_clustered(args.n, args.d, n_queries=10, n_clusters=1000, random_state=0, device=dev)
    X = np.ascontiguousarray(X.get() if hasattr(X, "get") else X, dtype=np.float32)
    rows = np.sort(np.random.default_rng(0).choice(args.n, 2000, replace=False))
    Dt, _ = knnkit.knn(X, X[rows], k=args.k + 1, device=dev)
    kth = np.asarray(Dt.get() if hasattr(Dt, "get") else Dt)[:, args.k]

    def rec(I):
        I = np.asarray(I.get() if hasattr(I, "get") else I)[rows]
        d = ((X[I].astype(np.float64) - X[rows][:, None]) ** 2).sum(-1)
        return round(float(np.mean(d <= kth[:, None] * (1 + 1e-5) + 1e-12)), 5)

    out = {"n": args.n, "d": args.d, "k": args.k, "device": dev, "device_blocks": bool(args.device_blocks), "runs": []}
    Xd = X
    if dev == "gpu":
        import cupy as cp

        Xd = cp.asarray(X)
    knnkit.knn_graph(Xd[:20000], k=args.k, device=dev)
    for w in map(int, args.workers.split(",")):
        if dev == "gpu":
            try:
                from dask_cuda import LocalCUDACluster

                cluster = LocalCUDACluster(CUDA_VISIBLE_DEVICES=",".join(map(str, range(w))), n_workers=w,
                                           threads_per_worker=1, dashboard_address=None)
            except ImportError:  # what LocalCUDACluster does: one Nanny per GPU, each seeing only its own
                from distributed import Nanny, Scheduler, SpecCluster

                spec = {f"gpu{g}": {"cls": Nanny, "options": {"nthreads": 1, "memory_limit": 0,
                                                              "env": {"CUDA_VISIBLE_DEVICES": str(g)}}}
                        for g in range(w)}
                cluster = SpecCluster(scheduler={"cls": Scheduler, "options": {"dashboard_address": None}},
                                      workers=spec)
        else:
            cluster = LocalCluster(n_workers=w, threads_per_worker=1, processes=True, dashboard_address=None)
        with cluster, Client(cluster) as c:
            dX = da.from_array(X, chunks=(-(-args.n // w), args.d))
            if args.device_blocks:  # the blocks live in the workers' GPU memory, as the reference's cupy input
                import cupy

                dX = dX.map_blocks(cupy.asarray, dtype=X.dtype, meta=cupy.empty((0, 0), X.dtype))
            dX = c.persist(dX)
            wait(dX)
            for sched in args.partition.split(","):  # warm every worker's kernels
                knnkit.dask.knn_graph(dX[:20000 * w].rechunk((20000, args.d)), k=args.k, client=c, device=dev,
                                      partition=sched, n_parts=w)
            for rep in range(args.reps):
                if w == 1:
                    t, u = time.perf_counter(), cpu_s()
                    g = knnkit.knn_graph(Xd, k=args.k, device=dev, random_state=0)
                    if dev == "gpu":
                        cp.cuda.Device().synchronize()
                    r = {"bench": "knn_graph_single_process", "rep": rep, "seconds": round(time.perf_counter() - t, 3),
                         "cpu_s": round(cpu_s() - u, 3), "recall": rec(g.indices),
                         "engine_recall_estimate": g.stats.extra.get("recall_estimate")}
                    out["runs"].append(r)
                    log(json.dumps(r))
                for sched in args.partition.split(","):
                    wu, u = c.run(cpu_s), cpu_s()
                    t = time.perf_counter()
                    with get_task_stream(client=c) as ts:
                        g = knnkit.dask.knn_graph(dX, k=args.k, client=c, device=dev, partition=sched, n_parts=w,
                                                  random_state=0)
                    s = time.perf_counter() - t
                    u, wu = cpu_s() - u, {a: v - wu[a] for a, v in c.run(cpu_s).items()}
                    ex = g.stats.extra
                    r = {"bench": "dask_knn_graph", "schedule": sched, "workers": w, "rep": rep, "seconds": round(s, 3),
                         "cpu_s": {"client": round(u, 3), "workers": round(sum(wu.values()), 3)},
                         "recall": rec(g.indices), "recall_estimate": ex.get("recall_estimate"),
                         "phases": ex.get("phases"), "slab_fraction": ex.get("slab_fraction"),
                         "tasks": _busy(ts.data, t)}
                    out["runs"].append(r)
                    log(json.dumps({key: v for key, v in r.items() if key != "tasks"}))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
