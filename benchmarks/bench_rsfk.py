"""Benchmark of RSFK (random-sample forest k-NN lists, w-KNNG leaf updates, NNE); writes one JSON file.

Part 1, time-to-recall: for each data set, ladders of configurations of
  * ``rsfk``        forest alone (n_trees ladder),
  * ``rsfk+nne``    forest + one NNE pass,
  * ``rsfk->nnd``   NN-Descent started from rsfk+nne lists (``init_indices``), max_iters ladder,
  * ``nnd``         plain NN-Descent (random start), max_iters ladder,
each timed end to end (data on the device, kernels compiled by a warm-up) with recall@10 estimated on
``--recall-sample`` rows against exact neighbours; then, per target (0.90 / 0.95 / 0.99), the fastest
configuration that reached it.
Part 2, leaf-update variants (GPU: atomic / tiles / diagonal; CPU: its one leaf join): time of the
leaf phase by dimension (32, 128, 256, 784) and leaf size.

Examples::

    PYTHONPATH=src python benchmarks/bench_rsfk.py --device gpu --quick           # < 3 minutes
    PYTHONPATH=src python benchmarks/bench_rsfk.py --device gpu                   # 1M x 128, 70k x 784, 300k x 256
    PYTHONPATH=src python benchmarks/bench_rsfk.py --device cpu --quick --out benchmarks/results/cpu
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

TARGETS = (0.90, 0.95, 0.99)
K_RECALL = 10


def _commit():
    try:
        return subprocess.check_output(["git", "rev-parse", "HEAD"], text=True, stderr=subprocess.DEVNULL).strip()
    except Exception:
        return None


def _hardware(device):
    hw = {"platform": platform.platform(), "python": sys.version.split()[0], "cpu_count": os.cpu_count()}
    try:
        import numba

        hw["numba_threads"] = numba.get_num_threads()
    except Exception:
        pass
    if device == "gpu":
        import cupy as cp

        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
        hw["gpu"] = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        hw["gpu_memory_gib"] = round(props["totalGlobalMem"] / 2 ** 30, 1)
        hw["cupy"] = cp.__version__
    return hw


def _datasets(device, quick):
    """(name, n, d, source) of the time-to-recall data sets."""
    if device == "gpu":
        if quick:
            return [("clustered-200k-128", 200_000, 128), ("fmnist-shape-20k-784", 20_000, 784),
                    ("clustered-100k-256", 100_000, 256)]
        return [("broad-1M-128", 1_000_000, 128), ("clustered-1M-128", 1_000_000, 128), ("fmnist-70k-784", 70_000, 784),
                ("clustered-300k-256", 300_000, 256)]
    if quick:
        return [("clustered-20k-32", 20_000, 32), ("fmnist-shape-5k-784", 5_000, 784)]
    return [("clustered-100k-32", 100_000, 32), ("fmnist-shape-10k-784", 10_000, 784),
            ("clustered-20k-256", 20_000, 256)]


def _load(name, n, d, device):
    from knnkit.datasets import make_clustered

    src = f"make_clustered({n}, {d}, random_state=0)"
    X = None
    if name.startswith("fmnist-70k"):
        try:
            from knnkit.datasets import load_fashion_mnist

            got = load_fashion_mnist()
            arrs = [a for a in (got if isinstance(got, tuple) else (got,)) if getattr(a, "ndim", 0) == 2]
            X = np.vstack(arrs).astype(np.float32)
            src = "Fashion-MNIST (train + test)"
        except Exception as e:  # absent: same shape, synthetic
            print(f"Fashion-MNIST unavailable ({type(e).__name__}); using {src}", file=sys.stderr)
    if X is None and name.startswith("broad"):
        from knnkit.datasets.suite import make_broad_clusters

        X = make_broad_clusters(n, d, random_state=0)
        src = f"make_broad_clusters({n}, {d}, random_state=0) (the issue's hard data)"
    if X is None:
        X = make_clustered(n, d, random_state=0, device="cpu")
    X = np.ascontiguousarray(X, dtype=np.float32)
    if device == "gpu":
        import cupy as cp

        X = cp.asarray(X)
    return X, src


def _sync(device):
    if device == "gpu":
        import cupy as cp

        cp.cuda.get_current_stream().synchronize()


def _timed(device, fn):
    _sync(device)
    t0 = time.perf_counter()
    out = fn()
    _sync(device)
    return time.perf_counter() - t0, out


def _nnd(device):
    if device == "gpu":
        from knnkit.graph.nndescent._gpu import nndescent_gpu

        return nndescent_gpu
    from knnkit.graph.nndescent._cpu import nndescent_cpu

    return nndescent_cpu


def _time_to_recall(X, device, quick, rsample, log):
    from knnkit.graph.nndescent import default_parameters
    from knnkit.graph.rsfk import RSFKParams, estimate_recall, rsfk_lists

    n = X.shape[0]
    rows = []

    def rec(idx):
        return estimate_recall(X, idx[:, :K_RECALL], K_RECALL, metric="l2", sample=rsample, seed=1)

    trees = [1, 2, 4, 8] if quick else [1, 2, 4, 8, 12, 16, 24, 32]
    rsfk_lists(X[: min(n, 5000)], K_RECALL, metric="l2", params=RSFKParams(n_trees=1))  # compile
    for nne in (False, True):
        for t in trees:
            secs, (idx, _d, st) = _timed(device, lambda: rsfk_lists(X, K_RECALL, metric="l2",
                                                                    params=RSFKParams(n_trees=t, nne=nne)))
            r = rec(idx)
            rows.append({"method": "rsfk+nne" if nne else "rsfk", "n_trees": t, "time_s": secs, "recall": r,
                         "phases_s": st["time_s"], "leaf_size": st["leaf_size"]})
            log(rows[-1])
            if r >= 0.995:
                break
    nnd = _nnd(device)
    Kn, p, _max_iters = default_parameters(K_RECALL, n, device=device)
    iters = [2, 4, 8] if quick else [2, 3, 4, 6, 8, 12, 16, 24]
    nnd(X[: min(n, 5000)], Kn, sample=p, max_iters=1, delta=0.0, metric="l2")  # compile
    for start_trees in ([2] if quick else [2, 4]):
        for it in iters:
            def run():
                idx0, d0, _ = rsfk_lists(X, Kn, metric="l2", params=RSFKParams(n_trees=start_trees, nne=True))
                return nnd(X, Kn, sample=p, max_iters=it, delta=0.001, metric="l2", init_indices=idx0,
                           init_distances=d0)
            secs, out = _timed(device, run)
            r = rec(out[0])
            rows.append({"method": "rsfk->nnd", "n_trees": start_trees, "K": Kn, "sample": p, "max_iters": it,
                         "time_s": secs, "recall": r})
            log(rows[-1])
            if r >= 0.995:
                break
    for it in iters:
        secs, out = _timed(device, lambda: nnd(X, Kn, sample=p, max_iters=it, delta=0.001, metric="l2"))
        r = rec(out[0])
        rows.append({"method": "nnd", "K": Kn, "sample": p, "max_iters": it, "time_s": secs, "recall": r})
        log(rows[-1])
        if r >= 0.995:
            break
    # the public default (NN-Descent driven to target_recall=0.99 by its own estimate) and lower targets
    import knnkit

    knnkit.knn_graph(X[: min(n, 150_000)], k=K_RECALL, device=device, random_state=0)  # compile
    for tr in (0.9, 0.95, 0.99):
        secs, g = _timed(device, lambda: knnkit.knn_graph(X, k=K_RECALL, device=device, random_state=0,
                                                             target_recall=tr))
        rows.append({"method": "knn_graph", "target_recall": tr, "time_s": secs, "recall": rec(g.indices)})
        log(rows[-1])
    if device == "gpu":
        try:
            import cupy as cp
            from cuvs.neighbors import nn_descent

            nn_descent.build(nn_descent.IndexParams(graph_degree=K_RECALL), X[:20_000])  # warm-up
            for it in ([5, 10, 20] if quick else [5, 8, 10, 15, 20, 30]):
                prm = nn_descent.IndexParams(graph_degree=K_RECALL, max_iterations=it)
                secs, nd = _timed(device, lambda: nn_descent.build(prm, X))
                rows.append({"method": "cuvs_nn_descent", "max_iterations": it, "time_s": secs,
                             "recall": rec(cp.asarray(nd.graph)[:, :K_RECALL].astype(cp.int64))})
                log(rows[-1])
        except ImportError:
            pass
    best = {}
    for m in ("rsfk", "rsfk+nne", "rsfk->nnd", "nnd", "knn_graph", "cuvs_nn_descent"):
        best[m] = {}
        for tg in TARGETS:
            ok = [x for x in rows if x["method"] == m and x["recall"] >= tg]
            best[m][str(tg)] = min(ok, key=lambda x: x["time_s"]) if ok else None
    return rows, best


def _variants(device, quick, log):
    from knnkit.datasets import make_clustered
    from knnkit.graph.rsfk import RSFKParams, rsfk_lists

    if device == "gpu":
        n = 100_000 if quick else 500_000
        variants = ["atomic", "tiles", "diagonal"]
    else:
        n = 10_000 if quick else 30_000
        variants = ["auto"]
    dims = [32, 128, 256, 784]
    leaves = [64, 256] if quick else [32, 64, 128, 256, 512]
    out = []
    for d in dims:
        X, _src = None, None
        Xh = np.ascontiguousarray(make_clustered(n, d, random_state=0, device="cpu"), dtype=np.float32)
        if device == "gpu":
            import cupy as cp

            X = cp.asarray(Xh)
        else:
            X = Xh
        for leaf in leaves:
            for v in variants:
                p = RSFKParams(n_trees=2, nne=False, leaf_size=leaf, leaf_update=v)
                rsfk_lists(X[:2000], K_RECALL, metric="l2", params=p.replace(leaf_size=min(leaf, 1999)))  # warm-up
                _secs, (_i, _d, st) = _timed(device, lambda: rsfk_lists(X, K_RECALL, metric="l2", params=p))
                out.append({"n": n, "d": d, "leaf_size": leaf, "variant": st["leaf_update"],
                            "leaf_s_per_tree": st["time_s"]["leaves"] / st["trees"],
                            "tree_s_per_tree": st["time_s"]["trees"] / st["trees"],
                            "mean_leaf": float(np.mean([lv["mean"] for lv in st["leaves"]]))})
                log(out[-1])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=["cpu", "gpu"], default="gpu")
    ap.add_argument("--quick", action="store_true", help="smaller sets and ladders (GPU: under ~3 minutes)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="output folder (default $OUT)")
    ap.add_argument("--recall-sample", type=int, default=2000)
    ap.add_argument("--datasets", default=None, help="comma-separated names of the time-to-recall sets (default: all)")
    ap.add_argument("--skip-variants", action="store_true")
    ap.add_argument("--skip-recall", action="store_true")
    args = ap.parse_args()

    def log(row):
        print(json.dumps(row, default=float), file=sys.stderr, flush=True)

    t_start = time.perf_counter()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"bench_rsfk_{args.device}{'_quick' if args.quick else ''}.json")

    def save():  # after every part, so that a run cut by a time limit still leaves its results
        result["total_s"] = time.perf_counter() - t_start
        with open(path, "w") as f:
            json.dump(result, f, indent=1, default=float)

    result = {"benchmark": "bench_rsfk", "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "commit": _commit(), "device": args.device, "quick": args.quick, "hardware": _hardware(args.device),
              "parameters": {"k_recall": K_RECALL, "metric": "l2", "recall_sample": args.recall_sample,
                             "targets": TARGETS, "rsfk_defaults": "RSFKParams() except n_trees/nne",
                             "nnd": "default_parameters(10, n, device) K and p, delta=0.001"},
              "datasets": [], "variants": None}
    if not args.skip_recall:
        for name, n, d in _datasets(args.device, args.quick):
            if args.datasets and name not in args.datasets.split(","):
                continue
            X, src = _load(name, n, d, args.device)
            print(f"== {name} ({src})", file=sys.stderr, flush=True)
            rows, best = _time_to_recall(X, args.device, args.quick, args.recall_sample, log)
            result["datasets"].append({"name": name, "n": int(X.shape[0]), "d": int(X.shape[1]), "source": src,
                                       "runs": rows, "time_to_recall": best})
            save()
            del X
    if not args.skip_variants:
        print("== leaf-update variants", file=sys.stderr, flush=True)
        result["variants"] = _variants(args.device, args.quick, log)
    save()
    print(path)


if __name__ == "__main__":
    main()
