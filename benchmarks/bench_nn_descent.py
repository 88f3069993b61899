"""Benchmark of GPU NN-Descent (GNND kernels) on clustered synthetic data; prints one JSON object.

Measures, for each (K, p) configuration: end-to-end time (data already on the GPU, kernels
compiled), recall@10 on a 10k-node sample against exact k-NN, per-iteration updates; then the
convergence curve (recall per iteration, paper Figure 4) and the ablation of paper Figure 5
(basic update / selective update / selective + segmented locks). ``--cuvs`` runs
cuvs.neighbors.nn_descent on the same data when it imports.

``--sweep`` records recall@k (``--ks``) and kernel time after every iteration of each ``--configs``
K:p (what any delta would give is read off the curve), ``--timed`` times K:p end to end with each
join kernel of ``--distances`` (fp32 / tensor), ``--defaults n1,n2`` runs ``knn_graph`` with the
default parameters for each k in ``--ks``.

Examples::

    PYTHONPATH=src python benchmarks/bench_nn_descent.py --n 1000000 --d 128 --configs 32:16,24:12
    PYTHONPATH=src python benchmarks/bench_nn_descent.py --sweep --configs 192:16,128:16 --iters 46 \
        --timed 48:16,192:16 --distances fp32,tensor --out sweep.json
    PYTHONPATH=src python benchmarks/bench_nn_descent.py --defaults 10000,100000,1000000 --ks 10,32,64
"""

import argparse
import datetime
import json
import subprocess
import sys
import time

import numpy as np


def _commit():
    try:
        return subprocess.check_output(["git", "rev-parse", "HEAD"], text=True).strip()
    except Exception:
        return None


def _data(n, d, seed, dtype):
    import cupy as cp

    try:
        from knnkit.datasets import make_clustered

        X = make_clustered(n, d, random_state=seed, device="gpu")
        X = cp.asarray(X, dtype=cp.float32)
        src = "knnkit.datasets.make_clustered"
    except Exception as e:  # own generator: clusters on a 16-d subspace plus noise
        print(f"make_clustered unavailable ({e}); using the bench generator", file=sys.stderr)
        rs = cp.random.RandomState(seed)
        lat = min(d, 16)
        centres = rs.standard_normal((64, lat), dtype=cp.float32)
        z = centres[rs.randint(0, 64, n)] + 0.3 * rs.standard_normal((n, lat), dtype=cp.float32)
        basis = cp.linalg.qr(rs.standard_normal((d, lat), dtype=cp.float32))[0]
        X = z @ basis.T + 0.05 * rs.standard_normal((n, d), dtype=cp.float32)
        src = "bench generator"
    return cp.ascontiguousarray(X.astype(cp.float32)), src


def _exact_sample(X, rows, k):
    """Exact k nearest (squared L2, self excluded) of X[rows] against all of X, on the GPU."""
    import cupy as cp

    sq = (X * X).sum(1)
    out = []
    step = max(1, min(1000, (1 << 30) // len(X)))  # a (step x n) float32 block of about 4 GiB at most
    for s in range(0, len(rows), step):
        r = rows[s:s + step]
        D = sq[r][:, None] + sq[None, :] - 2.0 * (X[r] @ X.T)
        D[cp.arange(len(r)), r] = cp.inf
        try:  # torch.topk is much faster than a cupy partition of 1000 x n
            import torch

            out.append(cp.asarray(torch.topk(torch.as_tensor(D, device="cuda"), k, dim=1, largest=False)[1]))
        except ImportError:
            part = cp.argpartition(D, k, axis=1)[:, :k]
            o = cp.argsort(cp.take_along_axis(D, part, 1), axis=1)
            out.append(cp.take_along_axis(part, o, 1))
        del D
    return cp.concatenate(out)


def _recall(found, truth, k=10):
    import cupy as cp

    f = cp.asnumpy(found[:, :k])
    t = cp.asnumpy(truth[:, :k])
    return float(np.mean([len(np.intersect1d(a, b)) for a, b in zip(f, t)]) / k)


def _top_of_raw(idx, dist, rows, k):
    """First k of raw (segment-sorted, flagged) lists for the sampled rows."""
    import cupy as cp

    i = idx[rows] & 0x7FFFFFFF
    o = cp.argsort(dist[rows], axis=1)[:, :k]
    return cp.take_along_axis(i, o, 1)


def run_gnnd(X, K, p, *, iters, delta, update="selective", locks="segmented", callback=None, seed=0, group=8,
             minblocks=None, **kw):
    import cupy as cp
    from knnkit.graph.nndescent._gpu import nndescent_gpu

    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    idx, dist, stats = nndescent_gpu(X, K, sample=p, max_iters=iters, delta=delta, metric="l2", seed=seed,
                                     update=update, locks=locks, callback=callback, _group=group,
                                     _minblocks=minblocks, **kw)
    cp.cuda.Device().synchronize()
    return idx, dist, stats, time.perf_counter() - t0



def _recall_gpu(found, truth, k):
    """recall@k of found[:, :k] against truth[:, :k] (both cupy, rows aligned), on the GPU."""
    f, t = found[:, :k], truth[:, :k]
    return float((f[:, :, None] == t[:, None, :]).any(axis=2).sum()) / t.size


def sweep(X, rows, truth, configs, ks, iters, seed=0, **kw):
    """Convergence of each (K, p): recall@k for every k in ``ks`` and the cumulative kernel time
    after each iteration (delta = 0, so every iteration runs); what any delta would have given is
    read off the per-iteration updates (stop after the first iteration below delta * n * K)."""
    out = []
    n = len(X)
    for K, p in configs:
        run_gnnd(X[:5000], K, p, iters=2, delta=0, **kw)  # compile
        curve = []

        def cb(it, gi, gd):
            top = _top_of_raw(gi, gd, rows, max(ks))
            curve.append({f"r{k}": round(_recall_gpu(top, truth, k), 5) for k in ks})

        idx, dist, stats, t = run_gnnd(X, K, p, iters=iters, delta=0.0, callback=cb, seed=seed, **kw)
        cum = np.cumsum(stats["time_s"])
        final = {f"r{k}": round(_recall_gpu(idx[rows], truth, k), 5) for k in ks}
        for c, u, tc in zip(curve, stats["updates"], cum):
            c.update(updates=u, frac=round(u / (n * K), 6), t=round(float(tc), 4))
        res = dict(n=n, K=K, p=p, total_s=round(t, 4), final=final, curve=curve, **kw)
        # the stop point and time of each delta (kernel time up to and including that iteration)
        res["by_delta"] = {}
        for dl in (0.003, 0.001, 0.0005, 0.0002, 0.0001):
            j = next((i for i, c in enumerate(curve) if c["updates"] < dl * n * K), len(curve) - 1)
            res["by_delta"][str(dl)] = dict(it=j + 1, t=curve[j]["t"], **{kk: curve[j][kk] for kk in curve[j]
                                                                          if kk.startswith("r")})
        out.append(res)
        print(json.dumps(res), file=sys.stderr)
        del idx, dist
    return out


def timed(X, rows, truth, configs, ks, iters, delta, distances, seed=0):
    """End-to-end time (no callback) and recall@k of each (K, p) with each join distance kernel."""
    out = []
    for K, p in configs:
        for dist in distances:
            run_gnnd(X[:5000], K, p, iters=2, delta=0, distance=dist)  # compile
            idx, _, stats, t = run_gnnd(X, K, p, iters=iters, delta=delta, seed=seed, distance=dist)
            out.append(dict(K=K, p=p, distance=dist, delta=delta, time_s=round(t, 4),
                            iterations=stats["iterations"],
                            **{f"r{k}": round(_recall_gpu(idx[rows], truth, k), 5) for k in ks}))
            print(json.dumps(out[-1]), file=sys.stderr)
            del idx
    return out


def defaults(ns, ks, d, seed=0, sample_rows=10_000):
    """knn_graph(k, method="nndescent") with knnkit's default parameters: time and recall@k."""
    import cupy as cp
    import knnkit
    from knnkit.graph.nndescent import default_parameters

    res = []
    for n in ns:
        X, _ = _data(n, d, seed, "float32")
        rows = cp.asarray(np.random.default_rng(1).choice(n, min(sample_rows, n), replace=False))
        truth = _exact_sample(X, rows, max(ks))
        for k in ks:
            K, p, it = default_parameters(k, n, device="gpu")
            knnkit.knn_graph(X[:4000], k, method="nndescent", device="gpu", random_state=seed,
                             n_neighbors_internal=K, sample=p)  # compile
            cp.cuda.Device().synchronize()
            t0 = time.perf_counter()
            g = knnkit.knn_graph(X, k, method="nndescent", device="gpu", random_state=seed)
            cp.cuda.Device().synchronize()
            t = time.perf_counter() - t0
            ind = cp.asarray(g.indices)
            st = g.stats
            res.append(dict(n=n, k=k, K=st["K"], p=st["sample"], iterations=st["iterations"], time_s=round(t, 4),
                            recall=round(_recall_gpu(ind[rows], truth, k), 5)))
            print(json.dumps(res[-1]), file=sys.stderr)
            del g, ind
        del X
    return res


def grid():
    """Recall@K and recall@10 of small problems over data kinds, d, metrics, K, p, update, locks."""
    import cupy as cp
    from knnkit.graph.nndescent._gpu import nndescent_gpu

    rng = np.random.default_rng(0)
    rows = []

    def exact(X, k, metric):
        Xg = cp.asarray(X, dtype=cp.float32)
        if metric == "l2":
            sq = (Xg * Xg).sum(1)
            D = sq[:, None] + sq[None, :] - 2 * Xg @ Xg.T
        elif metric == "ip":
            D = -(Xg @ Xg.T)
        else:
            D = cp.abs(Xg[:, None, :] - Xg[None, :, :]).sum(-1)
        D[cp.arange(len(X)), cp.arange(len(X))] = cp.inf
        return cp.asnumpy(cp.argsort(D, axis=1)[:, :k])

    def rec(a, b, k):
        return float(np.mean([len(np.intersect1d(x[:k], y[:k])) for x, y in zip(a, b)]) / k)

    for kind, d in (("clustered", 2), ("clustered", 17), ("clustered", 128), ("uniform", 2), ("uniform", 17),
                    ("uniform", 128), ("clustered", 960)):
        n = 3000 if d < 960 else 1500
        if kind == "clustered":
            from knnkit.datasets import make_clustered

            X = np.asarray(make_clustered(n, d, random_state=1, device="cpu"), np.float32)
        else:
            X = rng.random((n, d), dtype=np.float32)
        metrics = ("l2", "ip", "l1") if d == 17 else ("l2",)
        for metric in metrics:
            Xm = X / np.linalg.norm(X, axis=1, keepdims=True) if metric == "ip" else X
            truth = exact(Xm, 64, metric)
            for K, p in ((10, 7), (10, 10), (16, 8), (32, 16), (64, 16), (64, 32)):
                for upd, lk in (("selective", "segmented"), ("selective", "global"), ("basic", "segmented")):
                    if (upd, lk) != ("selective", "segmented") and K != 64:
                        continue
                    idx, _, st = nndescent_gpu(cp.asarray(Xm), K, sample=p, max_iters=30, delta=0.0005,
                                               metric=metric, update=upd, locks=lk)
                    idx = cp.asnumpy(idx)
                    rows.append(dict(kind=kind, d=d, metric=metric, K=K, p=p, update=upd, locks=lk,
                                     recall_K=round(rec(idx, truth, K), 4), recall_10=round(rec(idx, truth, 10), 4),
                                     it=st["iterations"]))
                    print(json.dumps(rows[-1]))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--configs", default="32:16,24:12,16:8", help="K:p pairs")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--delta", type=float, default=0.001)
    ap.add_argument("--sample-rows", type=int, default=10_000)
    ap.add_argument("--no-curve", action="store_true")
    ap.add_argument("--no-ablation", action="store_true")
    ap.add_argument("--ablation-config", default=None, help="K:p of the ablation (default: first config)")
    ap.add_argument("--cuvs", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variants", action="store_true", help="also time kernel tuning variants")
    ap.add_argument("--fp16", action="store_true", help="also time float16 input")
    ap.add_argument("--grid", action="store_true", help="small-data recall grid (parameters, metrics, d)")
    ap.add_argument("--sweep", action="store_true",
                    help="per-iteration recall@ks / time curves of --configs (delta read off the curves)")
    ap.add_argument("--ks", default="10,32,64", help="k values of recall@k (--sweep, --defaults)")
    ap.add_argument("--defaults", default=None, help="comma list of n: knn_graph defaults for each k in --ks")
    ap.add_argument("--distance", default=None, help="join distance kernel of --sweep (fp32 / tensor)")
    ap.add_argument("--timed", default=None,
                    help="K:p list: end-to-end time and recall@ks for each of --distances (after --sweep)")
    ap.add_argument("--distances", default="fp32,tensor")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args()
    if args.grid:
        return grid()
    ks = [int(v) for v in args.ks.split(",")]
    if args.defaults:
        res = dict(bench="nn_descent_gpu_defaults", date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                   commit=_commit(), d=args.d,
                   runs=defaults([int(float(v)) for v in args.defaults.split(",")], ks, args.d, args.seed,
                                 args.sample_rows))
        _emit(res, args.out)
        return res

    import cupy as cp

    t0 = time.perf_counter()
    X, src = _data(args.n, args.d, args.seed, "float32")
    t_data = time.perf_counter() - t0
    rows = cp.asarray(np.random.default_rng(1).choice(args.n, min(args.sample_rows, args.n), replace=False))
    t0 = time.perf_counter()
    truth = _exact_sample(X, rows, args.k)
    t_truth = time.perf_counter() - t0
    out = dict(bench="nn_descent_gpu", gpu=cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(), commit=_commit(),
               data=dict(source=src, n=args.n, d=args.d, dtype="float32"), k=args.k, iters=args.iters,
               delta=args.delta, sample_rows=int(len(rows)), t_data_s=t_data, t_truth_s=t_truth, runs=[])

    configs = [tuple(int(v) for v in c.split(":")) for c in args.configs.split(",") if c]
    if args.sweep:
        kw = {} if args.distance is None else dict(distance=args.distance)
        truth = _exact_sample(X, rows, max(ks))
        out["sweep"] = sweep(X, rows, truth, configs, ks, args.iters, args.seed, **kw) if configs else []
        if args.timed:
            tcfg = [tuple(int(v) for v in c.split(":")) for c in args.timed.split(",") if c]
            out["timed"] = timed(X, rows, truth, tcfg, ks, args.iters, args.delta, args.distances.split(","),
                                 args.seed)
        _emit(out, args.out)
        return out
    # compile every kernel variant once on a small problem (the timed runs exclude compilation)
    for K, p in configs:
        run_gnnd(X[:5000], K, p, iters=2, delta=0)
    for K, p in configs:
        idx, dist, stats, t = run_gnnd(X, K, p, iters=args.iters, delta=args.delta)
        r = _recall(idx[rows], truth, args.k)
        out["runs"].append(dict(K=K, p=p, time_s=t, recall=r, iterations=stats["iterations"],
                                updates=stats["updates"], iter_s=[round(v, 5) for v in stats["time_s"]]))
        print(json.dumps(out["runs"][-1]), file=sys.stderr)
        del idx, dist

    if args.variants:  # kernel tuning: (lanes per insertion group, min blocks per SM)
        for group, minb in ((4, 5), (8, 7), (8, 8)):
            for K, p in configs[:2]:
                run_gnnd(X[:5000], K, p, iters=2, delta=0, group=group, minblocks=minb)
                idx, dist, stats, t = run_gnnd(X, K, p, iters=args.iters, delta=args.delta, group=group,
                                               minblocks=minb)
                out["runs"].append(dict(K=K, p=p, group=group, minblocks=minb, time_s=t,
                                        recall=_recall(idx[rows], truth, args.k), iterations=stats["iterations"]))
                print(json.dumps(out["runs"][-1]), file=sys.stderr)
                del idx, dist
    if args.fp16:  # the same graphs built from a float16 copy (half the bytes per sample row)
        Xh = X.astype(cp.float16)
        for K, p in configs[:2]:
            run_gnnd(Xh[:5000], K, p, iters=2, delta=0)
            idx, dist, stats, t = run_gnnd(Xh, K, p, iters=args.iters, delta=args.delta)
            out["runs"].append(dict(K=K, p=p, dtype="float16", time_s=t, recall=_recall(idx[rows], truth, args.k),
                                    iterations=stats["iterations"]))
            print(json.dumps(out["runs"][-1]), file=sys.stderr)
            del idx, dist
        del Xh

    K0, p0 = configs[0]
    if args.ablation_config:
        K0, p0 = (int(v) for v in args.ablation_config.split(":"))
    if not args.no_curve:  # paper Figure 4: recall and sum of distances after each iteration
        curve = []

        def cb(it, gi, gd):
            top = _top_of_raw(gi, gd, rows, args.k)
            curve.append(dict(iteration=it + 1, recall=_recall(top, truth, args.k),
                              phi=float(cp.sort(gd[rows], axis=1)[:, :args.k].sum())))

        _, _, stats, _ = run_gnnd(X, K0, p0, iters=args.iters, delta=0.0, callback=cb)
        for c, u in zip(curve, stats["updates"]):
            c["updates"] = u
        out["curve"] = dict(K=K0, p=p0, points=curve)
        print(json.dumps(out["curve"]), file=sys.stderr)
    if not args.no_ablation:  # paper Figure 5
        ab = []
        for name, upd, lk in (("r1_basic", "basic", "global"), ("r2_selective", "selective", "global"),
                              ("gnnd_selective_segmented", "selective", "segmented")):
            if upd == "basic":
                run_gnnd(X[:5000], K0, p0, iters=2, delta=0, update=upd, locks=lk)
            idx, _, stats, t = run_gnnd(X, K0, p0, iters=args.iters, delta=args.delta, update=upd, locks=lk)
            ab.append(dict(run=name, update=upd, locks=lk, K=K0, p=p0, time_s=t,
                           recall=_recall(idx[rows], truth, args.k), iterations=stats["iterations"]))
            print(json.dumps(ab[-1]), file=sys.stderr)
        out["ablation"] = ab
    if args.cuvs:
        try:
            from cuvs.neighbors import nn_descent

            res = []
            for gd in (32, 64):
                params = nn_descent.IndexParams(metric="sqeuclidean", graph_degree=gd,
                                                intermediate_graph_degree=2 * gd)
                nn_descent.build(params, X[:5000])
                cp.cuda.Device().synchronize()
                t0 = time.perf_counter()
                index = nn_descent.build(params, X)
                cp.cuda.Device().synchronize()
                t = time.perf_counter() - t0
                g = cp.asarray(index.graph)
                res.append(dict(graph_degree=gd, time_s=t, recall=_recall(g[rows].astype(cp.int64), truth,
                                                                          args.k)))
            out["cuvs"] = res
        except Exception as e:
            out["cuvs"] = dict(error=repr(e))
    _emit(out, args.out)


def _emit(obj, path):
    text = json.dumps(obj, indent=1)
    print(text)
    if path:
        with open(path, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
