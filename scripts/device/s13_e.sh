#!/usr/bin/env bash
# Thirteenth session, last GPU call: the GPU tests of what changed since s13_d (Sweet KNN's gate
# inside the run, the exact facade's shared tail, the reverse-edge stage's single sort), then
# the reverse-edge stage on the 1M hard sets and knnkit.knn(auto) against Sweet / GEMM on the
# sweep's 16-D / 32-D cases.
#   OUT=/some/folder scripts/device/s13_e.sh   (from the repository root)
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1 KNNKIT_DATA=${KNNKIT_DATA:-$PWD/.data}
py=${PYTHON:-python3}
t0=$(date +%s)
timeout 300 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_sweet_gpu.py tests/test_stall_watch.py > "$out/t1.log" 2>&1 &
timeout 300 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_brute_force.py tests/test_fuzz.py > "$out/t2.log" 2>&1 &
timeout 300 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_graph_build_gpu.py tests/test_graph_index_gpu.py > "$out/t3.log" 2>&1 &
wait
cat "$out"/t[123].log > "$out/tests.log"; rm -f "$out"/t[123].log
echo "tests $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|FAILED|Error" "$out/tests.log" | tail -12
timeout 150 $py benchmarks/stall_watch_ab.py --scale full --sets broad_d128,uniform_d128 --index --modes verdict \
    --out "$out" > "$out/reverse_ab.log" 2>&1
echo "reverse rc=$?"; grep -o '"index_build_s[^}]*}' "$out/reverse_ab.log" | cut -c1-330
grep -o '"index_reverse_edges[^}]*}' "$out/reverse_ab.log"
timeout 200 $py benchmarks/bench_sweet.py --device gpu --repeats 3 --cases clustered_d16,clustered_d32,uniform_d16 \
    --tag _gate --out "$out" > "$out/bench_sweet_gate.log" 2>&1
echo "bench_sweet rc=$?"; cut -c1-330 "$out/bench_sweet_gate.log" | tail -10
