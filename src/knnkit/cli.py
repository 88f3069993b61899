"""The ``knnkit`` command (also ``python -m knnkit``).

Subcommands:

- ``knnkit info``: versions, backend, GPUs.
- ``knnkit demo``: a synthetic data set through exact k-NN, a k-NN graph and a graph index, with
  times and recalls; the quickest way to see what the library does on this machine.
- ``knnkit knn DATA -k K -o OUT``: exact k-NN of vector files.
- ``knnkit graph DATA -k K -o OUT``: k-NN graph of a vector file (in memory or out of core).
- ``knnkit convert IN OUT``: change a vector file's format (or take its first rows).
- ``knnkit index build DATA OUT`` / ``knnkit index search INDEX QUERIES``: a saved graph index.
- ``knnkit demo --save DIR`` also writes sample files (data.fbin, queries.fbin, groundtruth.ivecs).

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


# --------------------------------------------------------------------------- index

def cmd_index_build(args):
    import knnkit
    from .evaluate import Timer

    data, _ = _read_input(args.data)
    with Timer("build") as t:
        index = knnkit.GraphIndex.build(data, metric=args.metric, device=args.device, graph_degree=args.graph_degree,
                                        entry=args.entry, random_state=args.seed)
    index.save(args.output)
    _say(f"index: {index.n} x {index.dim} ({args.metric}), graph degree {index.graph_degree}, default beam "
         f"{index.search_params.beam}, built in {t.elapsed:.3f} s; wrote {args.output}")
    return 0


def cmd_index_search(args):
    import knnkit
    from . import io
    from .evaluate import Timer, recall

    index = knnkit.load(args.index, device=args.device)
    queries, _ = _read_input(args.queries)
    kw = {"target_recall": args.target_recall} if args.target_recall is not None else {"beam": args.beam}
    index.search(queries[: min(len(queries), 100)], k=args.k, **kw)  # first call compiles: outside the timing
    with Timer("search") as t:
        d, i = index.search(queries, k=args.k, **kw)
    from ._core.backend import as_host

    d, i = np.asarray(as_host(d)), np.asarray(as_host(i))
    line = f"search: {len(queries)} queries, k={args.k}, {len(queries) / max(t.elapsed, 1e-9):,.0f} queries/s"
    if args.groundtruth:
        gt = io.read(args.groundtruth)
        if gt.shape[0] != i.shape[0] or gt.shape[1] < args.k:
            raise ValueError(f"{args.groundtruth}: shape {gt.shape} does not match {i.shape[0]} queries x k={args.k}")
        line += f", recall@{args.k} {recall(i, gt[:, :args.k], k=args.k):.4f}"
    _say(line)
    if args.output:
        dist_out = distances_path(args.output)
        io.write(args.output, i.astype(np.int64 if args.output.endswith(".npy") else np.int32))
        io.write(dist_out, d.astype(np.float32))
        _say(f"wrote indices to {args.output}, distances to {dist_out}")
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
    n, d = _copy_vectors(args.input, args.output, args.rows)
    _say(f"wrote {n} x {d} to {args.output}")
    return 0


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
        # compile the Numba functions / CUDA kernels once on a small set, so the times below are steady-state
        w = min(n, 2000)
        wx, wq = datasets.make_clustered(w, d, n_queries=min(nq, 50), random_state=seed, device=kind)
        for fn in (lambda: knnkit.knn(wx, wq, k=min(k, w - 1), metric=args.metric, device=kind),
                   lambda: knnkit.knn_graph(wx, k=min(k, w - 1), metric=args.metric, device=kind,
                                            random_state=seed, method="nndescent"),
                   lambda: knnkit.GraphIndex.build(wx, metric=args.metric, device=kind,
                                                   random_state=seed).search(wq, k=min(k, w - 1))):
            try:
                fn()
            except (NotImplementedError, AttributeError, TypeError):
                pass
        _say("  (warm-up on 2000 points done: JIT/kernel compilation is not counted below)")

    with Timer("data") as t:
        data, queries = datasets.make_clustered(n, d, n_queries=nq, random_state=seed, device=kind)
    _say(f"  data        {t.elapsed:8.3f} s   make_clustered({n}, {d}, n_queries={nq})")

    with Timer("knn") as t:
        _true_d, true_i = knnkit.knn(data, queries, k=k, metric=args.metric, device=kind)
    _say(f"  exact knn   {t.elapsed:8.3f} s   {nq} queries x {n} points ({_rate(nq, t.elapsed, 'queries')}); "
         f"the ground truth below")
    if args.save:
        from . import io
        from ._core.backend import as_host

        os.makedirs(args.save, exist_ok=True)
        files = {"data.fbin": as_host(data), "queries.fbin": as_host(queries),
                 "groundtruth.ivecs": np.asarray(as_host(true_i), dtype=np.int32)}
        for name, arr in files.items():
            io.write(os.path.join(args.save, name), np.ascontiguousarray(arr))
        _say(f"  wrote {', '.join(files)} to {args.save}")

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
                   help="also write the data set as DIR/data.fbin, DIR/queries.fbin and DIR/groundtruth.ivecs")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("index", parents=[common], help="build or search a graph index (knnkit.GraphIndex)")
    isub = p.add_subparsers(dest="index_command", metavar="ACTION")
    isub.required = True
    q = isub.add_parser("build", parents=[common], help="build an index of a vector file and save it",
                        description="GraphIndex.build on DATA (any vector file knnkit.io reads), saved to OUT "
                        "(the knnkit container; load it with knnkit.load or `knnkit index search`).")
    q.add_argument("data", metavar="DATA")
    q.add_argument("output", metavar="OUT", help="index file to write (e.g. index.knnk)")
    _add_metric_and_device(q)
    q.add_argument("--graph-degree", type=_positive, default=None, help="out-degree (default: from the data)")
    q.add_argument("--entry", choices=["kmeans", "hierarchy"], default="kmeans", help="entry structure")
    q.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    q.set_defaults(func=cmd_index_build)
    q = isub.add_parser("search", parents=[common], help="search a saved index",
                        description="k nearest neighbours of QUERIES in the saved index. Output convention as for "
                        "`knnkit knn`: indices to OUT (.ibin, .ivecs or .npy), distances next to it.")
    q.add_argument("index", metavar="INDEX")
    q.add_argument("queries", metavar="QUERIES")
    q.add_argument("-k", type=_positive, default=10, help="neighbours per query (default 10)")
    q.add_argument("--beam", type=_positive, default=None, help="candidate list size (default: the index's)")
    q.add_argument("--target-recall", type=float, default=None, help="pick the beam from the index's calibration")
    q.add_argument("--device", type=_device, default="auto", help="auto (default), cpu, gpu or a GPU number")
    q.add_argument("--groundtruth", metavar="GT", default=None, help="ground-truth indices file: report recall@k")
    q.add_argument("-o", "--output", metavar="OUT", default=None, help="indices file (.ibin, .ivecs or .npy)")
    q.set_defaults(func=cmd_index_search)

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
