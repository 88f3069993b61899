"""Real-data benchmark: TEXMEX siftsmall and Fashion-MNIST, every knnkit capability on one device.

    PYTHONPATH=src python benchmarks/bench_real.py [--device gpu|cpu] > result.json

- exact knn: siftsmall recall@100 against the official ground truth; Fashion-MNIST 10-NN of the
  10k test set against the 60k train set, GPU vs CPU identical (up to exact ties);
- knn_graph (NN-Descent) recall@10 against the exact graph;
- GraphIndex recall@10 / QPS curve over the beam width.
Data is found by knnkit.datasets (on the GPU machine: the carried `.data/` folder).
"""

import argparse
import datetime
import json
import subprocess
import sys
import time

import numpy as np

import knnkit
from knnkit import datasets, evaluate


def _sync():
    try:
        import cupy

        cupy.cuda.Stream.null.synchronize()
    except Exception:
        pass


def timed(fn, repeats=3):
    fn()
    ts = []
    for _ in range(repeats):
        _sync()
        t = time.perf_counter()
        out = fn()
        _sync()
        ts.append(time.perf_counter() - t)
    return out, float(np.median(ts))


def host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def one_dataset(name, base, queries, device, gt=None, k_gt=100):
    res = {"dataset": name, "n": int(base.shape[0]), "d": int(base.shape[1]), "nq": int(queries.shape[0]),
           "dtype": str(base.dtype)}
    (d, i), t = timed(lambda: knnkit.knn(base, queries, k=k_gt, device=device))
    d, i = host(d), host(i)
    res["knn_time_s"] = t
    if gt is not None:
        res["knn_recall_at_100_vs_official"] = evaluate.recall(i, gt, k_gt)
    if device != "cpu":
        dc, ic = knnkit.knn(base, queries, k=k_gt, device="cpu")
        res["knn_gpu_vs_cpu_identical_indices"] = float((i == ic).mean())
        res["knn_gpu_vs_cpu_recall_tie_tolerant"] = evaluate.recall(i, ic, k_gt, found_distances=d, true_distances=dc)
        res["knn_gpu_vs_cpu_max_rel_dist_diff"] = float(np.max(np.abs(d - dc) / np.maximum(np.abs(dc), 1e-6)))
    # all-points exact graph (truth for NN-Descent)
    (gd, gi), t = timed(lambda: knnkit.knn(base, None, k=10, device=device), repeats=1)
    res["exact_graph_time_s"] = t
    gi, gd = host(gi), host(gd)
    g, t = timed(lambda: knnkit.knn_graph(base, k=10, method="nndescent", device=device, random_state=0), repeats=1)
    res["nndescent_time_s"] = t
    res["nndescent_recall_at_10"] = evaluate.recall(host(g.indices), gi, 10)
    res["nndescent_recall_at_10_tie_tolerant"] = evaluate.recall(host(g.indices), gi, 10,
                                                                 found_distances=host(g.distances), true_distances=gd)
    t0 = time.perf_counter()
    index = knnkit.GraphIndex.build(base, device=device, random_state=0)
    _sync()
    res["index_build_s"] = time.perf_counter() - t0
    td, ti = knnkit.knn(base, queries, k=10, device=device)
    ti, td = host(ti), host(td)
    curve = []
    for beam in (16, 32, 64, 128):
        (sd, si), t = timed(lambda: index.search(queries, k=10, beam=beam))
        curve.append({"beam": beam, "recall_at_10": evaluate.recall(host(si), ti, 10),
                      "recall_at_10_tie_tolerant": evaluate.recall(host(si), ti, 10, found_distances=host(sd),
                                                                   true_distances=td),
                      "qps": queries.shape[0] / t})
    res["index_curve"] = curve
    print(json.dumps(res), file=sys.stderr, flush=True)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()
    out = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
           "device": args.device, "results": []}
    try:
        import cupy

        out["gpu"] = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    except Exception:
        out["gpu"] = None
    base, queries, gt = datasets.load_siftsmall()
    out["results"].append(one_dataset("siftsmall", base, queries, args.device, gt=gt))
    try:
        train, test = datasets.load_fashion_mnist()
    except FileNotFoundError as e:
        print(f"fashion-mnist skipped: {e}", file=sys.stderr)
    else:
        out["results"].append(one_dataset("fashion-mnist", train, test, args.device, k_gt=10))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
