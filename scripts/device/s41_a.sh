#!/usr/bin/env bash
# Forty-first session, first call (nvidia-h200, no peers; issue 16): where a host-placed call's GPU
# sits idle. The seed selection's host cost per call on one or two streams (seeds_host_micro.py),
# then 3M x 96 under the budget, beams 24 and 32: a timeline of one call (torch.profiler with CPU
# activities: kernels, CUDA API calls, knnkit's host pieces by name), the busy fraction and cProfile.
. scripts/device/common.sh
$py scripts/device/seeds_host_micro.py > "$out/seeds_micro.json" 2>&1; echo "micro rc=$? $(( $(date +%s) - t0 )) s"; cat "$out/seeds_micro.json"
KNNKIT_PROGRESS=0 timeout ${BT:-300} $py benchmarks/bang_bench.py --n ${N:-3000000} --d 96 --beams 24,32 --widths 4 \
  --prefetch on --rerank on --paths new-onecall-mapped,new-mapped --no-cuvs --timeline --busy --cprofile \
  --out "$out/tl.json" > "$out/tl.log" 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s"
python3 scripts/device/bang_rows.py "$out/tl.log"
grep '"timeline"' "$out/tl.log" | cut -c1-3000
