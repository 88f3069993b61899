#!/usr/bin/env bash
# Connectivity stage of the GPU index build on the kernels of index/connect.cu (issue 11; NOTES_search.md,
# "Connectivity on the GPU"): the kernel path against the old one (_connect.GPU_KERNELS = False), on the
# GPU machine. Run from the repository root:
#   OUT=/some/folder scripts/device/conn_gpu.sh
# Steps (logs and JSON under $OUT), each with its own time limit, under 3 minutes in all:
#   1. GPU tests of the connectivity code (pytest -m gpu tests/test_connect_gpu.py) plus its CPU
#      emulation and host-compiled kernel tests -> conn_gpu_tests.log;
#   2. benchmarks/conn_gpu_bench.py: 1M x 128 broad clusters (make_broad_clusters(1_000_000, 128,
#      random_state=0)) index builds new / old / new with their phase timings; the stage
#      (_engine._connect) alone, old and new alternating, and its parts (graph to host, host
#      union-find, kernel components, short-edge components both ways, kernel reach count, host
#      BFS); a random 1M x 64 graph, kernel vs host components and BFS; every answer compared
#      between the paths -> conn_gpu.json, conn_gpu_bench.log (exit 1 if an answer differs).
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>&1
  git rev-parse HEAD 2>/dev/null; date -u; } > "$out/env.txt"
cat "$out/env.txt"
rc=0

echo "=== 1. GPU connectivity tests (limit 80 s)"
timeout 80 $py -m pytest -q -p no:cacheprovider tests/test_connect_gpu.py tests/test_connect_gpu_emulated.py \
  tests/test_connect_kernels_host.py > "$out/conn_gpu_tests.log" 2>&1 || rc=1
tail -15 "$out/conn_gpu_tests.log"

echo "=== 2. connectivity stage, kernels vs old path, 1M x 128 broad clusters (limit 95 s)"
timeout 95 $py benchmarks/conn_gpu_bench.py --out "$out" ${CONN_GPU_UNIFORM:+--uniform} \
  > "$out/conn_gpu_bench.log" 2>&1 || rc=1
cut -c1-600 "$out/conn_gpu_bench.log" | grep -v "^\s*$" | tail -20
echo "rc=$rc"
exit $rc
