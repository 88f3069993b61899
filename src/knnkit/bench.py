"""``knnkit bench``: recall against speed of knnkit and its peers on the user's own vectors.

The command a user runs to decide: it reads a data file (every format :mod:`knnkit.io` reads, or an
ann-benchmarks HDF5 file with its ``train``/``test``/``neighbors``), builds each method, sweeps its
search parameter, and reports recall@k, queries per second and build time as a table, a JSON file
and a recall-vs-QPS plot.

Like :mod:`knnkit.cli`, this module is a *user* of the public API (``knnkit.knn``,
``knnkit.knn_graph``, ``knnkit.GraphIndex``): it sits at the top of the library, beside the CLI.

Methods (``methods=``):

- ``"exact"``: :func:`knnkit.knn` (brute force; recall 1 up to ties), one point.
- ``"index"``: :class:`knnkit.GraphIndex`, sweeping ``beam``.
- ``"graph"``: :func:`knnkit.knn_graph` of the data (no queries: the all-points k-NN graph);
  its recall is measured on sampled nodes and its speed reported as points per second.
- ``"hnswlib"``: ``hnswlib.Index`` (M=16, ef_construction=200), sweeping ``ef``.
- ``"faiss"``: ``faiss.IndexHNSWFlat`` (M=32), sweeping ``efSearch``.
- ``"cuvs"``: cuVS CAGRA on the GPU (``cuvs.neighbors.cagra``), sweeping ``itopk_size``.

Peers that do not import are skipped with a note. Recall is computed by this module for every
method the same way: from the returned ids, with distances recomputed in float64 from the vectors,
ties at the k-th true distance counted as found (the ann-benchmarks rule), so a method's own
distance convention (squared or not, similarity or distance) does not matter.
"""

import json
import os
import platform
import time

import numpy as np

from ._core.version import __version__

__all__ = ["BENCH_METHODS", "load_bench_data", "run_bench", "format_table", "plot_bench"]

BENCH_METHODS = ("exact", "index", "graph", "hnswlib", "faiss", "cuvs")
DEFAULT_METHODS = ("exact", "index", "graph", "hnswlib", "faiss", "cuvs")
_BEAMS = (10, 16, 24, 32, 48, 64, 96, 128, 192, 256)          # GraphIndex beam, hnswlib ef, faiss efSearch
_ITOPK = (32, 64, 96, 128, 192, 256)                           # CAGRA itopk_size (multiples of 32)


# --------------------------------------------------------------------------- data

def _read_ids(path):
    from . import io

    ids = np.asarray(io.read(path))
    if ids.ndim != 2 or ids.dtype.kind not in "iu":
        raise ValueError(f"{path}: ground truth must be a 2-D integer array (nq, k), got shape {ids.shape} "
                         f"dtype {ids.dtype}")
    return ids.astype(np.int64)


def load_bench_data(data, queries=None, groundtruth=None, *, n_queries=1000, random_state=0):
    """Read the benchmark's inputs.

    Parameters
    ----------
    data : str
        Vector file (``.fvecs .bvecs .fbin .u8bin .i8bin .npy`` ...), or an ann-benchmarks ``.hdf5``
        file: its ``train`` set is the data, ``test`` the queries and ``neighbors`` the ground truth
        (unless ``queries``/``groundtruth`` are given).
    queries : str, optional
        Query file. Without one (and no HDF5 ``test``), ``n_queries`` random rows of the data are
        held out: removed from the data and used as queries, so no query finds itself.
    groundtruth : str, optional
        True neighbour ids (``.ivecs .ibin .npy``), nearest first, one row per query.
    n_queries : int
        Rows held out as queries when there is no query set (at most a tenth of the data).
    random_state : int
        Seed of the held-out sample.

    Returns
    -------
    dict
        ``data``, ``queries`` (numpy), ``groundtruth`` (int64 or None), ``metric`` (the HDF5 file's,
        or None) and ``held_out`` (how many rows were held out, 0 when queries were given).

    Examples
    --------
    >>> import numpy as np, os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "x.npy")
    >>> np.save(path, np.random.default_rng(0).random((200, 4), dtype=np.float32))
    >>> d = load_bench_data(path, n_queries=10)
    >>> d["data"].shape, d["queries"].shape, d["held_out"]
    ((190, 4), (10, 4), 10)
    """
    from . import io

    metric = None
    q = gt = None
    ext = os.path.splitext(os.fspath(data))[1].lower()
    if ext in (".hdf5", ".h5"):
        h = io.read_hdf5(data)
        if h.get("train") is None:
            raise ValueError(f"{data}: no 'train' dataset")
        x, q, metric = h["train"], h.get("test"), h.get("metric")
        gt = h.get("neighbors") if q is not None else None
    else:
        x = np.asarray(io.read(data))
    if x.ndim != 2 or x.shape[0] < 2:
        raise ValueError(f"{data}: need a 2-D array of at least 2 rows, got shape {x.shape}")
    held_out = 0
    if queries is not None:
        q = np.asarray(io.read(queries))
        gt = None
    if groundtruth is not None:
        gt = _read_ids(groundtruth)
    if q is None:
        if groundtruth is not None:
            raise ValueError("--groundtruth needs --queries (the held-out queries are drawn at random)")
        n_queries = int(n_queries)
        if n_queries < 1:
            raise ValueError(f"n_queries must be >= 1, got {n_queries}")
        held_out = max(1, min(n_queries, x.shape[0] // 10))
        rows = np.random.default_rng(random_state).permutation(x.shape[0])
        q, x = x[np.sort(rows[:held_out])], x[np.sort(rows[held_out:])]
    if q.ndim != 2 or q.shape[1] != x.shape[1]:
        raise ValueError(f"queries have shape {q.shape}, the data has dimension {x.shape[1]}")
    if gt is not None and gt.shape[0] != q.shape[0]:
        raise ValueError(f"ground truth has {gt.shape[0]} rows for {q.shape[0]} queries")
    return {"data": x, "queries": q, "groundtruth": None if gt is None else np.asarray(gt, dtype=np.int64),
            "metric": metric, "held_out": held_out}


# --------------------------------------------------------------------------- recall

def _scores(x, q, ids, metric):
    """float64 'smaller is nearer' scores of q[r] against x[ids[r, j]] (ids < 0 score +inf)."""
    valid = ids >= 0
    rows = x[np.where(valid, ids, 0)].astype(np.float64)                    # (nq, k, d)
    qq = q.astype(np.float64)[:, None, :]
    if metric in ("sqeuclidean", "euclidean"):
        s = ((rows - qq) ** 2).sum(-1)
    elif metric == "inner_product":
        s = -(rows * qq).sum(-1)
    else:  # cosine
        num = (rows * qq).sum(-1)
        den = np.linalg.norm(rows, axis=-1) * np.linalg.norm(qq, axis=-1)
        s = 1.0 - np.divide(num, den, out=np.zeros_like(num), where=den > 0)
    return np.where(valid, s, np.inf)


def _recall(x, q, found, true, k, metric, true_scores):
    """Recall@k of ``found`` ids, ties with the true k-th neighbour counted as found."""
    from .evaluate import recall

    found = np.asarray(found, dtype=np.int64)[:, :k]
    fs = _scores(x, q, found, metric)
    return recall(found, true[:, :k], k=k, found_distances=fs, true_distances=true_scores[:, :k], eps=1e-5)


# --------------------------------------------------------------------------- methods
#
# Each runner yields result dicts; a runner raising ImportError is skipped with a note.

def _timed(fn):
    from .evaluate import Timer

    with Timer(sync=True) as t:
        out = fn()
    return out, t.elapsed


def _search_sweep(name, build, search, values, param, ctx):
    """Build once, then one point per search parameter value."""
    index, build_s = _timed(build)
    q, k = ctx["queries"], ctx["k"]
    # first-call setup (JIT, kernels, batch-size dependent plans) not timed: a warm-up on 100
    # queries left cuVS CAGRA's first full-size point at ~1% of its speed (H100, 2026-11-24)
    search(index, q, values[0])
    for v in values:
        ids, secs = _timed(lambda: search(index, q, v))
        yield {"method": name, "param": param, "value": v, "build_s": build_s, "search_s": secs,
               "qps": len(q) / secs if secs > 0 else float("inf"),
               "recall": _recall(ctx["data"], q, ids, ctx["gt"], k, ctx["metric"], ctx["gt_scores"])}
        ctx["bar"].update(1)


def _run_exact(ctx):
    import knnkit

    q, k = ctx["queries"], ctx["k"]
    knnkit.knn(ctx["data"], q[: min(len(q), 100)], k=k, metric=ctx["metric"], device=ctx["device"])
    (_d, ids), secs = _timed(lambda: knnkit.knn(ctx["data"], q, k=k, metric=ctx["metric"], device=ctx["device"]))
    ctx["bar"].update(1)
    yield {"method": "exact", "param": None, "value": None, "build_s": 0.0, "search_s": secs,
           "qps": len(q) / secs if secs > 0 else float("inf"),
           "recall": _recall(ctx["data"], q, ids, ctx["gt"], k, ctx["metric"], ctx["gt_scores"])}


def _run_index(ctx):
    import knnkit

    def build():
        return knnkit.GraphIndex.build(ctx["data"], metric=ctx["metric"], device=ctx["device"],
                                       random_state=ctx["seed"])

    def search(index, q, beam):
        return index.search(q, k=ctx["k"], beam=beam)[1]

    yield from _search_sweep("index", build, search, ctx["beams"], "beam", ctx)


def _run_graph(ctx):
    """The all-points k-NN graph: recall on sampled nodes, speed as points per second."""
    import knnkit
    from .evaluate import graph_recall

    x, k = ctx["data"], min(ctx["k"], ctx["data"].shape[0] - 1)
    g, secs = _timed(lambda: knnkit.knn_graph(x, k=k, metric=ctx["metric"], device=ctx["device"],
                                              random_state=ctx["seed"]))
    r = graph_recall(x, g, sample=min(1000, x.shape[0]), metric=ctx["metric"], random_state=ctx["seed"],
                     device=ctx["device"])
    ctx["bar"].update(1)
    yield {"method": "graph", "param": None, "value": None, "build_s": secs, "search_s": None,
           "qps": None, "points_per_s": x.shape[0] / secs if secs > 0 else float("inf"), "recall": float(r),
           "note": f"all-points k-NN graph (knn_graph, {(getattr(g, 'stats', None) or {}).get('method', 'auto')}); "
                   f"recall on {min(1000, x.shape[0])} sampled nodes"}


def _unit_rows(a):
    n = np.linalg.norm(a, axis=1, keepdims=True)
    return np.divide(a, n, out=np.zeros_like(a), where=n > 0)


def _as_f32(a, metric):
    a = np.ascontiguousarray(a, dtype=np.float32)
    return _unit_rows(a) if metric == "cosine" else a


def _run_hnswlib(ctx):
    import hnswlib

    space = {"sqeuclidean": "l2", "euclidean": "l2", "inner_product": "ip", "cosine": "cosine"}[ctx["metric"]]
    x = np.ascontiguousarray(ctx["data"], dtype=np.float32)

    def build():
        index = hnswlib.Index(space=space, dim=x.shape[1])
        index.init_index(max_elements=x.shape[0], M=16, ef_construction=200, random_seed=ctx["seed"])
        index.add_items(x, np.arange(x.shape[0]))
        return index

    def search(index, q, ef):
        index.set_ef(max(ef, ctx["k"]))
        return index.knn_query(np.ascontiguousarray(q, dtype=np.float32), k=ctx["k"])[0]

    yield from _search_sweep("hnswlib", build, search, ctx["beams"], "ef", ctx)


def _run_faiss(ctx):
    import faiss

    metric = ctx["metric"]
    x = _as_f32(ctx["data"], metric)

    def build():
        kind = faiss.METRIC_INNER_PRODUCT if metric in ("inner_product", "cosine") else faiss.METRIC_L2
        index = faiss.IndexHNSWFlat(x.shape[1], 32, kind)
        index.hnsw.efConstruction = 200
        index.add(x)
        return index

    def search(index, q, ef):
        index.hnsw.efSearch = max(ef, ctx["k"])
        return index.search(_as_f32(q, metric), ctx["k"])[1]

    yield from _search_sweep("faiss", build, search, ctx["beams"], "efSearch", ctx)


def _run_cuvs(ctx):
    from .evaluate import _synchronize

    try:
        import cupy as cp
        from cuvs.neighbors import cagra
    except ImportError as e:
        raise ImportError(f"cuVS is not importable ({e})") from None
    if ctx["device_kind"] != "gpu":
        raise ImportError("cuVS runs on the GPU only (device is cpu)")
    metric = ctx["metric"]
    if metric == "cosine":
        x = cp.asarray(_as_f32(ctx["data"], metric))
        cuvs_metric = "inner_product"
    else:
        x = cp.asarray(np.ascontiguousarray(ctx["data"], dtype=np.float32))
        cuvs_metric = "inner_product" if metric == "inner_product" else "sqeuclidean"

    def build():
        index = cagra.build(cagra.IndexParams(metric=cuvs_metric), x)
        _synchronize()
        return index

    def search(index, q, itopk):
        qd = cp.asarray(_as_f32(q, metric))
        params = cagra.SearchParams(itopk_size=max(itopk, ctx["k"]))
        _d, ids = cagra.search(params, index, qd, ctx["k"])
        return cp.asnumpy(cp.asarray(ids)).astype(np.int64)

    yield from _search_sweep("cuvs", build, search, _ITOPK, "itopk_size", ctx)


_RUNNERS = {"exact": _run_exact, "index": _run_index, "graph": _run_graph, "hnswlib": _run_hnswlib,
            "faiss": _run_faiss, "cuvs": _run_cuvs}


# --------------------------------------------------------------------------- driver

def _check_methods(methods):
    if isinstance(methods, str):
        methods = [m.strip() for m in methods.split(",") if m.strip()]
    methods = list(methods)
    bad = [m for m in methods if m not in BENCH_METHODS]
    if bad or not methods:
        raise ValueError(f"methods must be a non-empty list of {', '.join(BENCH_METHODS)}; got {bad or methods}")
    return list(dict.fromkeys(methods))


def run_bench(data, queries, *, k=10, metric="sqeuclidean", methods=DEFAULT_METHODS, groundtruth=None,
              device="auto", beams=None, random_state=0, log=None):
    """Build every method on ``data``, sweep its search parameter, and measure recall@k, QPS and build time.

    Parameters
    ----------
    data, queries : numpy.ndarray (n, d), (nq, d)
    k : int
        Neighbours per query.
    metric : {"sqeuclidean", "euclidean", "inner_product", "cosine"}
    methods : sequence of str or comma-separated str
        Among ``exact, index, graph, hnswlib, faiss, cuvs``. Peers that do not import are skipped.
    groundtruth : (nq, >=k) int array, optional
        True neighbour ids; computed with exact :func:`knnkit.knn` when None.
    device : {"auto", "cpu", "gpu"} or int
        For the knnkit methods (peers run where they run: hnswlib and faiss-cpu on the CPU, cuVS on
        the GPU).
    beams : sequence of int, optional
        The GraphIndex ``beam`` / hnswlib ``ef`` / faiss ``efSearch`` sweep (default 10 ... 256,
        values below ``k`` raised to ``k``).
    random_state : int
    log : callable, optional
        Called with one line of text per note (skipped peers ...); default: the knnkit logger.

    Returns
    -------
    dict
        ``results`` (one dict per measured point: method, param, value, recall, qps, build_s,
        search_s), ``skipped`` ({method: reason}), and the run's ``meta`` (machine, versions, sizes).

    Examples
    --------
    >>> import numpy as np
    >>> x = np.random.default_rng(0).random((300, 8), dtype=np.float32)
    >>> out = run_bench(x[20:], x[:20], k=5, methods="exact,index", device="cpu", beams=[8, 32])
    >>> [(r["method"], r["value"]) for r in out["results"]]
    [('exact', None), ('index', 8), ('index', 32)]
    >>> out["results"][0]["recall"]
    1.0
    """
    import knnkit
    from ._core.backend import resolve_device
    from ._core.config import logger, progress
    from ._core.validation import METRICS

    note = log or logger.warning
    methods = _check_methods(methods)
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    k = int(k)
    x = np.asarray(data)
    q = np.asarray(queries)
    if x.ndim != 2 or q.ndim != 2 or x.shape[1] != q.shape[1]:
        raise ValueError(f"data {x.shape} and queries {q.shape} must be 2-D with the same dimension")
    if k > x.shape[0]:
        raise ValueError(f"k={k} is larger than the data ({x.shape[0]} points)")
    beams = sorted({max(int(b), k) for b in (beams or _BEAMS)})
    if any(b < 1 for b in beams):
        raise ValueError(f"beams must be positive integers, got {beams}")
    kind, _dev = resolve_device(device)

    if groundtruth is None:
        _d, gt = knnkit.knn(x, q, k=k, metric=metric, device=device)
        gt = np.asarray(gt, dtype=np.int64)
        gt_source = "exact knnkit.knn"
    else:
        gt = np.asarray(groundtruth, dtype=np.int64)
        if gt.ndim != 2 or gt.shape[0] != q.shape[0] or gt.shape[1] < k:
            raise ValueError(f"groundtruth must be ({q.shape[0]}, >= {k}) ids, got shape {gt.shape}")
        if gt.max(initial=-1) >= x.shape[0]:
            raise ValueError(f"groundtruth has ids up to {gt.max()} but the data has {x.shape[0]} points")
        gt_source = "given"
    gt = gt[:, :k]
    ctx = {"data": x, "queries": q, "k": k, "metric": metric, "device": device, "device_kind": kind,
           "seed": random_state, "beams": beams, "gt": gt, "gt_scores": _scores(x, q, gt, metric)}

    sizes = {"exact": 1, "graph": 1, "cuvs": len(_ITOPK)}
    results, skipped = [], {}
    with progress(total=sum(sizes.get(m, len(beams)) for m in methods), desc="bench", unit="point") as bar:
        ctx["bar"] = bar
        for m in methods:
            bar.set_postfix_str(m)
            t0 = time.perf_counter()
            try:
                for row in _RUNNERS[m](ctx):
                    results.append(row)
            except ImportError as e:
                skipped[m] = str(e) or "not importable"
                note(f"bench: {m} skipped ({skipped[m]})")
                bar.update(sizes.get(m, len(beams)))
                continue
            logger.info("bench: %s done in %.1f s", m, time.perf_counter() - t0)
    meta = {"knnkit": __version__, "python": platform.python_version(), "machine": platform.machine(),
            "cpu_count": os.cpu_count(), "device": kind, "n": int(x.shape[0]), "d": int(x.shape[1]),
            "dtype": str(x.dtype), "n_queries": int(q.shape[0]), "k": k, "metric": metric,
            "groundtruth": gt_source, "methods": methods, "beams": beams,
            "date": time.strftime("%Y-%m-%dT%H:%M:%S")}
    if kind == "gpu":
        try:
            import cupy

            name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
            meta["gpu"] = name.decode() if isinstance(name, bytes) else name
        except Exception:  # the name is decoration: a driver query failing must not lose the results
            pass
    return {"meta": meta, "results": results, "skipped": skipped}


def format_table(out):
    """The results as a fixed-width text table (one line per measured point).

    Examples
    --------
    >>> print(format_table({"results": [{"method": "exact", "param": None, "value": None, "recall": 1.0,
    ...                                  "qps": 1234.5, "build_s": 0.0}], "skipped": {}}))
    method    param         recall@k         QPS   build s
    exact     -               1.0000       1,234     0.000
    """
    lines = [f"{'method':<9} {'param':<12} {'recall@k':>9} {'QPS':>11} {'build s':>9}"]
    for r in out["results"]:
        p = "-" if r.get("param") is None else f"{r['param']}={r['value']}"
        qps = r.get("qps")
        qps_text = f"{qps:,.0f}" if qps is not None else f"{r.get('points_per_s', 0):,.0f} pt/s"
        lines.append(f"{r['method']:<9} {p:<12} {r['recall']:>9.4f} {qps_text:>11} {r['build_s']:>9.3f}")
    for m, why in out.get("skipped", {}).items():
        lines.append(f"{m:<9} skipped: {why}")
    return "\n".join(lines)


def plot_bench(out, path):
    """Write a recall-vs-QPS plot (log QPS) of ``run_bench``'s result to ``path`` (PNG).

    Needs matplotlib (``pip install knnkit[plot]``). The ``graph`` method has no queries and is left
    out of the plot (it is in the table and the JSON).
    """
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("the recall-vs-QPS plot needs matplotlib: pip install 'knnkit[plot]' "
                          "(or pip install matplotlib)") from None
    meta = out.get("meta", {})
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for m in dict.fromkeys(r["method"] for r in out["results"]):
        pts = sorted((r["recall"], r["qps"]) for r in out["results"] if r["method"] == m and r.get("qps"))
        if not pts:
            continue
        rec, qps = zip(*pts)
        ax.plot(rec, qps, "o-" if len(pts) > 1 else "s", label="knnkit " + m if m in ("exact", "index") else m)
    ax.set_yscale("log")
    ax.set_xlabel(f"recall@{meta.get('k', 'k')}")
    ax.set_ylabel("queries per second")
    ax.set_title(f"{meta.get('n', '?')} x {meta.get('d', '?')} {meta.get('dtype', '')}, {meta.get('metric', '')}, "
                 f"{meta.get('gpu') or meta.get('device', '')}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def save_json(out, path):
    """Write ``run_bench``'s result as JSON (floats as numbers, infinities as null)."""
    def clean(v):
        if isinstance(v, dict):
            return {k: clean(w) for k, w in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(w) for w in v]
        if isinstance(v, (np.integer,)):
            return int(v)
        if isinstance(v, (float, np.floating)):
            return float(v) if np.isfinite(v) else None
        return v

    with open(path, "w") as f:
        json.dump(clean(out), f, indent=1)
