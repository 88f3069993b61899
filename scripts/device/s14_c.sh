#!/usr/bin/env bash
# Fourteenth session, third GPU call: GPU tests of the device repair of a few unreachable nodes
# and of the Sweet KNN gate now on by default; the repair A/B on uniform 1M x 128 and SIFT-like
# 1M (benchmarks/build_flag_ab.py --flag few); knnkit.knn(auto) on uniform 32-D and clustered 16-D.
#   OUT=/some/folder scripts/device/s14_c.sh   (from the repository root)
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1 KNNKIT_DATA=${KNNKIT_DATA:-$PWD/.data}
py=${PYTHON:-python3}
t0=$(date +%s)
timeout 240 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_connect_gpu.py tests/test_sweet_gpu.py > "$out/t1.log" 2>&1 &
timeout 240 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_graph_index_gpu.py tests/test_brute_force.py > "$out/t2.log" 2>&1 &
wait
cat "$out"/t[12].log > "$out/tests.log"; rm -f "$out"/t[12].log
echo "tests $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|FAILED|Error" "$out/tests.log" | tail -12
timeout 200 $py benchmarks/build_flag_ab.py --flag few --sets uniform_d128,sift_like_u8 --rounds 2 --out "$out" > "$out/build_ab_few.log" 2>&1
echo "few rc=$? $(( $(date +%s) - t0 )) s"; grep -o '"FEW_ON_DEVICE[^}]*}[^}]*}' "$out/build_ab_few.log" | cut -c1-420
grep identical "$out/build_ab_few.log"
timeout 100 $py benchmarks/bench_sweet.py --device gpu --repeats 3 --cases uniform_d32 \
    --api-only auto,gemm --tag _gate_default_u32 --out "$out" > "$out/sweet_c.log" 2>&1
timeout 100 $py benchmarks/bench_sweet.py --device gpu --repeats 3 --cases clustered_d16 \
    --api-only auto,sweet,gemm --tag _gate_default_c16 --out "$out" >> "$out/sweet_c.log" 2>&1
echo "sweet rc=$? $(( $(date +%s) - t0 )) s"; grep times_s "$out/sweet_c.log" | cut -c1-300
