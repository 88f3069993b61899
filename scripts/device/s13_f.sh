#!/usr/bin/env bash
# Thirteenth session: Sweet KNN's gate with the sample run split over several threads per query
# (GPU tests of Sweet KNN, then knnkit.knn auto against sweet / gemm where each matters).
#   OUT=/some/folder scripts/device/s13_f.sh
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1 KNNKIT_DATA=${KNNKIT_DATA:-$PWD/.data}
py=${PYTHON:-python3}
timeout 150 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_sweet_gpu.py > "$out/sweet_gpu_tests.log" 2>&1
tail -2 "$out/sweet_gpu_tests.log"
timeout 100 $py benchmarks/bench_sweet.py --device gpu --repeats 3 --cases clustered_d16,clustered_d32 --api-only auto,sweet \
    --tag _gate_clustered --out "$out" > "$out/gate_clustered.log" 2>&1
cut -c1-300 "$out/gate_clustered.log" | tail -6
timeout 60 $py benchmarks/bench_sweet.py --device gpu --repeats 3 --cases uniform_d16 --api-only auto,gemm \
    --tag _gate_uniform --out "$out" > "$out/gate_uniform.log" 2>&1
cut -c1-300 "$out/gate_uniform.log" | tail -3
