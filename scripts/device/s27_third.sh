#!/usr/bin/env bash
# Twenty-seventh session, third call (nvidia-h200, a fresh machine: CuPy's disk cache cold):
# tight_c1000 / tight_c10000 at 1M with the suite's index build timed twice (first build recorded
# beside the second), to show the first build's extra seconds are compilation.
. scripts/device/common.sh
KNNKIT_PROGRESS=0 timeout 300 $py benchmarks/robustness.py --device gpu --scale full \
  --sets tight_c1000,tight_c10000 --no-peers --out "$out/rob_tight" > "$out/harness.log" 2>&1
echo "tight rc=$? $(( $(date +%s) - t0 )) s"; grep -v Deprec "$out/harness.log" | grep -v "it/s\|iter/s" | tail -6
python3 - "$out/rob_tight/gpu_full.json" <<'PY'
import json, sys
for s in json.load(open(sys.argv[1]))["sets"]:
    k = s["knnkit"]
    print(s["name"], "first", k.get("index_build_first_s"), "second", k["index_build_s"], k["index_build_phases_s"])
PY
