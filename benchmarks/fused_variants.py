"""Kernel-level A/B of the fused fp16 GEMM + top-k' kernels (exact/fused_topk.cu; issue 11):
``fused_topk_fp16`` (query tile in shared memory, 64-half k-slices) against
``fused_topk_fp16_ar`` (query fragments in registers, whole-chunk stages), each also compiled
with ``-DFT_EXP_NOSELECT`` (every row refuses every key: the main loop + filter alone, no merge),
on one launch of 2^17 queries against n x d data; ids of the two kernels compared.

    PYTHONPATH=src python benchmarks/fused_variants.py --out "$OUT" [--n 1000000] [--d 128]
"""

import argparse
import json
import os

import numpy as np


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--dims", default="128,96")
    p.add_argument("--m", type=int, default=1 << 17)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--data", default="broad", choices=("broad", "clustered"))
    args = p.parse_args()
    import cupy as cp

    from knnkit._core.cuda import get_kernel
    from knnkit.datasets.suite import make_broad_clusters
    from knnkit.exact import _gpu

    out = {"gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "args": dict(vars(args), out="$OUT"), "cases": []}
    for d in map(int, args.dims.split(",")):
        if args.data == "broad":
            X = cp.asarray(make_broad_clusters(args.n, d, random_state=0))
        else:
            from knnkit.datasets import make_clustered
            X = cp.asarray(make_clustered(args.n, d, random_state=0, device="gpu"), cp.float32)
        n = X.shape[0]
        m = min(n, args.m)
        kc = _gpu._candidates_k(args.k, n - 1, "fp16_rerank")
        prep = _gpu._Prepared(X, "l2", "fp16_rerank")
        Qlow, sq, _ = prep.queries(X[:m])
        alpha = np.float32(-2.0 / (prep.sx * sq))
        dp = _gpu._fused_dim(d)
        Xf = _gpu._pad_half(prep.X, dp)
        Qf = _gpu._pad_half(Qlow, dp)
        sid = cp.arange(m, dtype=cp.int32)
        mt, nw, smem_old = _gpu._fused_config(d)
        variants = [("shared_q", f"fused_topk_fp16<{mt},{nw}>", smem_old, 16 * mt * nw)]
        if dp // 16 in _gpu._FT_AR_KST:
            variants.append(("register_q", f"fused_topk_fp16_ar<2,4,{dp // 16}>", _gpu._fused_ar_smem_bytes(dp), 128))
        ids = {}
        for label, name, smem, bm in variants:
            for opts in ((), ("-DFT_EXP_NOSELECT",)):
                kern = get_kernel(_gpu._FUSED_KERNEL, name, options=opts, name_expressions=_gpu._FT_NAMES)
                if smem > 48 * 1024:
                    kern.max_dynamic_shared_size_bytes = smem
                bd = cp.empty((m, kc), cp.float32)
                bi = cp.empty((m, kc), cp.int32)

                def launch(mm):
                    kern((-(-mm // bm),), (32 * nw if label == "shared_q" else 128,),
                         (Qf, Xf, np.int32(mm), np.int32(n), np.int32(dp), prep.xnorm2, alpha, sid, bd, bi,
                          np.int32(kc)), shared_mem=smem)
                launch(256)
                cp.cuda.Device().synchronize()
                ts = []
                for _ in range(args.repeats):
                    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                    e0.record()
                    launch(m)
                    e1.record()
                    e1.synchronize()
                    ts.append(cp.cuda.get_elapsed_time(e0, e1) / 1e3)
                s = float(np.median(ts))
                row = {"d": d, "dp": dp, "kc": kc, "variant": label, "kernel": name, "noselect": bool(opts),
                       "smem": smem, "median_s": s, "all_s": ts, "tflops_padded": 2.0 * m * n * dp / s / 1e12,
                       "extrapolated_graph_kernel_s": s * n / m}
                if not opts:
                    ids[label] = (bd.copy(), bi.copy())
                out["cases"].append(row)
                print(json.dumps(row), flush=True)
        if len(ids) == 2:
            (da, ia), (db, ib) = ids["shared_q"], ids["register_q"]
            agree = {"d": d, "rows_ids_differ": int((ia != ib).any(axis=1).sum()),
                     "rows_keys_differ": int((da != db).any(axis=1).sum())}
            out["cases"].append(agree)
            print(json.dumps(agree), flush=True)
        cp.get_default_memory_pool().free_all_blocks()
    with open(os.path.join(args.out, "fused_variants.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
