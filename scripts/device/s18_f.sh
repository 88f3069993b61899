#!/usr/bin/env bash
# Eighteenth session, sixth call: where the skewed-norm inner-product 1M build spends its 19 s of
# connectivity (and 2.4 s of entry points): wall-clock timers, then cProfile.
#   OUT=/some/folder scripts/device/s18_f.sh   (from the repository root)
. scripts/device/common.sh
timeout 280 $py benchmarks/profile_connectivity.py --set skewed_norms_ip --scale full --device gpu --top 45 \
    > "$out/profile_skewed.txt" 2>&1
echo "profile rc=$? $(( $(date +%s) - t0 )) s"; head -40 "$out/profile_skewed.txt" | cut -c1-200
