"""What limits a host-placed (BANG) index's recall on broad data: the PQ walk or the re-rank width?
Run on the CPU twin (same walk, PQ tables and re-rank as the GPU path; recall does not depend on the
device).

    PYTHONPATH=src python benchmarks/bang_rerank_cpu.py [--n 200000] [--d 96] [--queries 1000]
        [--beams 32,64,128,256] [--reranks 1,2,4] [--compression pq,opq] [--pq-bytes 48]
        [--out benchmarks/results/cpu/bang_rerank_<date>.json]

Data: ``knnkit.datasets.make_broad_clusters`` (32 overlapping clusters over the full dimension; the
set where the GPU host index stopped at recall 0.76 at L = 256 with 48-byte codes, 2M x 96).
For each compression an index is built with ``placement="host"`` on the CPU; every (beam L, re-rank
multiple r) searches with ``rerank = r * L`` (the r L PQ-best expanded nodes get exact distances;
the walk logs up to ``max_iters`` = 8 L expansions by default). Also recorded: the recall of
the graph walked with exact distances (the device-placed ``GraphIndex`` on the same graph
parameters), i.e. what the graph itself allows at each beam.
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
from knnkit.datasets.suite import make_broad_clusters  # noqa: E402


def recall_at(I, gt_d, X, Q, k):
    """recall@k with ties by distance: a returned id counts when its distance is within the k-th
    true distance (float32 resolution)."""
    d = ((X[I] - Q[:, None, :]) ** 2).sum(-1)
    kth = gt_d[:, k - 1:k]
    return float((d <= kth * (1 + 1e-5) + 1e-12).sum() / (Q.shape[0] * k))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--d", type=int, default=96)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--beams", default="32,64,128,256")
    ap.add_argument("--reranks", default="1,2,4")
    ap.add_argument("--compression", default="pq,opq")
    ap.add_argument("--pq-bytes", type=int, default=None)
    ap.add_argument("--graph-degree", type=int, default=None, help="default: the build's choice from the LID")
    ap.add_argument("--no-exact-walk", action="store_true", help="skip the device-placed index")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    X, Q = make_broad_clusters(a.n, a.d, n_queries=a.queries, random_state=1)
    X = np.ascontiguousarray(X, np.float32)
    Q = np.ascontiguousarray(Q, np.float32)
    t = time.perf_counter()
    gt_d, _ = knnkit.knn(X, Q, k=a.k, device="cpu")
    res = dict(benchmark="bang_rerank_cpu", date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
               n=a.n, d=a.d, queries=a.queries, k=a.k, ground_truth_s=time.perf_counter() - t, rows=[])
    beams = [int(b) for b in a.beams.split(",")]
    for comp in a.compression.split(","):
        t = time.perf_counter()
        index = knnkit.GraphIndex.build(X, placement="host", device="cpu", random_state=0, pq_bytes=a.pq_bytes,
                                        compression=comp, graph_degree=a.graph_degree)
        build_s = time.perf_counter() - t
        eng = index._engine
        res.setdefault("builds", []).append(dict(compression=comp, build_s=round(build_s, 1), pq_bytes=eng.pq_bytes,
                                                 graph_degree=eng.graph_degree,
                                                 host_check=index.build_params.get("host_check"),
                                                 default_beam=index.search_params.beam))
        print(json.dumps(dict(compression=comp, build_s=round(build_s, 1), pq_bytes=eng.pq_bytes,
                              graph_degree=eng.graph_degree,
                              host_check=index.build_params.get("host_check"),
                              default_beam=index.search_params.beam)), flush=True)
        for L in beams:
            for r in (int(v) for v in a.reranks.split(",")):
                sp = knnkit.index.SearchParams(rerank=r * L)  # (max_iters stays 8 L: up to 8 L are logged)
                t = time.perf_counter()
                _d, I = index.search(Q, k=a.k, beam=L, params=sp)
                dt = time.perf_counter() - t
                row = dict(compression=comp, pq_bytes=eng.pq_bytes, graph_degree=eng.graph_degree, beam=L, rerank=r * L,
                           recall=round(recall_at(np.asarray(I), gt_d, X, Q, a.k), 4), qps=round(a.queries / dt, 1),
                           build_s=round(build_s, 1))
                res["rows"].append(row)
                print(json.dumps(row), flush=True)
    if a.no_exact_walk:
        beams = []
    else:
        t = time.perf_counter()
        dev = knnkit.GraphIndex.build(X, device="cpu", random_state=0, graph_degree=a.graph_degree)
        res["device_index_build_s"] = time.perf_counter() - t
        res["device_index_graph_degree"] = dev._engine.graph_degree
    for L in beams:
        _d, I = dev.search(Q, k=a.k, beam=L)
        row = dict(compression="none (exact walk)", graph_degree=dev._engine.graph_degree, beam=L,
                   recall=round(recall_at(np.asarray(I), gt_d, X, Q, a.k), 4))
        res["rows"].append(row)
        print(json.dumps(row), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
