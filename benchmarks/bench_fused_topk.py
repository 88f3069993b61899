"""A/B of the fused fp16 GEMM + top-k' kernel (fused_topk.cu) against the unfused fp16 path
(cuBLAS fp16 tile + topk_tile) and the exact fp32 mode, on the GPU (issue 11).

    PYTHONPATH=src python benchmarks/bench_fused_topk.py --out "$OUT" [--repeats 3] [--quick]

Cases: all-points k = 10 graphs of clustered data (knnkit.datasets.make_clustered) for (n, d) in
(1M, 128), (1M, 96), (200k, 784), plus 10k separate queries against 1M x 128. Each mode is run
once untimed (compile, memory pool), then timed --repeats times (synchronised; median reported).
Agreement: ids of every variant against the unfused fp16 path (and the exact mode): rows whose
ids differ, and of those the rows whose k-th neighbour distance differs too (id differences
between equal distances are ties, not errors). A kernel-only timing of one fused launch over
2^17 queries gives the kernel's own rate. Results go to $OUT/bench_fused_topk.json, rewritten
after every case so a time-out keeps what finished.
"""

import argparse
import json
import logging
import os
import platform
import time

import numpy as np

log = logging.getLogger("bench_fused_topk")

CASES = [("graph", 1_000_000, 128), ("queries", 1_000_000, 128), ("graph", 1_000_000, 96),
         ("graph", 200_000, 784)]
QUICK_CASES = [("graph", 100_000, 128), ("queries", 100_000, 128), ("graph", 50_000, 784)]
# label -> (precision, knnkit.exact._gpu._FUSED)
VARIANTS = {"fused": ("fp16_rerank", True), "unfused": ("fp16_rerank", False), "exact": ("exact", "auto")}
# a variant whose first timed run takes longer than this is not repeated (keeps one command
# inside the device's time limit even if something is far slower than predicted)
SLOW_S = 25.0


def data(n, d, nq, seed=0):
    import cupy as cp

    from knnkit.datasets import make_clustered

    out = make_clustered(n, d, n_queries=nq, random_state=seed, device="gpu")
    if nq:
        X, Q = out
        return cp.asarray(X, cp.float32), cp.asarray(Q, cp.float32)
    return cp.asarray(out, cp.float32), None


def run_variant(X, Q, k, label, repeats):
    import cupy as cp

    import knnkit
    from knnkit.exact import _gpu

    precision, fused = VARIANTS[label]
    _gpu._FUSED = fused
    sync = cp.cuda.Device().synchronize
    avail = X.shape[0] - (1 if Q is None else 0)
    used = _gpu.use_fused(precision, _gpu._candidates_k(k, avail, precision), X.shape[1])
    try:
        # warm-up on a slice: compiles the kernels, fills the memory pool
        knnkit.knn(X[:50_000], None if Q is None else Q[:1000], k=k, precision=precision)
        sync()
        times, res = [], None
        for _ in range(repeats):
            res = None
            cp.get_default_memory_pool().free_all_blocks()
            t = time.perf_counter()
            res = knnkit.knn(X, Q, k=k, precision=precision)
            sync()
            times.append(time.perf_counter() - t)
            if times[-1] > SLOW_S:
                break
        fallback = int(_gpu.knn_gpu.last_fallback)
    finally:
        _gpu._FUSED = "auto"
    return {"median_s": float(np.median(times)), "all_s": times, "fallback_rows": fallback,
            "fused_used": bool(used)}, res


def agreement(a, b, k):
    """Rows with different ids, and rows whose k-th distance differs beyond float32 noise."""
    da, ia = (x.get() for x in a)
    db, ib = (x.get() for x in b)
    rows_ids = int((ia != ib).any(axis=1).sum())
    kth_a, kth_b = da[:, k - 1].astype(np.float64), db[:, k - 1].astype(np.float64)
    tol = 1e-5 * np.maximum(1.0, np.maximum(np.abs(kth_a), np.abs(kth_b)))
    rows_kth = int((np.abs(kth_a - kth_b) > tol).sum())
    recall = float(np.mean([len(set(x) & set(y)) / k for x, y in zip(ia[:20000], ib[:20000])]))
    return {"rows": int(ia.shape[0]), "rows_ids_differ": rows_ids, "rows_kth_distance_differs": rows_kth,
            "recall_first20k": recall}


def kernel_only(X, k, repeats):
    """One fused launch over 2^17 queries (no re-rank): the kernel's own time and rate."""
    import cupy as cp

    from knnkit.exact import _gpu

    n, d = X.shape
    m = min(n, 1 << 17)
    kc = _gpu._candidates_k(k, n - 1, "fp16_rerank")
    prep = _gpu._Prepared(X, "l2", "fp16_rerank")
    Qlow, sq, _ = prep.queries(X[:m])
    alpha = -2.0 / (prep.sx * sq)
    Xf = _gpu._pad_half(prep.X, _gpu._fused_dim(d))
    sid = cp.arange(m, dtype=cp.int32)
    _gpu.fused_candidates(Qlow[:256], Xf, kc, prep.xnorm2, alpha, sid[:256])
    cp.cuda.Device().synchronize()
    ts = []
    for _ in range(repeats):
        t0 = cp.cuda.Event()
        t1 = cp.cuda.Event()
        t0.record()
        _gpu.fused_candidates(Qlow, Xf, kc, prep.xnorm2, alpha, sid)
        t1.record()
        t1.synchronize()
        ts.append(cp.cuda.get_elapsed_time(t0, t1) / 1e3)
    s = float(np.median(ts))
    dp = _gpu._fused_dim(d)
    return {"queries": m, "n": n, "d": d, "dp": dp, "kc": kc, "config": list(_gpu._fused_config(d)),
            "median_s": s, "all_s": ts, "tflops_padded": 2.0 * m * n * dp / s / 1e12,
            "extrapolated_graph_kernel_s": s * n / m}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--nq", type=int, default=10_000)
    p.add_argument("--quick", action="store_true", help="small shapes (a smoke test)")
    p.add_argument("--variants", default="fused,unfused,exact")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    import cupy as cp

    import knnkit

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "bench_fused_topk.json")
    props = cp.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    res = {"gpu": name, "cupy": cp.__version__, "knnkit": getattr(knnkit, "__version__", "?"),
           "python": platform.python_version(), "k": args.k, "repeats": args.repeats,
           "timing": "wall clock of knnkit.knn, synchronised, warm; median", "cases": [], "kernel": None}

    def save():
        with open(path, "w") as f:
            json.dump(res, f, indent=1)

    variants = [v for v in args.variants.split(",") if v]
    for kind, n, d in (QUICK_CASES if args.quick else CASES):
        X, Q = data(n, d, args.nq if kind == "queries" else 0)
        case = {"kind": kind, "n": n, "d": d, "queries": int(Q.shape[0]) if Q is not None else n,
                "variants": {}, "agreement_vs_unfused": {}, "agreement_vs_exact": {}}
        results = {}
        for label in variants:
            try:
                r, out = run_variant(X, Q, args.k, label, args.repeats)
            except Exception as e:  # noqa: BLE001 - record the failure, go on with the others
                log.exception("%s %s n=%d d=%d failed", kind, label, n, d)
                case["variants"][label] = {"error": repr(e)}
                continue
            case["variants"][label] = r
            results[label] = out
            log.info("%s n=%d d=%d %s: %.3f s (fallback rows %d)", kind, n, d, label, r["median_s"],
                     r["fallback_rows"])
        for ref_label, key in (("unfused", "agreement_vs_unfused"), ("exact", "agreement_vs_exact")):
            if ref_label in results:
                for label, out in results.items():
                    if label != ref_label:
                        case[key][label] = agreement(out, results[ref_label], args.k)
        res["cases"].append(case)
        log.info("%s", json.dumps(case))
        save()
        del X, Q, results
        cp.get_default_memory_pool().free_all_blocks()

    try:
        X, _ = data(100_000 if args.quick else 1_000_000, 128, 0)
        res["kernel"] = kernel_only(X, args.k, args.repeats)
        log.info("kernel only: %s", json.dumps(res["kernel"]))
    except Exception as e:  # noqa: BLE001
        log.exception("kernel-only timing failed")
        res["kernel"] = {"error": repr(e)}
    save()
    log.info("wrote %s", path)


if __name__ == "__main__":
    main()
