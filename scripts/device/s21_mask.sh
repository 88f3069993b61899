#!/usr/bin/env bash
# Twenty-first session, one H200 (issue 11): the new-reverse-edge mask as one warp per node (was one
# thread per edge reading a whole row: 153 ms of the reverse stage on broad 1M x 128): its tests,
# the stage's parts again, and the build A/B (allkept flag, graphs identical) for whole-build times.
#   OUT=/some/folder scripts/device/s21_mask.sh   (from the repository root)
. scripts/device/common.sh
timeout 150 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_graph_build_gpu.py -k "mask or reverse or hubs or first_prune" \
    > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"; tail -2 "$out/tests.log"
timeout 120 $py benchmarks/reverse_stage_parts.py --sets broad_d128 --out "$out" > "$out/parts.log" 2>&1
echo "parts rc=$? $(( $(date +%s) - t0 )) s"; tail -1 "$out/parts.log" | grep -o '"ms": {[^}]*}'
timeout 200 $py benchmarks/build_flag_ab.py --flag allkept --sets broad_d128,uniform_d128 --rounds 1 --beams 64,256 \
    --out "$out" > "$out/ab.log" 2>&1
echo "ab rc=$? $(( $(date +%s) - t0 )) s"; grep -E '"graphs_identical"' "$out/ab.log"
grep -o '"set": "[a-z_0-9]*".\{0,60\}"SKIP_PRUNE_WHEN_ALL_KEPT": [a-z]*, "index_build_s": [0-9.]*' "$out/ab.log"
