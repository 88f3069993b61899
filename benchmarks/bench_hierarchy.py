"""Entry structures of the graph search compared on the robustness suite: flat k-means entry
points with and without connectivity repair vs the GGNN layer hierarchy (``index/_hierarchy.py``).

For every set of ``knnkit.datasets.suite.robustness_sets(scale)`` one search graph is built
(``GraphIndex.build(connectivity=False)``, default parameters); the variants share it:

* ``kmeans``: the index's k-means entry points, graph as built;
* ``kmeans_repair``: the same after ``_engine._connect`` (per-component doors + repair links);
* ``hierarchy``: :func:`build_hierarchy` seeds on the unrepaired graph;
* ``hierarchy_repair``: hierarchy seeds on the graph repaired for reachability from the
  hierarchy's bottom layer (``repair_connectivity(entry_ids=h.medoids)``).

Reported per variant: build time of the entry structure (k-means; k-means + repair; hierarchy;
hierarchy + repair), recall@10 (ties forgiven) and QPS (seed selection + graph search, best of 3,
one batch of all queries) at beams 16..256 with ``n_seeds = max(4, beam // 16)`` as the index
resolves it. Ground truth is exact on the prepared vectors (internal metric).

    PYTHONPATH=src python benchmarks/bench_hierarchy.py --device cpu --scale ci --out benchmarks/results/cpu
    PYTHONPATH=src python benchmarks/bench_hierarchy.py --device gpu --scale small --out $OUT

Output: ``<out>/hierarchy_<device>_<scale>.json``.
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "src"))

import knnkit  # noqa: E402
from knnkit._core.metrics import prepare_vectors  # noqa: E402
from knnkit.datasets.suite import robustness_sets  # noqa: E402
from knnkit.evaluate import recall  # noqa: E402
from knnkit.index._connect import repair_connectivity  # noqa: E402
from knnkit.index._engine import _connect  # noqa: E402
from knnkit.index._hierarchy import build_hierarchy  # noqa: E402

K = 10
BEAMS = [16, 24, 32, 48, 64, 96, 128, 192, 256]


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def _sync(device):
    if device == "gpu":
        import cupy as cp

        cp.cuda.get_current_stream().synchronize()


def _timed(fn, device, repeat=1):
    best, out = float("inf"), None
    for _ in range(repeat):
        _sync(device)
        t = time.perf_counter()
        out = fn()
        _sync(device)
        best = min(best, time.perf_counter() - t)
    return best, out


def _copy(a):
    return a.copy()


def _truth(X, Q, im, device):
    """Exact internal-metric k-NN of prepared Q in prepared X."""
    if device == "gpu":
        from knnkit.exact import knn_lists

        d, i, _ = knn_lists(X, Q, K, metric=im)
        return _host(d), _host(i)
    from knnkit.index._build import exact_knn_cpu

    return exact_knn_cpu(X, Q, K, im)


def _recall(I, D, TI, TD, im):
    # internal 'ip' distances are minus the inner product: compare as similarities
    sim = im == "ip"
    return float(recall(_host(I), TI, found_distances=-_host(D) if sim else _host(D),
                        true_distances=-TD if sim else TD, similarity=sim))


def _search_fn(device, X, G, Q, entry, beam, im, nn1, xmax):
    n_seeds = min(max(4, beam // 16), max(1, len(entry)))
    kw = dict(beam=beam, tau=None, max_iters=max(64, 8 * beam), metric=im, nn1_max=nn1, xnorm_max=xmax)
    if device == "gpu":
        from knnkit.index._search_gpu import search_gpu

        return lambda: search_gpu(X, G, Q, K, seeds=entry.seeds_for(Q, n_seeds), **kw)
    from knnkit.index._search_cpu import search_cpu

    return lambda: search_cpu(X, G, Q, K, seeds=entry.seeds_for(Q, n_seeds), **kw)


def run_set(X, Q, metric, device, seed, hier_kw):
    res = {}
    t, index = _timed(lambda: knnkit.GraphIndex.build(X, metric=metric, device=device, random_state=seed,
                                                        connectivity=False), device)
    eng = index._engine
    res["index_build_s"] = round(t, 3)
    res["graph_degree"] = eng.graph_degree
    im = eng._imetric
    Xp, G0, E0 = eng._X, eng._graph, eng._entry
    Qp = prepare_vectors(Q, metric, eng.scale)
    TD, TI = _truth(Xp, Qp, im, device)
    xmax = eng._xmax() if im == "ip" else None
    variants = {}
    bt = eng.build_timings
    variants["kmeans"] = (G0, E0, {"entry_build_s": round(bt["entry_points"], 3), "n_entry": len(E0)})
    t, (G1, E1, conn) = _timed(lambda: _connect(Xp, _copy(G0), E0, im), device)
    variants["kmeans_repair"] = (G1, E1, {"entry_build_s": round(bt["entry_points"] + t, 3), "repair_s": round(t, 3),
                                          "n_entry": len(E1), "connectivity": conn})
    tm = {}
    t, H = _timed(lambda: build_hierarchy(Xp, im, random_state=seed, timings=tm, **hier_kw), device)
    variants["hierarchy"] = (G0, H, {"entry_build_s": round(t, 3), "layers": H.sizes, "n_entry": len(H)})
    t2, (G2, st) = _timed(lambda: repair_connectivity(Xp, G0, metric=im, entry_ids=H.medoids), device)
    st = {k: (float(v) if isinstance(v, (float, np.floating)) else int(v) if isinstance(v, (int, np.integer)) else v)
          for k, v in st.items()}
    variants["hierarchy_repair"] = (G2, H, {"entry_build_s": round(t + t2, 3), "repair_s": round(t2, 3),
                                            "layers": H.sizes, "n_entry": len(H), "connectivity": st})
    nq = Qp.shape[0]
    for name, (G, E, info) in variants.items():
        curve = []
        for b in BEAMS:
            fn = _search_fn(device, Xp, G, Qp, E, b, im, eng.nn1_max, xmax)
            fn()  # warm-up: JIT / kernel compile
            t, (D, I) = _timed(fn, device, repeat=3)
            curve.append([b, round(_recall(I, D, TI, TD, im), 4), round(nq / t, 1)])
        info["curve"] = curve
        info["max_recall"] = max(c[1] for c in curve)
        res[name] = info
    return res


def _hardware(device):
    hw = {"platform": platform.platform(), "python": platform.python_version(), "cpu_count": os.cpu_count(),
          "processor": platform.processor()}
    if device == "gpu":
        try:
            import cupy as cp

            hw["gpu"] = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
        except Exception as e:  # pragma: no cover
            hw["gpu"] = repr(e)
    return hw


def _commit():
    try:
        c = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return c + ("-dirty" if dirty else "")
    except OSError:
        return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    ap.add_argument("--scale", choices=("ci", "small", "full"), default="ci")
    ap.add_argument("--sets", default=None, help="comma-separated set names (default: all)")
    ap.add_argument("--out", default=os.environ.get("OUT") or os.path.join(HERE, "results", "cpu"))
    ap.add_argument("--no-real", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-queries", type=int, default=None, help="queries per set (default: the suite's)")
    ap.add_argument("--ratio", type=int, default=16, help="layer size ratio of the hierarchy")
    ap.add_argument("--top-size", type=int, default=512)
    ap.add_argument("--degree", type=int, default=24, help="out-degree of the layer graphs")
    ap.add_argument("--layer-beam", type=int, default=32)
    args = ap.parse_args(argv)
    os.chdir(ROOT)  # ../shared/data is looked up relative to the repository root
    knnkit.set_progress(False)
    names = args.sets.split(",") if args.sets else None
    hier_kw = dict(ratio=args.ratio, top_size=args.top_size, degree=args.degree, layer_beam=args.layer_beam)
    t_all = time.perf_counter()
    sets = robustness_sets(args.scale, names=names, real=not args.no_real, n_queries=args.n_queries,
                           random_state=args.seed)
    # warm-up on small data of both internal metrics: Numba compilation / NVRTC kernels and the
    # repair's first call would otherwise be charged to the first set's build and search times
    for wm in ("sqeuclidean", "inner_product"):
        rng = np.random.default_rng(0)
        wx, wq = rng.random((1500, 16), dtype=np.float32), rng.random((50, 16), dtype=np.float32)
        if args.device == "gpu":
            import cupy as cp

            wx, wq = cp.asarray(wx), cp.asarray(wq)
        run_set(wx, wq, wm, args.device, 0, dict(hier_kw, ratio=4, top_size=64))
    doc = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "commit": _commit(),
           "hardware": _hardware(args.device),
           "params": {"device": args.device, "scale": args.scale, "k": K, "n_queries": args.n_queries, "beams": BEAMS, "seed": args.seed,
                      "hierarchy": hier_kw, "knnkit": knnkit.__version__},
           "sets": []}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"hierarchy_{args.device}_{args.scale}.json")
    for name, X, Q, metric in sets:
        t_set = time.perf_counter()
        entry = {"name": name, "n": int(X.shape[0]), "d": int(X.shape[1]), "dtype": str(X.dtype),
                 "n_queries": int(Q.shape[0]), "metric": metric}
        if args.device == "gpu":
            import cupy as cp

            X, Q = cp.asarray(X), cp.asarray(Q)
        try:
            entry.update(run_set(X, Q, metric, args.device, args.seed, hier_kw))
        except Exception as e:
            entry["error"] = repr(e)[:300]
            entry["traceback"] = traceback.format_exc()[-1500:]
        entry["seconds"] = round(time.perf_counter() - t_set, 1)
        doc["sets"].append(entry)
        line = f"{name:18s} n={entry['n']:>8d}"
        for v in ("kmeans", "kmeans_repair", "hierarchy", "hierarchy_repair"):
            if v in entry:
                c = {b: (r, q) for b, r, q in entry[v]["curve"]}
                line += (f" | {v}: build {entry[v]['entry_build_s']}s r@32 {c[32][0]} r@128 {c[128][0]} "
                         f"qps@64 {c[64][1]:.0f}")
        print(line + f" ({entry['seconds']} s)" + (f" ERROR {entry['error']}" if "error" in entry else ""),
              flush=True)
        with open(path, "w") as f:  # rewritten after every set: a cut-off run keeps its results
            json.dump(doc, f, indent=1)
    doc["total_s"] = round(time.perf_counter() - t_all, 1)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {path} ({doc['total_s']} s)")


if __name__ == "__main__":
    main()
