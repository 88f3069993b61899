#!/usr/bin/env bash
# Eighteenth session, third call: the GPU test of the near-exact fallback (after its stats fix); the
# suite's hard 1M sets without peers (their CAGRA / cuVS columns are the seventeenth session's:
# the index did not change), the beam sweep continued past 4096 to 16384 until 0.999, to see
# whether broad 128-d's 0.991 at 4096 is a plateau; knn_graph with the near-exact fallback.
#   OUT=/some/folder scripts/device/s18_c.sh   (from the repository root)
. scripts/device/common.sh
timeout 100 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_stall_watch.py > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"; tail -2 "$out/tests.log"
timeout 420 $py benchmarks/robustness.py --device gpu --scale full --no-peers --no-real \
    --sets broad_d128,uniform_d128,broad_clusters,uniform_d960 --more-beams 6144,8192,12288,16384 \
    --sweep-to 0.999 --out "$out/rob_c" > "$out/rob_c.log" 2>&1
echo "robustness rc=$? $(( $(date +%s) - t0 )) s"; grep -v -i warn "$out/rob_c.log" | tail -3 | cut -c1-300
$py -c "
import json
d = json.load(open('$out/rob_c/gpu_full.json'))
for x in d['sets']:
    k = x['knnkit']
    print(x['name'], 'graph', k.get('graph_build_s'), k.get('graph_recall'), 'index', k['index_build_s'],
          'default', k['recall_default_beam'], 'max', k['max_recall'], 'tail', k['curve'][-5:])
" 2>&1 | tail -5
