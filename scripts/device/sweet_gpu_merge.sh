#!/usr/bin/env bash
# Sweet KNN on the GPU, repeated-row merge (issue 13; NOTES_sweet.md, "GPU repeated-row merge").
# Run from the repository root on the GPU machine:
#   OUT=/some/dir KNNKIT_DATA=/path/to/data scripts/device/sweet_gpu_merge.sh
# Steps (logs and JSON under $OUT, default ./gpu-out):
#   1. the GPU sweet tests (pytest -m gpu tests/test_sweet_gpu.py): GPU ids against the CPU twin
#      and the GEMM path, merge gate forced on and off;
#   2. a paired A/B on skin (all-points, k = 1 and 20): merge off vs on in one process, median of
#      5 after a warm-up, ids checked equal, phases and distance counts recorded (sweet_merge_ab.json);
#   3. benchmarks/bench_sweet.py --device gpu --quick (sweet vs knnkit's GEMM path and cuVS
#      brute_force when it imports): bench_sweet_gpu_quick.json.
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
# staged cuVS (as scripts/gpu-check): its libraries and the nvJitLink it needs must be named
peers=${KNNKIT_PEER_SITE:-/tmp/peer-site}
if [ -d "$peers" ]; then
  export PYTHONPATH=$PYTHONPATH:$peers
  export LD_LIBRARY_PATH=$(ls -d "$peers"/lib*/lib64 "$peers"/lib*/lib "$peers"/nvidia/*/lib 2>/dev/null | tr '\n' ':')${LD_LIBRARY_PATH:-}
  export LD_PRELOAD=$(ls "$peers"/nvidia/*/lib/libnvJitLink.so.13 2>/dev/null | head -1)
fi
py=${PYTHON:-python}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1; git rev-parse HEAD 2>/dev/null
  date -u; echo "KNNKIT_DATA: ${KNNKIT_DATA:+set}"; $py -c "import cuvs; print('cuvs', cuvs.__version__)" 2>&1 | tail -1
} > "$out/env.txt"
cat "$out/env.txt"
rc=0

echo "=== tests"
$py -m pytest -q -m gpu tests/test_sweet_gpu.py > "$out/sweet_gpu_tests.log" 2>&1 || rc=1
tail -30 "$out/sweet_gpu_tests.log"

echo "=== skin merge A/B"
$py - "$out" > "$out/sweet_merge_ab.log" 2>&1 <<'PY' || rc=1
import json, os, sys, time
import numpy as np
import cupy as cp
sys.path.insert(0, "benchmarks")
from bench_sweet import find_skin
from knnkit.exact.sweet import sweet_knn
from knnkit.exact.sweet import _gpu as g

path = find_skin()
if path is None:
    raise SystemExit("skin not found: set KNNKIT_DATA (expects $KNNKIT_DATA/skin/skin_rgb_u8.npy)")
X = cp.asarray(np.load(path).astype(np.float32))
sync = cp.cuda.Device().synchronize
default = g._DUP_MIN_COPIES
rows = []
for k in (1, 20):
    res = {}
    for label, gate in (("off", np.inf), ("on", default)):
        g._DUP_MIN_COPIES = gate
        sweet_knn(X, X, k, exclude_self=True); sync()  # warm-up (compilation, pools)
        ts = []
        for _ in range(5):
            t = time.perf_counter(); d, i, st = sweet_knn(X, X, k, exclude_self=True); sync()
            ts.append(time.perf_counter() - t)
        res[label] = (float(np.median(ts)), d.get(), i.get(), st)
    g._DUP_MIN_COPIES = default
    same_i = bool((res["off"][2] == res["on"][2]).all())
    same_d = bool((res["off"][1] == res["on"][1]).all())
    rec = {"k": k, "n": int(X.shape[0]), "ids_equal": same_i, "dists_equal": same_d}
    for label in ("off", "on"):
        t, _, _, st = res[label]
        rec[label] = {"time_s": t, "distinct_rows": st.get("distinct_rows"), "times": st["times"],
                      "distance_computations": st["distance_computations"], "parts": st["parts"],
                      "filter": st["filter"], "n_landmarks_data": st["n_landmarks_data"]}
    rec["speedup"] = res["off"][0] / res["on"][0]
    print(json.dumps(rec), flush=True)
    rows.append(rec)
    if not (same_i and same_d):
        print("MISMATCH between merge off and on", flush=True)
json.dump(rows, open(os.path.join(sys.argv[1], "sweet_merge_ab.json"), "w"), indent=1, default=float)
if not all(r["ids_equal"] and r["dists_equal"] for r in rows):
    sys.exit(1)
PY
cat "$out/sweet_merge_ab.log"

echo "=== bench_sweet --quick"
$py benchmarks/bench_sweet.py --device gpu --quick --out "$out" > "$out/bench_sweet_gpu_quick.log" 2>&1 || rc=1
tail -12 "$out/bench_sweet_gpu_quick.log"
exit $rc
