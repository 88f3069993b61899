"""bfloat16 against float32 PQ distance tables in the host-placed (BANG) walk, on the CPU twin.

The GPU walk reloads each live query's table into shared memory every step; bfloat16 entries halve
that load (``_pq.TABLE_BITS``). The CPU twin walks the same rounded values as the GPU, so recall
measured here is the GPU's. One index per set (built once, ``placement="host"``, CPU); each beam is
searched with ``TABLE_BITS = 32`` and ``16``; recall@10 with ties by distance.

    PYTHONPATH=src python benchmarks/bang_bf16_cpu.py [--n 30000] [--queries 500] [--beams 16,32,64]
        [--out benchmarks/results/cpu/bang_bf16_<date>.json]

Sets (``knnkit.datasets.suite``): tight and broad clusters at 96-d, a 4-d manifold in 128-d, SIFT-like
uint8 (128-d), uniform 32-d, skewed norms (inner product), 2-D.
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
from knnkit.datasets import suite  # noqa: E402
from knnkit.index.bang import _pq  # noqa: E402


def sets(n, nq):
    yield "tight_96", "sqeuclidean", suite.make_tight_clusters(n, 96, 100, n_queries=nq, random_state=1)
    yield "broad_96", "sqeuclidean", suite.make_broad_clusters(n, 96, n_queries=nq, random_state=2)
    yield "manifold_128", "sqeuclidean", suite.make_manifold(n, 128, n_queries=nq, random_state=3)
    yield "sift_like_u8", "sqeuclidean", suite.make_sift_like_uint8(n, 128, n_queries=nq, random_state=4)
    yield "uniform_32", "sqeuclidean", suite.make_uniform_cube(n, 32, n_queries=nq, random_state=5)
    yield "skewed_ip", "inner_product", suite.make_skewed_norms(n, 64, n_queries=nq, random_state=6)
    yield "plane_2d", "sqeuclidean", suite.make_2d(n, n_queries=nq, random_state=7)


def recall(I, true_i, true_d, found_d, k, metric):
    """recall@k, ties by distance: a returned neighbour counts when its distance is within the
    k-th true distance (float32 resolution); inner product (similarities, no ties in this data):
    the overlap of the id sets."""
    if metric == "inner_product":
        return float(np.mean([len(set(a) & set(b)) / k for a, b in zip(I.tolist(), true_i.tolist())]))
    kth = true_d[:, k - 1:k]
    tol = np.abs(kth) * 1e-5 + 1e-12
    return float((found_d <= kth + tol).sum() / (I.shape[0] * k))


def suite_indexes(n, nq, k):
    """Per suite set, a host-placed index built on the CPU and the exact answers:
    ``(name, metric, X, Q, index, build_s, true distances, true ids)``."""
    for name, metric, (X, Q) in sets(n, nq):
        t = time.perf_counter()
        index = knnkit.GraphIndex.build(X, placement="host", device="cpu", metric=metric, random_state=0)
        build_s = time.perf_counter() - t
        td, ti = knnkit.knn(X, Q, k=k, metric=metric, device="cpu")
        yield name, metric, X, Q, index, build_s, td, ti


def walk_inputs(index, Q):
    """``(engine, PQ tables, seeds)`` of the CPU twin's walk for queries ``Q``, as the index's own
    search makes them."""
    from knnkit._core.metrics import prepare_vectors
    from knnkit.index.bang._pq import pq_tables

    e = index._engine
    qh = prepare_vectors(np.ascontiguousarray(Q), e.metric, e.scale)
    return e, pq_tables(e.pq_queries(qh), e._codebook, e.pq_metric, e._rotation), e._entry.seeds_for(qh, 4)


def save(res, out):
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=30000)
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--beams", default="16,32,64")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "cpu",
                                                  f"bang_bf16_{datetime.date.today().isoformat()}.json"))
    a = ap.parse_args()
    beams = [int(b) for b in a.beams.split(",")]
    res = {"params": dict(vars(a), out=os.path.relpath(a.out, os.path.join(HERE, ".."))), "rows": []}
    for name, metric, X, Q, index, build_s, td, ti in suite_indexes(a.n, a.queries, a.k):
        for beam in beams:
            row = {"set": name, "metric": metric, "beam": beam, "build_s": build_s}
            for bits in (32, 16):
                _pq.TABLE_BITS = bits
                t = time.perf_counter()
                D, I = index.search(Q, k=a.k, beam=beam)
                row[f"seconds_{bits}"] = time.perf_counter() - t
                row[f"recall_{bits}"] = recall(I, ti, td, D, a.k, metric)
                row[f"ids_{bits}"] = I
            row["same_ids"] = float((row.pop("ids_16") == row.pop("ids_32")).mean())
            _pq.TABLE_BITS = 16
            res["rows"].append(row)
            print(json.dumps(row), flush=True)
        save(res, a.out)


if __name__ == "__main__":
    main()
