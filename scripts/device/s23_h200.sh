#!/usr/bin/env bash
# Twenty-third session, nvidia-h200. (1) Issue 11: the device search's nodes per step (width 1, 2,
# 4, 8) by beam on the hard 1M suite sets and two easier ones (benchmarks/search_width_gpu.py).
# (2) Issue 16: BANG host placement at 3M x 96 (budget 1/8 of graph + vectors), W = 4, each beam
# also under torch.profiler for the GPU's busy time (bang_bench.py --busy).
#   OUT=/some/folder scripts/device/s23_h200.sh   (from the repository root)
. scripts/device/common.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$out/env.txt"
if [ "${PART:-ab}" = ab ] || [ "${PART:-ab}" = a ]; then
  timeout ${WIDTH_S:-330} $py benchmarks/search_width_gpu.py --sets ${SETS:-broad_d128,uniform_d128,broad_clusters,tight_c10000} \
      --out "$out" > "$out/search_width.log" 2>&1
  echo "width rc=$? $(( $(date +%s) - t0 )) s"; tail -3 "$out/search_width.log" | cut -c1-200
fi
if [ "${PART:-ab}" = ab ] || [ "${PART:-ab}" = b ]; then
  timeout ${BANG_S:-230} $py benchmarks/bang_bench.py --n 3000000 --d 96 --beams 16,24,32,64 --widths 4 --prefetch on \
      --rerank on --paths new --no-cuvs --busy --out "$out/bang_busy.json" > "$out/bang_busy.log" 2>&1
  echo "bang rc=$? $(( $(date +%s) - t0 )) s"
  grep -o '{"busy"[^}]*}' "$out/bang_busy.log" | cut -c1-330
  grep -E "Error|Traceback" "$out/bang_busy.log" | head -3
fi
if [ "${PART:-ab}" = c ]; then
  # the beam-dependent default width (default_width): GPU tests of the search, then the hard 1M suite sets
  timeout ${TESTS_S:-200} $py -m pytest -q -m gpu -p no:cacheprovider tests/test_graph_index_gpu.py \
      tests/test_hierarchy_gpu.py tests/test_graph_build_gpu.py > "$out/tests.log" 2>&1
  echo "tests rc=$? $(( $(date +%s) - t0 )) s"; tail -3 "$out/tests.log"; grep -E "^FAILED" "$out/tests.log" | head
  mkdir -p "$out/rob"
  timeout ${ROB_S:-330} $py benchmarks/robustness.py --device gpu --scale full --no-real --no-peers --no-graph \
      --sets ${SETS:-broad_d128,uniform_d128,broad_clusters,tight_c10000} --out "$out/rob" > "$out/rob.log" 2>&1
  echo "rob rc=$? $(( $(date +%s) - t0 )) s"; cat "$out"/rob/*.md 2>/dev/null | grep "^| [a-z]" | cut -c1-260
fi
if [ "${PART:-ab}" = d ]; then
  # issue 16: host placement on broad data with the build's own graph degree (the fourteenth session's
  # GPU run forced degree 32; the CPU twin reached 0.95 at L = 256 with the build's degree 64)
  timeout ${BANG_S:-420} $py benchmarks/bang_bench.py --data broad --n ${N:-2000000} --d 96 --beams 64,128,256,512 \
      --widths 4 --prefetch on --rerank on --paths new --no-cuvs --busy --out "$out/bang_broad.json" > "$out/bang_broad.log" 2>&1
  echo "bang rc=$? $(( $(date +%s) - t0 )) s"
  grep -o '{"method": "knnkit-host"[^}]*' "$out/bang_broad.log" | grep -o '"beam": [0-9]*\|"recall": [0-9.]*\|"qps": [0-9.]*' | paste - - - | head
  grep -o '"host_check": {[^}]*}' "$out/bang_broad.json" | head -2; grep -o '"repr": "[^"]*"' "$out/bang_broad.json"
fi
