"""The ``knnkit`` command (also ``python -m knnkit``).

Subcommands:

- ``knnkit info``: versions, backend, GPUs.
- ``knnkit demo``: a synthetic data set through exact k-NN, a k-NN graph and a graph index, with
  times and recalls; the quickest way to see what the library does on this machine.
- ``knnkit knn DATA -k K -o OUT``: exact k-NN of vector files.
- ``knnkit graph DATA -k K -o OUT``: k-NN graph of a vector file (in memory or out of core).
- ``knnkit convert IN OUT``: change a vector file's format (or take its first rows).
- ``knnkit index build DATA OUT.knn`` / ``knnkit index search OUT.knn QUERIES -k K -o RES``: a graph
  search index (``knnkit.GraphIndex``) saved to a file, and searched from it.
- ``knnkit bench DATA``: recall@k against queries per second of knnkit and the peers that import
  (hnswlib, faiss, cuVS), as a table, a JSON file and a PNG plot (``knnkit.bench``).
- ``knnkit demo --save DIR``: write sample files (data.fbin, queries.fbin, groundtruth.ivecs).

Global options ``--quiet`` (no progress bars) and ``--verbose`` (debug log) go before or after the
subcommand.
"""

import argparse
import logging
import os
import platform
import sys

import numpy as np

from ._core.validation import METRICS

__all__ = ["main"]

_INDEX_EXTS = {".ibin": ".dist.fbin", ".ivecs": ".dist.fvecs", ".npy": ".dist.npy"}


# --------------------------------------------------------------------------- helpers

def _device(text):
    """argparse type for --device: auto, cpu, gpu or a GPU number."""
    if text in ("auto", "cpu", "gpu"):
        return text
    if text.isdigit():
        return int(text)
    raise argparse.ArgumentTypeError(f"expected auto, cpu, gpu or a GPU number, got {text!r}")


def _positive(text):
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def _say(*parts):
    print(*parts, flush=True)


def _version(module):
    try:
        mod = __import__(module)
        return getattr(mod, "__version__", "installed")
    except Exception:
        return None


def _output_folder_exists(*paths):
    """Refuse, before any work, output files whose folder does not exist (the write at the end
    failed only after the whole computation: an out-of-core graph, an index build)."""
    for path in paths:
        folder = os.path.dirname(os.path.abspath(os.fspath(path)))
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"{path}: folder {folder} does not exist")


def distances_path(out):
    """Where ``knnkit knn -o OUT`` writes the distances: OUT's stem + ``.dist.fbin|.dist.fvecs|.dist.npy``."""
    stem, ext = os.path.splitext(os.fspath(out))
    if ext.lower() not in _INDEX_EXTS:
        raise ValueError(f"{out}: output must end in .ibin, .ivecs or .npy")
    return stem + _INDEX_EXTS[ext.lower()]


# --------------------------------------------------------------------------- info

def _gpu_lines():
    from ._core.backend import cupy_or_none

    cp = cupy_or_none()
    if cp is None:
        why = "CuPy is not installed" if _version("cupy") is None else "CuPy sees no CUDA device"
        return [f"GPU: no GPU ({why}; install knnkit[cuda12] or knnkit[cuda13] on a machine with an NVIDIA GPU)"]
    rt = cp.cuda.runtime
    lines = [f"CUDA: runtime {rt.runtimeGetVersion()}, driver {rt.driverGetVersion()}"]
    for i in range(rt.getDeviceCount()):
        p = rt.getDeviceProperties(i)
        name = p["name"].decode() if isinstance(p["name"], bytes) else p["name"]
        with cp.cuda.Device(i):
            free, total = rt.memGetInfo()
        lines.append(f"GPU {i}: {name}, compute capability {p['major']}.{p['minor']}, "
                     f"{total / 2 ** 30:.1f} GiB ({free / 2 ** 30:.1f} GiB free), {p['multiProcessorCount']} SMs")
    return lines


def _gpu_name(dev_id):
    import cupy

    name = cupy.cuda.runtime.getDeviceProperties(dev_id)["name"]
    return name.decode() if isinstance(name, bytes) else name


def cmd_info(args):
    import knnkit

    try:
        import numba

        numba_text = f"{numba.__version__} ({numba.get_num_threads()} threads)"
    except Exception:
        numba_text = "not installed"
    _say(f"knnkit {knnkit.__version__}")
    _say(f"python {platform.python_version()} on {platform.system()} {platform.machine()}, "
         f"{os.cpu_count()} CPU cores")
    _say(f"numpy {np.__version__}")
    _say(f"numba {numba_text}")
    for mod in ("cupy", "torch", "h5py"):
        _say(f"{mod} {_version(mod) or 'not installed'}")
    _say(f"backend: {'gpu (CuPy + CUDA kernels)' if knnkit.gpu_available() else 'cpu (NumPy + Numba)'}")
    for line in _gpu_lines():
        _say(line)
    return 0


# --------------------------------------------------------------------------- knn

def _read_input(path):
    """``(data, queries or None)`` from a vector file, or ``(train, test)`` from an ann-benchmarks file."""
    from . import io

    ext = os.path.splitext(path)[1].lower()
    if ext in (".hdf5", ".h5"):
        d = io.read_hdf5(path)
        if d.get("train") is None:
            raise ValueError(f"{path}: no 'train' dataset")
        return d["train"], d.get("test")
    return io.read(path), None


def cmd_knn(args):
    import knnkit
    from . import io
    from .evaluate import Timer

    dist_out = distances_path(args.output)   # checked before any work
    _output_folder_exists(args.output)
    data, hdf5_queries = _read_input(args.data)
    queries = io.read(args.queries) if args.queries else hdf5_queries
    kw = {"metric": args.metric, "device": args.device}
    if args.batch_size:
        kw["batch_size"] = args.batch_size
    with Timer("knn") as t:
        d, i = knnkit.knn(data, queries, k=args.k, **kw)
    io.write(args.output, i)     # int64 -> int32 for .ibin/.ivecs (checked to fit)
    if not args.no_distances:
        io.write(dist_out, d)
    nq = len(i)
    what = f"{nq} queries" if queries is not None else f"all {nq} points (each excluding itself)"
    _say(f"knn: {what} x k={args.k} over {data.shape[0]} points (d={data.shape[1]}, {args.metric}) "
         f"in {t.elapsed:.3f} s")
    _say(f"wrote indices to {args.output}" + ("" if args.no_distances else f", distances to {dist_out}"))
    return 0


# --------------------------------------------------------------------------- graph

def cmd_graph(args):
    import knnkit
    from . import io
    from .evaluate import Timer, graph_recall

    dist_out = distances_path(args.output)
    _output_folder_exists(args.output)
    if args.workdir:
        # out of core: the file is memory-mapped and processed in shards; results are streamed to OUT
        with Timer("graph") as t:
            res = knnkit.knn_graph_out_of_core(args.data, k=args.k, workdir=args.workdir, metric=args.metric,
                                               device=args.device, random_state=args.seed, return_graph=False)
        _copy_vectors(res["indices"], args.output)
        if not args.no_distances:
            _copy_vectors(res["distances"], dist_out)
        n = len(io.open_vectors(res["indices"]))
        _say(f"graph: k={args.k} over {n} points ({args.metric}, out of core in {args.workdir}) "
             f"in {t.elapsed:.3f} s")
    else:
        data, _ = _read_input(args.data)
        kw = {} if args.method == "auto" else {"method": args.method}
        with Timer("graph") as t:
            g = knnkit.knn_graph(data, k=args.k, metric=args.metric, device=args.device, random_state=args.seed,
                                 **kw)
        io.write(args.output, g.indices)
        if not args.no_distances:
            io.write(dist_out, g.distances)
        method = (getattr(g, "stats", None) or {}).get("method", args.method)
        _say(f"graph: k={args.k} over {data.shape[0]} points (d={data.shape[1]}, {args.metric}, {method}) "
             f"in {t.elapsed:.3f} s")
        if args.eval:
            r = graph_recall(data, g, sample=args.eval, metric=args.metric, random_state=args.seed,
                             device=args.device)
            _say(f"recall@{args.k} {r:.4f} on {min(args.eval, data.shape[0])} sampled nodes")
    _say(f"wrote indices to {args.output}" + ("" if args.no_distances else f", distances to {dist_out}"))
    return 0


# --------------------------------------------------------------------------- convert

def _copy_vectors(src_path, dst_path, rows=None):
    """Copy a vector file into another format, block by block (files larger than memory work)."""
    from . import io

    src = io.open_vectors(src_path)
    n = len(src) if rows is None else min(rows, len(src))
    ext = os.path.splitext(os.fspath(dst_path))[1].lower()
    if ext == ".npy" or src.ndim != 2:
        io.write(dst_path, src.read_rows(0, n))
    else:
        step = max(1, (256 << 20) // max(1, src.nbytes // max(1, len(src))))
        with io.VectorWriter(dst_path, d=src.shape[1]) as w:
            for s in range(0, n, step):
                w.append(src.read_rows(s, min(n, s + step)))
    return n, (src.shape[1] if src.ndim > 1 else 1)


def cmd_convert(args):
    _output_folder_exists(args.output)
    n, d = _copy_vectors(args.input, args.output, args.rows)
    _say(f"wrote {n} x {d} to {args.output}")
    return 0


# --------------------------------------------------------------------------- index

def _write_results(out, d, i):
    """Search results to OUT: .npz holds both arrays; otherwise the knn convention (ids to OUT,
    distances to OUT's stem + .dist.*)."""
    from . import io

    if os.fspath(out).lower().endswith(".npz"):
        with io.atomic_write(out) as f:  # as every other output: a failed write leaves the old file
            np.savez(f, distances=np.asarray(d), indices=np.asarray(i))
        return f"distances and indices to {out}"
    dist_out = distances_path(out)
    io.write(out, np.asarray(i))
    io.write(dist_out, np.asarray(d))
    return f"indices to {out}, distances to {dist_out}"


def cmd_index_build(args):
    import knnkit
    from .evaluate import Timer

    _output_folder_exists(args.output)
    data, _ = _read_input(args.data)
    kw = {}
    if args.graph_degree is not None:
        kw["graph_degree"] = args.graph_degree
    with Timer("build") as t:
        index = knnkit.GraphIndex.build(data, metric=args.metric, device=args.device, random_state=args.seed, **kw)
    index.save(args.output)
    _say(f"index build: {data.shape[0]} points (d={data.shape[1]}, {data.dtype}, {args.metric}) in "
         f"{t.elapsed:.3f} s; wrote {args.output}")
    return 0


def cmd_index_search(args):
    import knnkit
    from . import io
    from .evaluate import Timer, recall

    if args.output and not os.fspath(args.output).lower().endswith(".npz"):
        distances_path(args.output)   # a bad extension is refused before any work
    if args.output:
        _output_folder_exists(args.output)
    index = knnkit.GraphIndex.load(args.index, device=args.device)
    queries = io.read(args.queries)
    kw = {} if args.beam is None else {"beam": args.beam}
    index.search(queries[: min(len(queries), 10)], k=args.k, **kw)   # first-call setup outside the timing
    with Timer("search") as t:
        d, i = index.search(queries, k=args.k, **kw)
    _say(f"index search: {len(queries)} queries x k={args.k} in {t.elapsed:.3f} s "
         f"({_rate(len(queries), t.elapsed, 'queries')})")
    if args.groundtruth:
        gt = io.read(args.groundtruth)
        _say(f"recall@{args.k} {recall(i, gt[:, :args.k], k=args.k):.4f} against {args.groundtruth}")
    if args.output:
        _say("wrote " + _write_results(args.output, d, i))
    return 0


# --------------------------------------------------------------------------- bench

def cmd_bench(args):
    from . import bench

    inputs = bench.load_bench_data(args.data, args.queries, args.groundtruth, n_queries=args.n_queries,
                                   random_state=args.seed)
    metric = args.metric or inputs["metric"] or "sqeuclidean"
    x, q = inputs["data"], inputs["queries"]
    held = f" ({inputs['held_out']} rows held out of the data as queries)" if inputs["held_out"] else ""
    _say(f"bench: {x.shape[0]} x {x.shape[1]} {x.dtype}, {q.shape[0]} queries{held}, k={args.k}, {metric}")
    out = bench.run_bench(x, q, k=args.k, metric=metric, methods=args.methods, groundtruth=inputs["groundtruth"],
                          device=args.device, beams=args.beams, random_state=args.seed,
                          log=lambda line: _say("  " + line))
    _say(bench.format_table(out))
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, "bench.json")
    bench.save_json(out, json_path)
    written = [json_path]
    if not args.no_plot:
        png = os.path.join(args.out, "bench.png")
        bench.plot_bench(out, png)
        written.append(png)
    _say("wrote " + ", ".join(written))
    return 0


def _beams(text):
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        vals = []
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return vals


def _methods(text):
    from .bench import BENCH_METHODS

    vals = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in vals if m not in BENCH_METHODS]
    if bad or not vals:
        raise argparse.ArgumentTypeError(f"methods are a comma-separated list of {','.join(BENCH_METHODS)}, "
                                         f"got {text!r}")
    return vals


# --------------------------------------------------------------------------- demo --save

def save_samples(folder, n, d, n_queries, k, metric, seed, device):
    """Write the demo's data set as sample files: data.fbin, queries.fbin, groundtruth.ivecs (exact
    ids, k columns) and groundtruth.dist.fvecs; returns the paths."""
    import knnkit
    from . import datasets, io

    os.makedirs(folder, exist_ok=True)
    data, queries = datasets.make_clustered(n, d, n_queries=n_queries, random_state=seed, device="cpu")
    dist, ids = knnkit.knn(data, queries, k=min(k, n), metric=metric, device=device)
    paths = [os.path.join(folder, f) for f in ("data.fbin", "queries.fbin", "groundtruth.ivecs",
                                                "groundtruth.dist.fvecs")]
    for path, arr in zip(paths, (data, queries, ids, dist)):
        io.write(path, np.asarray(arr))
    return paths


# --------------------------------------------------------------------------- demo

def _step(name, fn):
    """Run one demo step; a missing feature (NotImplementedError/AttributeError) is reported and skipped."""
    try:
        return fn()
    except (NotImplementedError, AttributeError) as e:
        _say(f"  {name}: skipped ({type(e).__name__}: {str(e) or 'not implemented yet'})")
        logging.getLogger("knnkit").debug("demo step %s skipped", name, exc_info=True)
        return None


def _rate(count, seconds, unit):
    return f"{count / seconds:,.0f} {unit}/s" if seconds > 0 else f"- {unit}/s"


def cmd_demo(args):
    import knnkit
    from . import datasets
    from .evaluate import Timer, recall, graph_recall
    from ._core.backend import resolve_device

    if args.save:
        n = args.n or 10_000
        d = args.d or 32
        paths = save_samples(args.save, n, d, min(args.queries, n), max(args.k, 100), args.metric, args.seed,
                             args.device)
        _say(f"wrote {n} x {d} data, {min(args.queries, n)} queries and exact ground truth "
             f"(k={min(max(args.k, 100), n)}, {args.metric}): " + ", ".join(paths))
        return 0
    kind, dev_id = resolve_device(args.device)
    on_gpu = kind == "gpu"
    if on_gpu:
        import cupy

        if dev_id is not None:
            cupy.cuda.Device(dev_id).use()   # every step then runs on that GPU with device="gpu"
        dev_id = cupy.cuda.Device().id
    n = args.n or (200_000 if on_gpu else 20_000)
    d = args.d or (128 if on_gpu else 64)
    nq = min(args.queries, n)
    k = min(args.k, n - 1)
    if k < 1:
        raise ValueError("demo needs --n >= 2")
    seed = args.seed
    where = f"GPU {dev_id} ({_gpu_name(dev_id)})" if on_gpu else f"CPU ({os.cpu_count()} cores)"
    _say(f"knnkit {knnkit.__version__} demo on {where}: {n} x {d} clustered float32, {nq} queries, k={k}, "
         f"{args.metric}")

    if not args.no_warmup:
        # compile the Numba functions / CUDA kernels once on a small set, so the times below are steady-state;
        # over 2048 points so that the all-points exact k-NN (which the index build uses) takes its
        # block-symmetric path as it does on the full set
        w = min(n, 2500)
        wx, wq = datasets.make_clustered(w, d, n_queries=min(nq, 50), random_state=seed, device=kind)
        for fn in (lambda: knnkit.knn(wx, wq, k=min(k, w - 1), metric=args.metric, device=kind),
                   lambda: knnkit.knn(wx, k=min(k, w - 1), metric=args.metric, device=kind),
                   lambda: knnkit.knn_graph(wx, k=min(k, w - 1), metric=args.metric, device=kind,
                                            random_state=seed, method="nndescent"),
                   lambda: knnkit.GraphIndex.build(wx, metric=args.metric, device=kind,
                                                   random_state=seed).search(wq, k=min(k, w - 1))):
            try:
                fn()
            except (NotImplementedError, AttributeError, TypeError):
                pass
        _say(f"  (warm-up on {w} points done: JIT/kernel compilation is not counted below)")

    with Timer("data") as t:
        data, queries = datasets.make_clustered(n, d, n_queries=nq, random_state=seed, device=kind)
    _say(f"  data        {t.elapsed:8.3f} s   make_clustered({n}, {d}, n_queries={nq})")

    with Timer("knn") as t:
        _true_d, true_i = knnkit.knn(data, queries, k=k, metric=args.metric, device=kind)
    _say(f"  exact knn   {t.elapsed:8.3f} s   {nq} queries x {n} points ({_rate(nq, t.elapsed, 'queries')}); "
         f"the ground truth below")

    def graph_step():
        kw = {} if args.graph_method == "auto" else {"method": args.graph_method}
        with Timer("knn_graph") as t:
            g = knnkit.knn_graph(data, k=k, metric=args.metric, device=kind, random_state=seed, **kw)
        gi = g[1] if isinstance(g, tuple) else g
        method = (getattr(g, "stats", None) or {}).get("method", args.graph_method)
        r = graph_recall(data, gi, sample=min(1000, n), metric=args.metric, random_state=seed, device=kind)
        _say(f"  knn_graph   {t.elapsed:8.3f} s   k={k} ({method}): recall@{k} {r:.4f} on {min(1000, n)} "
             f"sampled nodes ({_rate(n, t.elapsed, 'points')})")

    _step("knn_graph", graph_step)

    def index_step():
        with Timer("build") as tb:
            index = knnkit.GraphIndex.build(data, metric=args.metric, device=kind, random_state=seed)
        _say(f"  index build {tb.elapsed:8.3f} s   GraphIndex.build ({_rate(n, tb.elapsed, 'points')})")
        index.search(queries[: min(nq, 100)], k=k)   # first-call setup outside the timing
        with Timer("search") as ts:
            _d, found = index.search(queries, k=k)
        _say(f"  search      {ts.elapsed:8.3f} s   {nq} queries ({_rate(nq, ts.elapsed, 'queries')}): "
             f"recall@{k} {recall(found, true_i, k=k):.4f}")

    _step("GraphIndex", index_step)
    return 0


# --------------------------------------------------------------------------- parser

def _add_metric_and_device(p, metrics=None):
    """The --metric and --device options shared by the subcommands."""
    p.add_argument("--metric", default="sqeuclidean", choices=list(metrics or METRICS))
    p.add_argument("--device", type=_device, default="auto", help="auto (default), cpu, gpu or a GPU number")


def build_parser():
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                        help="no progress bars")
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="debug log on stderr (and tracebacks on errors)")

    parser = argparse.ArgumentParser(prog="knnkit", description="Nearest neighbours on NVIDIA GPUs, with a CPU path.")
    # own copies, not parents=[common]: parents share action objects, and a default set here would
    # then leak into the subcommands and overwrite a flag given before the subcommand
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug log on stderr (and tracebacks on errors)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("info", parents=[common], help="versions, backend and GPUs")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("demo", parents=[common], help="run the library on a synthetic data set and report "
                       "times and recalls",
                       description="Make a clustered synthetic data set, compute exact k-NN of queries (ground "
                       "truth), then build a k-NN graph (knnkit.knn_graph) and a graph index "
                       "(knnkit.GraphIndex) and report times and recalls. Default size: 200000 x 128 on a GPU, "
                       "20000 x 64 on the CPU.")
    p.add_argument("--n", type=_positive, default=None, help="data points (default 200000 on GPU, 20000 on CPU)")
    p.add_argument("--d", type=_positive, default=None, help="dimension (default 128 on GPU, 64 on CPU)")
    p.add_argument("--queries", type=_positive, default=1000, help="queries (default 1000)")
    p.add_argument("-k", type=_positive, default=10, help="neighbours (default 10)")
    _add_metric_and_device(p)
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--graph-method", default="auto", choices=["auto", "nndescent", "brute"],
                   help="knn_graph method (default auto: brute force for small n, NN-Descent above)")
    p.add_argument("--no-warmup", action="store_true", help="include compilation in the first timings")
    p.add_argument("--save", metavar="DIR", default=None,
                   help="only write sample files to DIR: data.fbin, queries.fbin (clustered float32, default "
                   "10000 x 32 and 1000 queries), groundtruth.ivecs and groundtruth.dist.fvecs (exact, "
                   "k = max(-k, 100)); every README command line runs on them")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser(
        "knn", parents=[common], help="exact k nearest neighbours of vector files",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Exact k-NN by brute force.\n\n"
        "Output convention: indices go to OUT, whose extension picks the format (.ibin or .ivecs: int32;\n"
        ".npy: int64); distances (float32) go next to it, named OUT's stem + .dist.fbin, .dist.fvecs or\n"
        ".dist.npy respectively. Example: -o res.ibin writes res.ibin and res.dist.fbin.\n\n"
        "DATA (and --queries) may be .fvecs/.ivecs/.bvecs, .fbin/.ibin/.u8bin/.i8bin, .npy, or an\n"
        "ann-benchmarks .hdf5 file (its 'train' set, and its 'test' set as queries unless --queries is\n"
        "given). Without queries, the neighbours of every data point are computed, excluding itself.")
    p.add_argument("data", metavar="DATA", help="data vectors file")
    p.add_argument("--queries", "-Q", metavar="Q", default=None, help="query vectors file")
    p.add_argument("-k", type=_positive, required=True, help="neighbours per query")
    _add_metric_and_device(p)
    p.add_argument("--batch-size", type=_positive, default=None, help="queries per tile (default: from memory)")
    p.add_argument("-o", "--output", metavar="OUT", required=True, help="indices file (.ibin, .ivecs or .npy)")
    p.add_argument("--no-distances", action="store_true", help="do not write the distances file")
    p.set_defaults(func=cmd_knn)

    p = sub.add_parser(
        "graph", parents=[common], help="k-NN graph of a vector file (each point excluding itself)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="k-nearest-neighbour graph of DATA (knnkit.knn_graph: NN-Descent, or brute force for\n"
        "small inputs). Output convention as for `knnkit knn`: indices (int32) to OUT (.ibin, .ivecs or\n"
        ".npy), distances (float32) to OUT's stem + .dist.fbin, .dist.fvecs or .dist.npy.\n\n"
        "With --workdir the file is processed out of core (knnkit.knn_graph_out_of_core: shards and\n"
        "pairwise merges, resumable), for files larger than memory.")
    p.add_argument("data", metavar="DATA", help="data vectors file")
    p.add_argument("-k", type=_positive, required=True, help="neighbours per point")
    _add_metric_and_device(p, metrics=METRICS + ("manhattan",))
    p.add_argument("--method", default="auto", choices=["auto", "nndescent", "brute"],
                   help="auto (default): brute force for small n, NN-Descent above")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--workdir", default=None, help="build out of core, keeping shards and state in this folder")
    p.add_argument("--eval", type=_positive, default=None, metavar="SAMPLE",
                   help="also report recall on SAMPLE random nodes against exact neighbours")
    p.add_argument("-o", "--output", metavar="OUT", required=True, help="indices file (.ibin, .ivecs or .npy)")
    p.add_argument("--no-distances", action="store_true", help="do not write the distances file")
    p.set_defaults(func=cmd_graph)

    p = sub.add_parser("convert", parents=[common], help="convert a vector file to another format",
                       description="Convert between .fvecs/.ivecs/.bvecs, .fbin/.ibin/.u8bin/.i8bin and .npy "
                       "(formats chosen by extension; values must fit the target type). Streams, so files "
                       "larger than memory work.")
    p.add_argument("input", metavar="IN")
    p.add_argument("output", metavar="OUT")
    p.add_argument("--rows", type=_positive, default=None, help="keep only the first ROWS rows")
    p.set_defaults(func=cmd_convert)

    p = sub.add_parser("index", help="build a graph search index into a file, or search one")
    isub = p.add_subparsers(dest="index_command", metavar="{build,search}")
    isub.required = True
    p = isub.add_parser("build", parents=[common], help="build a knnkit.GraphIndex and save it",
                        description="Build a graph search index (knnkit.GraphIndex.build) over DATA (any format "
                        "knnkit.io reads; an ann-benchmarks .hdf5 file's 'train' set) and save it to OUT "
                        "(the knnkit container; knnkit.load(OUT) reads it back).")
    p.add_argument("data", metavar="DATA", help="data vectors file")
    p.add_argument("output", metavar="OUT", help="index file to write (e.g. index.knn)")
    _add_metric_and_device(p)
    p.add_argument("--graph-degree", type=_positive, default=None,
                   help="out-degree of the search graph (default: from the data's intrinsic dimension)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.set_defaults(func=cmd_index_build)
    p = isub.add_parser("search", parents=[common], help="search a saved index",
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        description="k nearest neighbours of QUERIES in a saved index.\n\n"
                        "-o RES.npz writes distances and indices in one file; -o RES.ibin|.ivecs|.npy writes the\n"
                        "indices there and the distances to RES's stem + .dist.fbin|.dist.fvecs|.dist.npy, as\n"
                        "`knnkit knn` does. --groundtruth GT prints recall@k against true ids.")
    p.add_argument("index", metavar="INDEX", help="index file written by `knnkit index build`")
    p.add_argument("queries", metavar="QUERIES", help="query vectors file")
    p.add_argument("-k", type=_positive, default=10, help="neighbours per query (default 10)")
    p.add_argument("--beam", type=_positive, default=None, help="search beam (larger: higher recall, slower)")
    p.add_argument("--device", type=_device, default="auto", help="auto (default), cpu, gpu or a GPU number")
    p.add_argument("--groundtruth", metavar="GT", default=None, help="true neighbour ids (.ivecs/.ibin/.npy)")
    p.add_argument("-o", "--output", metavar="RES", default=None, help="results file (.npz, .ibin, .ivecs or .npy)")
    p.set_defaults(func=cmd_index_search)

    p = sub.add_parser(
        "bench", parents=[common], help="recall against speed of knnkit and its peers on your data",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Build each method on DATA, sweep its search parameter, and report recall@k, queries per\n"
        "second and build time: a table on stdout, DIR/bench.json and DIR/bench.png (recall vs QPS).\n\n"
        "DATA: any format knnkit.io reads, or an ann-benchmarks .hdf5 file (train = data, test =\n"
        "queries, neighbors = ground truth, its metric as default). Without --queries (and no HDF5\n"
        "test set), --n-queries random rows are held out of the data as queries. Without ground\n"
        "truth, exact knnkit.knn computes it. Methods: exact, index (GraphIndex, sweeps beam), graph\n"
        "(knn_graph of the data, recall on sampled nodes), hnswlib (ef), faiss (HNSW efSearch), cuvs\n"
        "(CAGRA itopk_size, GPU); a peer that does not import is skipped with a note.")
    p.add_argument("data", metavar="DATA", help="data vectors file")
    p.add_argument("--queries", "-Q", metavar="Q", default=None, help="query vectors file")
    p.add_argument("--groundtruth", metavar="GT", default=None, help="true neighbour ids (.ivecs/.ibin/.npy)")
    p.add_argument("--metric", default=None, choices=list(METRICS),
                   help="default: the HDF5 file's metric, else sqeuclidean")
    p.add_argument("--device", type=_device, default="auto", help="auto (default), cpu, gpu or a GPU number")
    p.add_argument("--methods", type=_methods, default="exact,index,graph,hnswlib,faiss,cuvs",
                   help="comma-separated (default: all)")
    p.add_argument("-k", "--k", type=_positive, default=10, help="neighbours per query (default 10)")
    p.add_argument("--beams", type=_beams, default=None,
                   help="comma-separated beam / ef / efSearch sweep (default 10,16,24,32,48,64,96,128,192,256)")
    p.add_argument("--n-queries", type=_positive, default=1000,
                   help="queries held out of the data when no query set is given (default 1000, at most n/10)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--out", metavar="DIR", default="bench", help="folder for bench.json and bench.png "
                   "(default ./bench)")
    p.add_argument("--no-plot", action="store_true", help="do not write the PNG (no matplotlib needed)")
    p.set_defaults(func=cmd_bench)
    return parser


def main(argv=None):
    """Entry point of the ``knnkit`` command; returns the exit status (0 on success, 1 on error)."""
    from ._core.config import set_progress, _globals

    args = build_parser().parse_args(argv)
    log = logging.getLogger("knnkit")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("knnkit: %(levelname)s: %(message)s"))
    old_level, old_progress = log.level, _globals["progress"]
    log.addHandler(handler)
    log.setLevel(logging.DEBUG if args.verbose else logging.WARNING)
    if args.quiet:
        set_progress(False)
    try:
        return args.func(args)
    except (ValueError, TypeError, OSError, ImportError, MemoryError, RuntimeError) as e:
        if args.verbose:
            raise
        print(f"knnkit {args.command}: error: {str(e) or type(e).__name__}", file=sys.stderr)
        return 1
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)
        set_progress(old_progress)


if __name__ == "__main__":
    sys.exit(main())
