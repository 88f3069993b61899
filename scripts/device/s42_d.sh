#!/usr/bin/env bash
# Forty-second session (nvidia-h200; issue 16): the robustness suite with GraphIndex
# placement="host" (BANG) on the GPU, small scale, index only, no peers: recall at the default beam
# (set by the build's check) and the beam sweep on every set, the real ones included.
. scripts/device/common.sh
KNNKIT_PROGRESS=0 timeout ${BT:-560} $py benchmarks/robustness.py --device gpu --scale ${SCALE:-small} --no-peers --no-graph \
  --placement host --max-beam ${MAXB:-2048} --out "$out" > "$out/robustness_host.log" 2>&1
echo "robustness rc=$? $(( $(date +%s) - t0 )) s"; tail -20 "$out/robustness_host.log"
