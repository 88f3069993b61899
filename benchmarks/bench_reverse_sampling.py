"""Reverse sampling of GNND (section 4.1): the paper's first-come atomic append vs a uniform sample
of each node's reverse neighbours, for each metric and update rule; prints and writes one JSON.

    PYTHONPATH=src python benchmarks/bench_reverse_sampling.py --n 1000000 --d 128 --out DIR

For each (metric, update, reverse): end-to-end time of ``nndescent_gpu`` (data prepared and on the
GPU, kernels compiled), iterations, per-iteration updates and recall@10 on 10k sampled rows
against exact neighbours (``knnkit.knn`` with the same metric). Data: ``make_clustered``.
"""

import argparse
import datetime
import json
import os
import subprocess
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--K", type=int, default=48)
    ap.add_argument("--p", type=int, default=16)
    ap.add_argument("--metrics", default="sqeuclidean,inner_product")
    ap.add_argument("--updates", default="selective,basic")
    ap.add_argument("--reverses", default="atomic,random")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    import cupy as cp
    import knnkit
    from knnkit._core.metrics import internal_metric, prepare_vectors
    from knnkit.graph.nndescent import default_parameters
    from knnkit.graph.nndescent._gpu import nndescent_gpu

    res = {"bench": "reverse_sampling", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
           "gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "params": vars(a), "runs": []}
    X = cp.asarray(knnkit.datasets.make_clustered(a.n, a.d, random_state=0, device="gpu"), dtype=cp.float32)
    rows = cp.asarray(np.random.default_rng(0).choice(a.n, 10_000, replace=False))
    iters = default_parameters(10, a.n, device="gpu")[2]
    for metric in a.metrics.split(","):
        _, ti = knnkit.knn(X, X[rows], k=11, metric=metric)
        ti = cp.asarray(ti)
        is_self = ti == rows[:, None]  # drop the row itself wherever it ranks
        truth = cp.take_along_axis(ti, cp.argsort(is_self.astype(cp.int8), axis=1, kind="stable"), 1)[:, :10]
        Xp = cp.ascontiguousarray(prepare_vectors(X, metric))
        mi = internal_metric(metric)
        for upd in a.updates.split(","):
            for rev in a.reverses.split(","):
                kw = dict(sample=a.p, max_iters=iters, delta=0.001, metric=mi, update=upd, reverse=rev, seed=0)
                nndescent_gpu(Xp[:20000], a.K, **kw)  # compile
                cp.cuda.Device().synchronize()
                t = time.perf_counter()
                I, D, st = nndescent_gpu(Xp, a.K, **kw)
                cp.cuda.Device().synchronize()
                el = time.perf_counter() - t
                f = I[rows, :10]
                r = float((f[:, :, None] == truth[:, None, :]).any(axis=2).sum()) / truth.size
                run = dict(metric=metric, update=upd, reverse=rev, time_s=round(el, 4), recall_at_10=round(r, 5),
                           iterations=st["iterations"], updates=st["updates"])
                res["runs"].append(run)
                print(json.dumps(run), flush=True)
                del I, D
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "reverse_sampling.json"), "w") as fh:
        json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
