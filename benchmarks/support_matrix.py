"""Support matrix: every registered method x metric x dtype (x device) through the public API.

Each cell calls the public API on small data (n=600, d=12; 60 separate queries for ``knn`` and
``GraphIndex.search``) and records one of

* ``ok``: it ran; the cell holds recall@10 against an exact float64 brute force computed here,
  ties counted by distance (a returned neighbour is correct when its true distance is within the
  k-th true distance, so equal-distance swaps are not misses);
* ``refused``: a clear ``ValueError`` / ``TypeError`` / ``NotImplementedError`` (type and
  message recorded);
* ``WRONG``: it ran but recall < 0.9, or it raised anything else.

Each cell is also compared with the registry (``knnkit.methods()``): a declared combination that
is refused, or an undeclared one that runs, is flagged as a registry mismatch.

Methods: the ``exact`` task through ``knnkit.knn(method=...)``, the ``graph`` task through
``knnkit.knn_graph(method=...)`` (recall of the all-points graph, self excluded), plus
``GraphIndex`` through ``GraphIndex.build(...).search``.

Usage::

    PYTHONPATH=src python benchmarks/support_matrix.py            # cpu (and gpu when CuPy works)
    PYTHONPATH=src python benchmarks/support_matrix.py --device cpu

Writes ``benchmarks/results/support_matrix/<device>.md`` and ``<device>.json``.
"""

import argparse
import json
import os
import platform
import time
import warnings

import numpy as np

import knnkit

METRICS = ("sqeuclidean", "euclidean", "inner_product", "cosine", "manhattan")
DTYPES = ("float32", "float16", "uint8", "int8")
N, D, NQ, K = 600, 12, 60, 10
RECALL_OK = 0.9
CLEAR_ERRORS = (ValueError, TypeError, NotImplementedError)
#: the metrics GraphIndex documents (it has no registry entry)
INDEX_METRICS = ("sqeuclidean", "euclidean", "inner_product", "cosine")
OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "support_matrix")


def make_data(dtype, seed=0):
    """(data, queries) of ``dtype``: normal floats, or the full integer range for uint8/int8."""
    rng = np.random.default_rng(seed)
    total = N + NQ
    if dtype in ("uint8", "int8"):
        info = np.iinfo(dtype)
        A = rng.integers(info.min, int(info.max) + 1, size=(total, D)).astype(dtype)
    else:
        A = rng.standard_normal((total, D)).astype(dtype)
    return A[:N], A[N:]


def true_dist(metric, Q, X):
    """Distances (float64, smaller is nearer) of every query row to every data row."""
    Q = Q.astype(np.float64)
    X = X.astype(np.float64)
    if metric == "inner_product":
        return -(Q @ X.T)
    if metric == "cosine":
        qn = Q / np.maximum(np.linalg.norm(Q, axis=1, keepdims=True), 1e-300)
        xn = X / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-300)
        return 1.0 - qn @ xn.T
    if metric == "manhattan":
        return np.abs(Q[:, None, :] - X[None, :, :]).sum(-1)
    d2 = (Q * Q).sum(1)[:, None] - 2 * Q @ X.T + (X * X).sum(1)[None, :]
    d2 = np.maximum(d2, 0)
    return np.sqrt(d2) if metric == "euclidean" else d2


def tie_recall(found, dist, k, exclude=None):
    """Recall@k counting by distance: each distinct returned id whose true distance is at most the
    k-th smallest true distance (relative tolerance 1e-6) counts, at most k per row."""
    dist = dist.copy()
    if exclude is not None:
        dist[np.arange(dist.shape[0]), exclude] = np.inf
    kth = np.partition(dist, k - 1, axis=1)[:, k - 1]
    tol = 1e-6 * np.maximum(np.abs(kth), 1.0)
    hits = 0
    for r in range(found.shape[0]):
        ids = [int(j) for j in dict.fromkeys(np.asarray(found[r, :k]).tolist()) if 0 <= int(j) < dist.shape[1]]
        hits += min(k, int(np.sum(dist[r, ids] <= kth[r] + tol[r])))
    return hits / (found.shape[0] * k)


def _to_host(a):
    return np.asarray(a.get() if hasattr(a, "get") else a)


def run_cell(kind, method, metric, dtype, device):
    """One cell: {"status", "recall" | "error", "seconds"}."""
    X, Q = make_data(dtype)
    if device == "gpu":
        import cupy as cp

        Xa, Qa = cp.asarray(X), cp.asarray(Q)
    else:
        Xa, Qa = X, Q
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if kind == "exact":
                _d, found = knnkit.knn(Xa, Qa, k=K, metric=metric, method=method, device=device)
                r = tie_recall(_to_host(found), true_dist(metric, Q, X), K)
            elif kind == "graph":
                g = knnkit.knn_graph(Xa, K, method=method, metric=metric, device=device, random_state=0)
                r = tie_recall(_to_host(g.host_arrays()[0]), true_dist(metric, X, X), K, exclude=np.arange(N))
            else:
                index = knnkit.GraphIndex.build(Xa, metric=metric, device=device, random_state=0)
                _d, found = index.search(Qa, k=K)
                r = tie_recall(_to_host(found), true_dist(metric, Q, X), K)
    except CLEAR_ERRORS as e:
        return {"status": "refused", "error": f"{type(e).__name__}: {e}", "seconds": time.perf_counter() - t0}
    except Exception as e:  # noqa: BLE001 -- anything else is a bug worth a WRONG cell
        return {"status": "WRONG", "error": f"{type(e).__name__}: {e}", "seconds": time.perf_counter() - t0}
    status = "ok" if r >= RECALL_OK else "WRONG"
    return {"status": status, "recall": round(float(r), 4), "seconds": round(time.perf_counter() - t0, 3)}


def rows_to_run():
    """(kind, method name, declared metrics, declared dtypes, declared devices) per row."""
    rows = []
    for m in knnkit.methods():
        rows.append((m["task"], m["name"], tuple(m["metrics"]), tuple(m["dtypes"]), tuple(m["devices"])))
    rows.append(("index", "GraphIndex", INDEX_METRICS, DTYPES, ("cpu", "gpu")))
    return rows


def run(device):
    cells = []
    for kind, name, metrics, dtypes, devices in rows_to_run():
        for metric in METRICS:
            for dtype in DTYPES:
                res = run_cell(kind, name, metric, dtype, device)
                declared = metric in metrics and dtype in dtypes and device in devices
                res.update(task=kind, method=name, metric=metric, dtype=dtype, device=device, declared=declared)
                ran = res["status"] != "refused"
                res["registry_mismatch"] = declared != ran
                cells.append(res)
                print(f"{device} {name:10s} {metric:13s} {dtype:8s} {res['status']:8s} "
                      f"{res.get('recall', res.get('error', ''))}", flush=True)
    return cells


def _mark(c):
    if c["status"] == "ok":
        s = f"{c['recall']:.3f}"
    elif c["status"] == "refused":
        s = "refused"
    else:
        s = "**WRONG**" + (f" {c['recall']:.3f}" if "recall" in c else "")
    if c["registry_mismatch"]:
        s += " (registry: declared)" if c["declared"] else " (registry: undeclared)"
    return s


def to_markdown(cells, device):
    lines = [f"# Support matrix ({device})", "",
             f"n={N}, d={D}, k={K}; {NQ} separate queries for knn and GraphIndex.search, the all-points graph "
             "for knn_graph. Cells: recall@10 against exact float64 brute force with ties counted by "
             f"distance; `refused` = a clear ValueError/TypeError/NotImplementedError; **WRONG** = recall < "
             f"{RECALL_OK} or another exception. `(registry: ...)` flags a cell that disagrees with "
             "`knnkit.methods()`.", "",
             f"Generated by `benchmarks/support_matrix.py` on {platform.platform()}, knnkit {knnkit.__version__}.", ""]
    header = "| method (task) | metric | " + " | ".join(DTYPES) + " |"
    lines += [header, "|" + "---|" * (2 + len(DTYPES))]
    by = {(c["method"], c["metric"], c["dtype"]): c for c in cells}
    seen = []
    for c in cells:
        key = (c["method"], c["task"])
        if key not in seen:
            seen.append(key)
    for name, task in seen:
        for metric in METRICS:
            row = [f"{name} ({task})", metric] + [_mark(by[(name, metric, dt)]) for dt in DTYPES]
            lines.append("| " + " | ".join(row) + " |")
    lines += ["", "## Refusals and failures", ""]
    for c in cells:
        if c["status"] != "ok":
            lines.append(f"- {c['method']} / {c['metric']} / {c['dtype']}: {c['status']}: "
                         f"{c.get('error', 'recall %.3f' % c.get('recall', float('nan')))}")
    mism = [c for c in cells if c["registry_mismatch"]]
    lines += ["", "## Registry mismatches", ""]
    lines += [f"- {c['method']} / {c['metric']} / {c['dtype']}: "
              f"{'declared but refused' if c['declared'] else 'runs but not declared'} ({c.get('error', '')})"
              for c in mism] or ["- none"]
    return "\n".join(lines) + "\n"


def gpu_works():
    try:
        import cupy as cp

        return cp.cuda.runtime.getDeviceCount() > 0 and knnkit.gpu_available()
    except Exception:  # noqa: BLE001
        return False


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cpu", "gpu", "all"), default="all")
    ap.add_argument("--out", default=OUT_DIR)
    args = ap.parse_args(argv)
    knnkit.set_progress(False)
    devices = ["cpu", "gpu"] if args.device == "all" else [args.device]
    if "gpu" in devices and not gpu_works():
        if args.device == "gpu":
            raise SystemExit("no usable GPU (CuPy with a CUDA device) on this machine")
        print("no usable GPU: cpu only")
        devices.remove("gpu")
    os.makedirs(args.out, exist_ok=True)
    for dev in devices:
        cells = run(dev)
        with open(os.path.join(args.out, f"{dev}.json"), "w") as f:
            json.dump({"device": dev, "n": N, "d": D, "k": K, "queries": NQ, "recall_ok": RECALL_OK,
                       "knnkit": knnkit.__version__, "cells": cells}, f, indent=1)
        with open(os.path.join(args.out, f"{dev}.md"), "w") as f:
            f.write(to_markdown(cells, dev))
        bad = [c for c in cells if c["status"] == "WRONG"]
        mism = [c for c in cells if c["registry_mismatch"]]
        print(f"{dev}: {len(cells)} cells, {sum(c['status'] == 'ok' for c in cells)} ok, "
              f"{sum(c['status'] == 'refused' for c in cells)} refused, {len(bad)} WRONG, "
              f"{len(mism)} registry mismatches")


if __name__ == "__main__":
    main()
