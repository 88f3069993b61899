#!/usr/bin/env bash
# Thirty-third session, 20M x 96 against cuVS IVF-PQ in one process (cuVS 26.10 staged in this
# lease): the host gather (BANG 4.3/4.6) against mapped access ("-mapped"), one call (new-onecall)
# and under the budget's bound (new), W = 4, prefetch and re-rank on, busy time per configuration.
. scripts/device/common.sh
. scripts/device/peer_env.sh
KNNKIT_PROGRESS=0 timeout ${BENCH_S:-540} $py benchmarks/bang_bench.py --n 20000000 --d 96 --beams 16,20,24,32,48,64 \
  --widths 4 --prefetch on --rerank on --paths new-onecall,new-onecall-mapped,new,new-mapped \
  --cuvs-probes 2,4,6,8,12,16,32 --busy --out "$out/bang_20m_mapped.json" > "$out/bang.log" 2>&1
echo "bang rc=$? $(( $(date +%s) - t0 )) s"
grep '^{"method"' "$out/bang.log" | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(r.get("method"), r.get("path"), r.get("beam"), r.get("probes", r.get("n_probes")), round(r["recall"], 4),
          round(r["qps"]), "calls", r.get("calls"), r.get("access"), r.get("iterations"))
'
grep '^{"busy"' "$out/bang.log" | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print("busy", r["busy"], r["beam"], "kernel", round(r["kernel_frac"], 3), "busy", round(r["busy_frac"], 3))
'
grep -i "cuvs\|ivf\|Error\|Traceback" "$out/bang.log" | grep -v '^{"method": "knnkit\|^{"busy' | cut -c1-300 | tail -12
python3 -c "import json; print('stages', json.load(open('$out/bang_20m_mapped.json'))['stages'])" | cut -c1-1500
