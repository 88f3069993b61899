"""Event counts of the fused kernel's selection (exact/fused_topk.cu, issue 11) on a CPU model, to
predict what the v2 selection protocol saves before it runs on a GPU.

Model: one block of 4 warps x 32 rows; each row sees the columns in scan order with i.i.d. keys
(random-order data: the survivor process depends only on the ranks, so uniform keys model any
distribution); 8-column steps (a lane tests 2 columns of 4 rows, the warp 8 columns of 32 rows).
A warp step is *slow* when any of its 256 keys is <= its row's register threshold. Rules:
  v1: before a slow step, merge every row holding > CAP - 8; append keys < threshold.
  v2: merge a row when count + this step's survivors would pass CAP; append keys <= threshold.
Reported per warp: slow steps, merges, appended survivors, mean merge size; per block and chunk
of 64 columns, the slowest warp's (slow steps, merges) -- the block syncs once per chunk, so that
is what the block waits for. The time estimate weights these with per-event cycle costs (argument
--costs, read off the SASS: see NOTES_topk.md "Cheaper selection") and scales v1's estimate to the
measured v1 selection time (--v1-seconds: full kernel minus FT_EXP_NOSELECT, one launch).

    PYTHONPATH=src python benchmarks/sim_fused_selection.py [--n 1000000] [--kc 128] [--out DIR]
"""

import argparse
import json
import os
import time

import numba
import numpy as np


@numba.njit(cache=False)
def _warp(keys, kc, rule, cap):
    """keys (32, n) of one warp; returns per-chunk slow steps and merges, survivors, merged entries."""
    R, n = keys.shape
    nch = (n + 63) // 64
    L = np.full((R, kc), np.inf)
    thr = np.full(R, np.inf)
    buf = np.empty((R, cap))
    cnt = np.zeros(R, np.int64)
    slow = np.zeros(nch, np.int64)
    merges = np.zeros(nch, np.int64)
    appended = 0
    merged = 0
    for c0 in range(0, n, 8):
        ch = c0 // 64
        c1 = min(c0 + 8, n)
        anyp = False
        for r in range(R):
            for c in range(c0, c1):
                if keys[r, c] <= thr[r]:
                    anyp = True
        if not anyp:
            continue
        slow[ch] += 1
        for r in range(R):
            tot = 0
            for c in range(c0, c1):
                if keys[r, c] <= thr[r]:
                    tot += 1
            do = (cnt[r] > cap - 8) if rule == 0 else (cnt[r] + tot > cap)
            if do and cnt[r] > 0:
                merges[ch] += 1
                merged += cnt[r]
                allv = np.concatenate((L[r], buf[r, :cnt[r]]))
                allv.sort()
                L[r, :] = allv[:kc]
                thr[r] = L[r, kc - 1]
                cnt[r] = 0
            for c in range(c0, c1):
                k = keys[r, c]
                if (k < thr[r]) if rule == 0 else (k <= thr[r]):
                    buf[r, cnt[r]] = k
                    cnt[r] += 1
                    appended += 1
    final = 0
    for r in range(R):
        if cnt[r] > 0:
            final += 1
            merged += cnt[r]
    return slow, merges, appended, merged, final


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--kc", type=int, default=128)
    p.add_argument("--blocks", type=int, default=1)
    p.add_argument("--cap", type=int, default=32)
    # cycles per (slow step, merge) for v1 and v2; see NOTES_topk.md for where they come from
    p.add_argument("--costs", default="v1:450,5400;v2:200,1100")
    p.add_argument("--v1-seconds", type=float, default=0.103, help="measured v1 selection time per launch")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    costs = {part.split(":")[0]: tuple(map(float, part.split(":")[1].split(","))) for part in a.costs.split(";")}
    rng = np.random.default_rng(0)
    res = {}
    t0 = time.time()
    for _b in range(a.blocks):
        per = {0: [], 1: []}
        for _w in range(4):
            keys = rng.random((32, a.n))
            for rule in (0, 1):
                per[rule].append(_warp(keys, a.kc, rule, a.cap))
        for rule, name in ((0, "v1"), (1, "v2")):
            slow = np.stack([w[0] for w in per[rule]])      # (4 warps, chunks)
            merges = np.stack([w[1] for w in per[rule]])
            cs, cm = costs[name]
            block_cycles = float(np.max(slow * cs + merges * cm, axis=0).sum())
            r = res.setdefault(name, {"slow_steps_per_warp": [], "merges_per_warp": [], "appended_per_row": [],
                                      "mean_merge_size": [], "block_cycles": [], "merges_first_1024_cols_per_row": []})
            r["slow_steps_per_warp"].append(float(slow.sum(1).mean()))
            r["merges_per_warp"].append(float(merges.sum(1).mean() + np.mean([w[4] for w in per[rule]])))
            r["appended_per_row"].append(float(np.mean([w[2] for w in per[rule]]) / 32))
            r["mean_merge_size"].append(float(np.sum([w[3] for w in per[rule]]) /
                                              (merges.sum() + np.sum([w[4] for w in per[rule]]))))
            r["block_cycles"].append(block_cycles)
            r["merges_first_1024_cols_per_row"].append(float(merges[:, :16].sum(1).mean() / 32))
    out = {"n": a.n, "kc": a.kc, "cap": a.cap, "steps_per_warp": -(-a.n // 8), "costs": costs, "rules": {}}
    for name, r in res.items():
        out["rules"][name] = {k: float(np.mean(v)) for k, v in r.items()}
    v1c = out["rules"]["v1"]["block_cycles"]
    for name in out["rules"]:
        out["rules"][name]["predicted_selection_s"] = a.v1_seconds * out["rules"][name]["block_cycles"] / v1c
    out["sim_seconds"] = time.time() - t0
    print(json.dumps(out, indent=1))
    if a.out:
        with open(os.path.join(a.out, "sim_fused_selection.json"), "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
