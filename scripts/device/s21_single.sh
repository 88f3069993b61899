#!/usr/bin/env bash
# Twenty-first session, one H200 (issue 11): the first prune skipped when it would keep every
# candidate (K <= R, the GPU's top tier): its test, the build A/B on broad / uniform 128-d 1M
# (graphs must stay identical), and where the reverse-edge stage's time goes.
#   OUT=/some/folder scripts/device/s21_single.sh   (from the repository root)
. scripts/device/common.sh
timeout 150 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_graph_build_gpu.py -k "first_prune or build_recall or hubs" \
    > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"; tail -2 "$out/tests.log"
timeout 240 $py benchmarks/build_flag_ab.py --flag allkept --sets broad_d128,uniform_d128 --rounds 1 --beams 64,256 \
    --out "$out" > "$out/ab.log" 2>&1
echo "ab rc=$? $(( $(date +%s) - t0 )) s"; grep -E '"graphs_identical"' "$out/ab.log"
timeout 120 $py benchmarks/reverse_stage_parts.py --sets broad_d128 --out "$out" > "$out/parts.log" 2>&1
echo "parts rc=$? $(( $(date +%s) - t0 )) s"; tail -1 "$out/parts.log" | cut -c1-900
