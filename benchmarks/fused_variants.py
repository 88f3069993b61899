"""Kernel-level A/B of the fused fp16 GEMM + top-k' kernels (exact/fused_topk.cu; issue 11), one
launch of 2^17 queries against n x d data, all variants in one process:

* ``register_q`` / ``register_q_v1``: ``fused_topk_fp16_ar`` (query fragments in registers, padded
  d <= 128) with the v2 selection (the default) and with the original v1 selection
  (``-DFT_SEL_V1``);
* ``shared_q`` / ``shared_q_v1``: ``fused_topk_fp16`` (query tile in shared memory), same two;
* ``register_q_main1`` / ``register_q_main1_noselect``: ``fused_topk_fp16_ar`` with the original
  main loop (``-DFT_MAIN_V1``) instead of the pipelined one (the default since NOTES_topk.md,
  "Pipelined main loop"), v2 selection;
* ``*_noselect``: compiled with ``-DFT_EXP_NOSELECT`` (every row refuses every key: the main loop +
  filter alone, no append, no merge).

Ids *and* keys of every variant are compared with the first one that selects (``register_q_v1`` or
``register_q_main1`` where listed first): the selection is exact under the threshold and the
accumulation order is the same in every variant, so they must be equal bit for bit.
``--rounds`` > 1 times the variants round-robin (``--repeats`` launches each per round) instead of all
of one variant's launches back to back.

    PYTHONPATH=src python benchmarks/fused_variants.py --out "$OUT" [--n 1000000] [--dims 128,96]
        [--variants register_q_v1,register_q,register_q_noselect] [--rounds 1]
"""

import argparse
import json
import os

import numpy as np

ALL = ("register_q_v1", "register_q", "register_q_noselect", "register_q_main1", "register_q_main1_noselect",
       "shared_q_v1", "shared_q", "shared_q_noselect")
# label suffix -> NVRTC option
OPTS = {"v1": "-DFT_SEL_V1", "main1": "-DFT_MAIN_V1", "noselect": "-DFT_EXP_NOSELECT"}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--dims", default="128,96")
    p.add_argument("--m", type=int, default=1 << 17)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--kc", type=int, default=0, help="candidates per row (0: the fp16_rerank default for k)")
    p.add_argument("--repeats", type=int, default=3, help="launches per variant and round")
    p.add_argument("--rounds", type=int, default=1, help="> 1: time the variants round-robin")
    p.add_argument("--data", default="broad", choices=("broad", "clustered"))
    p.add_argument("--variants", default="register_q_v1,register_q,register_q_noselect")
    args = p.parse_args()
    import cupy as cp

    from knnkit._core.cuda import get_kernel
    from knnkit.datasets.suite import make_broad_clusters
    from knnkit.exact import _gpu

    wanted = [v for v in args.variants.split(",") if v]
    assert all(v in ALL for v in wanted), f"variants: {ALL}"
    out = {"gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "args": dict(vars(args), out="$OUT"),
           "cases": []}
    ok = True
    for d in map(int, args.dims.split(",")):
        if args.data == "broad":
            X = cp.asarray(make_broad_clusters(args.n, d, random_state=0))
        else:
            from knnkit.datasets import make_clustered
            X = cp.asarray(make_clustered(args.n, d, random_state=0, device="gpu"), cp.float32)
        n = X.shape[0]
        m = min(n, args.m)
        kc = args.kc or _gpu._candidates_k(args.k, n - 1, "fp16_rerank")
        prep = _gpu._Prepared(X, "l2", "fp16_rerank")
        Qlow, sq, _ = prep.queries(X[:m])
        alpha = np.float32(-2.0 / (prep.sx * sq))
        dp = _gpu._fused_dim(d)
        Xf = _gpu._pad_half(prep.X, dp)
        Qf = _gpu._pad_half(Qlow, dp)
        sid = cp.arange(m, dtype=cp.int32)
        mt, nw, smem_shared = _gpu._fused_config(d)
        runs = []  # (label, name, opts, smem, launch, bd, bi)
        for label in wanted:
            base = label.split("_")[0]
            if base == "register":
                if dp // 16 not in _gpu._FT_AR_KST:
                    continue
                name, smem, bm, nthreads = f"fused_topk_fp16_ar<2,4,{dp // 16}>", _gpu._fused_ar_smem_bytes(dp), 128, 128
            else:
                name, smem, bm, nthreads = f"fused_topk_fp16<{mt},{nw}>", smem_shared, 16 * mt * nw, 32 * nw
            opts = tuple(OPTS[part] for part in label.split("_")[2:])
            # only this instantiation: one short NVRTC compile per variant
            kern = get_kernel(_gpu._FUSED_KERNEL, name, options=opts, name_expressions=(name,))
            if smem > 48 * 1024:
                kern.max_dynamic_shared_size_bytes = smem
            bd = cp.empty((m, kc), cp.float32)
            bi = cp.empty((m, kc), cp.int32)

            def launch(mm, kern=kern, bd=bd, bi=bi, bm=bm, nthreads=nthreads, smem=smem):
                kern((-(-mm // bm),), (nthreads,),
                     (Qf, Xf, np.int32(mm), np.int32(n), np.int32(dp), prep.xnorm2, alpha, sid, bd, bi,
                      np.int32(kc)), shared_mem=smem)
            launch(256)  # compile + warm up
            runs.append((label, name, opts, smem, launch, bd, bi))
        cp.cuda.Device().synchronize()
        times = {r[0]: [] for r in runs}
        for _ in range(args.rounds):  # rounds > 1: round-robin over the variants
            for label, _, _, _, launch, _, _ in runs:
                for _ in range(args.repeats):
                    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                    e0.record()
                    launch(m)
                    e1.record()
                    e1.synchronize()
                    times[label].append(cp.cuda.get_elapsed_time(e0, e1) / 1e3)
        ref = None
        for label, name, opts, smem, _, bd, bi in runs:
            ts = times[label]
            s = float(np.median(ts))
            row = {"d": d, "dp": dp, "kc": kc, "variant": label, "kernel": name, "options": list(opts), "smem": smem,
                   "median_s": s, "all_s": ts, "tflops_padded": 2.0 * m * n * dp / s / 1e12,
                   "extrapolated_graph_kernel_s": s * n / m}
            if not label.endswith("noselect"):
                if ref is None:
                    ref = (label, bd, bi)
                else:
                    row["vs"] = ref[0]
                    row["rows_ids_differ"] = int((ref[2] != bi).any(axis=1).sum())
                    row["rows_keys_differ"] = int((ref[1] != bd).any(axis=1).sum())  # NaN-free: +inf pads
                    ok &= row["rows_ids_differ"] == 0 and row["rows_keys_differ"] == 0
            out["cases"].append(row)
            print(json.dumps(row), flush=True)
        with open(os.path.join(args.out, "fused_variants.json"), "w") as f:  # per d: a cut run keeps its rows
            json.dump(out, f, indent=1)
        del runs
        cp.get_default_memory_pool().free_all_blocks()
    out["all_equal"] = bool(ok)
    with open(os.path.join(args.out, "fused_variants.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps({"all_equal": bool(ok)}), flush=True)
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
