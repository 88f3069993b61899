"""Where the GPU index build's reverse-edge stage spends its time (issue 11: index build <= 2 s on
1M hard data).

Records the arguments of ``add_reverse_edges_gpu`` in one default GraphIndex build, then times
(CUDA events, median of ``--reps``) its steps on them: ``new_reverse_mask`` (one thread per
edge), ``reverse_candidates`` with the hubs' lists (mask, stable sort of 64-bit keys, scatter),
the first prune (non-hub rows over [forward | reverse]), the hub prune, and the whole stage.

    PYTHONPATH=src python benchmarks/reverse_stage_parts.py --sets broad_d128 --out $OUT
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

import numpy as np  # noqa: E402

import knnkit  # noqa: E402
from knnkit.datasets.suite import robustness_sets  # noqa: E402
from knnkit.index import _prune_gpu, _reverse_gpu  # noqa: E402


def _timed(fn, reps):
    import cupy as cp

    fn()  # warm
    ts = []
    for _ in range(reps):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        ts.append(cp.cuda.get_elapsed_time(e0, e1))
    return round(float(np.median(ts)), 2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", default="full")
    ap.add_argument("--sets", default="broad_d128")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    import cupy as cp

    real = _reverse_gpu.add_reverse_edges_gpu
    rows = []
    for name, X, _Q, metric in robustness_sets(a.scale, names=a.sets.split(","), real=False):
        Xd = cp.asarray(X)
        seen = []

        def recording(X_, graph, graph_dist, R, alpha, metric_, **kw):
            seen.append((X_, cp.array(graph), cp.array(graph_dist), R, alpha, metric_,
                         {k: v for k, v in kw.items() if k != "stats"}))
            return real(X_, graph, graph_dist, R, alpha, metric_, **kw)

        try:  # build_graph_gpu imports it from _reverse_gpu at each call
            _reverse_gpu.add_reverse_edges_gpu = recording
            idx = knnkit.GraphIndex.build(Xd, metric=metric, random_state=0)
        finally:
            _reverse_gpu.add_reverse_edges_gpu = real
        X_, g, gd, R, alpha, metric_, kw = seen[-1]
        cap = int(R if kw.get("cap") is None else kw["cap"])
        stats = {}
        rec = {"set": name, "n": int(g.shape[0]), "R": int(R), "cap": cap, "build_s": idx.build_timings, "ms": {}}
        rec["ms"]["stage"] = _timed(lambda: real(X_, g, gd, R, alpha, metric_, **kw), a.reps)
        real(X_, g, gd, R, alpha, metric_, stats=stats, **kw)
        rec["stage_stats"] = stats
        rec["ms"]["new_reverse_mask"] = _timed(lambda: _prune_gpu.new_reverse_mask(g), a.reps)
        h_cap = int(stats.get("hub_cap") or 0)
        out = {}

        def candidates():
            out["r"] = _reverse_gpu.reverse_candidates(g, gd, cap, hubs_cap=lambda counts: h_cap)

        rec["ms"]["reverse_candidates"] = _timed(candidates, a.reps)
        rev_idx, rev_dist, hubs, ri, rd = out["r"]
        rest = cp.ones(g.shape[0], dtype=cp.bool_)
        rest[hubs] = False
        rows_ = cp.nonzero(rest)[0].astype(cp.int32)
        cand = cp.concatenate([g[rows_], rev_idx[rows_]], axis=1)
        cand_d = cp.concatenate([gd[rows_], rev_dist[rows_]], axis=1)
        shift = kw.get("shift")
        rec["ms"]["first_prune"] = _timed(lambda: _prune_gpu.prune_gpu(X_, cand, cand_d, R, alpha, metric_,
                                                                       shift=shift, node_ids=rows_), a.reps)
        rec["first_rows"] = int(rows_.shape[0])
        if ri is not None:
            hc = cp.concatenate([g[hubs], ri], axis=1)
            hd = cp.concatenate([gd[hubs], rd], axis=1)
            hub_ids = hubs.astype(cp.int32)
            rec["ms"]["hub_prune"] = _timed(lambda: _prune_gpu.prune_gpu(X_, hc, hd, R, alpha, metric_, shift=shift,
                                                                         node_ids=hub_ids), a.reps)
            rec["hubs"] = int(hubs.shape[0])
            rec["hub_C"] = int(hc.shape[1])
        print(json.dumps(rec, default=str), flush=True)
        rows.append(rec)
    env = {"gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
           "argv": ["$OUT" if x == a.out else x for x in sys.argv[1:]]}
    with open(os.path.join(a.out, "reverse_stage_parts.json"), "w") as f:
        json.dump({"env": env, "rows": rows}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
