#!/usr/bin/env bash
# Eighteenth session, fifth call: (1) the skewed-norm inner-product 1M index build after the
# seventeenth session's smaller source sample for mass-unreachable repairs (25.3 s was measured with
# the old sample); (2) what the index build on the hard 1M sets saves with 96 candidates instead of
# 128 and with hubs re-pruned over R instead of 2 R reverse candidates, and what it costs in recall;
# (3) GPU tests of the exact path (knn_gpu's new candidates argument) and of RSFK.
#   OUT=/some/folder scripts/device/s18_e.sh   (from the repository root)
. scripts/device/common.sh
timeout 200 $py benchmarks/robustness.py --device gpu --scale full --no-peers --no-real --no-graph \
    --sets skewed_norms_ip --out "$out/rob_e" > "$out/rob_e.log" 2>&1
echo "robustness rc=$? $(( $(date +%s) - t0 )) s"
$py -c "
import json
d = json.load(open('$out/rob_e/gpu_full.json'))
for x in d['sets']:
    k = x['knnkit']; c = k['index_build_stats'].get('connectivity', {})
    print(x['name'], 'index', k['index_build_s'], k.get('index_build_phases_s'), c, 'default', k['recall_default_beam'], 'max', k['max_recall'])
" 2>&1 | tail -3 | cut -c1-1500
timeout 260 $py benchmarks/gpu_hard_degree.py --sets broad_d128,uniform_d128 \
    --configs auto,128/96/1.0,auto@HUB_REVERSE_CAP_FACTOR_WIDE=1,128/96/1.0@HUB_REVERSE_CAP_FACTOR_WIDE=1 \
    --beams 256,512,1024,2048,4096 --out "$out" > "$out/hard_degree.log" 2>&1
echo "hard_degree rc=$? $(( $(date +%s) - t0 )) s"
grep '^{' "$out/hard_degree.log" | $py -c "
import json, sys
for l in sys.stdin:
    r = json.loads(l)
    print(r['set'], r['config'], r.get('build_s'), r.get('build_timings'), [(c.get('beam'), c.get('recall'), c.get('qps')) for c in r.get('curve', [])])
" | cut -c1-700
timeout 100 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_brute_force.py tests/test_rsfk_gpu.py > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"; tail -2 "$out/tests.log"
