"""CPU exact k-NN on several shapes: knnkit against faiss-cpu ``IndexFlatL2`` and scikit-learn's
brute force in one process, alternating rounds (shared cores: the medians of alternated runs are the
fair numbers). For an A/B of two knnkit trees, run it once per tree (``PYTHONPATH=<tree>/src``) with
``--only-knnkit`` on the older one; the peers' times then calibrate the machine between runs.

    PYTHONPATH=src python benchmarks/exact_cpu_shapes.py --out benchmarks/results/cpu/exact_shapes.json
"""

import argparse
import json
import os
import platform
import subprocess
import time

import numpy as np

#: (name, n, d, queries (0: all points, self excluded), k)
CASES = [("100k x 128, 1000 queries, k 10", 100_000, 128, 1000, 10),
         ("100k x 128, 10000 queries, k 10", 100_000, 128, 10_000, 10),
         ("200k x 32, 10000 queries, k 10", 200_000, 32, 10_000, 10),
         ("50k x 32 all points, k 48", 50_000, 32, 0, 48),
         ("30k x 128 all points, k 96", 30_000, 128, 0, 96)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only-knnkit", action="store_true")
    ap.add_argument("--tag", default="")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    import knnkit

    rng = np.random.default_rng(0)
    doc = {"tag": a.tag, "cpu": f"{platform.machine()}, {os.cpu_count()} cores", "rounds": a.rounds,
           "knnkit_file": os.path.relpath(knnkit.__file__, os.getcwd()), "cases": {}}
    try:
        doc["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        pass
    for name, n, d, nq, k in CASES:
        X = rng.standard_normal((n, d)).astype(np.float32)
        Q = X if nq == 0 else rng.standard_normal((nq, d)).astype(np.float32)
        runs = {"knnkit": lambda: knnkit.knn(X, None if nq == 0 else Q, k=k, device="cpu")[1]}
        if not a.only_knnkit:
            import faiss
            from sklearn.neighbors import NearestNeighbors

            def run_faiss():
                index = faiss.IndexFlatL2(d)
                index.add(X)
                return index.search(Q, k + (nq == 0))[1]

            def run_sklearn():
                nn = NearestNeighbors(n_neighbors=k, algorithm="brute").fit(X)
                return nn.kneighbors(None if nq == 0 else Q)[1]

            runs["faiss"] = run_faiss
            if nq:  # all points at 50k: scikit-learn's chunked brute force takes minutes on 2 cores
                runs["sklearn"] = run_sklearn
        knnkit.knn(X[:2000], None if nq == 0 else Q[:50], k=k, device="cpu")  # Numba compile / load
        times = {m: [] for m in runs}
        for _ in range(a.rounds):
            for m, f in runs.items():
                t = time.perf_counter()
                f()
                times[m].append(time.perf_counter() - t)
        med = {m: float(np.median(v)) for m, v in times.items()}
        doc["cases"][name] = {"median_s": med, "times_s": times}
        print(name, {m: round(v, 3) for m, v in med.items()}, flush=True)
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
