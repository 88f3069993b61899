"""Where RobustPrune's GPU time goes (issue 11: index build <= 2 s on 1M hard data).

Records the inputs of every ``prune_gpu`` call of one default GraphIndex build (the first prune and
the reverse-edge stage's two), then times each call again (CUDA events, median of ``--reps``) with
the fp32 kernel and the tensor-core kernel, and with the tensor-core kernel compiled without one of
its parts (``-DPT_SKIP_DUP``: the duplicate scan; ``STAGE``: the row loads; ``MMA``: the products;
``GREEDY``: the greedy pass, so no band is skipped and ``fill`` keeps the first R), and with the
near-tie band of its fp32 recheck at 2^-9 / 2^-12 (default) / 2^-16 / none (``PT_TIE_SHIFT``), with
the share of rows equal to the fp32 kernel's; and with registers capped for 3 and 4 blocks per SM
(``PT_MIN_BLOCKS``; default 2).
A part's cost is the full kernel's time minus the time without it (results of the cut kernels are
wrong, by design; only their times are used).

    PYTHONPATH=src python benchmarks/prune_kernel_parts.py --sets broad_d128 --out $OUT
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
from knnkit.index import _prune_gpu  # noqa: E402

VARIANTS = {"fp32": None, "tc": (), "tc-tie9": ("-DPT_TIE_SHIFT=9",), "tc-tie16": ("-DPT_TIE_SHIFT=16",),
            "tc-no-recheck": ("-DPT_TIE_SHIFT=126",), "tc-3blocks": ("-DPT_MIN_BLOCKS=3",),
            "tc-4blocks": ("-DPT_MIN_BLOCKS=4",), "tc-no-dup": ("-DPT_SKIP_DUP",), "tc-no-stage": ("-DPT_SKIP_STAGE",),
            "tc-no-mma": ("-DPT_SKIP_MMA",), "tc-no-greedy": ("-DPT_SKIP_GREEDY",),
            "tc-none": ("-DPT_SKIP_DUP", "-DPT_SKIP_STAGE", "-DPT_SKIP_MMA")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", default="full")
    ap.add_argument("--sets", default="broad_d128")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    import cupy as cp

    real = _prune_gpu.prune_gpu
    rows = []
    for name, X, _Q, metric in robustness_sets(a.scale, names=a.sets.split(","), real=False):
        Xd = cp.asarray(X)
        calls = []

        def recording(X_, cand, cand_d, R, alpha, metric_, **kw):
            calls.append((X_, cp.array(cand), cp.array(cand_d), R, alpha, metric_, dict(kw)))
            return real(X_, cand, cand_d, R, alpha, metric_, **kw)

        try:  # the build modules import prune_gpu from _prune_gpu at each call
            _prune_gpu.prune_gpu = recording
            knnkit.GraphIndex.build(Xd, metric=metric, random_state=0)
        finally:
            _prune_gpu.prune_gpu = real
        cp.cuda.Device().synchronize()
        for ci, (X_, cand, cand_d, R, alpha, metric_, kw) in enumerate(calls):
            rec = {"set": name, "call": ci, "nodes": int(cand.shape[0]), "C": int(cand.shape[1]), "R": int(R),
                   "alpha": float(alpha), "metric": metric_, "ms": {}}
            ref = None
            for vname, opts in VARIANTS.items():
                _prune_gpu.USE_TENSOR_CORES = opts is not None
                _prune_gpu.TC_OPTIONS = opts or ()
                real(X_, cand, cand_d, R, alpha, metric_, **kw)  # compile, warm
                ts = []
                for _ in range(a.reps):
                    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                    e0.record()
                    g = real(X_, cand, cand_d, R, alpha, metric_, **kw)
                    e1.record()
                    e1.synchronize()
                    ts.append(cp.cuda.get_elapsed_time(e0, e1))
                rec["ms"][vname] = round(float(np.median(ts)), 2)
                g = g[0] if isinstance(g, tuple) else g
                if vname == "fp32":
                    ref = cp.asnumpy(g)
                elif vname in ("tc", "tc-tie9", "tc-tie16", "tc-no-recheck"):
                    got = cp.asnumpy(g)
                    rec.setdefault("rows_equal_to_fp32", {})[vname] = round(float(np.mean(np.all(got == ref, axis=1))), 5)
            _prune_gpu.USE_TENSOR_CORES, _prune_gpu.TC_OPTIONS = True, ()
            print(json.dumps(rec), flush=True)
            rows.append(rec)
        calls.clear()
        cp.get_default_memory_pool().free_all_blocks()
    env = {"gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
           "argv": ["$OUT" if x == a.out else x for x in sys.argv[1:]]}
    with open(os.path.join(a.out, "prune_kernel_parts.json"), "w") as f:
        json.dump({"env": env, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
