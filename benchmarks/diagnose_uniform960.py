"""Issue 11, CPU uniform 960-d: why the index's beam stops short of 0.99 (diagnostic).

Builds the CPU index of uniform [0,1]^d data (the suite's generator) with the default
parameters and with variants, and reports the candidate lists' recall, the calibrated curve and
the recall of unseen queries per beam. Optional hnswlib reference (M, efc 200, ef sweep).

    PYTHONPATH=src python benchmarks/diagnose_uniform960.py --n 30000 --variants default,brute
"""
import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

import knnkit  # noqa: E402
from knnkit.datasets.suite import make_uniform_cube  # noqa: E402
from knnkit.evaluate import recall  # noqa: E402


def truth(X, Q, k):
    D, I = knnkit.knn(X, Q, k=k, device="cpu")
    return np.asarray(D), np.asarray(I)


def cand_recall(X, ids, k=10, sample=500, seed=0):
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(X.shape[0], sample, replace=False))
    D, I = knnkit.knn(X, X[rows], k=k + 1, device="cpu")
    I = np.asarray(I)
    hits = 0
    for j, r in enumerate(rows):
        t = [v for v in I[j] if v != r][:k]
        hits += len(set(t) & set(ids[r][:k].tolist()))
    return hits / (k * sample)


def sweep(index, Q, TD, TI, beams, k=10):
    out = []
    for b in beams:
        index.search(Q[:20], k=k, beam=b)
        t = time.perf_counter()
        D, I = index.search(Q, k=k, beam=b)
        t = time.perf_counter() - t
        r = float(recall(np.asarray(I), TI, found_distances=np.asarray(D), true_distances=TD))
        out.append((b, round(r, 4), round(len(Q) / t, 1)))
        print(f"    beam {b}: {r:.4f} @ {len(Q) / t:.0f} QPS", flush=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=30000)
    ap.add_argument("--d", type=int, default=960)
    ap.add_argument("--nq", type=int, default=300)
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--variants", default="default,brute")
    ap.add_argument("--beams", default="256,512,1024,2048")
    ap.add_argument("--hnsw", default="")  # e.g. 16,32
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    X, Q = make_uniform_cube(a.n, a.d, n_queries=a.nq, random_state=a.seed)
    TD, TI = truth(X, Q, 10)
    beams = [int(b) for b in a.beams.split(",")]
    res = {"n": a.n, "d": a.d, "nq": a.nq, "seed": a.seed, "variants": {}}
    for v in a.variants.split(","):
        kw = {}
        for part in v.split("+"):
            if part == "brute":
                kw["build_algo"] = "brute"
            elif part.startswith("R"):
                kw["graph_degree"] = int(part[1:])
            elif part.startswith("K"):
                kw["intermediate_degree"] = int(part[1:])
            elif part.startswith("a"):
                kw["alpha"] = float(part[1:])
        t = time.perf_counter()
        index = knnkit.GraphIndex.build(X, device="cpu", random_state=0, **kw)
        bt = time.perf_counter() - t
        bp = index.build_params
        cal = bp.get("calibration") or {}
        print(f"[{v}] build {bt:.1f} s R={bp.get('graph_degree')} K={bp.get('intermediate_degree')} "
              f"alpha={bp.get('alpha')} phases={ {k: round(x, 2) for k, x in index.build_timings.items()} }", flush=True)
        print("   calib", list(zip(cal.get("beams", []), cal.get("recall", []))), flush=True)
        print("   default beam", index.search_params.beam, flush=True)
        res["variants"][v] = {"build_s": round(bt, 2), "params": {k: bp.get(k) for k in ("graph_degree", "intermediate_degree", "alpha")},
                              "calibration": cal, "default_beam": index.search_params.beam,
                              "curve": sweep(index, Q, TD, TI, beams)}
    for M in [int(m) for m in a.hnsw.split(",") if m]:
        import hnswlib

        t = time.perf_counter()
        p = hnswlib.Index(space="l2", dim=a.d)
        p.init_index(max_elements=a.n, M=M, ef_construction=200, random_seed=0)
        p.add_items(X, np.arange(a.n), num_threads=os.cpu_count())
        bt = time.perf_counter() - t
        print(f"[hnswlib M={M}] build {bt:.1f} s", flush=True)
        curve = []
        for ef in beams:
            p.set_ef(ef)
            t = time.perf_counter()
            I, D = p.knn_query(Q, k=10, num_threads=os.cpu_count())
            t = time.perf_counter() - t
            r = float(recall(I, TI, found_distances=D, true_distances=TD))
            curve.append((ef, round(r, 4), round(len(Q) / t, 1)))
            print(f"    ef {ef}: {r:.4f} @ {len(Q) / t:.0f} QPS", flush=True)
        res["variants"][f"hnswlib_M{M}"] = {"build_s": round(bt, 2), "curve": curve}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
