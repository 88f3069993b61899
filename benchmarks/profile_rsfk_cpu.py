"""Where the CPU RSFK twin's time goes: the level driver (the GPU's shape: one side kernel, prefix sum
and partition kernel per level, run with the CPU level kernels) level by level, against the whole-tree
path the CPU uses (``CpuBackend._build_trees``), the leaf k-NN set update and NNE.

Usage::

    PYTHONPATH=src python benchmarks/profile_rsfk_cpu.py --out benchmarks/results/rsfk_cpu/profile.json
"""

import argparse
import json
import subprocess
import time

import numpy as np


def level_driver(be, X, K, tree, split):
    """One tree with the level driver, timing each level's three steps."""
    from knnkit.graph.rsfk import _engine as E

    n = X.shape[0]
    leaf = E.default_leaf_size(K)
    mc = max(1, min(K + 1, (leaf + 1) // 2))
    inv = np.ones(1, np.float32)
    perm, lo, hi = np.arange(n, dtype=np.int32), np.zeros(n, np.int32), np.full(n, n, np.int32)
    side, cum, proj = np.zeros(n, np.int32), np.zeros(n + 1, np.int32), np.zeros(n, np.float32)
    out = [np.empty_like(perm), np.empty_like(lo), np.empty_like(hi)]
    fd = E._force_depth(n, mc)
    levels, level = [], 0
    while int((hi - lo).max()) > leaf:
        t0 = time.perf_counter()
        force = level >= fd
        if split == "projection" and not force:
            be.project(X, perm, lo, hi, leaf, 0, tree, level, proj)
            t1 = time.perf_counter()
            perm = perm[be.argsort((lo.astype(np.uint64) << 32) | E._orderable(np, proj))]
            mode = 1
        else:
            be.side_sample(X, 0, inv, perm, lo, hi, leaf, 0, tree, level, side)
            t1 = time.perf_counter()
            cum[1:] = np.cumsum(side, dtype=np.int32)
            mode = 0
        t2 = time.perf_counter()
        be.partition(perm, lo, hi, side, cum, leaf, mc, mode, force, *out)
        (perm, lo, hi), out = out, [perm, lo, hi]
        levels.append({"side_s": round(t1 - t0, 4), "scan_or_sort_s": round(t2 - t1, 4),
                       "partition_s": round(time.perf_counter() - t2, 4)})
        level += 1
    return levels


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100000x128,70000x784")
    ap.add_argument("--K", type=int, default=16)
    ap.add_argument("--trees", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from knnkit.datasets import make_clustered
    from knnkit.graph.rsfk import RSFKParams, rsfk_lists
    from knnkit.graph.rsfk._cpu import CpuBackend

    be = CpuBackend()
    small = np.ascontiguousarray(make_clustered(3000, 16, random_state=0, device="cpu"))
    for sp in ("sample", "projection"):  # compile
        level_driver(be, small, args.K, 0, sp)
        rsfk_lists(small, args.K, metric="l2", params=RSFKParams(n_trees=2, split=sp))
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    res = {"commit": commit, "K": args.K, "trees": args.trees, "sizes": {}}
    for size in args.sizes.split(","):
        n, d = (int(v) for v in size.split("x"))
        X = np.ascontiguousarray(make_clustered(n, d, random_state=0, device="cpu"), dtype=np.float32)
        entry = {}
        for sp in ("sample", "projection"):
            lv = level_driver(be, X, args.K, 0, sp)
            t0 = time.perf_counter()
            _i, _d, st = rsfk_lists(X, args.K, metric="l2", params=RSFKParams(n_trees=args.trees, split=sp))
            entry[sp] = {"level_driver_one_tree_s": round(sum(sum(v.values()) for v in lv), 3), "levels": lv,
                         "whole_trees_phases_s": {k: round(v, 3) for k, v in st["time_s"].items()},
                         "total_s": round(time.perf_counter() - t0, 3)}
            print(size, sp, entry[sp]["level_driver_one_tree_s"], entry[sp]["whole_trees_phases_s"], flush=True)
        res["sizes"][size] = entry
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
