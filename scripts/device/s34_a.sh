#!/usr/bin/env bash
# Thirty-fourth session (nvidia-h200, no peers): the prefetch of the next queries' rows in the
# host gather (issue 16). GPU tests of the host-placed search, the gather alone with and without
# the prefetch at 3M and 20M rows, the walk at 3M x 96 (one call and under the budget, "-nopf"
# alternated), then the search width on broad 2M x 96 at large beams.
# Needs benchmarks/results/h200-2026-12-01-s34/gather_prefetch/gather_ahead.patch applied: the
# "-nopf" paths and configure(gather_ahead=) went with the reverted change.
. scripts/device/common.sh
$py -m pytest -q -m gpu tests/test_bang_call.py tests/test_bang.py tests/test_bang_width.py -p no:cacheprovider \
  > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$out/tests.log")"
for n in 3000000 20000000; do
  timeout 150 $py benchmarks/bang_gather_micro.py --n $n --reps 200 --out "$out/gather_${n}.json" > "$out/gather_$n.log" 2>&1
  echo "gather n=$n rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$out/gather_$n.log")"
done
summ() {
  grep '^{"method"' "$1" | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(r["path"], "L", r["beam"], "W", r["width"], round(r["recall"], 4), round(r["qps"]), "it", r.get("iterations"),
          "gather_ms", round(1e3 * r.get("host_gather_s", 0), 2), "walk_ms", round(1e3 * r["walk_s"], 2),
          "calls", r.get("calls"))
'
}
KNNKIT_PROGRESS=0 timeout 240 $py benchmarks/bang_bench.py --n 3000000 --d 96 --beams 16,20,32,64 --widths 4 --prefetch on \
  --rerank on --paths new-onecall,new-onecall-nopf,new,new-nopf,new-onecall,new-onecall-nopf,new,new-nopf --no-cuvs \
  --busy --out "$out/bang_3m_pf.json" > "$out/bang_3m.log" 2>&1
echo "3m rc=$? $(( $(date +%s) - t0 )) s"; summ "$out/bang_3m.log"
KNNKIT_PROGRESS=0 timeout 200 $py benchmarks/bang_bench.py --n 2000000 --d 96 --data broad --beams 128,256,512 \
  --widths 4,8,16 --prefetch on --rerank on --paths new-onecall --no-cuvs --out "$out/bang_broad_width.json" \
  > "$out/bang_broad.log" 2>&1
echo "broad rc=$? $(( $(date +%s) - t0 )) s"; summ "$out/bang_broad.log"
