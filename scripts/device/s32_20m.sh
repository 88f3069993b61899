#!/usr/bin/env bash
# Thirty-second session, 20M x 96 against cuVS IVF-PQ in one process (cuVS 26.10 staged in this
# lease), bfloat16 tables (default) and float32 ("-f32") alternated: one call (new-onecall) and
# under the budget's bound (new), W = 4, prefetch and re-rank on, busy time per configuration.
. scripts/device/common.sh
. scripts/device/peer_env.sh
KNNKIT_PROGRESS=0 timeout ${BENCH_S:-520} $py benchmarks/bang_bench.py --n 20000000 --d 96 --beams 16,20,24,32,48,64 \
  --widths 4 --prefetch on --rerank on --paths new-onecall,new-onecall-f32,new,new-f32 --cuvs-probes 8,12,16,24,32,64 \
  --busy --out "$out/bang_20m_bf16.json" > "$out/bang.log" 2>&1
echo "bang rc=$? $(( $(date +%s) - t0 )) s"
grep '^{"method"' "$out/bang.log" | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(r.get("method"), r.get("path"), r.get("beam"), r.get("width"), r.get("probes", r.get("n_probes")),
          round(r["recall"], 4), round(r["qps"]), "calls", r.get("calls"))
'
grep '^{"busy"' "$out/bang.log" | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print("busy", r["busy"], r["beam"], "kernel", round(r["kernel_frac"], 3), "busy", round(r["busy_frac"], 3))
'
grep -i "cuvs\|ivf\|Error\|Traceback" "$out/bang.log" | grep -v '^{"method": "knnkit\|^{"busy' | cut -c1-300 | tail -12
