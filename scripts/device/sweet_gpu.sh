#!/usr/bin/env bash
# Sweet KNN on the GPU, level 1 in one kernel and a level-2 driver without per-chunk syncs (issue 13;
# NOTES_sweet.md, "GPU level 1 in fewer launches"). Run from the repository root on the GPU machine:
#   OUT=/some/dir KNNKIT_DATA=/path/to/data scripts/device/sweet_gpu.sh
# Steps (logs and JSON under $OUT, default ./gpu-out), about 3-4 minutes in all:
#   1. the GPU sweet tests (pytest -m gpu tests/test_sweet_gpu.py): GPU ids against the CPU twin and
#      the GEMM path; sweet_level1 against the former level-1 algorithm (UB bits, candidate lists);
#      the device gate count against mean_copies;
#   2. per-phase times of sweet on skin and uniform 3-D 250k, k = 1 and 20 (all-points), median of
#      7 after a warm-up, the phases of every repeat (CUDA events now), ids checked against the
#      first repeat; level 1 alone (the kernel, median of 21) (sweet_phases.json);
#   3. benchmarks/bench_sweet.py --device gpu --quick (sweet vs knnkit's GEMM path and cuVS
#      brute_force when it imports): bench_sweet_gpu_quick.json.
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
source "$(dirname "$0")/peer_env.sh"
py=${PYTHON:-python}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1; git rev-parse HEAD 2>/dev/null
  date -u; echo "KNNKIT_DATA: ${KNNKIT_DATA:+set}"; $py -c "import cuvs; print('cuvs', cuvs.__version__)" 2>&1 | tail -1
} > "$out/env.txt"
cat "$out/env.txt"
rc=0

echo "=== tests"
timeout 150 $py -m pytest -q -m gpu tests/test_sweet_gpu.py > "$out/sweet_gpu_tests.log" 2>&1 || rc=1
tail -30 "$out/sweet_gpu_tests.log"

echo "=== phases (skin, uniform 3-D 250k; k = 1, 20)"
timeout 45 $py - "$out" > "$out/sweet_phases.log" 2>&1 <<'PY' || rc=1
import json, os, sys, time
import numpy as np
import cupy as cp
sys.path.insert(0, "benchmarks")
from bench_sweet import find_skin, uniform
from knnkit.exact.sweet import sweet_knn
from knnkit.exact.sweet import _gpu as g

sync = cp.cuda.Device().synchronize
data = []
path = find_skin()
if path is None:
    print("skin not found: set KNNKIT_DATA (expects $KNNKIT_DATA/skin/skin_rgb_u8.npy)", flush=True)
else:
    data.append(("skin", np.load(path).astype(np.float32)))
data.append(("uniform_d3_250k", uniform(250_000, 3, 3)))  # the bench's generator and seed
rows = []
for name, Xh in data:
    X = cp.asarray(Xh)
    for k in (1, 20):
        sweet_knn(X, X, k, exclude_self=True); sync()  # warm-up (compilation, pools)
        ts, phases, ref, same = [], [], None, True
        for _ in range(7):
            t = time.perf_counter(); d, i, st = sweet_knn(X, X, k, exclude_self=True); sync()
            ts.append(time.perf_counter() - t)
            phases.append(st["times"])
            if ref is None:
                ref = i.get()
            else:
                same &= bool((i.get() == ref).all())
        med = {p: float(np.median([ph[p] for ph in phases])) for p in phases[0]}
        rec = {"case": name, "n": int(X.shape[0]), "k": k, "time_s": float(np.median(ts)), "times_median": med,
               "times_all": phases, "repeat_ids_equal": same, "distinct_rows": st["distinct_rows"],
               "n_landmarks_data": st["n_landmarks_data"], "parts": st["parts"],
               "distance_computations": st["distance_computations"]}
        print(json.dumps({a: rec[a] for a in ("case", "k", "time_s", "times_median", "repeat_ids_equal")}), flush=True)
        rows.append(rec)
    # level 1 alone on this data's clusters (k = 20 all-points: k_eff = 21), median of 21
    n = X.shape[0]
    count = int(np.ceil(3 * np.sqrt(n)))
    c = g._Clusters(cp, X, count, 10, np.random.default_rng(0)); sync()
    for k_eff in (2, 21):
        g._level1(cp, c, c, k_eff, 1e-5, 1 << 30); sync()
        ts = []
        for _ in range(21):
            t = time.perf_counter(); g._level1(cp, c, c, k_eff, 1e-5, 1 << 30); sync()
            ts.append(time.perf_counter() - t)
        rec = {"case": name + "_level1_only", "n": int(n), "landmarks": count, "k_eff": k_eff,
               "level1_s": float(np.median(ts)), "level1_min_s": float(np.min(ts))}
        print(json.dumps(rec), flush=True)
        rows.append(rec)
json.dump(rows, open(os.path.join(sys.argv[1], "sweet_phases.json"), "w"), indent=1, default=float)
bad = [r for r in rows if not r.get("repeat_ids_equal", True)]
sys.exit(1 if bad else 0)
PY
cat "$out/sweet_phases.log"

echo "=== bench_sweet --quick"
timeout 95 $py benchmarks/bench_sweet.py --device gpu --quick --out "$out" > "$out/bench_sweet_gpu_quick.log" 2>&1 || rc=1
tail -12 "$out/bench_sweet_gpu_quick.log"
exit $rc
