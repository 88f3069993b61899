#!/usr/bin/env bash
# Seventeenth session, first benchmark call (cuVS staged in /tmp/peer-site): the GPU robustness
# suite at full scale on its synthetic 1M sets (uniform 32 / 128-d, uniform 960-d 200k, tight
# clusters 1,000 / 10,000, broad 96 / 128-d), knnkit defaults side by side with cuVS CAGRA
# (degree 64) and cuVS nn_descent in one run (issue 11's acceptance ratios).
#   OUT=/some/folder scripts/device/s17_a.sh   (from the repository root)
. scripts/device/common.sh
. scripts/device/peer_env.sh
$py -c "import cuvs; print('cuvs', cuvs.__version__)" 2>&1 | tail -1
timeout 570 $py benchmarks/robustness.py --device gpu --scale full --no-real \
    --sets broad_d128,uniform_d128,broad_clusters,tight_c1000,tight_c10000,uniform_d32,uniform_d960 \
    --out "$out/rob_a" > "$out/rob_a.log" 2>&1
echo "robustness rc=$? $(( $(date +%s) - t0 )) s"; grep -v -i warn "$out/rob_a.log" | tail -5 | cut -c1-300
cat "$out"/rob_a/*.md 2>/dev/null | cut -c1-700
