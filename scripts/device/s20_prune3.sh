#!/usr/bin/env bash
# Twentieth session, third round of the tensor-core RobustPrune: the recheck's near-tie band at
# 2^-12 (was 2^-9), variants of the band and of the register cap timed on the real inputs of one
# build, then the build A/B on the hard 1M sets.
#   OUT=/some/folder scripts/device/s20_prune3.sh   (from the repository root)
. scripts/device/common.sh
timeout 100 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_prune_tc_gpu.py > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|FAILED|Error" "$out/tests.log" | tail -8
timeout 200 $py benchmarks/prune_kernel_parts.py --sets broad_d128 --out "$out" > "$out/parts.log" 2>&1
echo "parts rc=$? $(( $(date +%s) - t0 )) s"
$py -c "
import json; d = json.load(open('$out/prune_kernel_parts.json'))
for r in d['rows']: print(r['call'], r['nodes'], r['C'], r['ms'], r.get('rows_equal_to_fp32'))
" 2>&1 | tail -4; tail -2 "$out/parts.log" | cut -c1-300
timeout 150 $py benchmarks/build_flag_ab.py --flag tc --sets broad_d128,uniform_d128 --rounds 1 \
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
