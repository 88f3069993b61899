"""The CPU index build's denser second tier (``GraphIndex._denser``): what its walk-based
candidate lists cost and how good they are, by walk setting (issue 11: CPU builds against hnswlib).

For each set, the automatic build runs until ``_too_sparse`` sends it to the denser tier; there the
walk that gives every row its K = 96 candidates (``SearchGraph.own_neighbour_lists``) is timed with
``--beams`` and with the walk seeded from the row itself and its first-tier candidates instead of
the entry points, and the walked lists' recall@96 is measured on 1,000 rows against exact
neighbours; then the denser build runs as shipped (its seconds and calibrated recall at beam 64).

    PYTHONPATH=src python benchmarks/denser_walk_cpu.py --sets uniform_d32,sift_like_u8 --out benchmarks/results/cpu
"""

import argparse
import datetime
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

import numpy as np  # noqa: E402

import knnkit  # noqa: E402
import knnkit.api.index as api_index  # noqa: E402
from knnkit.datasets.suite import robustness_sets  # noqa: E402
from knnkit.exact._cpu import knn_cpu  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sets", default="uniform_d32,sift_like_u8")
    ap.add_argument("--scale", default="small")
    ap.add_argument("--beams", default="128,97")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    knnkit.set_progress(False)
    rows_out = []
    original = api_index.GraphIndex._denser.__func__
    for name, X, _Q, metric in robustness_sets(a.scale, names=a.sets.split(","), real=False):
        got = {}

        def capture(cls, index, P, build_params, sp, random_state):
            first = index._engine
            R, K, _alpha = api_index.DENSER
            Xp = np.ascontiguousarray(first._X)
            rs = np.random.default_rng(0)
            rows = np.sort(rs.choice(first.n, 1000, replace=False))
            _d, truth = knn_cpu(Xp, np.ascontiguousarray(Xp[rows]), K + 1, first._imetric, False)
            truth = [set(t.tolist()) - {r} for t, r in zip(truth, rows)]

            def rec(ids):
                return float(np.mean([len(set(ids[r].tolist()) & t) / K for r, t in zip(rows, truth)]))

            res = {"first_candidates_recall": rec(first.first_candidates)}
            for beam in [int(b) for b in a.beams.split(",")]:
                b, tau, iters, seeds = sp.resolve(K + 1, {"beam": max(K + 1, beam), "tau": float("inf")},
                                                  n_entry=len(first._entry))
                t = time.perf_counter()
                walked = first.own_neighbour_lists(K, beam=b, tau=tau, max_iters=iters, n_seeds=seeds)
                res[f"walk_beam{b}_s"] = round(time.perf_counter() - t, 3)
                res[f"walk_beam{b}_recall"] = round(rec(walked), 4)
                # seeded from the row itself and its first-tier candidates
                from knnkit.index._search_cpu import search_cpu
                fc = first.first_candidates
                sd = np.concatenate([np.arange(first.n)[:, None], fc[:, : max(0, seeds - 1)]], axis=1).astype(np.int32)
                t = time.perf_counter()
                _d2, i2 = search_cpu(Xp, first._graph, Xp, K + 1, seeds=sd, beam=b, tau=tau, max_iters=iters,
                                     metric=first._imetric, xnorm_max=first._xmax() if first._imetric == "ip" else None,
                                     nn1_max=first.nn1_max)
                self_hit = i2 == np.arange(first.n)[:, None]
                i2 = np.take_along_axis(i2, np.argsort(self_hit, axis=1, kind="stable"), axis=1)[:, :K]
                res[f"walk_self_beam{b}_s"] = round(time.perf_counter() - t, 3)
                res[f"walk_self_beam{b}_recall"] = round(rec(i2), 4)
            t = time.perf_counter()
            out = original(cls, index, P, build_params, sp, random_state)
            res["denser_s"] = round(time.perf_counter() - t, 3)
            res["denser_record"] = out.build_params.get("denser")
            got.update(res)
            return out

        api_index.GraphIndex._denser = classmethod(capture)
        t = time.perf_counter()
        knnkit.GraphIndex.build(X, metric=metric, device="cpu", random_state=0)
        api_index.GraphIndex._denser = classmethod(original)
        row = {"set": name, "n": int(X.shape[0]), "d": int(X.shape[1]), "build_s": round(time.perf_counter() - t, 2), **got}
        print(json.dumps(row), flush=True)
        rows_out.append(row)
    if a.out:
        path = os.path.join(a.out, f"denser_walk_cpu_{datetime.date.today().isoformat()}.json")
        with open(path, "w") as f:
            json.dump({"benchmark": "denser_walk_cpu", "cpu_count": os.cpu_count(), "rows": rows_out}, f, indent=1)


if __name__ == "__main__":
    main()
