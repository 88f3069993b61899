"""Benchmark of exact brute-force k-NN (knnkit.knn) on the GPU; prints one JSON document.

    PYTHONPATH=src python benchmarks/bench_brute_force.py [--n 1000000] [--dim 128] [--nq 10000]
        [--k 10] [--modes exact,fp16_rerank,tf32_rerank,bf16_rerank] [--no-graph] [--cuvs]
        [--profile] [--cpu-graph 100000]

Data: clustered synthetic float32 (knnkit.datasets.make_clustered when it exists, else a
Gaussian-mixture generator here). Times are warm (one untimed run first), synchronised, and the
median of --repeats runs (the all-points graph runs --graph-repeats times).
"""

import argparse
import datetime
import json
import subprocess
import sys
import time

import numpy as np


def clustered(n, dim, n_clusters=1000, seed=0, xp=np):
    """Gaussian mixture: centres ~ N(0, 1), points = centre + N(0, 0.35^2) per coordinate."""
    try:
        from knnkit.datasets import make_clustered

        X = make_clustered(n, dim, random_state=seed)
        X = X[0] if isinstance(X, tuple) else X
        return xp.asarray(X, dtype=xp.float32), "knnkit.datasets.make_clustered"
    except Exception:
        pass
    rs = xp.random.RandomState(seed)
    centres = rs.standard_normal((n_clusters, dim)).astype(xp.float32)
    labels = rs.randint(0, n_clusters, size=n)
    X = centres[labels] + np.float32(0.35) * rs.standard_normal((n, dim)).astype(xp.float32)
    return X.astype(xp.float32), "own gaussian mixture (1000 clusters, sigma 0.35)"


def timed(fn, repeats, sync):
    fn()
    sync()
    ts = []
    out = None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        sync()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts)), ts, out


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def recall(a, b):
    a = _host(a)
    b = _host(b)
    k = a.shape[1]
    hits = sum(len(set(x) & set(y)) for x, y in zip(a.tolist(), b.tolist()))
    return hits / (a.shape[0] * k)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--nq", type=int, default=10_000)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--graph-repeats", type=int, default=1)
    p.add_argument("--modes", default="exact,fp16_rerank,tf32_rerank,bf16_rerank")
    p.add_argument("--no-graph", action="store_true")
    p.add_argument("--cuvs", action="store_true")
    p.add_argument("--profile", action="store_true", help="time GEMM and selection separately")
    p.add_argument("--cpu-graph", type=int, default=0, help="also time the CPU all-points graph on N points")
    args = p.parse_args()

    import knnkit
    from knnkit.exact import _gpu

    res = {"benchmark": "brute_force", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "params": vars(args)}
    try:
        res["git_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                                           text=True).stdout.strip()
    except Exception:
        res["git_commit"] = None

    if args.cpu_graph:
        Xc, _ = clustered(args.cpu_graph, args.dim, seed=1)
        knnkit.knn(Xc[:2000], k=args.k, device="cpu")
        t = time.perf_counter()
        knnkit.knn(Xc, k=args.k, device="cpu")
        res["cpu_graph"] = {"n": args.cpu_graph, "seconds": time.perf_counter() - t}

    if not knnkit.gpu_available():
        res["gpu"] = None
        print(json.dumps(res, indent=1))
        return
    import cupy as cp

    sync = cp.cuda.Device().synchronize
    props = cp.cuda.runtime.getDeviceProperties(0)
    res["gpu"] = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    res["cupy"] = cp.__version__
    X, gen = clustered(args.n, args.dim, seed=0, xp=cp)
    Q, _ = clustered(args.nq, args.dim, seed=0, xp=cp)  # same mixture, fresh points
    Q = Q + cp.float32(0.01) * cp.random.RandomState(7).standard_normal(Q.shape).astype(cp.float32)
    res["data"] = gen
    flops_q = 2.0 * args.nq * args.n * args.dim
    flops_g = 2.0 * args.n * args.n * args.dim
    res["predicted"] = {
        "queries_gemm_s_at_51TF": flops_q / 51e12, "queries_tile_bytes": 8.0 * args.nq * args.n,
        "graph_gemm_s_at_51TF": flops_g / 51e12, "graph_tile_bytes": 8.0 * args.n * args.n,
    }
    modes = [m for m in args.modes.split(",") if m]
    out = {}
    exact_q = exact_g = None
    for label in modes:
        # "<mode>+overlap": GEMM and selection on two streams (knnkit.exact._gpu._OVERLAP)
        # "<mode>+f32tile": fp16_rerank with a float32 distance tile (knnkit.exact._gpu._FP16_TILE)
        mode = label.split("+")[0]
        _gpu._OVERLAP = "+overlap" in label
        _gpu._FP16_TILE = "+f32tile" not in label
        r = {}
        med, ts, (d, i) = timed(lambda: knnkit.knn(X, Q, k=args.k, precision=mode), args.repeats, sync)
        r["queries_s"] = med
        r["queries_all_s"] = ts
        r["queries_fallback_rows"] = int(_gpu.knn_gpu.last_fallback)
        if label == "exact":
            exact_q = i
        elif exact_q is not None:
            r["queries_recall_vs_exact"] = recall(i, exact_q)
            r["queries_identical_frac"] = float((_host(i) == _host(exact_q)).mean())
        if not args.no_graph:
            knnkit.knn(X[:50000], k=args.k, precision=mode)  # warm-up (compile, pool)
            sync()
            ts = []
            for _ in range(args.graph_repeats):
                t = time.perf_counter()
                d, i = knnkit.knn(X, k=args.k, precision=mode)
                sync()
                ts.append(time.perf_counter() - t)
            r["graph_s"] = float(np.median(ts))
            r["graph_all_s"] = ts
            r["graph_fallback_rows"] = int(_gpu.knn_gpu.last_fallback)
            if label == "exact":
                exact_g = i
            elif exact_g is not None:
                sample = slice(0, 20000)
                r["graph_recall_vs_exact_first20k"] = recall(i[sample], exact_g[sample])
            del d, i
            cp.get_default_memory_pool().free_all_blocks()
        out[label] = r
        _gpu._OVERLAP = False
        _gpu._FP16_TILE = True
        print(json.dumps({label: r}), file=sys.stderr, flush=True)
    res["knnkit"] = out

    if args.profile:
        res["profile"] = profile(X, Q, args.k, sync)

    if args.cuvs:
        try:
            from cuvs.neighbors import brute_force

            idx = brute_force.build(X, metric="sqeuclidean")
            med, ts, (d, i) = timed(lambda: brute_force.search(idx, Q, args.k), args.repeats, sync)
            i = cp.asarray(i)
            c = {"queries_s": med, "queries_all_s": ts}
            if exact_q is not None:
                c["queries_recall_vs_knnkit_exact"] = recall(i, exact_q)
            res["cuvs"] = c
        except Exception as e:  # cuVS absent or failing: say so
            res["cuvs"] = {"error": repr(e)}
    print(json.dumps(res, indent=1))


def profile(X, Q, k, sync):
    """Split the exact 10k-query run into GEMM-only and selection-only time."""
    import cupy as cp
    from knnkit.exact import _gpu

    prep = _gpu._Prepared(X, "l2", "exact")
    n = X.shape[0]
    m = Q.shape[0]
    mq, nt = _gpu._tile_shape(n, m, X.shape[1], k, None, prep.X.nbytes)
    Qlow, sq, _ = prep.queries(Q[:mq])
    G = cp.empty((mq, -(-nt // 8) * 8), cp.float32)
    bd = cp.empty((mq, k), cp.float32)
    bi = cp.empty((mq, k), cp.int32)

    def gemm():
        for c0 in range(0, n, nt):
            c1 = min(n, c0 + nt)
            _gpu._gemm(Qlow, prep.X[c0:c1], G[:, : c1 - c0], "exact")

    def select():
        for c0 in range(0, n, nt):
            c1 = min(n, c0 + nt)
            _gpu._select_tile(G[:, : c1 - c0], k, c0, prep.xnorm2, -2.0, None, bd, bi, c0 > 0)

    gemm()
    tg, _, _ = timed(gemm, 3, sync)
    ts, _, _ = timed(select, 3, sync)
    Gh = G.astype(cp.float16)

    def select_h():
        _gpu._select_tile(Gh, k, 0, prep.xnorm2, -2.0, None, bd, bi, False)

    th, _, _ = timed(select_h, 3, sync)
    return {"rows": mq, "tile_cols": nt, "gemm_s": tg, "select_s": ts,
            "gemm_tflops": 2.0 * mq * n * X.shape[1] / tg / 1e12,
            "select_GBps": 4.0 * mq * n / ts / 1e9,
            "select_fp16_one_tile_GBps": 2.0 * mq * nt / th / 1e9}


if __name__ == "__main__":
    main()
