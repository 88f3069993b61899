"""How many candidates per row does the fused fp16 kernel need (issue 11)? The certified
fp16_rerank mode keeps k' candidates per row (``exact._gpu._candidates_k``: max(4k, 128)) so
that the certificate key[k'] - key[k] > 2 eps holds; the fused kernel's keys are fp32
accumulations (a smaller eps), and its selection cost grows with k' (~k' ln(n / k') survivors per
row). For each k and k', the all-points graph of n x d broad clusters: seconds, rows recomputed
by the certificate's fallback, rows whose k-th distance differs from the default k'.

    PYTHONPATH=src python benchmarks/fused_kc_sweep.py --out "$OUT"
"""

import argparse
import json
import os
import time



def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--plan", default="10:128,64,32,24,16;96:384,192,128,112")
    args = p.parse_args()
    import cupy as cp

    from knnkit.datasets.suite import make_broad_clusters
    from knnkit.exact import _gpu

    X = cp.asarray(make_broad_clusters(args.n, args.d, random_state=0))
    out = {"gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "args": dict(vars(args), out="$OUT"), "rows": []}
    orig = _gpu._candidates_k
    sync = cp.cuda.Device().synchronize
    _gpu.knn_gpu(X[:20000], X[:20000], 10, "l2", True, "fp16_rerank")  # compile
    for part in args.plan.split(";"):
        k, kcs = part.split(":")
        k = int(k)
        ref = None
        for kc in map(int, kcs.split(",")):
            _gpu._candidates_k = lambda kk, avail, mode, kc=kc: (orig(kk, avail, mode) if mode == "exact"
                                                                 else int(min(avail, _gpu.MAX_K, kc)))
            try:
                sync()
                t = time.perf_counter()
                D, I = _gpu.knn_gpu(X, X, k, "l2", True, "fp16_rerank")
                sync()
                s = time.perf_counter() - t
            finally:
                _gpu._candidates_k = orig
            row = {"k": k, "kc": kc, "seconds": s, "fallback_rows": int(_gpu.knn_gpu.last_fallback)}
            if ref is None:
                ref = (D, I)
            else:
                kth_a, kth_b = ref[0][:, k - 1], D[:, k - 1]
                row["rows_kth_differs"] = int((cp.abs(kth_a - kth_b) > 1e-5 * cp.maximum(1, cp.abs(kth_a))).sum())
                row["rows_ids_differ"] = int((ref[1] != I).any(axis=1).sum())
            out["rows"].append(row)
            print(json.dumps(row), flush=True)
            del D, I
    with open(os.path.join(args.out, "fused_kc_sweep.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
