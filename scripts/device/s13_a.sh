#!/usr/bin/env bash
# Thirteenth session, first GPU call: the GPU suite (scripts/device/session_check.sh: everything
# since the last GPU run, including the verdict before the descent, tests/test_stall_watch.py),
# then benchmarks/lid_vs_stall.py at 1M (local intrinsic dimension against NN-Descent's stall,
# knn_graph with the verdict off and on, A/B in one process).
#   OUT=/some/folder scripts/device/s13_a.sh   (from the repository root)
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1 KNNKIT_DATA=${KNNKIT_DATA:-$PWD/.data}
py=${PYTHON:-python3}
OUT="$out/session_check" bash scripts/device/session_check.sh
timeout 200 $py benchmarks/lid_vs_stall.py --device gpu --n 1000000 --out "$out" > "$out/lid_vs_stall.log" 2>&1
echo "lid_vs_stall rc=$?"; grep -v -i "warn" "$out/lid_vs_stall.log" | tail -16 | cut -c1-400
