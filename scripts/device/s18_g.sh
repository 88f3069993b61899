#!/usr/bin/env bash
# Eighteenth session, seventh call: the reach repair replayed on the skewed-norm inner-product 1M
# graph, rows without a free slot marked exhausted or not (benchmarks/repair_replay.py).
#   OUT=/some/folder scripts/device/s18_g.sh   (from the repository root)
. scripts/device/common.sh
timeout 280 $py benchmarks/repair_replay.py --set skewed_norms_ip --scale full > "$out/replay.jsonl" 2> "$out/replay.log"
echo "replay rc=$? $(( $(date +%s) - t0 )) s"; cat "$out/replay.jsonl" | cut -c1-600; grep -i error "$out/replay.log" | head -3
