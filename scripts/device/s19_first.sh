#!/usr/bin/env bash
# Prepared in the eighteenth session for the next GPU session's first benchmark call: what the
# eighteenth session changed without a GPU to run it.
# (1) GPU tests of the reach repair's state byte (host code shared by GPU builds) and of RSFK;
# (2) the repair replayed on the skewed-norm inner-product 1M graph (benchmarks/repair_replay.py:
#     _link_unreachable took 15-16.7 s there before the state byte; predicted ~1 s);
# (3) the skewed IP 1M index build in the suite (23.05 s before; predicted ~7-9 s).
#   OUT=/some/folder scripts/device/s19_first.sh   (from the repository root)
. scripts/device/common.sh
timeout 200 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_connect_gpu.py tests/test_connect_gpu_emulated.py \
    tests/test_connect.py tests/test_rsfk_gpu.py > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|FAILED|Error" "$out/tests.log" | tail -5
timeout 200 $py benchmarks/repair_replay.py --set skewed_norms_ip --scale full --reps 1 > "$out/replay.jsonl" 2> "$out/replay.log"
echo "replay rc=$? $(( $(date +%s) - t0 )) s"; cut -c1-500 "$out/replay.jsonl"
timeout 150 $py benchmarks/robustness.py --device gpu --scale full --no-peers --no-real --no-graph \
    --sets skewed_norms_ip --out "$out/rob" > "$out/rob.log" 2>&1
echo "robustness rc=$? $(( $(date +%s) - t0 )) s"
$py -c "
import json
d = json.load(open('$out/rob/gpu_full.json'))
for x in d['sets']:
    k = x['knnkit']; c = k['index_build_stats'].get('connectivity', {})
    print(x['name'], 'index', k['index_build_s'], k.get('index_build_phases_s'), c.get('reach_seconds'), c.get('unreachable_after'))
" 2>&1 | tail -2 | cut -c1-600
