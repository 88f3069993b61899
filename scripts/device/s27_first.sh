#!/usr/bin/env bash
# Twenty-seventh session, first call (nvidia-h200, no peers): the GPU test suite after the
# twenty-sixth session's CPU-only mend (shared reach bound in exact/_reach.py, new edge-sweep sets),
# the heavy-tail exact k-NN probe, and tight_c1000 / tight_c10000 at 1M with the 200k warm-up.
. scripts/device/common.sh
FIRST="tests/test_brute_force.py tests/test_edge_sweep.py" OUT="$out/suite" SHARD_S=330 \
  bash scripts/device/session_check.sh > "$out/suite.log" 2>&1
echo "suite $(( $(date +%s) - t0 )) s"; tail -35 "$out/suite.log"
KNNKIT_PROGRESS=0 timeout 120 $py scripts/device/s26_cauchy_gpu.py > "$out/cauchy.log" 2>&1
echo "cauchy rc=$? $(( $(date +%s) - t0 )) s"; grep -v Deprec "$out/cauchy.log" | tail -8
KNNKIT_PROGRESS=0 timeout 200 $py benchmarks/robustness.py --device gpu --scale full \
  --sets tight_c1000,tight_c10000 --no-peers --out "$out/rob_tight" > "$out/harness.log" 2>&1
echo "tight rc=$? $(( $(date +%s) - t0 )) s"; grep -v Deprec "$out/harness.log" | tail -12
cat "$out"/rob_tight/*.md 2>/dev/null | head -12
