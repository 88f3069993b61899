"""The connectivity stage of a GPU index build, kernel path (``connect.cu``) against the old path
(``_connect.GPU_KERNELS = False``: host union-find, CuPy gathers for the edge lengths, host copy
and host BFS in the repair), on the same machine and process (issue 11: build <= 2 s at 1M).

1. ``build``: 1M x 128 ``make_broad_clusters(random_state=0)`` index builds, new / old / new,
   each build's phase timings (``connectivity`` is the stage) and its connectivity stats.
2. ``stage``: ``_engine._connect`` on the built graph, old and new alternating (3 each), and its
   parts timed one by one (GPU synchronised around each): graph to host, host union-find,
   kernel components, short-edge components both ways, kernel reach count, host BFS; labels,
   counts and stats compared between the paths.
3. ``random_graph``: a random 1M x 64 graph (uniform ids): kernel components / BFS against the
   host union-find / BFS (times, equality, BFS levels).
4. ``uniform``: optional (``--uniform``) 1M x 128 ``make_uniform_cube`` builds, new and old.

    PYTHONPATH=src python benchmarks/conn_gpu_bench.py --out $OUT [--uniform]
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

import numpy as np  # noqa: E402

import knnkit  # noqa: E402
from knnkit.index import _connect as conn  # noqa: E402
from knnkit.index import _connect_gpu as cg  # noqa: E402
from knnkit.index import _engine  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--uniform", action="store_true")
    a = ap.parse_args()
    import cupy as cp

    sync = cp.cuda.Device().synchronize
    res = {"gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "n": a.n}
    path = os.path.join(a.out, "conn_gpu.json")

    def dump():
        with open(path, "w") as f:
            json.dump(res, f, indent=1, default=str)

    def timed(fn, *args, **kw):
        sync()
        t = time.perf_counter()
        out = fn(*args, **kw)
        sync()
        return out, round(time.perf_counter() - t, 4)

    def log(key, val):
        res[key] = val
        print(key, json.dumps(val, default=str), flush=True)
        dump()

    from knnkit.datasets.suite import make_broad_clusters, make_uniform_cube

    t = time.perf_counter()
    X = cp.asarray(make_broad_clusters(a.n, 128, random_state=0))
    res["data_seconds"] = round(time.perf_counter() - t, 2)
    for flag in (True, False):   # compile every kernel of both paths outside the timings
        conn.GPU_KERNELS = flag
        knnkit.GraphIndex.build(X[:20000], metric="sqeuclidean", random_state=0)
    sync()

    # 1. whole builds, new / old / new
    builds = []
    index = None
    for flag in (True, False, True):
        conn.GPU_KERNELS = flag
        idx, s = timed(knnkit.GraphIndex.build, X, metric="sqeuclidean", random_state=0)
        row = {"path": "kernels" if flag else "old", "build_seconds": s,
               "phases": {k: round(v, 4) for k, v in idx.build_timings.items()},
               "connectivity": idx.build_params.get("connectivity")}
        builds.append(row)
        log("build", builds)
        if flag:
            index = idx
    conn.GPU_KERNELS = True

    # 2. the stage alone on the built graph
    eng = index._engine
    Xp, g0, entry = eng._X, eng._graph, eng._entry
    im = "l2"
    stage = {"runs": []}
    for rep in range(3):
        for flag in (False, True):
            conn.GPU_KERNELS = flag
            (g2, e2, st), s = timed(_engine._connect, Xp, g0.copy(), entry, im)
            stage["runs"].append({"path": "kernels" if flag else "old", "seconds": s,
                                  "graph_unchanged": bool((g2 == g0).all()), "entries": len(e2),
                                  **{k: v for k, v in st.items() if "seconds" not in k}})
    conn.GPU_KERNELS = True
    parts = {}
    gh, parts["graph_to_host"] = timed(g0.get)
    (lab_h, c_h), parts["host_union_find"] = timed(conn.components, gh)
    (lab_k, c_k), parts["kernel_components"] = timed(conn.components, g0)
    parts["labels_equal"] = bool(c_h == c_k and np.array_equal(lab_k.get(), lab_h))
    parts["components"] = int(c_k)
    _, parts["kernel_edge_sqdist"] = timed(cg.edge_sqdist, Xp, g0)
    (soft_k, cs_k), parts["short_edge_kernels"] = timed(conn.short_edge_components, Xp, g0, im,
                                                        components_of=(lab_k, c_k))
    conn.GPU_KERNELS = False
    (soft_o, cs_o), parts["short_edge_old"] = timed(conn.short_edge_components, Xp, g0, im,
                                                    components_of=(lab_h, c_h))
    conn.GPU_KERNELS = True
    parts["short_edge_components"] = [int(cs_k), int(cs_o)]
    med = np.unique(np.asarray(entry.medoids.get() if hasattr(entry.medoids, "get") else entry.medoids))
    reached, parts["kernel_reach_count"] = timed(cg.reach_count, g0, med)
    parent = np.empty(gh.shape[0], np.int64)
    reached_h, parts["host_bfs"] = timed(conn._bfs_tree, gh, med.astype(np.int64), parent,
                                         np.empty(gh.shape[0], np.int64))
    parts["reached"] = [reached, int(reached_h)]
    stage["parts"] = parts
    log("stage", stage)

    # 3. a random 1M x 64 graph
    rng = np.random.default_rng(0)
    gr = rng.integers(0, a.n, (a.n, 64), dtype=np.int32)
    grd = cp.asarray(gr)
    rnd = {}
    conn.components(grd)
    (lk, ck), rnd["kernel_components"] = timed(conn.components, grd)
    (lh, chh), rnd["host_union_find"] = timed(conn.components, gr)
    rnd["labels_equal"] = bool(ck == chh and np.array_equal(lk.get(), lh))
    (bits, cnt), rnd["kernel_bfs"] = timed(cg.reach_bits, grd, np.array([0]))
    parent = np.empty(a.n, np.int64)
    cnt_h, rnd["host_bfs"] = timed(conn._bfs_tree, gr, np.array([0], np.int64), parent, np.empty(a.n, np.int64))
    rnd["reached"] = [cnt, int(cnt_h)]
    _, rnd["graph_to_host"] = timed(grd.get)
    log("random_graph", rnd)
    del grd, gr

    # 4. uniform 1M x 128 (optional)
    if a.uniform:
        X = cp.asarray(make_uniform_cube(a.n, 128, random_state=0))
        rows = []
        for flag in (True, False):
            conn.GPU_KERNELS = flag
            idx, s = timed(knnkit.GraphIndex.build, X, metric="sqeuclidean", random_state=0)
            rows.append({"path": "kernels" if flag else "old", "build_seconds": s,
                         "phases": {k: round(v, 4) for k, v in idx.build_timings.items()},
                         "connectivity": idx.build_params.get("connectivity")})
            log("uniform", rows)
        conn.GPU_KERNELS = True

    ok = parts["labels_equal"] and rnd["labels_equal"] and cs_k == cs_o and reached == reached_h \
        and rnd["reached"][0] == rnd["reached"][1]
    old = [r for r in stage["runs"] if r["path"] == "old"]
    new = [r for r in stage["runs"] if r["path"] == "kernels"]
    strip = lambda r: {k: v for k, v in r.items() if k not in ("path", "seconds")}  # noqa: E731
    ok = ok and all(strip(r) == strip(old[0]) for r in old + new)
    log("equal", bool(ok))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
