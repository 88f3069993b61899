#!/usr/bin/env bash
# Thirteenth session, second GPU call: knn_graph and GraphIndex.build end to end at 1M with the
# stall watch alone and with the verdict before the descent (benchmarks/stall_watch_ab.py, A/B in
# one process; the index's connectivity stage with LINK_PLACEMENT="auto"), then the full Sweet KNN
# sweep beside knnkit's GEMM path and cuVS brute_force (benchmarks/bench_sweet.py --device gpu).
#   OUT=/some/folder scripts/device/s13_b.sh   (from the repository root; cuVS in /tmp/peer-site)
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1 KNNKIT_DATA=${KNNKIT_DATA:-$PWD/.data}
source "$(dirname "$0")/peer_env.sh"
py=${PYTHON:-python3}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1; git rev-parse HEAD 2>/dev/null
  date -u; $py -c "import cuvs; print('cuvs', cuvs.__version__)" 2>&1 | tail -1; } > "$out/env.txt"
cat "$out/env.txt"
timeout 200 $py benchmarks/stall_watch_ab.py --scale full --sets broad_d128,uniform_d128,tight_c1000,sift_like_u8 \
    --index --modes watch,verdict --out "$out" > "$out/stall_ab.log" 2>&1
echo "stall_ab rc=$?"; grep -v -i "warn" "$out/stall_ab.log" | tail -10 | cut -c1-600
timeout 360 $py benchmarks/bench_sweet.py --device gpu --out "$out" > "$out/bench_sweet_gpu.log" 2>&1
echo "bench_sweet rc=$?"; tail -40 "$out/bench_sweet_gpu.log"
