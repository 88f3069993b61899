"""Before/after check of the engine restructure (issue "One engine under the public API").

Runs exact k-NN, the k-NN graph and the search index through the PUBLIC API only (the calls
that exist before and after the restructure) and records, for each, the warm median time and a
SHA-256 of the results, so that "same results to the last digit" is a comparison of two hashes.

    PYTHONPATH=src python benchmarks/ab_engine.py --device gpu --n 1000000 --d 128 --tag before
    PYTHONPATH=src python benchmarks/ab_engine.py --device cpu --n 100000 --d 128 --tag before

Writes one JSON to --out (default $OUT or .).
"""

import argparse
import datetime
import hashlib
import json
import os
import platform
import subprocess
import time

import numpy as np


def _host(a):
    if hasattr(a, "get"):
        return a.get()
    if hasattr(a, "cpu"):
        return a.cpu().numpy()
    return np.asarray(a)


def digest(*arrays):
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(_host(a))
        h.update(str(a.dtype).encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def timed(fn, sync, reps):
    first = fn()  # warm-up (compiles)
    sync()
    timed.first = first
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        out = fn()
        sync()
        ts.append(time.perf_counter() - t)
    return out, float(np.median(ts)), [round(x, 4) for x in ts]


def recall(found, truth):
    f = _host(found).astype(np.int64)
    t = _host(truth).astype(np.int64)
    return float((f[:, :, None] == t[:, None, :]).any(axis=2).mean())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--queries", type=int, default=10_000)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--beams", type=lambda s: [int(v) for v in s.split(",")], default=[32, 64])
    ap.add_argument("--tasks", default="exact,graph,index")
    ap.add_argument("--index-kw", default="{}", help="JSON of extra GraphIndex.build keywords")
    ap.add_argument("--tag", default="")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    import knnkit

    if a.device == "gpu":
        import cupy as cp

        def sync():
            cp.cuda.Device().synchronize()

        hw = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    else:

        def sync():
            pass

        hw = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    res = {
        "tag": a.tag,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
        "hardware": hw,
        "params": vars(a),
    }
    X, Q = knnkit.datasets.make_clustered(a.n, a.d, n_queries=a.queries, random_state=0, device=a.device)
    res["data"] = f"make_clustered({a.n}, {a.d}, n_queries={a.queries}, random_state=0)"
    tasks = a.tasks.split(",")
    truth = None
    if "exact" in tasks or "index" in tasks:
        (d, i), t, ts = timed(lambda: knnkit.knn(X, Q, k=a.k, device=a.device), sync, a.reps)
        truth = i
        res["exact"] = {"time_s": t, "times": ts, "hash": digest(d, i)}
        print(json.dumps({"exact": res["exact"]}), flush=True)
    if "graph" in tasks:
        rows = np.random.default_rng(0).choice(a.n, 2000, replace=False)
        g, t, ts = timed(lambda: knnkit.knn_graph(X, k=a.k, random_state=0, device=a.device), sync, a.reps)
        _, ti = knnkit.knn(X, X[rows], k=a.k + 1, device=a.device)
        ti = _host(ti)
        # drop the row itself from its truth (stable, by id)
        keep = np.array([[c for c in r if c != s][: a.k] for r, s in zip(ti, rows)])
        res["graph"] = {
            "time_s": t,
            "times": ts,
            "hash": digest(g.distances, g.indices),
            "hash_first_run": digest(timed.first.distances, timed.first.indices),
            "recall_sample": recall(_host(g.indices)[rows], keep),
        }
        print(json.dumps({"graph": res["graph"]}), flush=True)
    if "index" in tasks:
        t0 = time.perf_counter()
        ikw = json.loads(a.index_kw)
        warm = knnkit.GraphIndex.build(X[: min(a.n, 200_000)], random_state=0, device=a.device, **ikw)
        warm.search(Q[:100], k=a.k)
        del warm
        sync()
        res["index_warmup_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        index = knnkit.GraphIndex.build(X, random_state=0, device=a.device, **ikw)
        sync()
        res["index_build_s"] = time.perf_counter() - t0
        res["index_repr"] = repr(index)
        res["index_build_params"] = {k: v for k, v in dict(index.build_params).items()}
        curve = []
        for beam in a.beams:
            (d, i), t, ts = timed(lambda: index.search(Q, k=a.k, beam=beam), sync, a.reps)
            curve.append(
                {"beam": beam, "qps": a.queries / t, "times": ts, "recall": recall(i, truth), "hash": digest(d, i)}
            )
            print(json.dumps(curve[-1]), flush=True)
        res["index_search"] = curve
    os.makedirs(a.out, exist_ok=True)
    name = f"ab_engine_{a.device}_{a.n}{('_' + a.tag) if a.tag else ''}.json"
    with open(os.path.join(a.out, name), "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
