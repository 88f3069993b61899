#!/usr/bin/env bash
# Thirteenth session: the rest of the full Sweet KNN GPU sweep (the 16-64-d cases and the query
# sets that s13_b.sh's 360 s did not reach), beside knnkit's GEMM path and cuVS brute_force, and
# the GPU test of the verdict before the descent.
#   OUT=/some/folder CASES=a,b,c TAG=_part scripts/device/s13_c.sh   (cuVS in /tmp/peer-site)
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1 KNNKIT_DATA=${KNNKIT_DATA:-$PWD/.data}
source "$(dirname "$0")/peer_env.sh"
py=${PYTHON:-python3}
if [ "${TESTS:-1}" = 1 ]; then
  timeout 120 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_stall_watch.py > "$out/stall_gpu_test.log" 2>&1
  tail -2 "$out/stall_gpu_test.log"
fi
timeout ${LIMIT:-500} $py benchmarks/bench_sweet.py --device gpu --repeats 2 --cases "$CASES" --tag "${TAG:-}" \
    --out "$out" > "$out/bench_sweet_gpu${TAG:-}.log" 2>&1
echo "bench_sweet rc=$?"; cut -c1-330 "$out/bench_sweet_gpu${TAG:-}.log" | tail -30
