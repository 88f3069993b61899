"""Benchmark of the GPU graph search (knnkit.index._search_gpu) -- recall/QPS curve,
batch-size curve, optional cuVS CAGRA side by side.

    PYTHONPATH=src python benchmarks/bench_graph_index.py --out $OUT [--cuvs] [--build own|knnkit]
        [--n 1000000 --d 128 --queries 10000 --variants fp32,fp16 --ref 'CAGRA:3.16e6@0.968,1.74e6@0.994']

Build ("own", default): k-means (1024 lists) -> exact k-NN inside each point's 2 nearest lists
(torch matmul + topk) -> RobustPrune (prune_gpu) -> reverse edges -> prune again.  "knnkit" uses
knnkit.GraphIndex.build.  Seeds: data points nearest to the query's nearest k-means centroids
(their cost is timed in "qps_with_seeds").  Ground truth: exact float32 (torch).
Prints one JSON document and writes it (plus recall_qps.png) under --out.

    PYTHONPATH=src python benchmarks/bench_graph_index.py --mode api --out $OUT [--parts batch,seeds,visited]

"api" mode: index from ``knnkit.GraphIndex.build(X, device="gpu", random_state=0)`` on
``make_clustered(n, d, n_queries=queries, random_state=0)``; batch-size curve through the public
``GraphIndex.search`` with the CuPy seed selection (before) and the fused seed kernel (after), a
per-stage breakdown for one query, seed kernel direct vs GEMM crossover, threads per block at small
batches, and the visited set (hash vs Bloom filter, BANG 4.4) at several beams and k = 1000.
Writes bench_graph_index_api.json.
"""

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import time

import numpy as np


def _git_commit():
    try:
        return subprocess.check_output(["git", "rev-parse", "HEAD"], text=True,
                                       stderr=subprocess.DEVNULL).strip()
    except Exception:
        return None


def _t(fn, reps):
    import cupy as cp

    fn()
    cp.cuda.Device().synchronize()
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        cp.cuda.Device().synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def _torch(a):
    import torch

    return torch.as_tensor(a, device="cuda")


def make_data(n, d, nq, seed):
    import cupy as cp

    try:
        from knnkit.datasets import make_clustered

        X, Q = make_clustered(n, d, n_queries=nq, random_state=seed, device="gpu")
        src = f"knnkit.datasets.make_clustered({n}, {d}, n_queries={nq}, random_state={seed}) (defaults)"
    except Exception as e:  # own generator
        print(f"# make_clustered unavailable ({e}); own generator", file=sys.stderr)
        rs = cp.random.RandomState(seed)
        C = rs.standard_normal((1024, d), dtype=cp.float32) * 2
        lab = rs.randint(0, 1024, n + nq)
        A = C[lab] + rs.standard_normal((n + nq, d), dtype=cp.float32) * 0.5
        X, Q = A[:n], A[n:]
        src = "own gaussian blobs (1024)"
    return cp.ascontiguousarray(cp.asarray(X, dtype=cp.float32)), cp.ascontiguousarray(
        cp.asarray(Q, dtype=cp.float32)), src


def exact_knn_torch(X, Q, k, exclude_self=False, tile=2048):
    """Exact float32 k-NN (squared L2) with torch matmul + topk; returns cupy (dist, idx int64)."""
    import cupy as cp
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    Xt, Qt = _torch(X), _torch(Q)
    xn = (Xt * Xt).sum(1)
    outd = torch.empty((Q.shape[0], k), device="cuda")
    outi = torch.empty((Q.shape[0], k), device="cuda", dtype=torch.int64)
    for s in range(0, Q.shape[0], tile):
        q = Qt[s:s + tile]
        D = xn[None, :] - 2 * (q @ Xt.T) + (q * q).sum(1)[:, None]
        if exclude_self:
            r = torch.arange(q.shape[0], device="cuda")
            D[r, r + s] = float("inf")
        v, i = torch.topk(D, k, dim=1, largest=False, sorted=True)
        outd[s:s + tile], outi[s:s + tile] = v, i
    return cp.asarray(outd), cp.asarray(outi)


def kmeans(X, nlist, iters, seed):
    import cupy as cp
    import torch

    rs = np.random.default_rng(seed)
    Xt = _torch(X)
    sample = Xt[torch.as_tensor(rs.choice(X.shape[0], min(X.shape[0], 64 * nlist), replace=False), device="cuda")]
    C = sample[torch.as_tensor(rs.choice(sample.shape[0], nlist, replace=False), device="cuda")].clone()
    for _ in range(iters):
        lab = torch.argmin((C * C).sum(1)[None] - 2 * sample @ C.T, dim=1)
        sums = torch.zeros_like(C).index_add_(0, lab, sample)
        cnt = torch.bincount(lab, minlength=nlist)[:, None]
        C = torch.where(cnt > 0, sums / cnt.clamp(min=1), C)  # empty lists keep their centre
    return cp.asarray(C.contiguous())


def build_own(X, R, K, alpha, nlist, probes, seed):
    """Approximate K-NN candidates per point from its `probes` nearest lists, then prune."""
    import cupy as cp
    import torch
    from knnkit.index._prune_gpu import prune_gpu

    torch.backends.cuda.matmul.allow_tf32 = False
    n = X.shape[0]
    t0 = time.perf_counter()
    C = kmeans(X, nlist, 8, seed)
    Xt, Ct = _torch(X), _torch(C)
    cn = (Ct * Ct).sum(1)
    assign = torch.empty((n, probes), dtype=torch.int64, device="cuda")
    for s in range(0, n, 65536):
        D = cn[None] - 2 * Xt[s:s + 65536] @ Ct.T
        assign[s:s + 65536] = torch.topk(D, probes, dim=1, largest=False).indices
    # members of each list, per probe rank
    flat = assign.reshape(-1)
    order = torch.argsort(flat, stable=True)
    pts = order // probes
    slot = order % probes
    bounds = torch.searchsorted(flat[order], torch.arange(nlist + 1, device="cuda"))
    cand_i = torch.full((n, probes, K), -1, dtype=torch.int64, device="cuda")
    cand_d = torch.full((n, probes, K), float("inf"), device="cuda")
    xn = (Xt * Xt).sum(1)
    bh = bounds.cpu().numpy()
    for c in range(nlist):
        a, b = int(bh[c]), int(bh[c + 1])
        if b - a < 2:
            continue
        m = pts[a:b]
        for s in range(0, b - a, 8192):
            mm = m[s:s + 8192]
            D = xn[mm][:, None] + xn[m][None] - 2 * Xt[mm] @ Xt[m].T
            D[torch.arange(mm.shape[0], device="cuda"), torch.arange(s, s + mm.shape[0], device="cuda")] = float("inf")
            kk = min(K, b - a - 1)
            v, i = torch.topk(D, kk, dim=1, largest=False)
            sl = slot[a + s:a + s + mm.shape[0]]
            cand_i[mm, sl, :kk] = m[i]
            cand_d[mm, sl, :kk] = v.clamp(min=0)
    t_knn = time.perf_counter() - t0
    ci = cp.asarray(cand_i.reshape(n, probes * K).to(torch.int32))
    cd = cp.asarray(cand_d.reshape(n, probes * K))
    del cand_i, cand_d
    t1 = time.perf_counter()
    g = prune_gpu(X, ci, cd, R, alpha, "l2")
    cp.cuda.Device().synchronize()
    t_prune1 = time.perf_counter() - t1
    # reverse edges: for each target, up to R sources, then prune the union again
    t2 = time.perf_counter()
    gt = _torch(g)
    src = torch.arange(n, device="cuda", dtype=torch.int32).repeat_interleave(R)
    dst = gt.reshape(-1)
    ok = dst >= 0
    src, dst = src[ok], dst[ok].long()
    o = torch.argsort(dst, stable=True)
    src, dst = src[o], dst[o]
    start = torch.searchsorted(dst, torch.arange(n, device="cuda"))
    rank = torch.arange(dst.shape[0], device="cuda") - start[dst]
    keep = rank < R
    rev = torch.full((n, R), -1, dtype=torch.int32, device="cuda")
    rev[dst[keep], rank[keep]] = src[keep]
    cand = torch.cat([gt, rev], dim=1)
    cdist = torch.empty(cand.shape, device="cuda")
    for s in range(0, n, 32768):
        cc = cand[s:s + 32768].long()
        v = Xt[cc.clamp(min=0)]
        dd = ((v - Xt[s:s + 32768, None]) ** 2).sum(-1)
        cdist[s:s + 32768] = torch.where(cc >= 0, dd, torch.full_like(dd, float("inf")))
    g2 = prune_gpu(X, cp.asarray(cand), cp.asarray(cdist), R, alpha, "l2")
    cp.cuda.Device().synchronize()
    t_prune2 = time.perf_counter() - t2
    return g2, C, {"knn_candidates_s": t_knn, "prune_s": t_prune1, "reverse_and_prune_s": t_prune2,
                   "nlist": nlist, "probes": probes, "K": K, "R": R, "alpha": alpha}


def medoids(X, C):
    """Index of the data point nearest to each centroid."""
    import cupy as cp
    import torch

    Xt, Ct = _torch(X), _torch(C)
    xn = (Xt * Xt).sum(1)
    best = torch.full((C.shape[0],), float("inf"), device="cuda")
    arg = torch.zeros((C.shape[0],), dtype=torch.int64, device="cuda")
    for s in range(0, X.shape[0], 262144):
        D = xn[s:s + 262144][None] - 2 * Ct @ Xt[s:s + 262144].T
        v, i = D.min(1)
        upd = v < best
        best = torch.where(upd, v, best)
        arg = torch.where(upd, i + s, arg)
    return cp.asarray(arg.to(torch.int32))


def make_seeder(C, M, s):
    import cupy as cp

    cn = (C * C).sum(1)

    def seeds_for(Q):
        # s rounds of argmin (cupy's argpartition sorts whole rows, ~10x slower here)
        D = cn[None] - 2 * Q @ C.T
        rows = cp.arange(Q.shape[0])
        out = cp.empty((Q.shape[0], s), dtype=cp.int32)
        for t in range(min(s, C.shape[0])):
            a = cp.argmin(D, axis=1)
            out[:, t] = M[a]
            D[rows, a] = cp.inf
        return out
    return seeds_for


def recall(found, truth):
    f, t = found.get(), truth.get()
    k = t.shape[1]
    hit = (f[:, :, None] == t[:, None, :]).any(axis=2).sum()
    return float(hit) / (t.shape[0] * k)


def _tsync(fn, reps):
    """Best wall time of fn() followed by a device synchronisation."""
    return _t(fn, reps)


def main_api(a, res):
    import cupy as cp
    import knnkit
    from knnkit.index import _entry
    from knnkit.index._search_gpu import search_gpu, select_seeds_gpu
    from knnkit.datasets import make_clustered

    parts = set(a.parts.split(","))
    out_path = os.path.join(a.out, "bench_graph_index_api.json")

    def dump():
        with open(out_path, "w") as f:
            json.dump(res, f, indent=1)

    t0 = time.perf_counter()
    X, Q = make_clustered(a.n, a.d, n_queries=a.queries, random_state=0, device="gpu")
    X, Q = cp.asarray(X), cp.asarray(Q)
    res["data"] = f"make_clustered({a.n}, {a.d}, n_queries={a.queries}, random_state=0, device='gpu')"
    warm = knnkit.GraphIndex.build(X[:20000], device="gpu", random_state=0)  # compile the build kernels
    warm.search(Q[:10], k=10)
    del warm
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    index = knnkit.GraphIndex.build(X, device="gpu", random_state=0)
    cp.cuda.Device().synchronize()
    res["build_s"] = time.perf_counter() - t0
    res["index"] = repr(index)
    gt_d, gt_i = exact_knn_torch(X, Q, a.k)
    print(f"# build {res['build_s']:.1f}s {res['index']}", file=sys.stderr)
    dump()
    beam = a.batch_beam
    big = cp.concatenate([Q] * (100_000 // Q.shape[0] + 1))[:100_000]

    if "batch" in parts:
        rows = []
        for label, flag in (("before_cupy_seeds", False), ("after_seed_kernel", True)):
            _entry._GPU_SEED_KERNEL = flag
            _, i = index.search(Q, k=a.k, beam=beam)
            r = recall(cp.asarray(i), gt_i)
            for b in (1, 10, 100, 1000, 10_000, 100_000):
                qb = big[:b]
                t = _tsync(lambda: index.search(qb, k=a.k, beam=beam), 50 if b <= 1000 else a.reps)
                rows.append({"seeds": label, "batch": b, "time_ms": t * 1e3, "qps": b / t, "recall_10k": r})
                print(f"# {label:18s} batch {b:7d}: {t * 1e3:.3f} ms qps={b / t:,.0f} (recall@10k {r:.4f})",
                      file=sys.stderr)
        _entry._GPU_SEED_KERNEL = True
        res["batch_curve_api"] = {"beam": beam, "rows": rows}
        dump()

        # per-stage breakdown, one query (each stage timed alone with a sync: upper bounds)
        from knnkit._core.validation import check_matrix
        from knnkit._core.metrics import prepare_vectors

        q1 = Q[:1]
        Xg, G, E = index._X, index._graph, index._entry
        X16 = index._fp16_copy(Xg, required=False)
        ns = max(4, beam // 16)
        seeds1 = E.seeds_for(q1, ns)
        bd = {}
        bd["check_matrix"] = _tsync(lambda: check_matrix(q1, "queries"), 50)
        bd["prepare_vectors"] = _tsync(lambda: prepare_vectors(q1, index.metric), 50)
        _entry._GPU_SEED_KERNEL = False
        bd["seeds_cupy"] = _tsync(lambda: E.seeds_for(q1, ns), 50)
        _entry._GPU_SEED_KERNEL = True
        bd["seeds_kernel"] = _tsync(lambda: E.seeds_for(q1, ns), 50)
        kw = dict(seeds=seeds1, beam=beam, tau=None, max_iters=max(64, 8 * beam), metric="l2", X_fp16=X16,
                  nn1_max=index.nn1_max)
        bd["search_gpu"] = _tsync(lambda: search_gpu(Xg, G, q1, a.k, **kw), 50)
        bd["empty_sync"] = _tsync(lambda: None, 50)
        bd["index_search"] = _tsync(lambda: index.search(q1, k=a.k, beam=beam), 50)
        res["breakdown_1query_ms"] = {k: v * 1e3 for k, v in bd.items()}
        print("# breakdown (ms): " + ", ".join(f"{k}={v * 1e3:.3f}" for k, v in bd.items()), file=sys.stderr)
        # threads per block at small batches (one block per query: more threads, fewer rounds per step)
        blk = []
        for b in (1, 100, 1000, 10_000):
            qb = big[:b]
            sb = E.seeds_for(qb, ns)
            for block in (128, 256, 512):
                t = _tsync(lambda: search_gpu(Xg, G, qb, a.k, **dict(kw, seeds=sb, block=block)), 20)
                blk.append({"batch": b, "block": block, "time_ms": t * 1e3})
                print(f"# block {block} batch {b}: {t * 1e3:.3f} ms", file=sys.stderr)
        res["block_small_batch"] = blk
        dump()

    if "seeds" in parts:
        E = index._entry
        E.seeds_for(Q[:1], 4)  # builds the cached device arrays E._dev
        _, C, M, cn = E._dev
        rows = []
        for b in (1, 10, 100, 300, 1000, 10_000, 100_000):
            qb = big[:b]
            row = {"batch": b}
            for m in ("direct", "gemm"):
                row[m + "_ms"] = 1e3 * _tsync(lambda: select_seeds_gpu(qb, C, M, 4, "l2", cnorms=cn, method=m), 20)
            _entry._GPU_SEED_KERNEL = False
            row["cupy_ms"] = 1e3 * _tsync(lambda: E.seeds_for(qb, 4), 10)
            ref = E.seeds_for(qb, 4)
            _entry._GPU_SEED_KERNEL = True
            row["same_as_cupy"] = float((E.seeds_for(qb, 4) == ref).all(axis=1).mean())
            rows.append(row)
            print(f"# seeds {row}", file=sys.stderr)
        res["seed_selection"] = {"n_centroids": len(E), "s": 4, "rows": rows}
        dump()

    if "visited" in parts:
        Xg, G, E = index._X, index._graph, index._entry
        X16 = index._fp16_copy(Xg, required=False)
        rows = []

        def one(label, qq, gt, k, beam, **extra):
            ns = max(4, beam // 16)
            sd = E.seeds_for(qq, ns)
            kw = dict(seeds=sd, beam=beam, tau=None, max_iters=max(64, 8 * beam), metric="l2",
                      nn1_max=index.nn1_max, **extra)
            _, i, st = search_gpu(Xg, G, qq, k, return_stats=True, **kw)
            r = recall(i, gt)
            t = _tsync(lambda: search_gpu(Xg, G, qq, k, **kw), a.reps)
            row = {"variant": label, "k": k, "beam": beam, "recall": r, "qps": qq.shape[0] / t, "time_ms": t * 1e3,
                   "mean_distances": float(st[:, 1].mean()), "mean_steps": float(st[:, 0].mean()),
                   **{kk: (vv if isinstance(vv, (int, str, float)) else "X16") for kk, vv in extra.items()}}
            rows.append(row)
            print(f"# {label:22s} k={k} beam={beam:5d} recall={r:.4f} qps={row['qps']:,.0f} "
                  f"dist={row['mean_distances']:.0f} steps={row['mean_steps']:.1f}", file=sys.stderr)

        from knnkit.index._search_gpu import _visited_config

        for trav in ("fp32", "fp16"):
            xf = dict(X_fp16=X16) if trav == "fp16" else {}
            cmax = max(32, (2 if trav == "fp16" else 1) * G.shape[1])
            for beam in (32, 64, 128, 512):
                for vis in ("hash", "bloom"):
                    one(f"{trav}-{vis}", Q, gt_i, a.k, beam, visited=vis, **xf)
                bits = _visited_config("bloom", beam, cmax, None, None)[1] * 32
                for f in (0.25, 2):  # filter size: refills (re-evaluated rejects) vs shared memory
                    one(f"{trav}-bloom-x{f}", Q, gt_i, a.k, beam, visited="bloom", bloom_bits=int(bits * f), **xf)
            for bits in (1024, 2048, 4096):  # false-positive effect: tiny filters
                one(f"{trav}-bloom{bits}", Q, gt_i, a.k, 64, visited="bloom", bloom_bits=bits, **xf)
        dump()
        q1k = Q[:1000]
        _, gt1k = exact_knn_torch(X, q1k, 1000)
        for trav in ("fp32", "fp16"):
            xf = dict(X_fp16=X16) if trav == "fp16" else {}
            for vis in ("hash", "bloom"):
                one(f"{trav}-{vis}", q1k, gt1k, 1000, 1024, visited=vis, **xf)
        one("fp16-bloom", q1k, gt1k, 1000, 4096, visited="bloom", X_fp16=X16)  # hash: 208 KiB, fits
        one("fp16-bloom", q1k, gt1k, 1000, 8192, visited="bloom", X_fp16=X16)  # hash would not fit
        res["visited"] = rows
        dump()
    print(json.dumps(res))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--queries", type=int, default=10_000)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--degree", type=int, default=64)
    ap.add_argument("--alpha", type=float, default=1.2)
    ap.add_argument("--build", choices=("own", "knnkit"), default="own")
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--beams", default="12,16,24,32,48,64,96,128")
    ap.add_argument("--taus", default="inf")
    ap.add_argument("--variants", default="fp32,fp16",
                    help="comma list: fp32|fp16 followed by options -wN (width), -tN (team), -bN (block), "
                         "-oN (min blocks per SM), -split (separate re-rank kernel)")
    ap.add_argument("--batch-curve", default="1,10,100,1000,10000,100000")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--cuvs", action="store_true")
    ap.add_argument("--ref", default="",
                    help="reference points to draw, 'label:qps@recall,qps@recall', e.g. "
                         "'CAGRA deg 64 (lead):3.16e6@0.968,1.74e6@0.994'")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mode", choices=("kernel", "api"), default="kernel")
    ap.add_argument("--parts", default="batch,seeds,visited", help="api mode: which parts to run")
    ap.add_argument("--batch-beam", type=int, default=32, help="api mode: beam of the batch curve")
    a = ap.parse_args(argv)

    import cupy as cp
    from knnkit.index._search_gpu import search_gpu, search_config

    os.makedirs(a.out, exist_ok=True)
    res = {"benchmark": "graph_index_search", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "git_commit": _git_commit(), "gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
           "params": vars(a)}
    if a.mode == "api":
        res["benchmark"] = "graph_index_api"
        return main_api(a, res)
    t0 = time.perf_counter()
    X, Q, src = make_data(a.n, a.d, a.queries, a.seed)
    res["data"] = {"source": src, "gen_s": time.perf_counter() - t0}
    t0 = time.perf_counter()
    gt_d, gt_i = exact_knn_torch(X, Q, a.k)
    res["ground_truth_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    if a.build == "knnkit":
        import knnkit

        idx = knnkit.GraphIndex.build(X, metric="sqeuclidean", graph_degree=a.degree, device="gpu")
        graph = cp.asarray(idx.graph, dtype=cp.int32)
        C = kmeans(X, 1024, 8, a.seed)
        binfo = {"via": "knnkit.GraphIndex.build"}
    else:
        graph, C, binfo = build_own(X, a.degree, a.degree, a.alpha, 1024, 2, a.seed)
    res["build"] = dict(binfo, total_s=time.perf_counter() - t0,
                        mean_degree=float((graph >= 0).sum(1).mean()))
    M = medoids(X, C)
    seeder = make_seeder(C, M, a.seeds)
    seeds = seeder(Q)
    X16 = X.astype(cp.float16)
    print(f"# built in {res['build']['total_s']:.1f}s", file=sys.stderr)

    curve = []
    for var in a.variants.split(","):
        opts = {}
        parts = var.split("-")
        fp16 = parts[0] == "fp16"
        for p in parts[1:]:
            if p == "split":
                opts["rerank"] = "split"
            elif p[0] == "w":
                opts["width"] = int(p[1:])
            elif p[0] == "t":
                opts["team"] = int(p[1:])
            elif p[0] == "b":
                opts["block"] = int(p[1:])
            elif p[0] == "o":
                opts["min_blocks"] = int(p[1:])
        for tau in [float(t) for t in a.taus.split(",")]:
            for beam in [int(b) for b in a.beams.split(",")]:
                if beam < a.k:
                    continue
                kw = dict(seeds=seeds, beam=beam, tau=tau, max_iters=None, metric="l2",
                          X_fp16=X16 if fp16 else None, **opts)
                d, i, st = search_gpu(X, graph, Q, a.k, return_stats=True, **kw)
                r = recall(i, gt_i)
                t = _t(lambda: search_gpu(X, graph, Q, a.k, **kw), a.reps)
                ts = _t(lambda: search_gpu(X, graph, Q, a.k, **dict(kw, seeds=seeder(Q))), a.reps)
                steps = float(st[:, 0].mean())
                ndist = float(st[:, 1].mean())
                row = {"variant": var, "tau": tau, "beam": beam, "recall": r, "time_s": t, "qps": a.queries / t,
                       "qps_with_seeds": a.queries / ts, "mean_expansions": steps, "mean_distances": ndist,
                       "bytes_per_query": ndist * a.d * (2 if fp16 else 4) + steps * a.degree * 4,
                       "effective_GBps": (ndist * a.d * (2 if fp16 else 4) + steps * a.degree * 4) * a.queries / t / 1e9,
                       "config": list(search_config(a.d, fp16=fp16, team=opts.get("team"), block=opts.get("block")))}
                curve.append(row)
                print(f"# {var:10s} tau={tau:<4} beam={beam:4d} recall={r:.4f} qps={row['qps']:,.0f} "
                      f"(+seeds {row['qps_with_seeds']:,.0f}) exp={steps:.1f} dist={ndist:.0f} "
                      f"GB/s={row['effective_GBps']:.0f}", file=sys.stderr)
    res["curve"] = curve

    def best_at(rows, target):
        ok = [r for r in rows if r["recall"] >= target]
        return max(ok, key=lambda r: r["qps"]) if ok else None

    res["best"] = {str(t): best_at(curve, t) for t in (0.9, 0.95, 0.968, 0.99, 0.994)}

    # batch-size curve at the cheapest fp32 setting reaching 0.95
    bc = []
    ref = best_at([r for r in curve if r["variant"] == "fp32"], 0.95) or (curve[0] if curve else None)
    if ref is not None and a.batch_curve:
        kw = dict(beam=ref["beam"], tau=ref["tau"], max_iters=None, metric="l2")
        for b in [int(x) for x in a.batch_curve.split(",")]:
            Qb = Q[cp.arange(b) % Q.shape[0]]
            Qb = Qb + cp.float32(1e-3) * cp.random.standard_normal(Qb.shape, dtype=cp.float32) if b > Q.shape[0] else Qb
            sb = seeder(Qb)
            reps = a.reps if b >= 100 else max(a.reps, 20)
            t = _t(lambda: search_gpu(X, graph, Qb, a.k, seeds=sb, **kw), reps)
            bc.append({"batch": b, "time_s": t, "qps": b / t, "latency_ms": t * 1e3})
            print(f"# batch {b:7d}: {t * 1e3:.3f} ms  qps={b / t:,.0f}", file=sys.stderr)
    res["batch_curve"] = {"setting": {k: ref[k] for k in ("variant", "beam", "tau")} if ref else None, "rows": bc}

    if a.cuvs:
        res["cuvs"] = run_cuvs(X, Q, gt_i, a)

    path = os.path.join(a.out, "bench_graph_index.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    try:
        plot(res, os.path.join(a.out, "recall_qps.png"))
    except Exception as e:
        print(f"# plot failed: {e}", file=sys.stderr)
    print(json.dumps(res))


def run_cuvs(X, Q, gt_i, a):
    try:
        import cupy as cp
        from cuvs.neighbors import cagra
    except Exception as e:
        print(f"# cuvs unavailable: {e}", file=sys.stderr)
        return {"error": f"cuvs unavailable: {e}"}
    out = {"rows": []}
    t0 = time.perf_counter()
    ip = cagra.IndexParams(metric="sqeuclidean", graph_degree=a.degree, intermediate_graph_degree=2 * a.degree)
    index = cagra.build(ip, X)
    cp.cuda.Device().synchronize()
    out["build_s"] = time.perf_counter() - t0
    for itopk in (16, 32, 64, 96, 128, 192, 256):
        try:
            sp = cagra.SearchParams(itopk_size=itopk)
            run = lambda: cagra.search(sp, index, Q, a.k)  # noqa: E731
            A, B = (cp.asarray(x) for x in run())
            nb = A if A.dtype.kind in "iu" else B  # (distances, neighbors) order differs between docs
            r = recall(nb.astype(cp.int64), gt_i)
            t = _t(run, a.reps)
            out["rows"].append({"itopk": itopk, "recall": r, "time_s": t, "qps": a.queries / t})
            print(f"# cagra itopk={itopk:4d} recall={r:.4f} qps={a.queries / t:,.0f}", file=sys.stderr)
        except Exception as e:
            out["rows"].append({"itopk": itopk, "error": str(e)})
    return out


def plot(res, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    series = {}
    for r in res["curve"]:
        series.setdefault(f"knnkit {r['variant']} tau={r['tau']}", []).append((r["recall"], r["qps"]))
    for name, pts in series.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=name, ms=3)
    cu = res.get("cuvs", {}).get("rows", [])
    pts = sorted((r["recall"], r["qps"]) for r in cu if "qps" in r)
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "s--", label="cuVS CAGRA", ms=3)
    ref = res["params"].get("ref") or ""
    if ":" in ref:
        label, spec = ref.split(":", 1)
        pts = sorted((float(p.split("@")[1]), float(p.split("@")[0])) for p in spec.split(",") if "@" in p)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "k*", ms=9, label=label)
    ax.set_yscale("log")
    ax.set_xlabel(f"recall@{res['params']['k']}")
    ax.set_ylabel("queries / s")
    ax.set_title(f"{res['params']['n']} x {res['params']['d']}, {res['params']['queries']} queries, {res['gpu']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
