#!/usr/bin/env bash
# Thirty-third session (nvidia-h200, no peers): where mapped access stops paying. The host gather
# against "-mapped", one call, alternated, at 1M x 96 (0.5 GB of graph + vectors) and 6M x 96
# (3.1 GB); 3M (1.5 GB, won) and 20M (10 GB, lost) were measured before.
. scripts/device/common.sh
for n in 6000000 1000000; do
  KNNKIT_PROGRESS=0 timeout 200 $py benchmarks/bang_bench.py --n $n --d 96 --beams 20,32,64 --widths 4 --prefetch on \
    --rerank on --paths new-onecall,new-onecall-mapped,new-onecall,new-onecall-mapped --no-cuvs \
    --out "$out/bang_${n}_cross.json" > "$out/bang_$n.log" 2>&1
  echo "n=$n rc=$? $(( $(date +%s) - t0 )) s"
  grep '^{"method"' "$out/bang_$n.log" | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(r["path"], r["beam"], round(r["recall"], 4), round(r["qps"]), r.get("access"), r.get("rerank_mode"),
          "walk_ms", round(1e3 * r["walk_s"], 2), "rerank_ms", round(1e3 * r["rerank_s"], 2))
'
done
