"""Scaling of knnkit.dask over the GPUs of one host (issue 17): 1 worker vs W workers
(dask_cuda.LocalCUDACluster, one worker per GPU, TCP between them).

* knn_graph, strong scaling: the same N x d clustered data on 1 and W workers (partitions = workers,
  and 2 x workers), recall@10 on 2,000 sampled rows against exact neighbours, seconds (the data is
  already in the workers' memory when the clock starts);
* ShardedIndex search throughput with replication: one shard on 1 worker vs the same shard
  replicated on W workers, query blocks split between replicas; recall@10 and QPS;
* exact knn of 100k queries: data partitioned over 1 and W workers.

``--partition rows,tree`` runs knn_graph with each schedule (``knnkit.dask.knn_graph(partition=...)``);
``knn_graph`` runs record ``phases`` (the client's seconds: tasks submitted, waiting for the
final lists, gathering them, the recall estimate) and ``tasks`` (per worker and task prefix).
``--resident-queries`` times the replicated search with the queries already on the workers (a
persisted dask array, blocks spread round-robin over the workers) and the results left there
(``search(compute=False)`` + persist + wait: nothing passes through the client), and once per
worker count the same queries as a numpy array (sent by the client, results gathered);
``--device-queries`` makes the resident blocks cupy arrays on the GPU workers (no host copy per
block: 4-10 ms per 50k block instead of 13-19 ms, ``two_gpu_contention.py``).
Every timed run records ``client``: the client's seconds by call (scatter, submit, wait,
gather, other; ``dask_path_cost.ClientClock``) and ``transfer_s``: the workers' seconds spent
receiving data from each other (task stream).

The GPU machine has no network: install the wheels staged by ``benchmarks/stage_dask.sh`` first.

    pip install -q --no-index --no-deps .wheels/dask/*.whl
    PYTHONPATH=src python benchmarks/dask_scaling.py --n 4000000 > $OUT/dask_scaling.json
"""

import argparse
import json
import subprocess
import sys
import time

import numpy as np


def log(*a):
    print(*a, file=sys.stderr, flush=True)


DEVICE = "gpu"


def true_distances(X, rows, k=10):
    """The exact (k + 1)-th distances of ``X[rows]`` (themselves included), for sampled_recall."""
    import knnkit

    D_true, _ = knnkit.knn(X, X[rows], k=k + 1, device=DEVICE)
    return np.asarray(D_true.get() if hasattr(D_true, "get") else D_true)


def sampled_recall(X, I, rows, k=10, D_true=None):
    D_true = true_distances(X, rows, k) if D_true is None else D_true
    hits = 0
    for j, r in enumerate(rows):
        d = ((X[I[r, :k]].astype(np.float64) - X[r]) ** 2).sum(1)
        hits += int(np.sum(d <= D_true[j, k] * (1 + 1e-5) + 1e-12))
    return hits / (len(rows) * k)


def _busy(records, t0):
    """Per worker and task prefix: tasks, summed compute seconds, first start and last stop
    (seconds after the clock started): whether the workers' tasks overlap in time."""
    from dask.utils import key_split

    out = {}
    for rec in records:
        pre = key_split(rec.get("key", "?"))
        for ss in rec.get("startstops", ()):
            if ss.get("action") != "compute":
                continue
            w = out.setdefault(str(rec.get("worker")), {}).setdefault(pre, [0, 0.0, float("inf"), 0.0])
            w[0] += 1
            w[1] += ss["stop"] - ss["start"]
            w[2] = min(w[2], ss["start"])
            w[3] = max(w[3], ss["stop"])
    base = min((v[2] for d in out.values() for v in d.values()), default=0.0)
    return {w: {p: {"tasks": v[0], "compute_s": round(v[1], 3), "first_start_s": round(v[2] - base, 3),
                    "last_stop_s": round(v[3] - base, 3)} for p, v in d.items()} for w, d in out.items()}


def _worker_gpu():
    import os

    import cupy

    return {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "pci_bus_id": cupy.cuda.Device(0).pci_bus_id}


def _count(items):
    out = {}
    for x in items:
        out[str(x)] = out.get(str(x), 0) + 1
    return out


def _set_descent(sparse, overlap):
    """On a worker: the shared descent's exchange (changed rows only or whole shares,
    ``knnkit.graph.nndescent._gpu.SPARSE_EXCHANGE``) and whether the owners share their rows beside
    the next sampling (``OVERLAP_SHARE``)."""
    from knnkit.graph.nndescent import _gpu

    _gpu.SPARSE_EXCHANGE = bool(sparse)
    _gpu.OVERLAP_SHARE = bool(overlap)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4_000_000)
    ap.add_argument("--d", type=int, default=96)
    ap.add_argument("--queries", type=int, default=1_000_000)
    ap.add_argument("--workers", type=int, default=0, help="0: every GPU")
    ap.add_argument("--benches", default="graph,exact,search")
    ap.add_argument("--part-factors", default="1,2", help="partitions per worker to try for knn_graph")
    ap.add_argument("--partition", default="auto", help="knn_graph schedules to time, comma separated: auto, rows, tree, descent")
    ap.add_argument("--graph-compute", default="true",
                    help="knn_graph compute= values to time, comma separated: true (lists gathered to the client, "
                         "as before 2026-11-26), false (lists left on the workers; recall read after the timing)")
    ap.add_argument("--device-queries", action="store_true",
                    help="with --resident-queries: the resident blocks are cupy arrays on the GPU workers")
    ap.add_argument("--search-repeats", type=int, default=1, help="timed searches per (workers, beam)")
    ap.add_argument("--beams", default="32,64,128", help="search beams to time, comma separated")
    ap.add_argument("--numpy-before", action="store_true",
                    help="with --resident-queries: the client-memory search also right after the build")
    ap.add_argument("--query-block", type=int, default=50_000,
                    help="with --resident-queries: rows per resident query block (one search task each)")
    ap.add_argument("--resident-queries", action="store_true",
                    help="search: queries as a persisted dask array on the workers, results persisted there")
    ap.add_argument("--cpu", action="store_true", help="smoke run on CPU workers (LocalCluster), small n")
    ap.add_argument("--exchange", default="sparse",
                    help="shared descent: 'sparse' (changed rows only), 'whole' (whole shares), or both "
                         "comma separated (A/B in one cluster; set on every worker)")
    ap.add_argument("--overlap", default="on",
                    help="shared descent: the owners' rows shared beside the next sampling ('on') or at the end "
                         "of each iteration ('off'), or both comma separated (A/B in one cluster)")
    ap.add_argument("--worker-counts", default="", help="clusters to time, comma separated (default: 1 and all)")
    ap.add_argument("--no-single", action="store_true", help="graph: skip the single-process reference")
    ap.add_argument("--device-data", action="store_true",
                    help="knn_graph: the data as a persisted dask array of cupy blocks on the workers' GPUs "
                         "(the single-process reference has its data on the GPU too)")
    args = ap.parse_args()
    schedules = args.partition.split(",")
    for p in schedules:
        if p not in ("auto", "rows", "tree", "descent"):
            ap.error(f"--partition: {p!r} is not one of auto, rows, tree, descent")
    import dask.array as da
    from distributed import Client, LocalCluster, wait

    import knnkit
    import knnkit.dask
    from knnkit.datasets import make_clustered
    from knnkit.evaluate import recall

    global DEVICE
    dev = DEVICE = "cpu" if args.cpu else "gpu"
    if args.cpu:
        n_gpus, name = 0, "cpu"
        W = args.workers or 2

        def cluster_of(w):
            # separate processes, as one worker per GPU: data and results cross between processes
            return LocalCluster(n_workers=w, threads_per_worker=1, processes=True, dashboard_address=None)
    else:
        import cupy as cp
        try:
            from dask_cuda import LocalCUDACluster
        except ImportError:  # what LocalCUDACluster does: one Nanny per GPU, each seeing only its own
            from distributed import Nanny, Scheduler, SpecCluster

            def LocalCUDACluster(CUDA_VISIBLE_DEVICES, n_workers, threads_per_worker, dashboard_address):
                gpus = CUDA_VISIBLE_DEVICES.split(",")
                spec = {f"gpu{g}": {"cls": Nanny, "options": {"nthreads": threads_per_worker, "memory_limit": 0,
                                                              "env": {"CUDA_VISIBLE_DEVICES": g}}}
                        for g in gpus[:n_workers]}
                return SpecCluster(scheduler={"cls": Scheduler, "options": {"dashboard_address": dashboard_address}},
                                   workers=spec)

        n_gpus = cp.cuda.runtime.getDeviceCount()
        name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
        W = args.workers or n_gpus

        def cluster_of(w):
            return LocalCUDACluster(CUDA_VISIBLE_DEVICES=",".join(str(i) for i in range(w)), n_workers=w,
                                    threads_per_worker=1, dashboard_address=None)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = {"commit": commit, "gpu": name, "gpus": n_gpus,
           "n": args.n, "d": args.d, "k": 10, "runs": []}
    t0 = time.perf_counter()
    X, Q = make_clustered(args.n, args.d, n_queries=args.queries, n_clusters=1000, random_state=0, device=dev)
    X = np.ascontiguousarray(X.get() if hasattr(X, "get") else X, dtype=np.float32)
    Q = np.ascontiguousarray(Q.get() if hasattr(Q, "get") else Q, dtype=np.float32)
    rows = np.sort(np.random.default_rng(0).choice(args.n, 2000, replace=False))
    log(f"data {time.perf_counter() - t0:.1f} s")
    Tq = None
    if {"exact", "search"} & set(args.benches.split(",")):
        _, Tq = knnkit.knn(X, Q[:10_000], k=10, device=dev)
        Tq = np.asarray(Tq.get() if hasattr(Tq, "get") else Tq)
    # the graphs' ground truth before any worker holds GPU memory (at 40M x 96 the client's exact
    # search beside a worker's pool ran out of memory on GPU 0)
    D_rows = true_distances(X, rows) if "graph" in args.benches.split(",") else None
    if not args.cpu:  # the client's pool gives the generation's memory back to the workers on GPU 0
        cp.get_default_memory_pool().free_all_blocks()

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from dask_path_cost import ClientClock, worker_seconds

    counts = sorted({1, W}) if not args.worker_counts else [int(c) for c in args.worker_counts.split(",")]
    for w in counts:
        with cluster_of(w) as cluster, Client(cluster) as c:
            clock = ClientClock(c)
            benches = args.benches.split(",")
            for parts in sorted({f * w for f in map(int, args.part_factors.split(","))}) if "graph" in benches else ():
                shared = [(p, w > 1 and p == "descent") for p in schedules]
                runs = [(p, cv, ex, ov) for p, sh in shared for cv in args.graph_compute.split(",")
                        for ex in (args.exchange.split(",") if sh else ["sparse"])
                        for ov in (args.overlap.split(",") if sh else ["on"])]
                for sched, comp, exchange, overlap in runs:
                    compute = {"true": True, "false": False}[comp]
                    c.run(_set_descent, exchange == "sparse", overlap == "on")
                    dX = da.from_array(X, chunks=(-(-args.n // parts), args.d))
                    if args.device_data:  # cupy blocks, each on its worker's GPU
                        dX = dX.map_blocks(cp.asarray, meta=cp.empty((0, args.d), dtype=X.dtype))
                    dX = c.persist(dX)
                    c.wait_for_workers(w)
                    wait(dX)
                    # warm the kernels on every worker (first calls compile)
                    warm = min(200_000, args.n // (2 * w))
                    # the shared descent needs two workers: one worker runs the single-device build
                    sched_w = "auto" if sched == "descent" and w == 1 else sched
                    knnkit.dask.knn_graph(dX[:warm * w].rechunk((warm, args.d)), k=10, client=c, device=dev,
                                          partition=sched_w, n_parts=parts)
                    from distributed import get_task_stream

                    clock.take(0.0)
                    t = time.perf_counter()
                    with get_task_stream(client=c) as ts:
                        g = knnkit.dask.knn_graph(dX, k=10, client=c, device=dev, partition=sched_w, n_parts=parts,
                                                  compute=compute)
                    s = time.perf_counter() - t
                    r = {"bench": "knn_graph", "schedule": sched, "exchange": exchange, "overlap": overlap,
                         "compute": compute,
                         "workers": w, "partitions": parts,
                         "device_data": bool(args.device_data),
                         "seconds": round(s, 3), "recall": round(sampled_recall(X, np.asarray(g.indices), rows, D_true=D_rows), 4),
                         "stats_method": g.stats.method, **g.stats.extra, "client": clock.take(s),
                         "transfer_s": worker_seconds(ts.data)["transfer_s"], "tasks": _busy(ts.data, t)}
                    out["runs"].append(r)
                    log(json.dumps(r))
                    del dX
            # exact knn of 100k queries
            dX = c.persist(da.from_array(X, chunks=(-(-args.n // w), args.d)))
            if "exact" in benches:
                knnkit.dask.knn(dX, Q[:1000], k=10, client=c, device=dev)
                t = time.perf_counter()
                _, I = knnkit.dask.knn(dX, Q[:100_000], k=10, client=c, device=dev, query_block=25_000)
                s = time.perf_counter() - t
                r = {"bench": "exact_knn", "workers": w, "queries": 100_000, "seconds": round(s, 3),
                     "recall_vs_single": round(float(recall(I[:10_000], Tq)), 5)}
                out["runs"].append(r)
                log(json.dumps(r))
            if "search" not in benches:
                continue
            # replicated index: one shard of the whole data, replicated on every worker
            t = time.perf_counter()
            ix = knnkit.dask.ShardedIndex.build(dX.rechunk((args.n, args.d)), replicas=w, client=c, device=dev,
                                                random_state=0)
            build_s = time.perf_counter() - t

            def numpy_search(when):
                from distributed import get_task_stream

                clock.take(0.0)
                t = time.perf_counter()
                nq = min(args.queries, 1_000_000)  # 1M: the client's own copies dominate beyond
                with get_task_stream(client=c) as ts:
                    _, I = ix.search(Q[:nq], k=10, beam=beam0, query_block=50_000)
                    s = time.perf_counter() - t
                r = {"bench": "replicated_search_numpy", "when": when, "workers": w, "replicas": w, "beam": beam0,
                     "queries": nq, "seconds": round(s, 3), "qps": round(nq / s),
                     "recall": round(float(recall(I[:10_000], Tq)), 4), "client": clock.take(s),
                     "tasks": _busy(ts.data, t), "transfer_s": worker_seconds(ts.data)["transfer_s"]}
                out["runs"].append(r)
                log(json.dumps(r))

            beam0 = int(args.beams.split(",")[0])
            if args.resident_queries and args.numpy_before:
                ix.search(Q[:20_000], k=10, beam=beam0, query_block=10_000)  # warm every replica
                numpy_search("before")
            if args.resident_queries:
                workers = sorted(c.nthreads())
                qb = args.query_block
                futs = [c.scatter(Q[lo:lo + qb], workers=[workers[b % w]])
                        for b, lo in enumerate(range(0, args.queries, qb))]
                meta = None
                if args.device_queries:  # cupy blocks on the workers: no host copy per block
                    import cupy as cp

                    futs = [c.submit(cp.asarray, f, workers=[workers[b % w]], pure=False) for b, f in enumerate(futs)]
                    meta = cp.empty((0, args.d), dtype=Q.dtype)
                dQ = da.concatenate([da.from_delayed(f, (min(qb, args.queries - lo), args.d), dtype=Q.dtype, meta=meta)
                                     for f, lo in zip(futs, range(0, args.queries, qb))])
                dQ = c.persist(dQ)  # blocks under their own keys: search takes them as they are (no tasks)
                wait(dQ)
                from distributed import futures_of

                # where dask put the persisted blocks (2 x H100, 2026-11-26: all 20 on one worker)
                held = c.who_has(futures_of(dQ))
                placed = {}
                for ws in held.values():
                    for wk in ws[:1]:
                        placed[wk] = placed.get(wk, 0) + 1
            for beam in map(int, args.beams.split(",")):
                ix.search(Q[:20_000], k=10, beam=beam, query_block=10_000)  # warm every replica
                if args.resident_queries:
                    # and the resident path itself, untimed (its first 2-worker call with CuPy
                    # blocks took 1.56 s against 0.11 s after, 2 x H100)
                    wait(c.persist(list(ix.search(dQ, k=10, beam=beam, compute=False))))
                for rep in range(args.search_repeats):
                    clock.take(0.0)
                    t = time.perf_counter()
                    busy = None
                    if args.resident_queries:
                        from distributed import get_task_stream

                        with get_task_stream(client=c) as ts:
                            Dr, Ir = ix.search(dQ, k=10, beam=beam, compute=False)
                            Dr, Ir = c.persist([Dr, Ir])
                            wait([Dr, Ir])
                            s = time.perf_counter() - t
                        busy = _busy(ts.data, t)
                        I = Ir[:10_000].compute()
                        I = I.get() if hasattr(I, "get") else I
                    else:
                        _, I = ix.search(Q, k=10, beam=beam, query_block=50_000)
                        s = time.perf_counter() - t
                    r = {"bench": "replicated_search", "workers": w, "replicas": w, "beam": beam, "build_s": round(build_s, 2),
                         "resident_queries": bool(args.resident_queries), "device_queries": bool(args.device_queries),
                         "queries": args.queries, "rep": rep, "seconds": round(s, 3), "qps": round(args.queries / s),
                         "recall": round(float(recall(I[:10_000], Tq)), 4)}
                    r["client"] = clock.take(s)
                    r["holders"] = [list(h) for h in ix._holders()]  # replicas of each shard now
                    # per worker: blocks it held, and search tasks asked of it (the task stream says
                    # where they ran)
                    pl = ix.last_placement or []
                    r["placement"] = {"blocks_on": _count([p["block_on"] for p in pl]),
                                      "asked_of": _count([w for p in pl for w in p["searched_on"]])}
                    if args.resident_queries:
                        r["query_blocks_per_worker"] = placed
                        r["query_block"] = qb
                    if busy is not None:
                        r["tasks"] = busy
                        r["transfer_s"] = worker_seconds(ts.data)["transfer_s"]
                    if beam == beam0 and not args.cpu:
                        r["worker_gpus"] = c.run(_worker_gpu)
                    out["runs"].append(r)
                    log(json.dumps(r))
            if args.resident_queries:  # the same queries from the client's memory, results gathered
                numpy_search("after")
    if "graph" not in args.benches.split(",") or args.no_single:
        print(json.dumps(out, indent=1))
        return
    # single process reference
    Xd = X if args.cpu else cp.asarray(X)
    knnkit.knn_graph(Xd[:200_000], k=10, device=dev)
    t = time.perf_counter()
    g = knnkit.knn_graph(Xd, k=10, device=dev, random_state=0)
    s = time.perf_counter() - t
    ind = g.indices.get() if hasattr(g.indices, "get") else g.indices
    out["runs"].append({"bench": "knn_graph_single_process", "seconds": round(s, 3),
                        "recall": round(sampled_recall(X, np.asarray(ind), rows, D_true=D_rows), 4)})
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
