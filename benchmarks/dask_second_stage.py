"""knnkit.dask.knn_graph's second stage on 2 workers (issue 17): the single process, one worker
(one partition) and two workers (the tree and rows schedules), with every task's worker and
start / stop recorded, so that one sees whether the stage after the partition graphs runs on
both workers and how long each worker computes in it.

Runs against whichever knnkit is importable (PYTHONPATH): the same script measures the schedules
before (tree: one slab graph on one worker; rows: one GGM merge on one worker) and after
(``second_stage="search"``: cross searches on both workers), paired in one shell run:

    for src in /path/before/src src; do PYTHONPATH=$src python benchmarks/dask_second_stage.py \\
        --n 200000 --d 32 --label $src >> $OUT/second_stage.jsonl; done

On a CPU box every process runs ``--threads`` Numba threads (default 1: each worker stands for one
device, the single process and the one-worker run for one device too); wall seconds, CPU seconds
(user + system of the client and all workers) and the per-worker compute seconds of each stage
are recorded, and per worker the thread CPU seconds of each task prefix (distributed's
fine performance metrics; robust where the wall clock is not). ``--device gpu`` (one worker per
GPU, as dask_scaling.py) runs the same on GPUs (scripts/device/dask_2gpu.sh); the data lives in
host memory everywhere (the single process copies it to its GPU, the workers hold numpy blocks).
"""

import argparse
import inspect
import json
import os
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # knnkit's path is recorded relative to it


def cpu_s():
    """CPU seconds (user + system) this process has used so far, all its threads."""
    import resource

    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def log(*a):
    print(*a, file=sys.stderr, flush=True)


#: task prefixes of each stage: the partition graphs, the second stage, the final per-leaf merge
FIRST = ("leaf_graph", "part_graph", "single_graph")
SECOND = ("cross_search", "pair_merge", "slab_graph")


def _tasks(records, t0):
    """Every compute task: ``[prefix, worker, start, stop]`` (seconds after the first start)."""
    from dask.utils import key_split

    out = []
    for rec in records:
        for ss in rec.get("startstops", ()):
            if ss.get("action") == "compute":
                out.append([key_split(rec.get("key", "?")), str(rec.get("worker")), ss["start"], ss["stop"]])
    base = min((r[2] for r in out), default=t0)
    return sorted([[p, w, round(a - base, 3), round(b - base, 3)] for p, w, a, b in out], key=lambda r: r[2])


def _stages(tasks):
    """Per stage, per worker: compute seconds and span. The slab graph of the old tree schedule is a
    ``leaf_graph`` task that starts after the first ``select_slab``: counted as second stage."""
    slab_t = min((a for p, _w, a, _b in tasks if p == "select_slab"), default=float("inf"))
    out = {}
    for p, w, a, b in tasks:
        if p in SECOND or (p == "leaf_graph" and a >= slab_t):
            st = "second"
        elif p in FIRST:
            st = "first"
        elif p in ("merge_leaf", "merge_running", "compact"):
            st = "final_merge"
        else:
            continue
        d = out.setdefault(st, {}).setdefault(w, {"tasks": 0, "compute_s": 0.0, "start_s": a, "stop_s": b})
        d["tasks"] += 1
        d["compute_s"] = round(d["compute_s"] + b - a, 3)
        d["start_s"], d["stop_s"] = min(d["start_s"], a), max(d["stop_s"], b)
    return out


def _task_cpu(dask_worker):
    """This worker's thread CPU seconds so far per task prefix (distributed's fine performance
    metrics: the CPU time of the thread that ran the task; with one Numba thread per worker, all of it)."""
    out = {}
    for key, v in dask_worker.digests_total.items():
        if isinstance(key, tuple) and len(key) == 5 and key[0] == "execute" and key[3] == "thread-cpu":
            out[key[2]] = out.get(key[2], 0.0) + float(v)
    return out


def _cpu_delta(before, after):
    return {w: {p: round(v - before.get(w, {}).get(p, 0.0), 3) for p, v in d.items()
                if v - before.get(w, {}).get(p, 0.0) > 0.0005} for w, d in after.items()}


def _cluster(workers, device, threads):
    from distributed import LocalCluster

    if device == "gpu":  # one worker per GPU (as dask_overhead.py)
        try:
            from dask_cuda import LocalCUDACluster

            return LocalCUDACluster(CUDA_VISIBLE_DEVICES=",".join(map(str, range(workers))), n_workers=workers,
                                    threads_per_worker=1, dashboard_address=None)
        except ImportError:  # what LocalCUDACluster does: one Nanny per GPU, each seeing only its own
            pass
        from distributed import Nanny, Scheduler, SpecCluster

        spec = {f"gpu{g}": {"cls": Nanny, "options": {"nthreads": 1, "memory_limit": 0,
                                                      "env": {"CUDA_VISIBLE_DEVICES": str(g)}}}
                for g in range(workers)}
        return SpecCluster(scheduler={"cls": Scheduler, "options": {"dashboard_address": None}}, workers=spec)
    return LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                        memory_limit=0, env={"NUMBA_NUM_THREADS": str(threads)})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--d", type=int, default=32)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--clusters", type=int, default=1000)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="Numba threads per process (CPU)")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--schedules", default="tree,rows", help="2-worker schedules")
    ap.add_argument("--second-stages", default="auto", help="second_stage values to run (where supported)")
    ap.add_argument("--skip-single", action="store_true", help="no single-process and 1-worker runs")
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    if args.device == "cpu":
        os.environ["NUMBA_NUM_THREADS"] = str(args.threads)
    import dask.array as da
    from distributed import Client, get_task_stream, wait

    import knnkit
    import knnkit.dask
    from knnkit.datasets import make_clustered

    has_stage = "second_stage" in inspect.signature(knnkit.dask.knn_graph).parameters
    dev = args.device
    X, _ = make_clustered(args.n, args.d, n_queries=10, n_clusters=args.clusters, random_state=0, device=dev)
    X = np.ascontiguousarray(X.get() if hasattr(X, "get") else X, dtype=np.float32)  # host data, as a numpy input
    rows = np.sort(np.random.default_rng(0).choice(args.n, 2000, replace=False))
    Dt, _ = knnkit.knn(X, X[rows], k=args.k + 1, device=dev)
    kth = np.asarray(Dt.get() if hasattr(Dt, "get") else Dt)[:, args.k]

    def rec(I):
        I = np.asarray(I.get() if hasattr(I, "get") else I)[rows]
        d = ((X[I].astype(np.float64) - X[rows][:, None]) ** 2).sum(-1)
        return round(float(np.mean(d <= kth[:, None] * (1 + 1e-5) + 1e-12)), 5)

    def sorted_ok(D):
        D = np.asarray(D.get() if hasattr(D, "get") else D)
        return bool((np.diff(D, axis=1) >= 0).all())

    head = {"label": args.label, "n": args.n, "d": args.d, "k": args.k, "device": dev, "threads": args.threads,
            "knnkit": os.path.relpath(knnkit.__file__, REPO), "has_second_stage": has_stage, "load_avg": os.getloadavg()}
    log(json.dumps(head))
    print(json.dumps(dict(head, bench="header")), flush=True)
    knnkit.knn_graph(X[:20000], k=args.k, device=dev)  # warm this process's kernels
    runs = [(1, "tree", None)] if not args.skip_single else []
    for sched in args.schedules.split(","):
        for b in (args.second_stages.split(",") if has_stage else [None]):
            runs.append((2, sched, b))
    for w in sorted({r[0] for r in runs}):
        with _cluster(w, dev, args.threads) as cluster, Client(cluster) as c:
            dX = c.persist(da.from_array(X, chunks=(-(-args.n // w), args.d)))
            wait(dX)
            for _w, sched, b in [r for r in runs if r[0] == w]:  # warm every worker's kernels
                kw = {"second_stage": b} if b else {}
                knnkit.dask.knn_graph(dX[:20000 * w].rechunk((20000, args.d)), k=args.k, client=c, device=dev,
                                      partition=sched, n_parts=w, **kw)
            for rep in range(args.reps):
                if w == 1 and not args.skip_single:
                    t, u = time.perf_counter(), cpu_s()
                    g = knnkit.knn_graph(X, k=args.k, device=dev, random_state=0)
                    r = {"bench": "single_process", "rep": rep, "seconds": round(time.perf_counter() - t, 3),
                         "cpu_s": round(cpu_s() - u, 3), "recall": rec(g.indices), "sorted": sorted_ok(g.distances)}
                    r.update(label=args.label)
                    print(json.dumps(r), flush=True)
                    log(json.dumps(r))
                for _w, sched, b in [r for r in runs if r[0] == w]:
                    kw = {"second_stage": b} if b else {}
                    wu, u, tc = c.run(cpu_s), cpu_s(), c.run(_task_cpu)
                    t = time.perf_counter()
                    with get_task_stream(client=c) as ts:
                        g = knnkit.dask.knn_graph(dX, k=args.k, client=c, device=dev, partition=sched, n_parts=w,
                                                  random_state=0, **kw)
                    s = time.perf_counter() - t
                    u, wu = cpu_s() - u, {a: v - wu[a] for a, v in c.run(cpu_s).items()}
                    tc = _cpu_delta(tc, c.run(_task_cpu))
                    ex = g.stats.extra
                    tasks = _tasks(ts.data, t)
                    r = {"bench": "dask_knn_graph", "label": args.label, "schedule": sched, "second_stage_arg": b,
                         "workers": w, "rep": rep, "seconds": round(s, 3),
                         "cpu_s": {"client": round(u, 3), "workers": round(sum(wu.values()), 3)},
                         "recall": rec(g.indices), "sorted": sorted_ok(g.distances),
                         "recall_estimate": ex.get("recall_estimate"), "second_stage": ex.get("second_stage"),
                         "method": g.stats.method, "cross_searches": ex.get("cross_searches"),
                         "slab_fraction": ex.get("slab_fraction"), "merges": ex.get("merges"),
                         "phases": ex.get("phases"), "stages": _stages(tasks), "task_cpu_s": tc, "tasks": tasks}
                    print(json.dumps(r), flush=True)
                    log(json.dumps({key: v for key, v in r.items() if key != "tasks"}))


if __name__ == "__main__":
    main()
