#!/usr/bin/env bash
# Twenty-seventh session, second call (nvidia-h200, no peers): the exact-engine GPU tests after the
# CPU twin's change (the GPU tests compare against it), and tight_c1000 / tight_c10000 at 1M with
# the warm-up that also builds a many-component 20k set.
. scripts/device/common.sh
timeout 240 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_brute_force.py tests/test_edge_sweep.py \
  > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"; tail -2 "$out/tests.log"
KNNKIT_PROGRESS=0 timeout 240 $py benchmarks/robustness.py --device gpu --scale full \
  --sets tight_c1000,tight_c10000 --no-peers --out "$out/rob_tight" > "$out/harness.log" 2>&1
echo "tight rc=$? $(( $(date +%s) - t0 )) s"; grep -v Deprec "$out/harness.log" | grep -v "it/s\|iter/s" | tail -8
python3 - "$out/rob_tight/gpu_full.json" <<'PY'
import json, sys
for s in json.load(open(sys.argv[1]))["sets"]:
    k = s["knnkit"]; c = k["index_build_stats"]["connectivity"]
    print(s["name"], "build", k["index_build_s"], "phases", k["index_build_phases_s"], "components", c["components_before"])
PY
