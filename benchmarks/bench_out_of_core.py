"""Out-of-GPU-memory k-NN graph vs the in-memory build on the same data (public API).

    PYTHONPATH=src python benchmarks/bench_out_of_core.py --n 10000000 --d 96 --budget-gib 1 --out DIR

Writes the data as .fbin under --workdir, builds knnkit.knn_graph (in memory, default budget) and
knnkit.knn_graph_out_of_core with memory_budget (and knnkit.set_memory_budget) set to --budget-gib,
and reports both times, their ratio and recall@k on 10k sampled rows against exact neighbours.
"""

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000_000)
    ap.add_argument("--d", type=int, default=96)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--budget-gib", type=float, default=1.0)
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "knnkit-ooc"))
    ap.add_argument("--skip-in-memory", action="store_true")
    ap.add_argument("--resume", action="store_true",
                    help="keep --workdir (data file and a partial out-of-core run) and continue it")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    import cupy as cp
    import knnkit

    # the work folder recorded without this machine's temp path (the results are committed)
    params = dict(vars(a), workdir=a.workdir.replace(tempfile.gettempdir(), "<tmp>", 1))
    res = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "params": params,
           "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
           "gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode()}
    X = knnkit.datasets.make_clustered(a.n, a.d, random_state=0, device="gpu")
    path = os.path.join(a.workdir, "data.fbin")
    if not (a.resume and os.path.exists(path)):
        shutil.rmtree(a.workdir, ignore_errors=True)
        os.makedirs(a.workdir)
        knnkit.io.write(path, cp.asnumpy(X))
    rows = np.random.default_rng(0).choice(a.n, 10_000, replace=False)
    _, ti = knnkit.knn(X, X[cp.asarray(rows)], k=a.k + 1)
    ti = cp.asnumpy(ti)
    truth = np.array([r[r != q][:a.k] for r, q in zip(ti, rows)])

    def rec(idx):
        f = np.asarray(idx)[rows, :a.k]
        return float(np.mean([len(set(x) & set(y)) / a.k for x, y in zip(f, truth)]))

    mem_file = os.path.join(a.workdir, "in_memory.json")
    if a.resume and os.path.exists(mem_file):
        with open(mem_file) as f:
            res.update(json.load(f))
    elif not a.skip_in_memory:
        knnkit.knn_graph(X[:200000], k=a.k, method="nndescent")  # compiles the GNND kernels
        cp.cuda.Device().synchronize()
        t = time.perf_counter()
        g = knnkit.knn_graph(X, k=a.k, random_state=0)
        cp.cuda.Device().synchronize()
        res["in_memory_s"] = time.perf_counter() - t
        res["in_memory_recall"] = rec(cp.asnumpy(cp.asarray(g.indices)))
        print(json.dumps({"in_memory_s": res["in_memory_s"], "recall": res["in_memory_recall"]}), file=sys.stderr)
        with open(mem_file, "w") as f:
            json.dump({"in_memory_s": res["in_memory_s"], "in_memory_recall": res["in_memory_recall"]}, f)
        del g
    del X
    cp.get_default_memory_pool().free_all_blocks()
    budget = int(a.budget_gib * 2 ** 30)
    knnkit.set_memory_budget(budget)
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    peak = [0, 0]
    stop = threading.Event()

    def sample_pool():  # peaks of live and held device memory of the pool, sampled every 2 ms
        while not stop.is_set():
            peak[0] = max(peak[0], pool.used_bytes())
            peak[1] = max(peak[1], pool.total_bytes())
            time.sleep(0.002)

    sampler = threading.Thread(target=sample_pool, daemon=True)
    sampler.start()
    t = time.perf_counter()
    g = knnkit.knn_graph_out_of_core(path, k=a.k, workdir=os.path.join(a.workdir, "work"), memory_budget=budget,
                                     device="gpu", random_state=0, return_graph=False)
    res["out_of_core_s_this_call"] = time.perf_counter() - t
    stop.set()
    res["peak_pool_used_bytes_sampled"] = peak[0]
    res["peak_pool_held_bytes_sampled"] = peak[1]
    idx = knnkit.io.read(g["indices"]) if isinstance(g, dict) else g.indices
    res["out_of_core_recall"] = rec(idx)
    with open(os.path.join(a.workdir, "work", "manifest.json")) as f:
        man = json.load(f)
    res["manifest_summary"] = {k: v for k, v in man.items() if not isinstance(v, (list, dict))}
    res["manifest_params"] = man["params"]
    done = man["done"]
    # the build's own time, summed over its steps (also right for a run resumed across calls):
    # load + compute per step on the main thread; writes overlap the next step's compute
    res["out_of_core_s"] = sum(v.get("load_s", 0) + v.get("compute_s", v["time_s"]) for v in done.values())
    for kind in ("graph", "merge", "final"):
        vs = [v for s_, v in done.items() if s_.startswith(kind)]
        keys = sorted({key for v in vs for key, x in v.items() if isinstance(x, (int, float)) and key != "time_s"})
        res[f"steps_{kind}"] = {"count": len(vs), **{key: round(sum(v.get(key, 0) for v in vs), 3) for key in keys}}
    if "in_memory_s" in res:
        res["ratio_out_of_core_to_in_memory"] = res["out_of_core_s"] / res["in_memory_s"]
    txt = json.dumps(res, indent=1)
    print(txt)
    print("peaks (used, held):", res["peak_pool_used_bytes_sampled"], res["peak_pool_held_bytes_sampled"], file=sys.stderr)
    with open(os.path.join(a.out, "out_of_core.json"), "w") as f:
        f.write(txt)


if __name__ == "__main__":
    main()
