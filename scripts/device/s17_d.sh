#!/usr/bin/env bash
# Seventeenth session, GPU check of the exact graph's certified tensor-core GEMM (method="brute"
# on the GPU) and where knn_graph's "auto" should stop taking it (graph_auto_crossover).
#   OUT=/some/folder scripts/device/s17_d.sh   (from the repository root; .data carried)
. scripts/device/common.sh
timeout 200 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_graph_build_gpu.py tests/test_integration_gpu.py \
    tests/test_nn_descent_gpu.py tests/test_sweet_gpu.py > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|FAILED|Error" "$out/tests.log" | tail -8
timeout 200 $py benchmarks/graph_auto_crossover.py --device gpu --rounds 2 --out "$out" > "$out/crossover.log" 2>&1
echo "crossover rc=$? $(( $(date +%s) - t0 )) s"
$py -c "
import json
d = json.load(open('$out/graph_auto_crossover_gpu.json'))
for r in d['rows']:
    if r['round'] == 1:
        print(r['set'], r['method'], r['time_s'], r['recall'], r['chosen'], r['extra'].get('precision'))
"
