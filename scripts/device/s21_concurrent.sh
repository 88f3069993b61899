#!/usr/bin/env bash
# Twenty-first session, one H200 (issue 11): the hubs' prune on a second stream beside the reverse
# stage's first pass (CONCURRENT_HUB_PASS): its test, the build A/B on broad / uniform 128-d 1M (graphs
# must stay identical), the reverse stage's parts.
#   OUT=/some/folder scripts/device/s21_concurrent.sh   (from the repository root)
. scripts/device/common.sh
timeout 120 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_graph_build_gpu.py -k "concurrent or hubs or mask" \
    > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"; tail -2 "$out/tests.log"
timeout 200 $py benchmarks/build_flag_ab.py --flag concurrent --sets broad_d128,uniform_d128 --rounds 1 --beams 64,256 \
    --out "$out" > "$out/ab.log" 2>&1
echo "ab rc=$? $(( $(date +%s) - t0 )) s"; grep -E '"graphs_identical"' "$out/ab.log"
grep -o '"set": "[a-z_0-9]*".\{0,60\}"CONCURRENT_HUB_PASS": [a-z]*, "index_build_s": [0-9.]*' "$out/ab.log"
grep -o '"CONCURRENT_HUB_PASS": [a-z]*.\{0,40\}\|"reverse_edges": {[^}]*}' "$out/ab.log" | grep reverse_edges
timeout 100 $py benchmarks/reverse_stage_parts.py --sets broad_d128 --out "$out" > "$out/parts.log" 2>&1
echo "parts rc=$? $(( $(date +%s) - t0 )) s"; tail -1 "$out/parts.log" | grep -o '"ms": {[^}]*}'
