#!/usr/bin/env bash
# Thirty-seventh session, first call (nvidia-h200, issue 16): the host-placed build of 50M x 96 under
# the automatic build budget (0.6 of the free memory, `_engine._build_budget`), which should keep it
# in GPU memory; its peak device memory against `build_bytes` (1.5x measured at 20M), its host
# resident set and its phases. If the device runs out of memory, the log shows the fallback.
. scripts/device/common.sh
export TMPDIR=/tmp/knnkit-s37; rm -rf "$TMPDIR"; mkdir -p "$TMPDIR"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv > "$out/gpu.txt"
free -g > "$out/host_free.txt"; df -h /tmp >> "$out/host_free.txt"
KNNKIT_PROGRESS=0 timeout 560 $py benchmarks/bang_build_memory.py --n 50000000 --d 96 \
  --out "$out/build_50m_auto.json" > "$out/build_50m_auto.log" 2>&1
echo "build_50m rc=$? $(( $(date +%s) - t0 )) s" | tee "$out/summary.txt"
rm -rf "$TMPDIR"
