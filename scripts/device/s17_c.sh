#!/usr/bin/env bash
# Seventeenth session, GPU check of the session's changes: GPU tests of the reach repair and the
# index; the suite's skewed-norm inner-product set at 1M (227 s and 74k unreachable before the
# repair change), uniform 32-d and tight_c1000 at 1M with the warm-up per dimension (knn_graph
# times); then where knn_graph's "auto" should stop taking the exact graph (graph_auto_crossover).
#   OUT=/some/folder scripts/device/s17_c.sh   (from the repository root; .data carried)
. scripts/device/common.sh
timeout 170 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_connect_gpu.py tests/test_connect_gpu_emulated.py \
    tests/test_connect.py tests/test_stall_watch.py tests/test_graph_index_gpu.py > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|FAILED|Error" "$out/tests.log" | tail -8
timeout 230 $py benchmarks/robustness.py --device gpu --scale full --no-peers --no-real \
    --sets skewed_norms_ip,uniform_d32,tight_c1000 --out "$out/rob_c" > "$out/rob_c.log" 2>&1
echo "robustness rc=$? $(( $(date +%s) - t0 )) s"; grep -v -i warn "$out/rob_c.log" | tail -5 | cut -c1-300
$py -c "
import json
d = json.load(open('$out/rob_c/gpu_full.json'))
print('warmup', d['warmup_s'])
for x in d['sets']:
    k = x['knnkit']; c = k['index_build_stats'].get('connectivity', {})
    print(x['name'], 'graph', k['graph_build_s'], k['graph_recall'], 'index', k['index_build_s'],
          {a: c.get(a) for a in ('unreachable_before', 'unreachable_after', 'reach_rounds', 'reach_seconds', 'links_added')},
          'default', k['recall_default_beam'], 'max', k['max_recall'])
" 2>&1 | tail -5
timeout 170 $py benchmarks/graph_auto_crossover.py --device gpu --rounds 2 --out "$out" > "$out/crossover.log" 2>&1
echo "crossover rc=$? $(( $(date +%s) - t0 )) s"
grep '"round": 1' "$out/crossover.log" | cut -c1-200
