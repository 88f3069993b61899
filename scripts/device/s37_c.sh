#!/usr/bin/env bash
# Thirty-seventh session, third call (nvidia-h200, no peer staged; issue 16): the largest host-placed
# index this device builds, 50M x 96 clustered, built under the automatic build budget (in GPU
# memory, K = 64) and searched under 1/8 of graph + vectors: how recall and QPS move from 40M.
. scripts/device/common.sh
export TMPDIR=/tmp/knnkit-s37; rm -rf "$TMPDIR"; mkdir -p "$TMPDIR"
KNNKIT_PROGRESS=0 timeout 560 $py benchmarks/bang_bench.py --n 50000000 --d 96 --beams 24,32,48,64 --widths 4 \
  --prefetch on --rerank on --paths new-onecall,new-onecall,new --no-cuvs \
  --out "$out/bang_50m.json" > "$out/bang_50m.log" 2>&1
echo "50m rc=$? $(( $(date +%s) - t0 )) s" | tee "$out/summary.txt"
[ -f "$out/bang_50m.json" ] && python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    print(r["path"], "L", r["beam"], round(r["recall"], 4), round(r["qps"]), "gather_ms", round(1e3 * r["host_gather_s"], 2),
          "calls", r.get("calls"))
print("stages", json.dumps({k: v for k, v in d["stages"].items() if k.endswith("_s")}))
print("memory", json.dumps(d.get("memory")))
' "$out/bang_50m.json" | tee -a "$out/summary.txt"
rm -rf "$TMPDIR"
