#!/usr/bin/env bash
# Eighteenth session, fourth call: broad 128-d alone (the third call lost it at beam 12288, past the
# search's shared-memory limit; robustness.py now ends the sweep there). Same sweep past 4096.
#   OUT=/some/folder scripts/device/s18_d.sh   (from the repository root)
. scripts/device/common.sh

timeout 420 $py benchmarks/robustness.py --device gpu --scale full --no-peers --no-real \
    --sets broad_d128 --more-beams 6144,8192,12288 \
    --sweep-to 0.999 --out "$out/rob_d" > "$out/rob_d.log" 2>&1
echo "robustness rc=$? $(( $(date +%s) - t0 )) s"; grep -v -i warn "$out/rob_d.log" | tail -3 | cut -c1-300
$py -c "
import json
d = json.load(open('$out/rob_d/gpu_full.json'))
for x in d['sets']:
    k = x['knnkit']
    print(x['name'], 'graph', k.get('graph_build_s'), k.get('graph_recall'), 'index', k['index_build_s'],
          'default', k['recall_default_beam'], 'max', k['max_recall'], 'tail', k['curve'][-5:])
" 2>&1 | tail -5
