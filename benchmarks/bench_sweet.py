"""Benchmark of Sweet KNN (knnkit.exact.sweet) against the GEMM exact path and other libraries.

    PYTHONPATH=src python benchmarks/bench_sweet.py --device gpu [--quick] [--out DIR]
    PYTHONPATH=src python benchmarks/bench_sweet.py --device cpu [--quick] [--out DIR]

Cases: the skin data set (``skin_rgb_u8.npy``, 245,057 x 3 uint8, under ``$KNNKIT_DATA/skin/``
or ``../shared/data/skin/`` relative to the repository root) and synthetic uniform and
clustered data at d = 2, 3, 8, 16, 32, 64; k = 1, 20, 100; the all-points join and a separate
query set. GPU: sweet vs ``knnkit.exact._gpu.knn_gpu`` (GEMM) and cuVS ``brute_force`` when it
imports. CPU: sweet vs scipy ``cKDTree(workers=-1)`` (build included) and sklearn
``NearestNeighbors`` (``n_jobs=-1``, auto algorithm, fit included). Every method runs once
untimed first; times are the median of ``--repeats`` synchronised runs (one run after a first
run longer than ``SLOW_S``). Sweet's distances are
checked against the GEMM path (max relative difference of the k-th distance) on every case.
Writes ``bench_sweet_<device>.json`` under ``--out`` (default ``$OUT``, else the current folder).
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

import knnkit  # noqa: E402
from knnkit.exact.sweet import SweetParams, sweet_knn  # noqa: E402


def find_skin():
    roots = [os.environ.get("KNNKIT_DATA"), os.path.join(HERE, "..", "..", "shared", "data")]
    for r in roots:
        if r and os.path.exists(os.path.join(r, "skin", "skin_rgb_u8.npy")):
            return os.path.join(r, "skin", "skin_rgb_u8.npy")
    return None


def uniform(n, dim, seed):
    return np.random.default_rng(seed).random((n, dim), dtype=np.float32)


def clustered(n, dim, seed, n_clusters=100):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_clusters, dim)).astype(np.float32) * 4
    return (centres[rng.integers(0, n_clusters, n)] + rng.standard_normal((n, dim)).astype(np.float32) * 0.5
            ).astype(np.float32)


def hardware(device):
    info = {"platform": platform.platform(), "python": sys.version.split()[0], "cpu_count": os.cpu_count()}
    try:
        info["cpu"] = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if "model name" in line)
    except Exception:
        pass
    try:
        import numba

        info["numba_threads"] = numba.get_num_threads()
    except Exception:
        pass
    if device == "gpu":
        import cupy as cp

        p = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
        info["gpu"] = p["name"].decode() if isinstance(p["name"], bytes) else p["name"]
        info["cupy"] = cp.__version__
    try:
        info["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                        cwd=HERE).stdout.strip()
    except Exception:
        pass
    return info


#: a method whose untimed first run takes longer than this is timed once, not ``--repeats`` times
#: (the first run of a case may compile kernels: s13's parts 2-3 took it as the time and recorded
#: compilation):
#: Sweet KNN forced on 16-64-d data takes seconds per run, which cut the full GPU sweep at 360 s
SLOW_S = 1.0


def timed(fn, repeats, sync):
    t = time.perf_counter()
    out = fn()  # warm-up (compilation, caches)
    sync()
    if time.perf_counter() - t > SLOW_S:  # one timed run (the first may have compiled kernels)
        repeats = 1
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        sync()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts)), out


def cases(quick, device, n=None):
    """(name, X, Q or None, k list); ``n`` overrides the synthetic sets' size."""
    out = []
    skin = find_skin()
    if skin is not None:
        S = np.load(skin).astype(np.float32)
        out.append(("skin", S, None, [1, 20] if quick else [1, 20, 100]))
        if not quick:
            rng = np.random.default_rng(7)
            out.append(("skin_queries10k", S, S[rng.choice(S.shape[0], 10000, replace=False)] + 0.5, [20]))
    else:
        print("skin data not found (set KNNKIT_DATA); skipping it", file=sys.stderr)
    if n is None and device == "gpu":
        n = 200_000 if quick else 500_000
    elif n is None:
        n = 50_000 if quick else 200_000
    dims = [3, 8] if quick else [2, 3, 8, 16, 32, 64]
    for dim in dims:
        ks = [20] if quick else [1, 20, 100]
        out.append((f"uniform_d{dim}", uniform(n, dim, dim), None, ks))
        out.append((f"clustered_d{dim}", clustered(n, dim, dim), None, ks))
    nq = 10_000
    out.append(("uniform_d3_queries", uniform(n, 3, 1), uniform(nq, 3, 2), [20]))
    out.append(("clustered_d8_queries", clustered(n, 8, 3), clustered(nq, 8, 3)[::-1].copy() + 0.1, [20]))
    return out


def run(args, save):
    gpu = args.device == "gpu"
    if gpu:
        import cupy as cp

        from knnkit.exact._gpu import knn_gpu

        sync = cp.cuda.Device().synchronize
        try:
            from cuvs.neighbors import brute_force
        except Exception:
            brute_force = None
    else:
        sync = lambda: None  # noqa: E731
        from scipy.spatial import cKDTree
        from sklearn.neighbors import NearestNeighbors

        from knnkit.exact._cpu import knn_cpu
    results = []

    def time_api(rec, methods, Xd, Qd, k, all_points):
        # the public entry, each method ("auto" must stay within 10 % of the better of the other two)
        # "auto_gate" / "auto_nogate": method="auto" with knnkit.api.exact.SWEET_AUTO_GATE on / off
        # (the estimate inside Sweet KNN's own run, or a separate one first); "auto": the default
        from knnkit.api import exact as api_exact

        for meth in methods:
            gate0 = api_exact.SWEET_AUTO_GATE
            api_exact.SWEET_AUTO_GATE = {"auto_gate": True, "auto_nogate": False}.get(meth, gate0)
            try:
                rec["times_s"][f"api_{meth}"] = timed(
                    lambda meth=meth: knnkit.knn(Xd, None if all_points else Qd, k=k,
                                                 method="auto" if meth.startswith("auto") else meth),
                    args.repeats, sync)[0]
            finally:
                api_exact.SWEET_AUTO_GATE = gate0

    only = None if args.cases is None else set(args.cases.split(","))
    for name, X, Q, ks in cases(args.quick, args.device, args.n):
        if only is not None and name not in only:
            continue
        all_points = Q is None
        if gpu:
            Xd = cp.asarray(X)
            Qd = Xd if all_points else cp.asarray(Q)
        else:
            Xd, Qd = X, (X if all_points else Q)
        for k in (ks if args.ks is None else [int(v) for v in args.ks.split(",")]):
            rec = {"case": name, "n": int(X.shape[0]), "m": int((X if all_points else Q).shape[0]),
                   "dim": int(X.shape[1]), "k": k, "all_points": all_points, "times_s": {}}
            try:
                if args.api_only:
                    # only these methods through knnkit.knn (no engine calls, no distance check)
                    time_api(rec, args.api_only.split(","), Xd, Qd, k, all_points)
                    print(json.dumps({a: rec.get(a) for a in ("case", "dim", "k", "times_s")}), flush=True)
                    results.append(rec)
                    save(results)
                    continue
                if gpu:
                    t, (d, i, stats) = timed(lambda: sweet_knn(Xd, Qd, k, metric="l2", exclude_self=all_points),
                                            args.repeats, sync)
                    rec["times_s"]["sweet"] = t
                    tg, (dg, ig) = timed(lambda: knn_gpu(Xd, Qd, k, "l2", all_points), args.repeats, sync)
                    rec["times_s"]["gemm"] = tg
                    time_api(rec, ("auto", "sweet", "gemm"), Xd, Qd, k, all_points)
                    dk, dgk = d[:, -1].get(), dg[:, -1].get()
                    if brute_force is not None:
                        try:
                            def cuvs_run():
                                idx = brute_force.build(Xd, metric="sqeuclidean")
                                return brute_force.search(idx, Qd, k + (1 if all_points else 0))
                            rec["times_s"]["cuvs_brute_force"] = timed(cuvs_run, args.repeats, sync)[0]
                        except Exception as e:  # a cuVS API difference must not lose the rest
                            rec["cuvs_error"] = repr(e)
                    rec["speedup_vs_gemm"] = tg / t
                else:
                    t, (d, i, stats) = timed(lambda: sweet_knn(X, X if all_points else Q, k, metric="l2",
                                                               exclude_self=all_points), args.repeats, sync)
                    rec["times_s"]["sweet"] = t
                    kq = k + (1 if all_points else 0)
                    Qh = X if all_points else Q
                    rec["times_s"]["ckdtree"] = timed(lambda: cKDTree(X).query(Qh, kq, workers=-1), args.repeats,
                                                      sync)[0]
                    if not args.quick or X.shape[1] <= 8:
                        rec["times_s"]["sklearn"] = timed(
                            lambda: NearestNeighbors(n_neighbors=kq, n_jobs=-1).fit(X).kneighbors(Qh),
                            1, sync)[0]
                    if args.gemm_cpu:
                        tg, (dg, ig) = timed(lambda: knn_cpu(X, Qh, k, "l2", all_points), 1, sync)
                        rec["times_s"]["gemm_cpu"] = tg
                        dgk = dg[:, -1]
                    else:
                        # reference k-th distance from the tree (Euclidean -> squared)
                        dd, _ = cKDTree(X).query(Qh, kq, workers=-1)
                        dgk = (dd[:, -1] ** 2).astype(np.float32)
                    dk = d[:, -1]
                    rec["speedup_vs_ckdtree"] = rec["times_s"]["ckdtree"] / t
                rel = np.abs(dk.astype(np.float64) - dgk) / np.maximum(np.abs(dgk), 1e-30)
                rec["kth_distance_max_rel_diff"] = float(rel.max())
                rec["sweet_stats"] = {a: b for a, b in stats.items()}
            except Exception as e:
                rec["error"] = repr(e)
            print(json.dumps({a: rec.get(a) for a in ("case", "dim", "k", "times_s", "error")}), flush=True)
            results.append(rec)
            save(results)  # a killed run keeps what it measured
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cpu", "gpu"], default="gpu")
    ap.add_argument("--quick", action="store_true", help="a subset that runs in a few minutes")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gemm-cpu", action="store_true", help="also time knnkit's CPU GEMM path (slow on few cores)")
    ap.add_argument("--cases", default=None, help="comma-separated case names (default: all)")
    ap.add_argument("--api-only", default=None,
                    help="time only these knnkit.knn methods (e.g. auto,gemm; auto_gate / auto_nogate = auto "
                         "with SWEET_AUTO_GATE on / off), nothing else")
    ap.add_argument("--n", type=int, default=None, help="size of the synthetic sets (default by device / quick)")
    ap.add_argument("--ks", default=None, help="comma-separated k values instead of each case's own")
    ap.add_argument("--tag", default="", help="suffix of the output file name")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    t0 = time.time()
    doc = {"benchmark": "bench_sweet", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "device": args.device, "quick": args.quick, "repeats": args.repeats,
           "params": repr(SweetParams()), "hardware": hardware(args.device)}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"bench_sweet_{args.device}{'_quick' if args.quick else ''}{args.tag}.json")

    def save(results):
        doc["results"] = results
        doc["wall_s"] = time.time() - t0
        with open(path, "w") as f:
            json.dump(doc, f, indent=1, default=float)

    save(run(args, save))
    print(f"wrote {os.path.basename(path)}", file=sys.stderr)


if __name__ == "__main__":
    main()
