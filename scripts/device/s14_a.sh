#!/usr/bin/env bash
# Fourteenth session, first GPU call: GPU tests of what changed (Sweet KNN's level-1 shortcut in
# the estimate and the gate; the reverse-edge first pass without the hubs), the reverse-edge A/B
# on broad 1M x 128 (benchmarks/build_flag_ab.py), then knnkit.knn(method="auto") with the gate
# on / off against Sweet KNN and GEMM on the 16-64-D cases (bench_sweet --api-only).
#   OUT=/some/folder scripts/device/s14_a.sh   (from the repository root)
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1 KNNKIT_DATA=${KNNKIT_DATA:-$PWD/.data}
py=${PYTHON:-python3}
t0=$(date +%s)
timeout 240 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_sweet_gpu.py > "$out/t1.log" 2>&1 &
timeout 240 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_graph_build_gpu.py tests/test_graph_index_gpu.py > "$out/t2.log" 2>&1 &
wait
cat "$out"/t[12].log > "$out/tests.log"; rm -f "$out"/t[12].log
echo "tests $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|FAILED|Error" "$out/tests.log" | tail -12
timeout 150 $py benchmarks/build_flag_ab.py --sets broad_d128 --rounds 2 --out "$out" > "$out/reverse_hub_ab.log" 2>&1
echo "reverse rc=$? $(( $(date +%s) - t0 )) s"; grep -o '"first_pass_skips_hubs[^}]*}' "$out/reverse_hub_ab.log" | cut -c1-300
grep identical "$out/reverse_hub_ab.log"
timeout 150 $py benchmarks/bench_sweet.py --device gpu --repeats 3 --cases clustered_d16,clustered_d32,clustered_d64 \
    --api-only auto_nogate,auto_gate,sweet,gemm --tag _gate_clustered --out "$out" > "$out/sweet_a.log" 2>&1
echo "sweet a rc=$? $(( $(date +%s) - t0 )) s"; grep times_s "$out/sweet_a.log" | cut -c1-300
timeout 150 $py benchmarks/bench_sweet.py --device gpu --repeats 3 --cases uniform_d16,uniform_d64 \
    --api-only auto_nogate,auto_gate,gemm --tag _gate_uniform --out "$out" > "$out/sweet_b.log" 2>&1
echo "sweet b rc=$? $(( $(date +%s) - t0 )) s"; grep times_s "$out/sweet_b.log" | cut -c1-300
