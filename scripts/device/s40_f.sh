#!/usr/bin/env bash
# Fortieth session, sixth call (nvidia-h200, no peers; issue 16): where the host's time of a call
# goes (cProfile) and the phases of a profiled call, 3M x 96, beam 24 and 32, under the budget: the
# kernels' share of a call is 0.53-0.68 at these beams.
. scripts/device/common.sh
KNNKIT_PROGRESS=0 timeout ${BT:-200} $py benchmarks/bang_bench.py --n 3000000 --d 96 --beams 24,32 --widths 4 \
  --prefetch on --rerank on --paths new-mapped --no-cuvs --cprofile --profile --out "$out/host.json" > "$out/host.log" 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s"; python3 scripts/device/bang_prof.py "$out/host.json"
grep -A45 "Ordered by" "$out/host.log" | head -100
