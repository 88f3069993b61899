#!/usr/bin/env bash
# Fortieth session, first call (nvidia-h200, no peers; issue 16): the fused walk's blocks make their
# own PQ tables (no table array, no table kernel) and the re-rank's exact distances read the rows
# where they are (bang_rerank_exact: no row buffer). Every BANG GPU test, then 3M x 96: tables made
# in the walk against loaded (-loadtab), one call and under the budget.
. scripts/device/common.sh
$py -m pytest -q -m gpu tests/test_bang.py tests/test_bang_call.py tests/test_bang_width.py tests/test_bang_opq.py \
  -p no:cacheprovider > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$out/tests.log")"
summ() { python3 scripts/device/bang_rows.py "$1"; }
P=new-onecall-mapped,new-onecall-mapped-loadtab
KNNKIT_PROGRESS=0 timeout ${BT:-330} $py benchmarks/bang_bench.py --n 3000000 --d 96 --beams 24,32,48 --widths 4 \
  --prefetch on --rerank on --paths $P,$P,new-mapped,new-mapped-loadtab --no-cuvs --busy \
  --out "$out/bang_3m.json" > "$out/bang_3m.log" 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s"; summ "$out/bang_3m.log" | tee "$out/summary_3m.txt"
