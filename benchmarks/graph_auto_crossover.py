"""Where ``knn_graph(method="auto")`` should stop taking the exact graph on the GPU (issue 11,
defaults that choose well; issue 14, time to recall on Fashion-MNIST).

``BRUTE_AUTO_MAX_N["gpu"]`` sends every graph of up to 100k points to the exact path, whatever
its dimension: Fashion-MNIST (70k x 784) took 0.18 s there, where NN-Descent reached recall 0.994 in
0.062 s (``results/h200-2026-11-29-s17/peers/bench_rsfk_gpu.json``); and the exact path itself
(float32 GEMM) was 2.4x slower than the certified tensor-core GEMM that knn_graph's fallbacks used.
Sets above 100k say whether the size limit should move. This times, in one process and
alternating, ``knn_graph`` with ``method="brute"``, ``method="nndescent"`` (the public defaults:
``target_recall=0.99``, the LID verdict and the stall watch) and ``method="auto"`` on sets of
50k-100k points and 32-960 dimensions, with the recall of each graph (1,000 sampled rows, exact).

    PYTHONPATH=src python benchmarks/graph_auto_crossover.py --device gpu --out $OUT
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

import numpy as np  # noqa: E402

import knnkit  # noqa: E402
from knnkit.datasets import load_fashion_mnist, make_clustered, make_uniform  # noqa: E402
from knnkit.evaluate import graph_recall  # noqa: E402
from knnkit.graph import BRUTE_AUTO_MAX_N, BRUTE_AUTO_MAX_WORK  # noqa: E402


def _sets(quick):
    out = []
    try:
        tr, te = load_fashion_mnist()
        F = np.vstack([tr, te]).astype(np.float32)
        out.append(("fashion_70k_784", F))
        out.append(("fashion_35k_784", F[:35_000]))
    except Exception as e:  # noqa: BLE001 -- absent data: the synthetic sets still run
        print(f"Fashion-MNIST unavailable ({type(e).__name__})", file=sys.stderr)
    sizes = ((100_000, 32), (100_000, 128), (60_000, 256), (200_000, 32), (200_000, 128), (300_000, 64))
    for n, d in sizes if not quick else ((20_000, 32),):
        out.append((f"clustered_{n // 1000}k_{d}", make_clustered(n, d, random_state=0, device="cpu")))
    for n, d in ((100_000, 128),) if not quick else ((10_000, 128),):
        out.append((f"uniform_{n // 1000}k_{d}", make_uniform(n, d, random_state=0)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", choices=("cpu", "gpu"), default="gpu")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    gpu = a.device == "gpu"
    if gpu:
        import cupy as cp

    def sync():
        if gpu:
            cp.cuda.get_current_stream().synchronize()

    rows = []
    for name, X in _sets(a.quick):
        Xd = cp.asarray(X) if gpu else X
        for m in ("brute", "nndescent", "auto"):  # warm-up: every kernel of the three paths
            knnkit.knn_graph(Xd, k=10, method=m, device=a.device, random_state=0)
        for r in range(a.rounds):
            for m in ("brute", "nndescent", "auto"):
                sync()
                t = time.perf_counter()
                g = knnkit.knn_graph(Xd, k=10, method=m, device=a.device, random_state=r)
                sync()
                dt = time.perf_counter() - t
                rec = float(graph_recall(X, g.indices.get() if gpu else g.indices, sample=1000, random_state=0))
                st = g.stats
                rows.append({"set": name, "n": int(X.shape[0]), "d": int(X.shape[1]), "method": m, "round": r,
                             "brute_auto_max_n": BRUTE_AUTO_MAX_N[a.device],
                             "brute_auto_max_work": BRUTE_AUTO_MAX_WORK[a.device],
                             "time_s": round(dt, 4), "recall": round(rec, 4), "chosen": st.method,
                             "iterations": st.iterations, "extra": {k: v for k, v in (st.extra or {}).items()
                                                                    if isinstance(v, (int, float, str, bool))}})
                print(json.dumps(rows[-1]), flush=True)
        del Xd
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, f"graph_auto_crossover_{a.device}.json")
    with open(path, "w") as f:
        json.dump({"benchmark": "graph_auto_crossover", "device": a.device, "rows": rows}, f, indent=1)
    print(path)


if __name__ == "__main__":
    main()
