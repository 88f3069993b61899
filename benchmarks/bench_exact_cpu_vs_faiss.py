"""CPU exact all-points k-NN: knnkit's GEMM path against faiss-cpu ``IndexFlatL2`` in one process,
alternating rounds (the machine's cores are shared: medians of alternated runs are the fair number).

    PYTHONPATH=src python benchmarks/bench_exact_cpu_vs_faiss.py --n 50000 --d 128 --k 10 --out DIR
"""

import argparse
import json
import os
import platform
import subprocess
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=50_000)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    import faiss

    import knnkit

    X = knnkit.datasets.make_clustered(a.n, a.d, random_state=0, device="cpu")
    X = np.ascontiguousarray(X, np.float32)

    def run_knnkit():
        return knnkit.knn(X, k=a.k, device="cpu")[1]

    def run_faiss():
        index = faiss.IndexFlatL2(a.d)
        index.add(X)
        _, ids = index.search(X, a.k + 1)
        return ids

    run_knnkit()  # compile
    times = {"knnkit": [], "faiss": []}
    for _ in range(a.rounds):
        for name, fn in (("knnkit", run_knnkit), ("faiss", run_faiss)):
            t = time.perf_counter()
            out = fn()
            times[name].append(time.perf_counter() - t)
            if name == "faiss":
                fa = out
            else:
                kk = out
    # agreement: faiss rows include the point itself (or a duplicate) first
    same = np.mean([len(set(r[:a.k].tolist()) & set(f[f != i][:a.k].tolist())) / a.k
                    for i, (r, f) in enumerate(zip(kk[:2000], fa[:2000]))])
    res = {"n": a.n, "d": a.d, "k": a.k, "cpu": f"{platform.machine()}, {os.cpu_count()} cores",
           "faiss": faiss.__version__, "median_s": {k: float(np.median(v)) for k, v in times.items()},
           "times_s": times, "id_agreement_2000_rows": float(same),
           "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()}
    res["ratio_knnkit_over_faiss"] = res["median_s"]["knnkit"] / res["median_s"]["faiss"]
    print(json.dumps(res, indent=1))
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, f"exact_cpu_vs_faiss_{a.n}x{a.d}.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
