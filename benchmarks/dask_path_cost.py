"""The Dask path's own cost (issue 17): knnkit.dask with the per-block engine work stubbed (no
distance computed anywhere), on a ``LocalCluster`` of worker PROCESSES (as one worker per GPU:
every byte between the client and a worker, or between two workers, is serialised and sent over
local TCP), so what is left is the path itself: scatters, tasks, transfers between workers and
the gather to the client.

Benches (``--benches``):

* ``search``: ``ShardedIndex.search`` of one shard replicated on every worker (``replicas`` =
  workers), ``--queries`` queries of ``--d`` dimensions, k = 10; the queries as a persisted dask
  array (blocks of ``--query-block`` rows spread round-robin over the workers; the results left
  on the workers: ``compute=False`` then persist and wait) and as a numpy array (blocks sent by
  the client, results gathered to it).
* ``knn``: exact ``knnkit.dask.knn`` of ``--exact-queries`` queries against ``--n`` persisted rows
  (one partition per worker), numpy queries (blocks of ``--query-block``) and persisted dask
  queries.
* ``graph``: ``knnkit.dask.knn_graph`` of ``--n`` x ``--d`` persisted rows, ``--k`` neighbours,
  ``partition`` rows and tree, default second stages (tree: cross searches, ``--slab-quantile``
  sets the slab's share; rows: the GGM merge). ``--graph-modes``: ``gathered`` (``compute=True``:
  the lists gathered to the client and put in row order there; a module without ``compute``
  always gathers) and ``resident`` (``compute=False``: the lists left on the workers in row
  blocks; skipped for a module without ``compute``).

Per run, the client's seconds by call (``scatter``, ``submit`` = submit / map / compute calls,
``wait`` = waiting for results, ``gather`` = moving them to the client once they exist,
``other`` = the rest: graph building, client-side assembly), the bytes ``gather`` brought to
the client (``gathered_bytes``, Dask's ``sizeof`` of the results) and the workers' seconds (task
stream: compute seconds per task prefix, and seconds spent receiving dependencies from other
workers, ``transfer``). ``--impl`` names the modules to time, alternated repetition by
repetition in one process (e.g. ``knnkit.dask,knnkit.dask_before``, the latter a copy of an
older ``src/knnkit/dask`` under another name, so that before and after are paired).

    PYTHONPATH=src python benchmarks/dask_path_cost.py > $OUT/dask_path_cost.json
"""

import argparse
import importlib
import inspect
import json
import logging
import sys
import time

import numpy as np

log = logging.getLogger("dask_path_cost")

#: modules whose task functions the stubs replace (the baseline copy too, when present)
TASK_MODULES = ("knnkit.dask._tasks", "knnkit.dask_before._tasks")


def patch():
    """Stub the per-block engine work in this process: graph lists, GGM merges, exact search, cross
    searches and ``GraphIndex.search`` (all return arrays of the right shapes and dtypes, no distances)."""
    import knnkit.api._graphops as graphops
    import knnkit.api.exact as exact
    import knnkit.graph as graph
    import knnkit.graph._merge as merge
    import knnkit.index._cpu as icpu
    from knnkit.api.index import GraphIndex
    from knnkit.index._entry import EntryPoints

    def build_lists(X, k, *, metric, method, params=None, seed=0, **kw):
        n = int(X.shape[0])
        return np.ones((n, k), np.int32), np.ones((n, k), np.float32), {"method": "stub", "recall_estimate": 1.0}

    def exact_search(P, Q, k, **kw):
        m = Q.n if Q is not None else P.n
        return np.zeros((m, k), np.float32), np.tile(np.arange(k, dtype=np.int64), (m, 1)), {}

    def index_search(self, queries, k=10, **kw):
        m = int(queries.shape[0])
        return np.zeros((m, k), np.float32), np.tile(np.arange(k, dtype=np.int64), (m, 1))

    def walk(X, graph, queries, k, *, seeds, **kw):
        nq, m = int(queries.shape[0]), int(X.shape[0])
        return np.zeros((nq, k), np.float32), (np.arange(nq, dtype=np.int64)[:, None] + np.arange(k)) % m

    def group_topk(xp, owner, other, d, width, n_owner):
        r = min(int(n_owner), owner.size // width)
        return (np.arange(r, dtype=np.int64), other[:r * width].reshape(r, width).astype(np.int64),
                np.sort(d[:r * width].reshape(r, width), axis=1))

    def ggm_merge(Xi, Xj, Ii, Di, Ij, Dj, k, **kw):
        n = int(Xi.shape[0]) + int(Xj.shape[0])
        return np.ones((n, k), np.int32), np.zeros((n, k), np.float32), {}, None

    graph.build_lists = graphops.build_lists = build_lists
    merge.ggm_merge = ggm_merge
    exact.exact_search = exact_search
    GraphIndex.search = index_search
    icpu.search = walk
    EntryPoints.seeds_for = lambda self, q, s, exact=False: np.zeros((q.shape[0], s), np.int32)
    for name in TASK_MODULES:
        try:
            tasks = importlib.import_module(name)
        except ImportError:
            continue
        tasks.search_graph = lambda xp, I, D, width: I
        tasks._group_topk = group_topk
    return True


class ClientClock:
    """Seconds the client spends in each of its calls, by wrapping them on the client object:
    ``gather`` first waits for its futures (``wait``), then moves them (``gather``)."""

    CALLS = {"scatter": "scatter", "submit": "submit", "map": "submit", "compute": "submit", "persist": "submit",
             "who_has": "submit", "replicate": "submit"}

    def __init__(self, client):
        from dask.sizeof import sizeof
        from distributed import futures_of, wait

        self.seconds = {}
        self.gathered_bytes = 0
        self._client = client
        self._originals = {name: getattr(client, name) for name in (*self.CALLS, "gather")}
        for name, phase in self.CALLS.items():
            setattr(client, name, self._timed(self._originals[name], phase))
        gather = self._originals["gather"]

        def timed_gather(futures, *a, **kw):
            t = time.perf_counter()
            wait(futures_of(futures))
            t1 = time.perf_counter()
            out = gather(futures, *a, **kw)
            self._add("wait", t1 - t)
            self._add("gather", time.perf_counter() - t1)
            self.gathered_bytes += int(sizeof(out))
            return out

        client.gather = timed_gather

    def _add(self, phase, s):
        self.seconds[phase] = self.seconds.get(phase, 0.0) + s

    def _timed(self, fn, phase):
        def call(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self._add(phase, time.perf_counter() - t)
        return call

    def take(self, total):
        """This run's seconds by phase (``other``: the rest of ``total``), and a fresh count."""
        out = {key: round(v, 4) for key, v in sorted(self.seconds.items())}
        out["other"] = round(total - sum(self.seconds.values()), 4)
        out["total"] = round(total, 4)
        out["gathered_bytes"] = self.gathered_bytes
        self.seconds = {}
        self.gathered_bytes = 0
        return out

    def close(self):
        for name in (*self.CALLS, "gather"):
            setattr(self._client, name, self._originals[name])


def worker_seconds(records):
    """From the task stream: compute seconds per task prefix (all workers), transfer seconds
    (receiving dependencies from another worker) and the number of tasks."""
    from dask.utils import key_split

    compute, transfer, tasks = {}, 0.0, 0
    for rec in records:
        for ss in rec.get("startstops", ()):
            if ss.get("action") == "compute":
                pre = key_split(rec.get("key", "?"))
                compute[pre] = compute.get(pre, 0.0) + ss["stop"] - ss["start"]
                tasks += 1
            elif ss.get("action") == "transfer":
                transfer += ss["stop"] - ss["start"]
    return {"tasks": tasks, "transfer_s": round(transfer, 4),
            "compute_s": {p: round(v, 4) for p, v in sorted(compute.items(), key=lambda kv: -kv[1])}}


def resident(c, A, block, workers):
    """``A`` as a persisted dask array whose row blocks of ``block`` rows sit on the workers
    round-robin (as an upstream dask pipeline leaves them)."""
    import dask.array as da
    from distributed import wait

    futs = [c.scatter(A[lo:lo + block], workers=[workers[b % len(workers)]], hash=False)
            for b, lo in enumerate(range(0, A.shape[0], block))]
    dA = da.concatenate([da.from_delayed(f, (min(block, A.shape[0] - lo), A.shape[1]), dtype=A.dtype)
                         for f, lo in zip(futs, range(0, A.shape[0], block))])
    dA = c.persist(dA)
    wait(dA)
    return dA


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--benches", default="search,knn,graph")
    ap.add_argument("--impl", default="knnkit.dask", help="modules to time, alternated (comma separated)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--d", type=int, default=96)
    ap.add_argument("--queries", type=int, default=1_000_000, help="search queries")
    ap.add_argument("--index-n", type=int, default=20_000, help="rows of the replicated shard (a real build)")
    ap.add_argument("--query-block", type=int, default=50_000)
    ap.add_argument("--exact-queries", type=int, default=100_000)
    ap.add_argument("--exact-block", type=int, default=25_000)
    ap.add_argument("--n", type=int, default=2_000_000, help="rows of knn's data and knn_graph's")
    ap.add_argument("--slab-quantile", type=float, default=0.3)
    ap.add_argument("--schedules", default="rows,tree")
    ap.add_argument("--k", type=int, default=10, help="knn_graph's k")
    ap.add_argument("--graph-modes", default="gathered,resident")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    log.setLevel(logging.INFO)
    from distributed import Client, LocalCluster, get_task_stream, wait

    impls = {name: importlib.import_module(name) for name in args.impl.split(",")}
    benches = args.benches.split(",")
    rng = np.random.default_rng(0)
    W = args.workers
    out = {"workers": W, "args": vars(args), "runs": []}

    def record(bench, impl, rep, t0, clock, ts, **extra):
        r = {"bench": bench, "impl": impl, "rep": rep, "seconds": round(time.perf_counter() - t0, 4),
             "client": clock.take(time.perf_counter() - t0), "workers": worker_seconds(ts.data), **extra}
        out["runs"].append(r)
        log.info(json.dumps({key: v for key, v in r.items() if key != "workers"} | {
            "transfer_s": r["workers"]["transfer_s"], "tasks": r["workers"]["tasks"]}))
        return r

    with LocalCluster(n_workers=W, threads_per_worker=1, processes=True, dashboard_address=None,
                      memory_limit=0) as cluster, Client(cluster) as c:
        c.run(patch)
        patch()
        workers = sorted(c.nthreads())
        clock = ClientClock(c)
        if "search" in benches:
            Xs = rng.standard_normal((args.index_n, args.d), dtype=np.float32)
            Q = rng.standard_normal((args.queries, args.d), dtype=np.float32)
            dQ = resident(c, Q, args.query_block, workers)
            indexes = {name: m.ShardedIndex.build(Xs, replicas=W, client=c, device="cpu", random_state=0)
                       for name, m in impls.items()}
            clock.take(0.0)
            for rep in range(args.reps):
                for name, ix in indexes.items():
                    t0 = time.perf_counter()
                    with get_task_stream(client=c) as ts:
                        Dr, Ir = ix.search(dQ, k=10, compute=False)
                        Dr, Ir = c.persist([Dr, Ir])
                        wait([Dr, Ir])
                    record("search_resident", name, rep, t0, clock, ts, queries=args.queries)
                    del Dr, Ir
                    t0 = time.perf_counter()
                    with get_task_stream(client=c) as ts:
                        D, I = ix.search(Q, k=10, query_block=args.query_block)
                    assert D.shape == (args.queries, 10)
                    record("search_numpy", name, rep, t0, clock, ts, queries=args.queries)
                    del D, I
            del indexes, dQ, Q
        if "knn" in benches or "graph" in benches:
            X = rng.standard_normal((args.n, args.d), dtype=np.float32)
            dX = resident(c, X, -(-args.n // W), workers)
        if "knn" in benches:
            Qe = rng.standard_normal((args.exact_queries, args.d), dtype=np.float32)
            dQe = resident(c, Qe, args.exact_block, workers)
            clock.take(0.0)
            for rep in range(args.reps):
                for name, m in impls.items():
                    for label, queries in (("knn_numpy", Qe), ("knn_resident", dQe)):
                        t0 = time.perf_counter()
                        with get_task_stream(client=c) as ts:
                            D, I = m.knn(dX, queries, k=10, client=c, device="cpu", query_block=args.exact_block)
                            if hasattr(D, "dask"):  # dask arrays out: left on the workers
                                D, I = c.persist([D, I])
                                wait([D, I])
                        record(label, name, rep, t0, clock, ts, queries=args.exact_queries, n=args.n)
                        del D, I
        if "graph" in benches:
            clock.take(0.0)
            modes = args.graph_modes.split(",")
            for rep in range(args.reps):
                for name, m in impls.items():
                    has_compute = "compute" in inspect.signature(m.knn_graph).parameters
                    for sched in args.schedules.split(","):
                        for mode in modes:
                            if mode == "resident" and not has_compute:
                                continue  # an older module: its lists always go to the client
                            kw = {"slab_quantile": args.slab_quantile} if sched == "tree" else {}
                            if has_compute:
                                kw["compute"] = mode == "gathered"
                            t0 = time.perf_counter()
                            with get_task_stream(client=c) as ts:
                                g = m.knn_graph(dX, k=args.k, client=c, device="cpu", partition=sched, n_parts=W,
                                                **kw)
                            ex = g.stats.extra
                            record(f"graph_{sched}_{mode}", name, rep, t0, clock, ts, n=args.n, k=args.k,
                                   phases=ex.get("phases"), slab_fraction=ex.get("slab_fraction"),
                                   second_stage=ex.get("second_stage"), on_workers=bool(getattr(g, "is_dask", False)))
                            del g
        clock.close()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
