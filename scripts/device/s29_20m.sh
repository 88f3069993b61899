#!/usr/bin/env bash
# Twenty-ninth session, last call (nvidia-h200, cuVS 26.10 staged): the 20M x 96 comparison with
# cuVS IVF-PQ again at the library's default search width W = 4 (the twenty-eighth session's run
# used the bench's default W = 1), one call (new-onecall) and under the budget's bound (new).
. scripts/device/common.sh
. scripts/device/peer_env.sh
KNNKIT_PROGRESS=0 timeout ${BENCH_S:-540} $py benchmarks/bang_bench.py --n 20000000 --d 96 --beams 16,20,24,32,48,64 \
  --widths 4 --prefetch on --rerank on --paths new-onecall,new --cuvs-probes 8,12,16,24,32,64 \
  --out "$out/bang_20m_w4.json" > "$out/bang.log" 2>&1
echo "bang rc=$? $(( $(date +%s) - t0 )) s"
grep '^{"method"' "$out/bang.log" | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(r.get("method"), r.get("path"), r.get("beam"), r.get("width"), r.get("probes", r.get("n_probes")),
          round(r["recall"], 4), round(r["qps"]), "calls", r.get("calls"))
'
grep -i "cuvs\|ivf" "$out/bang.log" | grep -v '^{"method": "knnkit' | cut -c1-300 | tail -12
