#!/usr/bin/env bash
# Fourteenth session, second GPU call: random reads of host memory from a kernel (zero copy,
# benchmarks/zero_copy_probe.py), then BANG host placement beside cuVS IVF-PQ + refine in one run
# (3M x 96, budget 1/8 of graph + vectors, W = 4, prefetch on, re-rank on, profiled calls).
#   OUT=/some/folder scripts/device/s14_b.sh   (cuVS in /tmp/peer-site)
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1 KNNKIT_DATA=${KNNKIT_DATA:-$PWD/.data}
. scripts/device/peer_env.sh
py=${PYTHON:-python3}
t0=$(date +%s)
timeout 120 $py benchmarks/zero_copy_probe.py --out "$out/zero_copy_probe.json" > "$out/zero_copy.log" 2>&1
echo "probe rc=$? $(( $(date +%s) - t0 )) s"; cut -c1-200 "$out/zero_copy.log" | grep -v -i warn
timeout 400 $py benchmarks/bang_bench.py --n 3000000 --beams 12,16,24,32,48,64 --widths 4 --prefetch on \
    --rerank on --paths new --profile --out "$out/bang_ivfpq.json" > "$out/bang.log" 2>&1
echo "bang rc=$? $(( $(date +%s) - t0 )) s"; grep -v -i warn "$out/bang.log" | tail -40 | cut -c1-300
