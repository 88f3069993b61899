"""CPU RSFK twin and NN-Descent starts: time to recall@k 0.90 / 0.95 / 0.99.

Configurations (one process, every kernel compiled by a small warm-up run first):

* ``rsfk``: the RSFK forest alone (no NNE), ``n_trees`` swept;
* ``rsfk+nne``: the forest plus one NNE pass, ``n_trees`` swept;
* ``nndescent[<init>]`` for ``init`` in auto (the default), rpforest, rsfk, random: the forest start
  (``graph.nndescent.forest_start``, renumbering included) then the CPU NN-Descent, recall traced
  after every iteration (the probe's time is not counted).

Recall@k is measured on ``--eval`` sampled rows against exact neighbours (``graph._estimate.RecallProbe``:
tie-aware). "Time to recall r" is the first (time, recall) point of a configuration with recall >= r.

Usage::

    PYTHONPATH=src python benchmarks/rsfk_cpu_bench.py --data clustered --n 100000 --d 128 \\
        --out benchmarks/results/rsfk_cpu/clustered_100k_128.json
    PYTHONPATH=src python benchmarks/rsfk_cpu_bench.py --data uniform --n 100000 --d 32 --out ...
    PYTHONPATH=src python benchmarks/rsfk_cpu_bench.py --data fashion-mnist --out ...   # 70k x 784
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import time

import numpy as np

TARGETS = (0.90, 0.95, 0.99)


def git_commit():
    try:
        return subprocess.check_output(["git", "rev-parse", "HEAD"], text=True,
                                       cwd=os.path.dirname(os.path.abspath(__file__))).strip()
    except Exception:
        return None


def load(args):
    from knnkit.datasets import make_clustered, make_uniform

    if args.data == "clustered":
        return make_clustered(args.n, args.d, random_state=args.seed, device="cpu")
    if args.data == "uniform":
        return make_uniform(args.n, args.d, random_state=args.seed, device="cpu")
    if args.data == "fashion-mnist":
        from knnkit.datasets.real import load_fashion_mnist

        train, test = load_fashion_mnist()
        return np.concatenate([train, test]).astype(np.float32)
    raise SystemExit(f"unknown --data {args.data!r}")


def time_to(points):
    """{target: (time, recall, setting)} of the first point reaching each target (sorted by time)."""
    out = {}
    for r in TARGETS:
        hit = [p for p in sorted(points, key=lambda p: p[0]) if p[1] >= r]
        out[f"{r:.2f}"] = None if not hit else {"time_s": round(hit[0][0], 3), "recall": round(hit[0][1], 4),
                                               "setting": hit[0][2]}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="clustered", choices=("clustered", "uniform", "fashion-mnist"))
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--eval", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trees", default="1,2,4,8,16,32", help="rsfk tree counts (no NNE)")
    ap.add_argument("--nne-trees", default="1,2,4,8", help="rsfk+nne tree counts")
    ap.add_argument("--inits", default="auto,rpforest,rsfk,random")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import numba

    from knnkit.graph._estimate import RecallProbe
    from knnkit.graph.nndescent import NNDescentParams, forest_start
    from knnkit.graph.nndescent._cpu import nndescent_cpu
    from knnkit.graph.rsfk import RSFKParams, rsfk_lists

    X = np.ascontiguousarray(load(args), dtype=np.float32)
    n, k = X.shape[0], args.k
    res = {"benchmark": "rsfk_cpu", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "commit": git_commit(), "machine": platform.processor() or platform.machine(),
           "cpu_count": os.cpu_count(), "numba_threads": numba.get_num_threads(), "data": args.data,
           "n": n, "d": int(X.shape[1]), "k": k, "eval_rows": args.eval, "configs": {}}
    # warm-up: compile every kernel on a small slice
    small = X[:3000]
    for sp in ("sample", "projection"):
        rsfk_lists(small, k, metric="l2", params=RSFKParams(n_trees=2, split=sp))
    for init in ("rpforest", "rsfk", "random"):
        Xw, _o, I0, D0, _i = forest_start(small, 16, metric="l2", init=init, seed=0)
        nndescent_cpu(Xw, 16, sample=14, max_iters=3, delta=0.001, metric="l2", init_indices=I0, init_distances=D0)

    probe = RecallProbe(X, k, "l2", args.eval, args.seed)

    def rec(Xa, idx, pr=probe):
        return float(pr.recall(Xa, np.ascontiguousarray(idx[:, :k])))

    for nne, trees in ((False, args.trees), (True, args.nne_trees)):
        name = "rsfk+nne" if nne else "rsfk"
        pts = []
        for t in [int(x) for x in trees.split(",")]:
            t0 = time.perf_counter()
            idx, _d, st = rsfk_lists(X, k, metric="l2", params=RSFKParams(n_trees=t, nne=nne), seed=args.seed)
            dt = time.perf_counter() - t0
            pts.append((dt, rec(X, idx), f"n_trees={t}", {p: round(v, 3) for p, v in st["time_s"].items()}))
            print(name, t, round(dt, 3), round(pts[-1][1], 4), flush=True)
        res["configs"][name] = {"points": [{"time_s": round(a, 3), "recall": round(b, 4), "setting": c, "phases_s": p}
                                           for a, b, c, p in pts], "time_to": time_to(pts)}

    par = NNDescentParams().resolve(k=k, n=n, device="cpu", metric="sqeuclidean")
    K, p, iters = par.n_neighbors_internal, par.sample, par.max_iters
    for init in args.inits.split(","):
        t0 = time.perf_counter()
        Xw, order, I0, D0, info = forest_start(X, K, metric="l2", init=init, seed=args.seed)
        t_forest = time.perf_counter() - t0
        pw = RecallProbe(Xw, k, "l2", args.eval, args.seed) if order is not None else probe
        pts = [(t_forest, rec(Xw, I0, pw) if I0 is not None else 0.0, "iteration 0 (start)")]
        clock = {"t": t_forest, "last": None}

        def cb(it, ind, dist, clock=clock, pts=pts, pw=pw, Xw=Xw):
            now = time.perf_counter()
            clock["t"] += now - clock["last"]
            pts.append((clock["t"], rec(Xw, ind, pw), f"iteration {it + 1}"))
            clock["last"] = time.perf_counter()

        clock["last"] = time.perf_counter()
        _I, _D, st = nndescent_cpu(Xw, K, sample=p, max_iters=iters, delta=par.delta, metric="l2",
                                   init_indices=I0, init_distances=D0, seed=args.seed, update=par.update, callback=cb)
        name = f"nndescent[{init}]"
        print(name, [(round(a, 2), round(b, 4)) for a, b, _c in pts], flush=True)
        res["configs"][name] = {"K": K, "sample": p, "forest_s": round(t_forest, 3), "init_s": round(st["init_s"], 3),
                                "points": [{"time_s": round(a, 3), "recall": round(b, 4), "setting": c}
                                           for a, b, c in pts], "time_to": time_to(pts)}
    text = json.dumps(res, indent=1)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(json.dumps({c: v["time_to"] for c, v in res["configs"].items()}, indent=1))


if __name__ == "__main__":
    main()
