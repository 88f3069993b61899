#!/usr/bin/env bash
# Checks the twenty-fifth session could not run on a GPU (its device time was spent), for the next
# session's first call on nvidia-h200 (no peers needed, ~4 min with the first compile):
# - the GPU variants of the edge-sweep tests (every public path against float64 truth; the cosine
#   resolution warning), the fp16-walk and entry tests, and the host-placement tests (the float16
#   copy is now made only where it is walked; the build check's exact-copies filter);
# - tight_c1000 / tight_c10000 at full scale: the index build read 9.6 s for tight_c1000 (2.9 s in
#   s24) with the repair's kernels compiling inside the timed build; the warm-up now builds a
#   many-component set first, so the build should read ~2.9 s again.
#   OUT=/some/folder scripts/device/s26_checks.sh   (from the repository root)
. scripts/device/common.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/env.txt"
timeout ${TESTS_S:-240} $py -m pytest -q -m gpu -p no:cacheprovider tests/test_edge_sweep.py \
    tests/test_graph_index.py tests/test_seeds_cpu.py tests/test_bang*.py > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"; tail -2 "$out/tests.log"; grep -E "^FAILED" "$out/tests.log" | head
KNNKIT_PROGRESS=0 timeout ${ROB_S:-240} $py benchmarks/robustness.py --device gpu --scale full \
    --sets tight_c1000,tight_c10000 --no-peers --out "$out/rob" > "$out/rob.log" 2>&1
echo "robustness rc=$? $(( $(date +%s) - t0 )) s"; tail -4 "$out/rob.log"
