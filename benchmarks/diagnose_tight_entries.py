"""Why do 1M tight-cluster sets plateau on the GPU (issue 11)? tight_c10000 at 1M: max recall 0.968
with 8,664 entries for 10,000 clusters; tight_c1000: 0.947 with 1,325 entries.

Builds the default GPU index, finds the queries that fail at a large beam, and asks of each: was a
seed in its cluster (best seed distance against the true 10th distance), where did the search end
(found 1st distance against the true 1st). Then counts the short-edge components of the search
graph under two scales for "long" (the row's median edge, today's rule, and the row's shortest
positive edge) and searches again with one entry per component under each rule.

    PYTHONPATH=src python benchmarks/diagnose_tight_entries.py --sets tight_c10000,tight_c1000 --out $OUT/diag_tight.json
"""

import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

import knnkit  # noqa: E402
from knnkit.datasets.suite import robustness_sets  # noqa: E402


def host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def per_query_recall(I, D_true, Dfound, k=10):
    thr = D_true[:, k - 1:k] * (1 + 1e-5) + 1e-12
    return (Dfound[:, :k] <= thr).sum(1) / k


def soft_components(X, g, rule, factor=64.0):
    import cupy as cp

    from knnkit.index._connect import components

    n, R = g.shape
    dist = cp.empty((n, R), cp.float32)
    for s in range(0, n, 8192):
        gb = g[s:s + 8192]
        valid = (gb >= 0) & (gb < n)
        d = ((X[cp.where(valid, gb, 0)] - X[s:s + 8192, None, :]) ** 2).sum(axis=2)
        dist[s:s + 8192] = cp.where(valid, d, cp.nan)
    if rule == "median":
        sc = cp.nanmedian(dist, axis=1)
    else:
        pos = cp.where(dist > 0, dist, cp.nan)
        sc = cp.nanmin(pos, axis=1)
    sc = cp.where(cp.isnan(sc), 0, sc)
    gi = cp.where((g >= 0) & (g < n), g, 0)
    scale = cp.maximum(sc[:, None], sc[gi])
    long_ = (dist > factor * scale) & (sc[:, None] > 0) & (sc[gi] > 0)
    short = cp.where(long_, -1, g).astype(cp.int32)
    return components(host(short)), float(host(long_.sum())) / max(1, int(host((g >= 0).sum())))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sets", default="tight_c10000,tight_c1000")
    ap.add_argument("--scale", default="full")
    ap.add_argument("--beams", default="128,512")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    import cupy as cp

    from knnkit.index._connect import combine_entry_points, entry_points_per_component
    from knnkit.index._entry import build_entry_points

    res = {}
    for name, X, Q, _metric in robustness_sets(a.scale, names=a.sets.split(","), real=False):
        t = time.perf_counter()
        idx = knnkit.GraphIndex.build(cp.asarray(X))
        cp.cuda.Device().synchronize()
        r = {"build_s": round(time.perf_counter() - t, 2), "stats": {k: v for k, v in idx.build_params.items()}}
        Qg = cp.asarray(Q)
        Dt, It = knnkit.knn(cp.asarray(X), Qg, k=10)
        Dt = host(Dt)
        eng = idx._engine
        for beam in [int(b) for b in a.beams.split(",")]:
            D, I = idx.search(Qg, 10, beam=beam)
            pr = per_query_recall(host(I), Dt, host(D))
            r[f"recall_beam{beam}"] = float(pr.mean())
        fail = np.flatnonzero(pr < 0.5)
        r["failing"] = int(fail.size)
        if fail.size:
            seeds = host(eng._entry.seeds_for(Qg[cp.asarray(fail)], 8))
            Xh = eng._X
            sd = []
            for j, qi in enumerate(fail[:2000]):
                ss = seeds[j][seeds[j] >= 0]
                dd = host(((Xh[cp.asarray(ss)] - Qg[int(qi)]) ** 2).sum(1))
                sd.append(float(dd.min() / max(Dt[qi, 9], 1e-30)))
            sd = np.array(sd)
            found1 = host(D)[fail, 0] / np.maximum(Dt[fail, 0], 1e-30)
            r["fail_best_seed_over_true10"] = np.percentile(sd, [10, 50, 90]).round(2).tolist()
            r["fail_seed_in_cluster_frac"] = float((sd < 4).mean())
            r["fail_found1_over_true1"] = np.percentile(found1, [10, 50, 90]).round(2).tolist()
        km = build_entry_points(eng._X, 1000, eng._imetric, random_state=0)
        for rule in ("median", "min"):
            (lab, c), frac_long = soft_components(eng._X, eng._graph, rule)
            med, cen = entry_points_per_component(cp.asarray(lab), eng._X, metric=eng._imetric)
            saved = eng._entry
            eng._entry = combine_entry_points(km, med, cen)
            D2, I2 = idx.search(Qg, 10, beam=512)
            pr2 = per_query_recall(host(I2), Dt, host(D2))
            eng._entry = saved
            r[f"soft_{rule}"] = {"components": int(c), "long_edge_frac": round(frac_long, 5),
                                 "entries": int(len(med)) + 1000, "recall_beam512": float(pr2.mean())}
        print(name, json.dumps(r, default=str)[:1500], file=sys.stderr, flush=True)
        res[name] = r
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1, default=str)


if __name__ == "__main__":
    main()
