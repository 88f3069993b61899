"""CPU index build with one knob of its NN-Descent candidates changed (issue 11: CPU builds against
hnswlib's time): ``--knob delta`` (``knnkit.index._build.INDEX_DELTA``), ``max_iters`` or ``sample``
(fields given to the candidates' ``NNDescentParams``; 0 = the default). One build per value after a
small warm-up build; prints one JSON line per build: build and candidate seconds, the held-out
calibration by beam, recall@10 of the suite's queries by beam (exact ground truth, ties forgiven)
and the descent's updates per iteration.

    PYTHONPATH=src python benchmarks/cpu_candidate_knobs.py --sets tight_c10000 --knob sample --values 0,16,12
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

import knnkit  # noqa: E402
from knnkit.datasets.suite import robustness_sets  # noqa: E402
from knnkit.evaluate import recall  # noqa: E402
from knnkit.graph.nndescent import _cpu as nndescent_cpu  # noqa: E402
from knnkit.index import _build  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sets", default="tight_c10000")
    ap.add_argument("--scale", default="small")
    ap.add_argument("--knob", choices=("delta", "max_iters", "sample"), default="sample")
    ap.add_argument("--values", default="0,16")
    a = ap.parse_args()
    params, run = _build.NNDescentParams, nndescent_cpu.nndescent_cpu
    seen = {}

    def spy(*args, **kwargs):
        out = run(*args, **kwargs)
        seen["updates"] = out[2]["updates"]
        return out

    nndescent_cpu.nndescent_cpu = spy
    for name, X, Q, metric in robustness_sets(a.scale, names=a.sets.split(","), real=True):
        gd, gi = knnkit.knn(X, Q, k=10, metric=metric, device="cpu")
        knnkit.GraphIndex.build(X[:3000], metric=metric, device="cpu", random_state=0)
        for v in a.values.split(","):
            value = float(v) if a.knob == "delta" else int(v)
            seen.clear()
            if a.knob == "delta":
                _build.INDEX_DELTA = value
            else:
                _build.NNDescentParams = (lambda **kw: params(**{a.knob: value}, **kw)) if value else params
            t = time.perf_counter()
            idx = knnkit.GraphIndex.build(X, metric=metric, device="cpu", random_state=0)
            dt = time.perf_counter() - t
            _build.NNDescentParams = params
            cal = idx.calibration or {"beams": [], "recall": []}
            rec = {}
            for beam in (10, 16, 32, 64):
                D, I = idx.search(Q, 10, beam=beam)
                rec[beam] = round(float(recall(I, gi, found_distances=D, true_distances=gd,
                                               similarity=metric == "inner_product")), 4)
            print(json.dumps({"set": name, a.knob: value, "build_s": round(dt, 2),
                              "candidates_s": round(idx.build_timings["candidates"], 2),
                              "default_beam": idx.search_params.beam,
                              "calibration": dict(zip(cal["beams"][:6], cal["recall"][:6])), "recall": rec,
                              "updates": seen.get("updates"), "candidates": idx.build_params.get("candidates")}),
                  flush=True)


if __name__ == "__main__":
    main()
