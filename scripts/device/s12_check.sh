#!/usr/bin/env bash
# Twelfth session, second GPU call: the float64 threshold lists of the exact GEMM path and the
# exact graph through Sweet KNN (commit 9bd0016), and a profile of the connectivity stage.
#   OUT=/some/folder scripts/device/s12_check.sh   (from the repository root; cuVS in /tmp/peer-site if staged)
# 1. GPU tests of the exact path, Sweet KNN and graph building (3 processes side by side) -> tests.log
# 2. benchmarks/gemm_lowd_fallback.py -> gemm_lowd_fallback.json / .log
# 3. robustness small, points_2d / duplicates / skin_u8, no peers -> rob/gpu_small.{json,md}
# 4. benchmarks/profile_connectivity.py tight_c1000 full -> conn_profile.log
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1 KNNKIT_DATA=${KNNKIT_DATA:-$PWD/.data}
[ -d /tmp/peer-site ] && export PYTHONPATH=$PYTHONPATH:/tmp/peer-site
py=${PYTHON:-python3}
t0=$(date +%s)
timeout 300 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_brute_force.py > "$out/t1.log" 2>&1 &
timeout 300 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_sweet_gpu.py tests/test_sweet.py > "$out/t2.log" 2>&1 &
timeout 300 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_graph_build_gpu.py tests/test_nn_descent.py tests/test_graph_index_gpu.py > "$out/t3.log" 2>&1 &
wait
cat "$out"/t[123].log > "$out/tests.log"; rm -f "$out"/t[123].log
echo "tests $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|FAILED|Error" "$out/tests.log" | tail -12
timeout 240 $py benchmarks/gemm_lowd_fallback.py --out "$out" > "$out/gemm_lowd_fallback.log" 2>&1
echo "gemm rc=$?"; grep -v -i warning "$out/gemm_lowd_fallback.log" | tail -14
timeout 150 $py benchmarks/robustness.py --device gpu --scale small --sets points_2d,duplicates,skin_u8 --no-peers \
    --out "$out/rob" 2>&1 | grep -v -i warning | tail -5
timeout 120 $py benchmarks/profile_connectivity.py --set tight_c1000 --scale full > "$out/conn_profile.log" 2>&1
echo "profile rc=$?"; head -40 "$out/conn_profile.log"
