"""``knnkit.knn(method="auto")`` against the better of Sweet KNN and the GEMM path on the CPU
(or the GPU: ``--device gpu``), the runs of one case interleaved (issue 13: ``auto`` never more
than 10 % slower than the better).

    PYTHONPATH=src python benchmarks/sweet_auto_paired_cpu.py [--n 50000] [--dims 16,32,64]
        [--ks 1,20] [--repeats 3] [--device cpu|gpu]
        [--out benchmarks/results/cpu/sweet_auto_paired_<date>.json]

All-points joins (``knnkit.knn(X, k=k, ...)``, on the chosen device) on uniform and clustered synthetic data.
Per case the methods run in turn after one untimed run each, the order rotated every round and a
0.5 s pause before each run (a GEMM's BLAS threads spin for a while after it returns and slowed
whatever ran next), so that a load change on the shared cores hits all of them alike; the minimum and the median of
``--repeats`` are reported with the ratio auto / min(gemm, sweet). Sweet KNN on uniform data above
8-D is not timed (it takes several times the GEMM path: the filters save little there, which is
what ``auto`` detects); there the ratio is auto / gemm. ``auto``'s choice is read from its stats.
"""

import argparse
import datetime
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

import knnkit  # noqa: E402


def _run(X, k, method, device):
    t = time.perf_counter()
    D, _ = knnkit.knn(X, k=k, method=method, device=device)
    if device == "gpu":  # the answer is a CuPy array: wait for it
        D[:1, :1].get()
    return time.perf_counter() - t


def _auto_choice(X, k, device):
    """What ``auto`` ran, from the engine's statistics (one more, untimed call)."""
    from knnkit._core.prepare import prepare
    from knnkit.api.exact import exact_search

    _, _, st = exact_search(prepare(X, metric="sqeuclidean", device=device), None, k, method="auto")
    if "sweet_gate" in st:
        return "gemm (Sweet KNN gave way: saved estimate %.3f)" % st["sweet_gate"]["saved_estimate"]
    return "sweet" if "filter" in st else "gemm"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=50_000)
    ap.add_argument("--dims", default="16,32,64")
    ap.add_argument("--ks", default="1,20")
    ap.add_argument("--kinds", default="clustered,uniform")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = []
    for kind in a.kinds.split(","):
        for d in (int(v) for v in a.dims.split(",")):
            make = knnkit.datasets.make_clustered if kind == "clustered" else knnkit.datasets.make_uniform
            X = make(a.n, d, random_state=0, device=a.device)
            for k in (int(v) for v in a.ks.split(",")):
                methods = ["auto", "gemm"] + (["sweet"] if kind == "clustered" or d <= 8 else [])
                times = {m: [] for m in methods}
                chosen = _auto_choice(X, k, a.device)
                load0 = os.getloadavg()[0]
                for rep in range(a.repeats + 1):
                    # the order turns each round (each method follows each other one alike), and a
                    # pause lets the BLAS threads of a GEMM run stop spinning before the next run
                    for m in methods[rep % len(methods):] + methods[:rep % len(methods)]:
                        time.sleep(0.5 if a.device == "cpu" else 0.05)
                        t = _run(X, k, m, a.device)
                        if rep:
                            times[m].append(t)
                best_other = min(min(times[m]) for m in methods if m != "auto")
                row = dict(kind=kind, n=a.n, d=d, k=k, auto_chose=chosen,
                           min_s={m: round(min(v), 4) for m, v in times.items()},
                           median_s={m: round(float(np.median(v)), 4) for m, v in times.items()},
                           ratio_min=round(min(times["auto"]) / best_other, 3),
                           ratio_median=round(float(np.median(times["auto"])) /
                                              min(float(np.median(times[m])) for m in methods if m != "auto"), 3),
                           load1=[round(load0, 2), round(os.getloadavg()[0], 2)])
                rows.append(row)
                print(json.dumps(row), flush=True)
    res = dict(benchmark="sweet_auto_paired_" + a.device, date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
               cpu_count=os.cpu_count(), repeats=a.repeats, rows=rows)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
