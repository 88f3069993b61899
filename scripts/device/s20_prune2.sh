#!/usr/bin/env bash
# Twentieth session, second round of the tensor-core RobustPrune (32-row bands, resident fp16 rows
# up to 128 dimensions, four loads in flight, at most 128 registers):
# (1) GPU tests; (2) where the kernel's time goes (benchmarks/prune_kernel_parts.py, the real inputs
# of one build); (3) the build A/B fp32 vs tensor cores on the hard 1M sets, with recall at beams.
#   OUT=/some/folder scripts/device/s20_prune2.sh   (from the repository root)
. scripts/device/common.sh
timeout 200 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_prune_tc_gpu.py tests/test_graph_build_gpu.py \
    > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|FAILED|Error" "$out/tests.log" | tail -8
timeout 150 $py benchmarks/prune_kernel_parts.py --sets broad_d128 --out "$out" > "$out/parts.log" 2>&1
echo "parts rc=$? $(( $(date +%s) - t0 )) s"; grep '^{' "$out/parts.log" | cut -c1-400; tail -2 "$out/parts.log" | cut -c1-300
timeout 200 $py benchmarks/build_flag_ab.py --flag tc --sets broad_d128,uniform_d128 --rounds 2 \
    --beams 64,256,1024 --out "$out" > "$out/ab.log" 2>&1
echo "ab rc=$? $(( $(date +%s) - t0 )) s"
$py - "$out/build_ab_tc.json" <<'PY' 2>&1 | tail -20
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    if "round" in r:
        p = r["phases_s"] or {}
        print(r["set"], r["round"], "tc" if r["USE_TENSOR_CORES"] else "fp32", round(r["index_build_s"], 3),
              "prune", round(p.get("prune", 0), 3), "reverse", round(p.get("reverse", 0), 3), r["reverse_edges"], r["recall_at_beam"])
    else:
        print(r)
PY
