#!/usr/bin/env bash
# Fourteenth session, fourth GPU call: Sweet KNN's level-1 floor (auto above 16-D gives up after
# level 1 when it saves < 50 %): GPU tests, knnkit.knn(auto) against GEMM on uniform 32 / 64-D and
# against Sweet KNN on clustered 32 / 64-D; then the GPU robustness suite at scale small without
# peers (every set: graph and index defaults after this session's build changes).
#   OUT=/some/folder scripts/device/s14_d.sh   (from the repository root; .data carried)
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1 KNNKIT_DATA=${KNNKIT_DATA:-$PWD/.data}
py=${PYTHON:-python3}
t0=$(date +%s)
timeout 200 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_sweet_gpu.py > "$out/tests.log" 2>&1
timeout 150 $py benchmarks/bench_sweet.py --device gpu --repeats 3 --cases uniform_d32,uniform_d64 \
    --api-only auto,gemm --tag _floor_uniform --out "$out" > "$out/sweet_d.log" 2>&1
timeout 150 $py benchmarks/bench_sweet.py --device gpu --repeats 3 --cases clustered_d32,clustered_d64 \
    --api-only auto,sweet --tag _floor_clustered --out "$out" >> "$out/sweet_d.log" 2>&1
echo "tests+sweet $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|FAILED|Error" "$out/tests.log" | tail -6
grep times_s "$out/sweet_d.log" | cut -c1-300
timeout 280 $py benchmarks/robustness.py --device gpu --scale small --no-peers --out "$out/rob" > "$out/rob.log" 2>&1
echo "robustness rc=$? $(( $(date +%s) - t0 )) s"; ls "$out/rob"; cat "$out"/rob/*.md 2>/dev/null | head -40 | cut -c1-400
