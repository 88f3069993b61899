"""CPU index build: the candidate degree of the middle intrinsic-dimension tier (LID 28-40: graph
degree 48 from 96 candidates) against 64 candidates, paired with hnswlib, on robustness-suite sets.

    PYTHONPATH=src python benchmarks/cpu_candidate_degree.py [--sets broad_clusters,skewed_norms_ip]
        [--scale small] [--out benchmarks/results/cpu/cpu_candidate_degree_<date>.json]

Per set: ``GraphIndex.build(device="cpu")`` with the defaults and with ``intermediate_degree=64``,
then hnswlib (M 16, ef_construction 200, 2 threads); recall@10 (ties by distance, the set's metric)
and QPS of 1000 held-out queries over beams / ef values, build seconds and phases.
"""

import argparse
import datetime
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

import knnkit  # noqa: E402
from knnkit.datasets.suite import robustness_sets  # noqa: E402


def _recall(I, gt_d, X, Q, metric):
    if metric == "inner_product":
        s = np.einsum("qd,qkd->qk", Q.astype(np.float64), X[I].astype(np.float64))
        kth = gt_d[:, -1:]
        return float((s >= kth - 1e-5 * np.abs(kth)).sum() / I.size)
    d = ((X[I].astype(np.float64) - Q[:, None, :]) ** 2).sum(-1)
    return float((d <= gt_d[:, -1:] * (1 + 1e-5) + 1e-12).sum() / I.size)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", default="broad_clusters,skewed_norms_ip")
    ap.add_argument("--scale", default="small")
    ap.add_argument("--configs", default="default,K64")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    import hnswlib

    res = dict(benchmark="cpu_candidate_degree", date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
               cpu_count=os.cpu_count(), sets=[])
    for name, X, Q, metric in robustness_sets(a.scale, names=a.sets.split(","), real=True):
        X = np.ascontiguousarray(X, np.float32)
        Q = np.ascontiguousarray(Q, np.float32)
        gt_d, _ = knnkit.knn(X, Q, k=10, metric=metric, device="cpu")
        gt_d = np.asarray(gt_d, np.float64)
        row = dict(name=name, n=X.shape[0], d=X.shape[1], metric=metric, configs={})
        for cfg in a.configs.split(","):
            kw = {} if cfg == "default" else {"intermediate_degree": int(cfg[1:])}
            t = time.perf_counter()
            idx = knnkit.GraphIndex.build(X, metric=metric, device="cpu", random_state=0, **kw)
            bt = time.perf_counter() - t
            curve = []
            for beam in (16, 32, 64, 128, 256):
                idx.search(Q[:100], k=10, beam=beam)
                t = time.perf_counter()
                _d, I = idx.search(Q, k=10, beam=beam)
                curve.append([beam, round(_recall(np.asarray(I), gt_d, X, Q, metric), 4),
                              round(Q.shape[0] / (time.perf_counter() - t))])
            t = time.perf_counter()
            _d, I = idx.search(Q, k=10)
            default = [idx.search_params.beam, round(_recall(np.asarray(I), gt_d, X, Q, metric), 4),
                       round(Q.shape[0] / (time.perf_counter() - t))]
            row["configs"][cfg] = dict(build_s=round(bt, 2), graph_degree=idx._engine.graph_degree,
                                       intermediate_degree=idx._engine.build_params.get("intermediate_degree"),
                                       phases={k: round(v, 2) for k, v in idx.build_timings.items()},
                                       default_beam=default, curve=curve)
            print(name, cfg, json.dumps(row["configs"][cfg]), flush=True)
        t = time.perf_counter()
        p = hnswlib.Index(space="ip" if metric == "inner_product" else "l2", dim=X.shape[1])
        p.init_index(max_elements=X.shape[0], M=16, ef_construction=200)
        p.set_num_threads(2)
        p.add_items(X)
        bt = time.perf_counter() - t
        curve = []
        for ef in (10, 20, 40, 80, 160, 320):
            p.set_ef(ef)
            t = time.perf_counter()
            I, _ = p.knn_query(Q, k=10)
            curve.append([ef, round(_recall(I.astype(np.int64), gt_d, X, Q, metric), 4),
                          round(Q.shape[0] / (time.perf_counter() - t))])
        row["hnswlib"] = dict(build_s=round(bt, 2), params="M=16 ef_construction=200", curve=curve)
        print(name, "hnswlib", json.dumps(row["hnswlib"]), flush=True)
        res["sets"].append(row)
        if a.out:
            with open(a.out, "w") as f:
                json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
