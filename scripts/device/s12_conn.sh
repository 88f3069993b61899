#!/usr/bin/env bash
# Twelfth session, connectivity stage of GPU graphs (LINK_PLACEMENT hybrid / host / device).
#   OUT=/some/folder scripts/device/s12_conn.sh
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
t0=$(date +%s)
timeout 240 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_connect_gpu.py tests/test_delete.py > "$out/t1.log" 2>&1 &
timeout 240 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_graph_index_gpu.py tests/test_hierarchy_gpu.py > "$out/t2.log" 2>&1 &
wait
cat "$out"/t[12].log > "$out/tests.log"; rm -f "$out"/t[12].log
echo "tests $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|FAILED|Error" "$out/tests.log" | tail -8
timeout 100 $py benchmarks/profile_connectivity.py --set tight_c1000 --scale small --placements hybrid,host,device > "$out/conn_small.log" 2>&1
timeout 200 $py benchmarks/profile_connectivity.py --set tight_c1000 --scale full --placements hybrid,host,device > "$out/conn_full.log" 2>&1
echo "full rc=$?"
for f in conn_small conn_full; do grep '"placement"' "$out/$f.log" | $py -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print('$f', r['placement'], r['build_s'], r['connectivity_s'], r['graph_sha1'], r['stats']['components_before'], r['stats']['links_added'], r['stats']['unreachable_after'], list(r['timers_s_calls'].items())[:6])
"; done
