"""BANG host-placement benchmark (issue 16), for the GPU machine.

Generates N x d float32 clustered vectors on the GPU in streamed batches into a host memory map
under $TMPDIR, computes exact ground truth (knnkit.knn) for the queries, builds a
``GraphIndex(placement="host")`` (graph on the GPU, then kept on the host; PQ trained and encoded on
the GPU), sets the memory budget to 1/8 of graph + vectors, and sweeps the work-list size with
prefetch on/off, re-rank on/off and the search width W (``--widths``): recall@10 vs QPS, per-stage costs, GPU memory held by the
search. Optional peers: the device-placed GraphIndex (--device-peer, when the data fits) and cuVS
IVF-PQ with refinement (when ``cuvs`` imports). Rows are written to JSON as they come.

    PYTHONPATH=src python benchmarks/bang_bench.py --n 2000000 --out $OUT/bang_2m.json
    PYTHONPATH=src python benchmarks/bang_bench.py --n 3000000 --beams 32,64,128 --widths 1,2,4,8 \
        --rerank on --out $OUT/bang_width.json
    PYTHONPATH=src python benchmarks/bang_bench.py --n 3000000 --beams 32,64,128 --widths 4 --prefetch on \
        --rerank on --paths legacy,new,new-host,new-gpuvec --profile --out $OUT/bang_call.json

``--paths``: ``legacy`` is the v2 search path (``_search_gpu.configure(legacy=True)``: per-call
allocations, CuPy table expression, host re-rank after the walk), ``new`` the current one under the
benchmark's memory budget (vectors do not fit: re-rank rows stashed during the walk). Either may be
followed by flags, in any order and combination: ``-host`` the re-rank rows gathered after the walk
(pinned chunks) instead of stashed during it; ``-gpuvec`` the budget lifted for the call (the
vectors fit: re-rank from a device copy); ``-onecall`` every query in one walk
(``MIN_CALL_QUERIES`` set to the query count: the search as it was before it kept to the memory
budget per call); ``-cupy`` the re-rank by CuPy calls instead of its two kernels; ``-f32`` float32
distance tables instead of the bfloat16 default (``_pq.TABLE_BITS``); ``-gemm`` the tables by the
batched GEMM expansion instead of the direct kernel (``_pq.TABLE_METHOD``); ``-mapped`` the graph
and vectors mapped, read by the kernels over PCIe (``configure(access="mapped")``: no host gather,
no round trip per step; the mapping is the first call's, ``mapped_managed_s`` or ``mapped_pinned_s``
in the stages), in managed memory where the device has it, or with ``-pinned`` page-locked in place
(``configure(mapped_memory="pinned")``, the only kind before the thirty-eighth session), and with
``-steps`` walked one launch per kernel per step (``configure(fused_walk=False)``, the mapped walk
before the thirty-ninth session) instead of one ``bang_walk`` launch per batch, and with
``-loadtab`` the fused walk loading tables made by a kernel before it
(``configure(walk_tables=False)``, the fused walk of the thirty-ninth session) instead of each
block making its own; ``-rowsfirst`` the re-rank's rows copied into a buffer before the exact
distances (``_search_gpu.RERANK_ROWS_FIRST``) and ``-einsum`` those distances by CuPy's einsum
(``RERANK_EINSUM``): the re-rank before the fortieth session with both; ``-seedsmem`` the seeds'
GEMM dots selected by ``seed_select``'s shared-memory mode (``knnkit.index._search_gpu.SEED_SELECT_ROWS
= False``, before the forty-second session) instead of ``seed_select_rows``. Every
configuration gets one full-size warm-up call (the cached buffers are made there; CuPy's memory pool
emptied before it, so the timed call reuses its blocks, as repeated calls do), then the timed call
(``-coldpool``: the pool emptied after the warm-up instead, so every temporary of the timed call is
a new ``cudaMalloc``, as every run before the fortieth session measured); ``--profile`` adds a
third, profiled call (per-phase times, device synchronised at phase boundaries) as its own row.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np


def _git_commit():
    try:
        return subprocess.check_output(["git", "rev-parse", "HEAD"], text=True, stderr=subprocess.DEVNULL).strip()
    except Exception:
        return None


def generate(path, n, d, n_queries, seed, batch=1 << 20, n_clusters=1024):
    """Gaussian mixture on a 24-dimensional latent subspace plus noise, made on the GPU batch by batch."""
    import cupy as cp

    rs = cp.random.RandomState(seed)
    latent = min(24, d)
    basis = rs.standard_normal((latent, d), dtype=cp.float32) / np.sqrt(latent)
    centers = rs.standard_normal((n_clusters, latent), dtype=cp.float32) * 2.0
    mm = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, d))

    def rows(m, rstate):
        lab = rstate.randint(0, n_clusters, m)
        z = centers[lab] + 0.5 * rstate.standard_normal((m, latent), dtype=cp.float32)
        return (z @ basis + 0.05 * rstate.standard_normal((m, d), dtype=cp.float32)).astype(cp.float32)

    for s in range(0, n, batch):
        mm[s:s + batch] = cp.asnumpy(rows(min(batch, n - s), cp.random.RandomState(seed + 1 + s // batch)))
    mm.flush()
    Q = cp.asnumpy(rows(n_queries, cp.random.RandomState(seed + 10 ** 6)))
    return np.load(path, mmap_mode="r"), Q


def recall(found, gt_d, X, Q, k):
    """recall@k with ties counted by distance (exact distances of the returned ids)."""
    found = np.asarray(found)
    kth = gt_d[:, k - 1]
    rows = X[np.maximum(found, 0).ravel()].reshape(found.shape[0], found.shape[1], -1).astype(np.float32)
    dist = ((rows - Q[:, None, :]) ** 2).sum(2)
    ok = (found >= 0) & (dist <= kth[:, None] * (1 + 1e-5) + 1e-6)
    return float(ok[:, :k].mean())


def _cumulative_us(pr, n=40):
    """The ``n`` functions of a cProfile run with the most cumulative time, in microseconds (the
    standard listing rounds to milliseconds, too coarse for a 5 ms call)."""
    import pstats

    rows = sorted(pstats.Stats(pr).stats.items(), key=lambda kv: -kv[1][3])[:n]
    out = ["\n cumulative_us  own_us  calls  function"]
    for (file, line, fn), (_cc, nc, tt, ct, _callers) in rows:
        out.append(f"{ct * 1e6:14.0f} {tt * 1e6:7.0f} {nc:6d}  {file}:{line}({fn})")
    return "\n".join(out) + "\n"


def run_cuvs(a, X, Q, Qd, gt_d, pq_bytes, res, dump, when="after"):
    """cuVS IVF-PQ (codes of ``pq_bytes``) + host refine over the same data and queries: rows appended to
    res, tagged ``when`` (before or after knnkit's rows: ``--cuvs-twice`` measures the peer's drift)."""
    import cupy as cp

    try:
        from cuvs.neighbors import ivf_pq, refine

        t = time.perf_counter()
        n_lists = int(min(65536, max(1024, 4 * np.sqrt(a.n))))
        bp = ivf_pq.IndexParams(n_lists=n_lists, pq_dim=pq_bytes, pq_bits=8, metric="sqeuclidean")
        train = cp.asarray(X[np.sort(np.random.default_rng(0).choice(a.n, min(a.n, 1 << 20), replace=False))])
        cv = ivf_pq.build(bp, train)
        del train
        for s in range(0, a.n, 1 << 20):  # the rest added in batches (the data may not fit)
            cv = ivf_pq.extend(cv, cp.asarray(X[s:s + (1 << 20)]), cp.arange(s, min(a.n, s + (1 << 20)), dtype=cp.int64))
        res["stages"][f"cuvs_build_s_{when}" if when != "after" else "cuvs_build_s"] = time.perf_counter() - t
        ivf_pq.search(ivf_pq.SearchParams(n_probes=8), cv, Qd, 4 * a.k)  # warm-up at full size
        cp.cuda.Device().synchronize()
        for n_probes in [int(p) for p in a.cuvs_probes.split(",")]:
            t = time.perf_counter()
            _d, cand = ivf_pq.search(ivf_pq.SearchParams(n_probes=n_probes), cv, Qd, 4 * a.k)
            _d, i = refine(X, Q, cp.asnumpy(cp.asarray(cand)), k=a.k)  # host refine: vectors stay on the host
            cp.cuda.Device().synchronize()
            dt = time.perf_counter() - t
            res["rows"].append({"method": "cuvs-ivfpq+refine", "when": when, "n_probes": n_probes, "qps": a.queries / dt,
                                "recall": recall(np.asarray(i), gt_d, X, Q, a.k)})
            dump()
    except Exception as e:  # noqa: BLE001
        res["cuvs_error"] = f"{type(e).__name__}: {e}"
    finally:
        cv = None  # the peer's index is given back before knnkit's rows
        cp.get_default_memory_pool().free_all_blocks()


PATH_FLAGS = {"onecall", "host", "gpuvec", "cupy", "f32", "gemm", "mapped", "pinned", "steps", "loadtab", "rowsfirst",
              "einsum", "coldpool", "seedsmem"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20_000_000)
    ap.add_argument("--d", type=int, default=96)
    ap.add_argument("--queries", type=int, default=10_000)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--beams", default="16,32,48,64,96,128,192")
    ap.add_argument("--widths", default="4", help="search widths W to sweep (SearchParams.search_width; default the "
                    "library's 4: it was 1 until the twenty-ninth session, so the twenty-eighth session's 20M run walked at W = 1)")
    ap.add_argument("--prefetch", default="on,off", help="prefetch settings to sweep")
    ap.add_argument("--pipeline-batches", default="2",
                    help="numbers of pipelined query batches to sweep (SearchParams.pipeline_batch = "
                         "ceil(queries / this); 2 is the default)")
    ap.add_argument("--rerank", default="on,off", help="re-rank settings to sweep (off: rerank=k)")
    ap.add_argument("--cuvs-probes", default="8,16,32,64,128,256")
    ap.add_argument("--graph-degree", type=int, default=None,
                    help="default: the build's own choice from the data's intrinsic dimension (32 was forced "
                         "before 2026-11-29: on broad data it cost recall 0.95 -> 0.89 at L = 256, CPU 200k)")
    ap.add_argument("--pq-bytes", type=int, default=None)
    ap.add_argument("--data", default="clustered", choices=["clustered", "broad"],
                    help="clustered: 1024 tight clusters in a 24-d subspace (IVF-friendly); broad: "
                         "knnkit.datasets.make_broad_clusters (32 overlapping clusters, full dimension)")
    ap.add_argument("--compression", default=None, choices=["pq", "opq"],
                    help="force PQ or OPQ (default: the library's choice)")
    ap.add_argument("--budget-ratio", type=float, default=8.0,
                    help="search under a memory budget of (graph + vectors) / this")
    ap.add_argument("--build-budget-mb", type=float, default=None,
                    help="memory budget during the build (small: candidate lists out of core)")
    ap.add_argument("--paths", default="new",
                    help="GPU search paths to sweep: legacy or new, each followed by any of the flags -onecall, "
                         "-host, -gpuvec, -cupy, -f32, -gemm, -mapped, -pinned, -steps (module docstring), e.g. new-onecall-host")
    ap.add_argument("--profile", action="store_true", help="a profiled call per configuration (phases)")
    ap.add_argument("--cprofile", action="store_true",
                    help="a call per configuration under cProfile: the host's time per Python function (top 30)")
    ap.add_argument("--busy", action="store_true",
                    help="a call per configuration under torch.profiler: the GPU's busy time (_gpu_busy.py)")
    ap.add_argument("--timeline", action="store_true",
                    help="a call per configuration under torch.profiler with CPU activities: the call's timeline "
                         "(kernels, copies, CUDA API calls, knnkit's host pieces) and the GPU's idle gaps "
                         "(_gpu_busy.gpu_timeline)")
    ap.add_argument("--device-peer", action="store_true", help="also the device-placed GraphIndex")
    ap.add_argument("--no-cuvs", action="store_true")
    ap.add_argument("--cuvs-twice", action="store_true",
                    help="cuVS IVF-PQ also before knnkit's build (the peer's rows of both runs, tagged 'when')")
    ap.add_argument("--no-knnkit", action="store_true",
                    help="the peer only (same data, queries and ground truth; codes of --pq-bytes, default ceil(d / 2))")
    ap.add_argument("--cache", default=None,
                    help="a folder for the data, ground truth and built index: made on the first run, loaded on "
                         "the next (another tree's process measures the same index; its stages say 'cached')")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "bang_bench.json"))
    a = ap.parse_args()

    import cupy as cp

    import knnkit
    from knnkit.index.bang import _pq, _search_gpu
    from knnkit.index import _search_gpu as _seed_gpu
    from knnkit.index.bang._search_gpu import last_stats

    res = {"machine": {"gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "host": platform.node(),
                       "cpus": os.cpu_count()},
           "git_commit": _git_commit(), "stages": {}, "rows": [],
           # the output path as the user wrote it relative to $OUT: no machine path in results
           "params": dict(vars(a), out=os.path.relpath(a.out, os.environ.get("OUT", ".")))}

    def dump():
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)

    tmp = a.cache or tempfile.mkdtemp(dir=os.environ.get("TMPDIR"))
    os.makedirs(tmp, exist_ok=True)
    cached = a.cache is not None and all(os.path.exists(os.path.join(tmp, f)) for f in
                                         ("base.npy", "queries.npy", "gt_d.npy", "index.knnkit"))
    res["stages"]["cached"] = cached
    t = time.perf_counter()
    if cached:
        X, Q = np.load(os.path.join(tmp, "base.npy"), mmap_mode="r"), np.load(os.path.join(tmp, "queries.npy"))
    elif a.data == "broad":
        from knnkit.datasets.suite import make_broad_clusters

        Xb, Q = make_broad_clusters(a.n, a.d, n_queries=a.queries, random_state=1)
        np.save(os.path.join(tmp, "base.npy"), Xb)
        del Xb
        X = np.load(os.path.join(tmp, "base.npy"), mmap_mode="r")
    else:
        X, Q = generate(os.path.join(tmp, "base.npy"), a.n, a.d, a.queries, seed=1)
    res["stages"]["generate_s"] = time.perf_counter() - t
    t = time.perf_counter()
    if cached:
        gt_d = np.load(os.path.join(tmp, "gt_d.npy"))
    else:
        gt_d, _gt_i = knnkit.knn(X, cp.asarray(Q), k=a.k, device="gpu")  # X streamed from the memory map
        gt_d = cp.asnumpy(gt_d)
        if a.cache:
            np.save(os.path.join(tmp, "queries.npy"), Q)
            np.save(os.path.join(tmp, "gt_d.npy"), gt_d)
    res["stages"]["ground_truth_s"] = time.perf_counter() - t
    dump()

    if a.no_knnkit:
        run_cuvs(a, X, Q, cp.asarray(Q), gt_d, a.pq_bytes or -(-a.d // 2), res, dump)
        dump()
        return
    if a.cuvs_twice and not a.no_cuvs:
        # the code length knnkit's build will choose (no budget during the build)
        run_cuvs(a, X, Q, cp.asarray(Q), gt_d, _pq.choose_m(a.n, a.d, pq_bytes=a.pq_bytes), res, dump, when="before")
        dump()
    if a.build_budget_mb is not None:
        knnkit.set_memory_budget(int(a.build_budget_mb * 2 ** 20))
    t = time.perf_counter()
    if cached:
        index = knnkit.GraphIndex.load(os.path.join(tmp, "index.knnkit"), device="gpu")
    else:
        index = knnkit.GraphIndex.build(X, placement="host", device="gpu", random_state=0,
                                        graph_degree=a.graph_degree, pq_bytes=a.pq_bytes, compression=a.compression)
        if a.cache:
            index.save(os.path.join(tmp, "index.knnkit"))
    res["stages"]["build_s" if not cached else "load_s"] = time.perf_counter() - t
    knnkit.set_memory_budget(None)
    res["stages"]["build_params"] = {k: v for k, v in index._engine.build_params.items()
                                     if isinstance(v, (int, float, str, bool, type(None)))}
    res["stages"]["host_check"] = index.build_params.get("host_check")
    res["default_beam"] = index.search_params.beam
    res["stages"]["build_phases_s"] = getattr(index, "build_timings", None) if not cached else None
    res["stages"]["connectivity"] = index._engine.build_params.get("connectivity")
    eng = index._engine
    need = a.n * a.d * 4 + a.n * eng.graph_degree * 4
    budget = int(need / a.budget_ratio)
    knnkit.set_memory_budget(budget)
    res["memory"] = {"graph_plus_vectors_bytes": need, "budget_bytes": budget, "pq_bytes": eng.pq_bytes,
                     "codes_bytes": a.n * eng.pq_bytes}
    res["repr"] = repr(index)
    dump()
    pool = cp.get_default_memory_pool()
    Qd = cp.asarray(Q)
    # one full-size call first: the first call at the full query count paid ~6 s outside the walk
    # (5M run of 2026-11-24), which a 256-query warm-up did not take
    index.search(Qd, k=a.k, beam=int(a.beams.split(",")[0]))
    widths = [int(w) for w in a.widths.split(",")]
    prefetches = [p.strip() == "on" for p in a.prefetch.split(",")]
    reranks = [r.strip() for r in a.rerank.split(",")]
    paths = [p.strip() for p in a.paths.split(",")]
    n_batches = [int(x) for x in a.pipeline_batches.split(",")]
    min_call = _search_gpu.MIN_CALL_QUERIES
    for beam, nb in [(int(b), nb) for b in a.beams.split(",") for nb in n_batches]:
        for width in widths:
            for prefetch in prefetches:
                for rr in reranks:
                    for path in paths:
                        # "legacy" or "new", then any of -onecall -host -gpuvec -cupy -f32 -gemm -mapped -pinned -steps
                        # -loadtab -rowsfirst -einsum -coldpool -seedsmem
                        words = path.split("-")
                        flags = set(words[1:])
                        if words[0] not in ("legacy", "new") or not flags <= PATH_FLAGS:
                            raise SystemExit(f"unknown path {path!r}")
                        _pq.TABLE_BITS = 32 if "f32" in flags else 16  # float32 tables
                        _pq.TABLE_METHOD = "gemm" if "gemm" in flags else "direct"  # tables by the GEMM
                        _search_gpu.RERANK_ROWS_FIRST = "rowsfirst" in flags  # re-rank rows into a buffer first
                        _search_gpu.RERANK_EINSUM = "einsum" in flags  # exact distances by einsum
                        # seeds by seed_select's shared-memory mode (before the forty-second session)
                        _seed_gpu.SEED_SELECT_ROWS = "seedsmem" not in flags
                        _search_gpu.configure(legacy=words[0] == "legacy", profile=False,
                                              rerank_mode="host" if "host" in flags else None,
                                              rerank_kernels="cupy" not in flags,
                                              access="mapped" if "mapped" in flags else "gather",
                                              mapped_memory="pinned" if "pinned" in flags else "auto",
                                              fused_walk="steps" not in flags, walk_tables="loadtab" not in flags)
                        knnkit.set_memory_budget(None if "gpuvec" in flags else budget)
                        # onecall: every query in one walk, as before the per-call memory bound
                        _search_gpu.MIN_CALL_QUERIES = a.queries if "onecall" in flags else min_call
                        sp = knnkit.index.SearchParams(prefetch=prefetch, rerank=None if rr == "on" else a.k,
                                                       search_width=width, pipeline_batch=-(-a.queries // nb))
                        # warm-up at full size: compilation, and the buffers the new path keeps; the
                        # pool emptied before it, so the timed call reuses the warm-up's blocks (the
                        # steady state of repeated calls; gpu_pool_bytes: one call's peak) -- or with
                        # -coldpool after it (every temporary a new cudaMalloc: the bench before s40)
                        pool.free_all_blocks()
                        index.search(Qd, k=a.k, beam=beam, params=sp)
                        if "coldpool" in flags:
                            pool.free_all_blocks()
                        cp.cuda.Device().synchronize()
                        t = time.perf_counter()
                        _d, i = index.search(Qd, k=a.k, beam=beam, params=sp)
                        cp.cuda.Device().synchronize()
                        dt = time.perf_counter() - t
                        row = {"method": "knnkit-host", "path": path, "table_bits": _pq.TABLE_BITS,
                               "table_method": _pq.TABLE_METHOD,
                               "beam": beam, "width": width, "pipeline_batches": nb,
                               "prefetch": prefetch, "rerank": rr, "recall": recall(cp.asnumpy(i), gt_d, X, Q, a.k),
                               "qps": a.queries / dt, "seconds": dt, "gpu_pool_bytes": int(pool.total_bytes()),
                               "gpu_free_bytes": int(cp.cuda.runtime.memGetInfo()[0]),
                               **last_stats()}
                        mp = getattr(index._engine, "_bang_mapped", None)
                        if mp and mp.get("memory") and f"mapped_{mp['memory']}_s" not in res["stages"]:
                            res["stages"][f"mapped_{mp['memory']}_s"] = mp["seconds"]  # first mapped call's cost
                        res["rows"].append(row)
                        print(json.dumps({k: v for k, v in row.items() if k not in ("phases", "gpu_s")}), flush=True)
                        if a.busy:
                            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
                            from _gpu_busy import gpu_busy

                            if "coldpool" in flags:
                                pool.free_all_blocks()
                            busy = gpu_busy(lambda: index.search(Qd, k=a.k, beam=beam, params=sp),
                                            cp.cuda.Device().synchronize)
                            res["rows"].append(dict(row, busy=busy))
                            print(json.dumps({"busy": path, "beam": beam, "width": width, "pipeline_batches": nb, **busy}),
                                  flush=True)
                        if a.timeline:
                            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
                            from _gpu_busy import gpu_timeline

                            try:
                                tl = gpu_timeline(lambda: index.search(Qd, k=a.k, beam=beam, params=sp),
                                                  cp.cuda.Device().synchronize)
                            except Exception as e:  # a measurement aid: its failure is reported, not fatal
                                tl = {"error": f"{type(e).__name__}: {e}"}
                            res.setdefault("timeline", []).append({"path": path, "beam": beam, "width": width, **tl})
                            print(json.dumps({"timeline": path, "beam": beam, **tl.get("summary", tl)}), flush=True)
                        if a.cprofile:
                            import cProfile
                            import io
                            import pstats
                            import site
                            import sysconfig

                            if "coldpool" in flags:
                                pool.free_all_blocks()
                            cp.cuda.Device().synchronize()
                            pr = cProfile.Profile()
                            pr.enable()
                            index.search(Qd, k=a.k, beam=beam, params=sp)
                            cp.cuda.Device().synchronize()
                            pr.disable()
                            buf = io.StringIO()
                            pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(30)
                            buf.write(_cumulative_us(pr))
                            # no machine path in results: the repository and site-packages by name
                            text = buf.getvalue().replace(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "<repo>")
                            for sp_dir in set(site.getsitepackages() + [sysconfig.get_paths()["purelib"]]):
                                text = text.replace(sp_dir, "<site-packages>")
                            res.setdefault("cprofile", []).append({"path": path, "beam": beam, "text": text})
                            print(text, flush=True)
                        if a.profile:
                            _search_gpu.configure(profile=True)
                            if "coldpool" in flags:
                                pool.free_all_blocks()
                            cp.cuda.Device().synchronize()
                            t = time.perf_counter()
                            index.search(Qd, k=a.k, beam=beam, params=sp)
                            cp.cuda.Device().synchronize()
                            dt = time.perf_counter() - t
                            _search_gpu.configure(profile=False)
                            prow = dict(row, profiled=True, qps=a.queries / dt, seconds=dt, **last_stats())
                            res["rows"].append(prow)
                            print(json.dumps({"profiled": path, "beam": beam, "phases": prow.get("phases"),
                                              "gpu_s": prow.get("gpu_s")}), flush=True)
                        dump()
    _search_gpu.configure(legacy=False, profile=False, rerank_mode=None, rerank_kernels=True, access="gather")
    _search_gpu.MIN_CALL_QUERIES = min_call
    _pq.TABLE_BITS, _pq.TABLE_METHOD = 16, "direct"
    knnkit.set_memory_budget(budget)
    index._engine.release_gpu_buffers()
    if a.device_peer:
        try:
            knnkit.set_memory_budget(None)
            dev = knnkit.GraphIndex.build(cp.asarray(X), device="gpu", random_state=0, graph_degree=a.graph_degree,
                                          calibrate=False)
            for beam in [int(b) for b in a.beams.split(",")]:
                dev.search(Qd[:256], k=a.k, beam=beam)
                cp.cuda.Device().synchronize()
                t = time.perf_counter()
                _d, i = dev.search(Qd, k=a.k, beam=beam)
                cp.cuda.Device().synchronize()
                dt = time.perf_counter() - t
                res["rows"].append({"method": "knnkit-device", "beam": beam, "qps": a.queries / dt,
                                    "recall": recall(cp.asnumpy(i), gt_d, X, Q, a.k)})
                dump()
            del dev
        except Exception as e:  # noqa: BLE001 - a peer's failure is a result, not a crash
            res["device_peer_error"] = f"{type(e).__name__}: {e}"
        pool.free_all_blocks()
    if not a.no_cuvs:
        run_cuvs(a, X, Q, Qd, gt_d, eng.pq_bytes, res, dump)
    dump()
    print(json.dumps({k: v for k, v in res.items() if k != "rows"}, indent=1, default=str))


if __name__ == "__main__":
    main()
