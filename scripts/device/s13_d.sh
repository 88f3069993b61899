#!/usr/bin/env bash
# Thirteenth session: the last Sweet KNN GPU cases but uniform 64-d (forced Sweet takes minutes per
# run there; uniform 32-d was already 40-50x slower than GEMM) and the verdict's GPU test (s13_c.sh), the reverse-edge stage's
# two passes on the 1M hard sets (benchmarks/stall_watch_ab.py --modes verdict), then the GPU tests
# of the graph build (the stage's new stats).
#   OUT=/some/folder scripts/device/s13_d.sh   (cuVS in /tmp/peer-site)
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1 KNNKIT_DATA=${KNNKIT_DATA:-$PWD/.data}
py=${PYTHON:-python3}
OUT=$out TESTS=1 LIMIT=240 TAG=_part3 CASES=clustered_d64,uniform_d3_queries,clustered_d8_queries \
    bash scripts/device/s13_c.sh
timeout 120 $py benchmarks/stall_watch_ab.py --scale full --sets broad_d128,uniform_d128 --index --modes verdict \
    --out "$out" > "$out/reverse_ab.log" 2>&1
echo "reverse rc=$?"; grep -o '"index_build_s[^}]*}[^}]*}' "$out/reverse_ab.log" | cut -c1-400
grep -o '"index_reverse_edges[^}]*}' "$out/reverse_ab.log"
timeout 150 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_graph_build_gpu.py > "$out/graph_build_gpu_tests.log" 2>&1
tail -2 "$out/graph_build_gpu_tests.log"
