#!/usr/bin/env bash
# Pipelined main loop of the fused fp16 GEMM + top-k' kernel (issue 11; NOTES_topk.md, "Pipelined
# main loop"): main loop v2 (default) against the original one (-DFT_MAIN_V1), on the GPU machine.
# Run from the repository root:
#   OUT=/some/folder scripts/device/fused_main.sh
# Steps (logs and JSON under $OUT), each with its own time limit, under 4 minutes in all:
#   1. GPU tests of the fused kernel (pytest -m gpu tests/test_fused_topk.py), including
#      test_fused_main_v2_equals_v1 (ids and keys of both main loops bit for bit) -> fused_main_tests.log;
#   2. benchmarks/fused_variants.py: one launch of 2^17 queries vs 1M x 128 and 1M x 96 broad
#      clusters, register_q_main1 (old loop) / register_q (new loop) and both with -DFT_EXP_NOSELECT,
#      round-robin (3 rounds x 1 launch), ids and keys of the new loop compared with the old
#      (must be equal) -> fused_variants.json, fused_variants.log;
#   3. the certified all-points graph of 1M x 128 broad clusters, k = 10, new and old loop alternating
#      in one process: knnkit.graph._exact_graph (knn_graph's exact path on the GPU: fp16_rerank)
#      twice each, knn_gpu(fp16_rerank) once each; ids and distances compared between the two
#      loops -> fused_main_graph.json (1.49 s with the old loop on an H200, fused_sel.sh).
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>&1
  git rev-parse HEAD 2>/dev/null; date -u; } > "$out/env.txt"
cat "$out/env.txt"
rc=0

echo "=== 1. GPU tests of the fused kernel (limit 100 s)"
timeout 100 $py -m pytest -q -m gpu tests/test_fused_topk.py > "$out/fused_main_tests.log" 2>&1 || rc=1
tail -15 "$out/fused_main_tests.log"

echo "=== 2. kernel A/B, one launch of 2^17 queries, old / new main loop (limit 70 s)"
timeout 70 $py benchmarks/fused_variants.py --out "$out" --dims 128,96 --rounds 3 --repeats 1 \
  --variants register_q_main1,register_q,register_q_main1_noselect,register_q_noselect \
  > "$out/fused_variants.log" 2>&1 || rc=1
cut -c1-400 "$out/fused_variants.log"

echo "=== 3. whole certified graph 1M x 128, new vs old main loop (limit 70 s)"
timeout 70 $py - "$out" > "$out/fused_main_graph.log" 2>&1 <<'PY' || rc=1
import json, os, sys, time
import cupy as cp
from knnkit.datasets.suite import make_broad_clusters
from knnkit.exact import _gpu
from knnkit.graph import _exact_graph

out_dir = sys.argv[1]
sync = cp.cuda.Device().synchronize
X = cp.asarray(make_broad_clusters(1_000_000, 128, random_state=0))
res = {"gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "n": 1_000_000, "d": 128, "k": 10, "runs": []}


def dump():
    with open(os.path.join(out_dir, "fused_main_graph.json"), "w") as f:
        json.dump(res, f, indent=1)


for old in (False, True):  # compile both modules and warm up outside the timings
    _gpu._FUSED_MAIN_V1 = old
    _gpu.knn_gpu(X[:300_000], X[:300_000], 10, "l2", True, "fp16_rerank")
sync()
outs = {}
for what, old in [("exact_graph", False), ("exact_graph", True), ("exact_graph", False), ("exact_graph", True),
                  ("knn_gpu", False), ("knn_gpu", True)]:
    _gpu._FUSED_MAIN_V1 = old
    sync()
    t = time.perf_counter()
    if what == "exact_graph":
        I, D = _exact_graph(X, 10, "l2", "gpu")
    else:
        D, I = _gpu.knn_gpu(X, X, 10, "l2", True, "fp16_rerank")
    sync()
    s = time.perf_counter() - t
    label = "main_v1" if old else "main_v2"
    row = {"call": what, "main_loop": label, "seconds": s, "fallback_rows": int(_gpu.knn_gpu.last_fallback)}
    I, D = cp.asarray(I), cp.asarray(D)
    key = (what, label)
    if key not in outs:
        outs[key] = (I, D)
    other = outs.get((what, "main_v1" if label == "main_v2" else "main_v2"))
    if other is not None:
        row["rows_ids_differ_vs_other"] = int((other[0] != I).any(axis=1).sum())
        row["rows_dist_differ_vs_other"] = int((other[1] != D).any(axis=1).sum())
    res["runs"].append(row)
    print(json.dumps(row), flush=True)
    dump()
_gpu._FUSED_MAIN_V1 = False
bad = [r for r in res["runs"] if r.get("rows_ids_differ_vs_other", 0) or r.get("rows_dist_differ_vs_other", 0)]
res["v1_v2_equal"] = not bad
dump()
sys.exit(1 if bad else 0)
PY
cut -c1-400 "$out/fused_main_graph.log"
echo "rc=$rc"
exit $rc
