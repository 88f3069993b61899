"""Filtered search: knnkit against hnswlib's filter (CPU) or cuVS CAGRA's bitset filter (GPU), and
a sweep of knnkit's two strategies forced, to measure where exact search over the passing points
beats the over-fetching graph walk.

    # comparison at 50 / 10 / 1 / 0.1 % selectivity (knnkit at its defaults)
    PYTHONPATH=src python benchmarks/filter_bench.py --device cpu --n 100000 --d 32 --out DIR
    # strategy sweep: exact vs graph walk with over-fetch factors 1, 2, 4, 8, at 50 ... 0.1 %
    PYTHONPATH=src python benchmarks/filter_bench.py --mode sweep --device cpu --n 30000 --out DIR
    # both on the GPU (CuPy needed; CAGRA compared when ``import cuvs`` works)
    PYTHONPATH=src python benchmarks/filter_bench.py --mode both --device gpu --n 1000000 --d 96 --out DIR

Recall@k is measured against exact search over the passing points (``knnkit.knn(filter=)``), the
same random mask for every query. Times are the best of ``--repeats`` runs over all queries, the
strategies interleaved within each repeat (paired), after a warm-up call.

Comparison (``filter_{device}.json``): knnkit at its default search parameters (the filter path
chooses over-fetch or exact by selectivity); hnswlib (M=16, ef_construction=200, its Python
``filter=`` callable on a query subset) at ef 64 and 256; CAGRA (graph_degree 64, intermediate 128)
with ``cuvs.neighbors.filters.from_bitset`` (one bit per dataset row in uint32 words, bit ``j % 32``
of word ``j // 32`` for row ``j``, 1 = keep) over an itopk sweep, queries and results on the device.

Sweep (``filter_sweep_{device}.json``): per selectivity, ``index._search_filtered`` forced to
``"exact"`` and to ``"graph"`` at each over-fetch factor ``f`` (``ceil(f k / selectivity)``
candidates, at most 1024, no exact fallback), plus ``"auto"``. The recall bar is the unfiltered
search's recall at the default beam. ``crossover`` in the JSON reads the thresholds from the rows.
"""

import argparse
import json
import logging
import math
import os
import platform
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

import knnkit  # noqa: E402
from knnkit.api.index import MAX_K, filter_thresholds  # noqa: E402

log = logging.getLogger("filter_bench")


def _recall(i, t):
    """Recall of result ids ``i`` against true ids ``t`` (``-1`` slots of ``t`` not counted)."""
    return sum(len(set(a[a >= 0]) & set(b[b >= 0])) for a, b in zip(i, t)) / max(1, int((t >= 0).sum()))


def _floats(text, name):
    try:
        vals = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"{name}: expected comma-separated numbers, got {text!r}") from None
    if not vals:
        raise SystemExit(f"{name}: no values given")
    return vals


def _check_args(ap, a):
    if a.n < 2 or a.d < 1 or a.nq < 1 or a.k < 1 or a.repeats < 1 or a.hnsw_queries < 1:
        ap.error("--n >= 2, --d, --nq, --k, --repeats and --hnsw-queries >= 1 are required")
    if a.k > min(a.n, MAX_K):
        ap.error(f"--k must be <= min(n, {MAX_K}), got {a.k}")
    a.selectivities = _floats(a.selectivities, "--selectivities") if a.selectivities else None
    a.overfetch = _floats(a.overfetch, "--overfetch")
    a.itopk = [int(v) for v in _floats(a.itopk, "--itopk")]
    if a.selectivities and not all(0 < s <= 1 for s in a.selectivities):
        ap.error(f"--selectivities must lie in (0, 1], got {a.selectivities}")
    if not all(f >= 1 for f in a.overfetch):
        ap.error(f"--overfetch factors must be >= 1, got {a.overfetch}")
    if not all(t >= a.k for t in a.itopk):
        ap.error(f"--itopk values must be >= k={a.k}, got {a.itopk}")
    if a.device == "gpu":
        try:
            import cupy  # noqa: F401
        except ImportError as e:
            raise SystemExit(f"--device gpu needs CuPy (pip install 'knnkit[cuda12]'): {e}") from None
        if not knnkit.gpu_available():
            raise SystemExit("--device gpu: CuPy imports but knnkit.gpu_available() is False (no usable GPU)")


def _best_times(calls, repeats):
    """``{name: (best seconds, last result)}``: every call once per repeat, interleaved."""
    best, out = {}, {}
    for name, fn in calls.items():  # warm-up (JIT compilation, kernel loading)
        out[name] = fn()
    for _ in range(repeats):
        for name, fn in calls.items():
            t0 = time.perf_counter()
            out[name] = fn()
            dt = time.perf_counter() - t0
            best[name] = min(best.get(name, math.inf), dt)
    return {name: (best[name], out[name]) for name in calls}


def _host_ids(i):
    return np.asarray(i.get() if hasattr(i, "get") else i).astype(np.int64)


def _sync(device):
    if device == "gpu":
        import cupy as cp

        cp.cuda.Device().synchronize()


def run_sweep(args, X, Q, index, doc):
    """knnkit's strategies forced, per selectivity; ``doc['sweep']`` and ``doc['crossover']``."""
    k, dev = args.k, args.device
    _d, T0 = knnkit.knn(X, Q, k=k, device=dev)
    T0 = _host_ids(T0)
    (t_plain, (_d, i_plain)), = _best_times({"plain": lambda: index.search(Q, k=k)}, args.repeats).values()
    bar = _recall(_host_ids(i_plain), T0)
    doc["unfiltered_default"] = {"recall": round(bar, 4), "qps": round(len(Q) / t_plain, 1),
                                 "beam": index.search_params.beam}
    log.info("unfiltered default beam: recall %.4f, %.0f QPS", bar, len(Q) / t_plain)
    exact_max, f_default, fetch_max = filter_thresholds(dev)
    doc["thresholds_in_force"] = {"exact_max": exact_max, "overfetch": f_default, "fetch_max": fetch_max}
    rng = np.random.default_rng(1)
    rows = []
    for sel in args.selectivities:
        mask = rng.random(args.n) < sel
        passing = int(mask.sum())
        if passing == 0:
            continue
        _d, T = knnkit.knn(X, Q, k=k, device=dev, filter=mask)
        T = _host_ids(T)
        calls = {"exact": lambda m=mask: index._search_filtered(Q, k, m, {}, strategy="exact"),
                 "auto": lambda m=mask: index._search_filtered(Q, k, m, {})}
        for f in args.overfetch:
            calls[f"graph_f{f:g}"] = lambda m=mask, f=f: index._search_filtered(Q, k, m, {}, strategy="graph",
                                                                              overfetch=f)
        res = _best_times(calls, args.repeats)
        row = {"selectivity": sel, "passing": passing, "strategies": {}}
        for name, (dt, (_d, i)) in res.items():
            i = _host_ids(i)
            ent = {"recall": round(_recall(i, T), 4), "qps": round(len(Q) / dt, 1),
                   "short_queries": int(((i >= 0).sum(axis=1) < min(k, passing)).sum())}
            if name.startswith("graph_f"):
                f = float(name[len("graph_f"):])
                ent["fetch"] = max(k, min(math.ceil(f * k * args.n / passing), MAX_K, args.n))
                ent["capped"] = math.ceil(f * k * args.n / passing) > MAX_K
            row["strategies"][name] = ent
        rows.append(row)
        log.info("sweep %s", json.dumps(row))
        doc["sweep"] = rows
        _write(args, doc, f"filter_sweep_{dev}.json")
    doc["crossover"] = crossover(rows, bar, k=k, n=args.n, f=f_default)
    log.info("crossover %s", json.dumps(doc["crossover"]))
    _write(args, doc, f"filter_sweep_{dev}.json")


def crossover(rows, bar, *, k, n, f):
    """Read the thresholds from the sweep rows: per selectivity, the fastest over-fetch factor whose
    recall reaches ``bar`` (the unfiltered default-beam recall), whether exact is faster than it,
    and the walk's fetch at over-fetch ``f``; then the bracket of the switch in passing points and
    in fetch (exact wins at and below ``largest_passing_exact_wins``, at and above
    ``smallest_fetch_exact_wins``)."""
    per = []
    for r in rows:
        s = r["strategies"]
        ok = {m: e for m, e in s.items() if m.startswith("graph_f") and e["recall"] >= bar}
        best = max(ok, key=lambda m: ok[m]["qps"]) if ok else None
        per.append({"selectivity": r["selectivity"], "passing": r["passing"],
                    "fetch_at_f": math.ceil(f * k * n / r["passing"]), "graph_best": best,
                    "graph_best_qps": ok[best]["qps"] if best else None,
                    "smallest_f_reaching_bar": min((float(m[len("graph_f"):]) for m in ok), default=None),
                    "exact_qps": s["exact"]["qps"], "exact_wins": best is None or s["exact"]["qps"] >= ok[best]["qps"]})
    ex = [p for p in per if p["exact_wins"]]
    gr = [p for p in per if not p["exact_wins"]]
    return {"recall_bar": round(bar, 4), "overfetch": f, "per_selectivity": per,
            "largest_passing_exact_wins": max((p["passing"] for p in ex), default=None),
            "smallest_passing_graph_wins": min((p["passing"] for p in gr), default=None),
            "smallest_fetch_exact_wins": min((p["fetch_at_f"] for p in ex), default=None),
            "largest_fetch_graph_wins": max((p["fetch_at_f"] for p in gr), default=None),
            # one crossing expected: exact wins below, the walk above; more than one is noise to re-measure
            "monotone": not ex or not gr or max(p["passing"] for p in ex) < min(p["passing"] for p in gr)}


def run_compare(args, X, Q, index, doc):
    """knnkit at its defaults vs hnswlib (CPU) or CAGRA (GPU) at 50 / 10 / 1 / 0.1 %."""
    k, dev = args.k, args.device
    h = cg = None
    if dev == "cpu":
        try:
            import hnswlib

            t0 = time.perf_counter()
            h = hnswlib.Index(space="l2", dim=args.d)
            h.init_index(max_elements=args.n, M=16, ef_construction=200, random_seed=0)
            h.add_items(X, np.arange(args.n))
            doc["hnswlib_build_s"] = round(time.perf_counter() - t0, 2)
        except ImportError:
            doc["hnswlib"] = "not installed"
    else:
        cg = _cagra_build(X, doc)
    rng = np.random.default_rng(1)
    rows = []
    for sel in args.selectivities:
        mask = rng.random(args.n) < sel
        _d, T = knnkit.knn(X, Q, k=k, device=dev, filter=mask)
        T = _host_ids(T)
        (dt, (_d, i)), = _best_times({"knnkit": lambda m=mask: index.search(Q, k=k, filter=m)},
                                     args.repeats).values()
        i = _host_ids(i)
        row = {"selectivity": sel, "passing": int(mask.sum()), "knnkit_recall": round(_recall(i, T), 4),
               "knnkit_qps": round(len(Q) / dt, 1),
               "knnkit_outside_filter": int((~mask[i[i >= 0]]).sum())}
        if h is not None:
            # its Python filter callable is slow at low selectivity: a query subset bounds the time
            nh = min(len(Q), args.hnsw_queries)
            for ef in (64, 256):
                h.set_ef(ef)
                t0 = time.perf_counter()
                try:
                    hi, _hd = h.knn_query(Q[:nh], k=k, filter=lambda j, m=mask: bool(m[j]))
                except RuntimeError as e:  # it refuses to return fewer than k (fewer than k pass)
                    row[f"hnswlib_ef{ef}_error"] = str(e)
                    continue
                dt = time.perf_counter() - t0
                row[f"hnswlib_ef{ef}_recall"] = round(_recall(hi.astype(np.int64), T[:nh]), 4)
                row[f"hnswlib_ef{ef}_qps"] = round(nh / dt, 1)
            row["hnswlib_queries"] = nh
        if cg is not None:
            row["cagra"] = _cagra_search(cg, mask, T, args)
        rows.append(row)
        log.info("compare %s", json.dumps(row))
        doc["rows"] = rows
        _write(args, doc, f"filter_{dev}.json")


def _cagra_build(X, doc):
    """CAGRA at graph_degree 64 (intermediate 128) on the device, or None when cuVS is missing."""
    try:
        import cupy as cp
        from cuvs.neighbors import cagra, filters  # noqa: F401
    except ImportError as e:
        doc["cagra"] = f"not available: {e}"
        log.warning("cuVS not available (%s): CAGRA not compared", e)
        return None
    Xd = cp.asarray(X)
    t0 = time.perf_counter()
    idx = cagra.build(cagra.IndexParams(metric="sqeuclidean", graph_degree=64, intermediate_graph_degree=128), Xd)
    cp.cuda.Device().synchronize()
    doc["cagra_build_s"] = round(time.perf_counter() - t0, 2)
    return {"index": idx, "X": Xd, "Q": None}


def cagra_bitset(mask):
    """``mask`` (bool, n) as CAGRA's bitset: uint32 words, bit ``j % 32`` of word ``j // 32`` is row
    ``j`` (numpy's little bit order within each byte, bytes little-endian in each word), 1 = keep."""
    b = np.packbits(np.asarray(mask, bool), bitorder="little")
    b = np.concatenate([b, np.zeros(-len(b) % 4, np.uint8)])
    return b.view("<u4").astype(np.uint32)


def _cagra_search(cg, mask, T, args):
    import cupy as cp
    from cuvs.neighbors import cagra, filters

    if cg["Q"] is None:
        cg["Q"] = cp.asarray(args.Q)
    bits = cp.asarray(cagra_bitset(mask))
    prefilter = filters.from_bitset(bits)
    n, k, out = args.n, args.k, []
    for itopk in args.itopk:
        try:
            sp = cagra.SearchParams(itopk_size=itopk)

            def run(sp=sp):
                r = cagra.search(sp, cg["index"], cg["Q"], k, filter=prefilter)
                cp.cuda.Device().synchronize()
                return r

            (dt, (a, b)), = _best_times({"cagra": run}, args.repeats).values()
            a, b = cp.asarray(a), cp.asarray(b)
            nb = a if a.dtype.kind in "iu" else b  # (distances, neighbors); the dtype tells which
            i = cp.asnumpy(nb).astype(np.int64)
            i[(i < 0) | (i >= n)] = -1  # unfilled slots (uint32 max) as -1
            out.append({"itopk": itopk, "recall": round(_recall(i, T), 4), "qps": round(len(args.Q) / dt, 1),
                        "outside_filter": int((~mask[i[i >= 0]]).sum()),
                        "short_queries": int(((i >= 0).sum(axis=1) < min(k, int(mask.sum()))).sum())})
        except Exception as e:  # noqa: BLE001 - one failing itopk must not lose the rest of the run
            out.append({"itopk": itopk, "error": f"{type(e).__name__}: {e}"})
            log.warning("CAGRA itopk=%d failed: %s", itopk, e)
    return out


def _write(args, doc, name):
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, name), "w") as f:  # after every row: a cut run keeps its rows
        json.dump(doc, f, indent=1)


def _portable_argv(argv):
    """The command line with the output folder written as ``$OUT`` (no path of this machine)."""
    return ["$OUT" if i and argv[i - 1] == "--out" else a for i, a in enumerate(argv)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("compare", "sweep", "both"), default="compare")
    ap.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--d", type=int, default=32)
    ap.add_argument("--nq", type=int, default=1000)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per measurement (best kept)")
    ap.add_argument("--selectivities", default=None,
                    help="comma-separated fractions (default: compare 0.5,0.1,0.01,0.001; "
                         "sweep 0.5,0.2,0.1,0.05,0.02,0.01,0.005,0.001)")
    ap.add_argument("--overfetch", default="1,2,4,8", help="sweep: over-fetch factors of the forced graph walk")
    ap.add_argument("--itopk", default="32,64,128,256,512", help="GPU compare: CAGRA itopk_size values")
    ap.add_argument("--hnsw-queries", type=int, default=50)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    _check_args(ap, args)
    logging.basicConfig(level=logging.INFO, format="# %(message)s", stream=sys.stderr)
    knnkit.set_progress(False)
    X, Q = knnkit.datasets.make_clustered(args.n, args.d, n_queries=args.nq, random_state=0, device="cpu")
    args.Q = Q
    t0 = time.perf_counter()
    index = knnkit.GraphIndex.build(X, device=args.device, random_state=0)
    _sync(args.device)
    base = {"benchmark": "filter_bench", "n": args.n, "d": args.d, "nq": args.nq, "k": args.k,
            "device": args.device, "repeats": args.repeats, "index_build_s": round(time.perf_counter() - t0, 2),
            "graph_degree": index.graph_degree, "platform": platform.platform(), "cpu_count": os.cpu_count(),
            "argv": _portable_argv(sys.argv[1:]),
            "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()}
    if args.device == "gpu":
        import cupy as cp

        base["gpu"] = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()
    sel = args.selectivities
    if args.mode in ("compare", "both"):
        args.selectivities = sel or [0.5, 0.1, 0.01, 0.001]
        run_compare(args, X, Q, index, dict(base))
    if args.mode in ("sweep", "both"):
        args.selectivities = sel or [0.5, 0.2, 0.1, 0.05, 0.02, 0.01, 0.005, 0.001]
        run_sweep(args, X, Q, index, dict(base))


if __name__ == "__main__":
    main()
