"""Unseen shapes: data that no robustness-suite set resembles, with default parameters, against
float64 exact truth and (on the CPU) hnswlib in the same run.

The suite (``robustness.py``) covers clusters, uniform cubes, manifolds, copies, skewed norms,
2-D and integer data; the edge sweep (``edge_sweep.py``) covers float32/float16 hazards. This one
asks the guide's question for shapes a user may bring that neither generates: sparse binary rows,
count vectors by cosine, one dimension dwarfing the others, heavy tails, rows half of which are
copies (or near-copies) of a few points, an integer grid with ties everywhere, a rank-3 cloud with
no noise in 256-d, mostly-zero uint8 rows.

Recall is counted by ids: a returned neighbour counts when its float64 distance is within 1e-5
(relative) of the true k-th (ties forgiven). Paths: ``knn`` (exact), ``knn_graph`` (auto), and
``GraphIndex`` (default search, then beams 32 / 64 / 128 / 512). Queries are drawn from each set's
own generator, not held out of the data (so the calibration, which holds out data rows, is tested
on queries it did not see).

Usage: ``PYTHONPATH=src python benchmarks/unseen_shapes.py --device cpu|gpu [--n 20000] [--out DIR]``;
``--table FILE.json`` prints a saved run as a Markdown table.
"""
import argparse
import json
import os
import platform
import subprocess
import time
import warnings

import numpy as np

import knnkit
from knnkit.evaluate import float64_distances

K = 10
BEAMS = (32, 64, 128, 512)


def sets(n, nq, rng):
    m = n + nq
    yield "binary_sparse_d64", (rng.random((m, 64)) < 0.1).astype(np.float32), "sqeuclidean"
    yield "binary_sparse_d64_cosine", (rng.random((m, 64)) < 0.1).astype(np.float32), "cosine"
    yield "poisson_counts_d100_cosine", rng.poisson(0.3, (m, 100)).astype(np.float32), "cosine"
    a = rng.standard_normal((m, 32)).astype(np.float32)
    a[:, 0] *= 1000
    yield "one_dominant_dim_d32", a, "sqeuclidean"
    yield "cauchy_d16", rng.standard_cauchy((m, 16)).astype(np.float32), "sqeuclidean"
    base = rng.standard_normal((50, 32))
    for tag, noise in (("exact", 0.0), ("near_1e-3", 1e-3)):
        copies = base[rng.integers(0, 50, n // 2)] + noise * rng.standard_normal((n // 2, 32))
        data = np.concatenate([copies, rng.standard_normal((n - n // 2, 32))])
        rng.shuffle(data)
        yield f"half_{tag}_copies_of_50_d32", np.concatenate([data, rng.standard_normal((nq, 32))]).astype(np.float32), \
            "sqeuclidean"
    yield "int_grid_5^8", rng.integers(0, 5, (m, 8)).astype(np.float32), "sqeuclidean"
    yield "lognormal_d32_ip", (rng.standard_normal((m, 32)) * rng.lognormal(0, 1, (m, 32))).astype(np.float32), \
        "inner_product"
    yield "rank3_d256_no_noise", (rng.standard_normal((m, 3)) @ rng.standard_normal((3, 256))).astype(np.float32), \
        "sqeuclidean"
    yield "uint8_95pct_zero_d128", (rng.integers(0, 256, (m, 128)) * (rng.random((m, 128)) < 0.05)).astype(np.uint8), \
        "sqeuclidean"


def dmat(X, Q, metric):
    D = float64_distances(X, Q, metric)
    return -D if metric == "inner_product" else D  # smaller is nearer here


def recall(ids, D):
    kth = np.sort(D, axis=1)[:, K - 1:K]
    ids = np.asarray(ids.get() if hasattr(ids, "get") else ids).astype(np.int64)
    d = np.where(ids >= 0, np.take_along_axis(D, np.maximum(ids, 0), axis=1), np.inf)
    return round(float(np.mean(d <= kth + 1e-5 * np.abs(kth) + 1e-300)), 4)


def hnswlib_row(X, Q, metric, D):
    try:
        import hnswlib
    except ImportError:
        return None
    space = {"sqeuclidean": "l2", "cosine": "cosine", "inner_product": "ip"}[metric]
    p = hnswlib.Index(space=space, dim=X.shape[1])
    p.init_index(max_elements=X.shape[0], M=16, ef_construction=200, random_seed=0)
    t = time.perf_counter()
    p.add_items(X.astype(np.float32))
    out = {"build_s": round(time.perf_counter() - t, 2)}
    for ef in BEAMS:
        p.set_ef(ef)
        i, _ = p.knn_query(Q.astype(np.float32), k=K)
        out[f"ef{ef}"] = recall(i, D)
    return out


def markdown(doc):
    """A saved run (the JSON this script writes) as a Markdown table."""
    peers = any(r.get("hnswlib") for r in doc["sets"])
    head = ["set", "n x d", "metric", "knn", "graph", "graph s", "index s", "default beam",
            "calibrated", "recall @ default", "beam 32 / 64 / 128 / 512"]
    if peers:
        head += ["hnswlib build s", "hnswlib ef 32 / 64 / 128 / 512"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in doc["sets"]:
        cells = [r["name"], f"{r['n']} x {r['d']} {r['dtype']}", r["metric"], r["knn"], r["graph"], r["graph_s"],
                 r["index_s"], r["default_beam"], r["calibrated_at_default"], r["index_default"],
                 " / ".join(str(r[f"beam{b}"]) for b in BEAMS)]
        if peers:
            h = r.get("hnswlib") or {}
            cells += [h.get("build_s"), " / ".join(str(h.get(f"ef{b}")) for b in BEAMS)]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--queries", type=int, default=400)
    ap.add_argument("--sets", default=None, help="comma-separated names (default: all)")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--table", default=None, help="print a saved run's JSON as a Markdown table and exit")
    a = ap.parse_args()
    if a.table:
        with open(a.table) as f:
            print(markdown(json.load(f)))
        return
    warnings.simplefilter("ignore")
    rng = np.random.default_rng(2026)
    want = None if a.sets is None else set(a.sets.split(","))
    rows = []
    for name, A, metric in sets(a.n, a.queries, rng):
        if want is not None and name not in want:
            continue
        X, Q = A[:a.n], A[a.n:]
        D = dmat(X, Q, metric)
        row = {"name": name, "n": int(X.shape[0]), "d": int(X.shape[1]), "dtype": str(X.dtype), "metric": metric}
        _d, i = knnkit.knn(X, Q, k=K, metric=metric, device=a.device)
        row["knn"] = recall(i, D)
        sample = rng.choice(a.n, 200, replace=False)
        Ds = dmat(X, X[sample], metric)
        Ds[np.arange(sample.size), sample] = np.inf
        t = time.perf_counter()
        g = knnkit.knn_graph(X, k=K, metric=metric, device=a.device, random_state=0)
        row["graph_s"] = round(time.perf_counter() - t, 2)
        gi = g.indices.get() if hasattr(g.indices, "get") else np.asarray(g.indices)
        row["graph"] = recall(gi[sample], Ds)
        t = time.perf_counter()
        index = knnkit.GraphIndex.build(X, metric=metric, device=a.device, random_state=0)
        row["index_s"] = round(time.perf_counter() - t, 2)
        row["default_beam"] = index.search_params.beam
        row["calibrated_at_default"] = dict(zip(index.calibration["beams"], index.calibration["recall"])).get(
            index.search_params.beam)
        row["index_default"] = recall(index.search(Q, k=K)[1], D)
        for b in BEAMS:
            row[f"beam{b}"] = recall(index.search(Q, k=K, beam=b)[1], D)
        if a.device == "cpu" and not a.no_peers:
            row["hnswlib"] = hnswlib_row(X, Q, metric, D)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        try:
            commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        except OSError:
            commit = None
        doc = {"device": a.device, "n": a.n, "queries": a.queries, "k": K, "commit": commit,
               "machine": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(), "sets": rows}
        with open(os.path.join(a.out, f"unseen_shapes_{a.device}.json"), "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
