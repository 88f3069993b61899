#!/usr/bin/env bash
# Thirty-fifth session (nvidia-h200, no peers): the stash read by its kernel from the pinned
# buffers ("-zc", configure(stash_reads="mapped")) and prepared launches ("-pl",
# configure(prepared=True)) against the copies and CuPy's launches (issue 16). GPU tests of the
# host-placed search, then the walk at 3M x 96 (one call and under the budget, alternated twice,
# a profiled call each), then 20M x 96 one call alternated.
. scripts/device/common.sh
$py -m pytest -q -m gpu tests/test_bang_call.py tests/test_bang.py tests/test_bang_width.py -p no:cacheprovider \
  > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$out/tests.log")"
summ() {
  grep '^{"method"' "$1" | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(r["path"], "L", r["beam"], round(r["recall"], 4), round(r["qps"]), "it", r.get("iterations"),
          "wait", round(1e3 * r.get("host_wait_s", 0), 2), "gather", round(1e3 * r.get("host_gather_s", 0), 2),
          "launch", round(1e3 * r.get("host_launch_s", 0), 2), "finish", round(1e3 * r.get("host_finish_s", 0), 2),
          "walk", round(1e3 * r["walk_s"], 2), "total", round(1e3 * r["total_s"], 2), "calls", r.get("calls"),
          "zc", r.get("stash_reads"), "pl", r.get("prepared"))
'
}
P=new-onecall,new-onecall-zc,new-onecall-pl,new-onecall-zc-pl,new,new-zc-pl
KNNKIT_PROGRESS=0 timeout 280 $py benchmarks/bang_bench.py --n 3000000 --d 96 --beams 20,32,64 --widths 4 --prefetch on \
  --rerank on --paths $P,$P --no-cuvs --profile --out "$out/bang_3m_zc.json" > "$out/bang_3m.log" 2>&1
echo "3m rc=$? $(( $(date +%s) - t0 )) s"; summ "$out/bang_3m.log"
