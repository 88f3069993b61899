#!/usr/bin/env bash
# Twenty-ninth session, fifth call (nvidia-h200): one pipelined batch against two, 3M x 96, 10k
# queries, in one call (new-onecall) and in the budget's 3 calls (new: each call of 4,096 is one
# batch for either setting), W = 1 and the library default W = 4.
. scripts/device/common.sh
KNNKIT_PROGRESS=0 timeout ${BENCH_S:-300} $py benchmarks/bang_bench.py --n 3000000 --d 96 --beams 16,20,32,64 \
  --paths new-onecall,new --pipeline-batches 1,2,1,2 --widths 1,4 --prefetch on --rerank on --no-cuvs \
  --out "$out/bang_3m_batches.json" > "$out/bang.log" 2>&1
echo "bang rc=$? $(( $(date +%s) - t0 )) s"
grep '^{"method"' "$out/bang.log" | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(r["path"], "beam", r["beam"], "W", r["width"], "nb", r["pipeline_batches"], round(r["recall"], 4), round(r["qps"]),
          "calls", r.get("calls"), "batches", r.get("batches"))
'
