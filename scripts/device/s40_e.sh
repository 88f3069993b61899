#!/usr/bin/env bash
# Fortieth session, fifth call (nvidia-h200, no peers; issue 16): every BANG GPU test at the final
# kernels (bang_merge and bang_walk sharing one merge, bang::merge_into_list), then 3M x 96: the
# fused walk now (tables made by its blocks, the row-free re-rank), one call and under the budget,
# against the thirty-ninth session's path (-loadtab-rowsfirst-einsum-coldpool), twice each.
. scripts/device/common.sh
$py -m pytest -q -m gpu tests/test_bang.py tests/test_bang_call.py tests/test_bang_width.py tests/test_bang_opq.py \
  -p no:cacheprovider > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$out/tests.log")"
P=new-onecall-mapped,new-mapped,new-onecall-mapped-loadtab-rowsfirst-einsum-coldpool
KNNKIT_PROGRESS=0 timeout ${BT:-280} $py benchmarks/bang_bench.py --n 3000000 --d 96 --beams 24,32,48 --widths 4 \
  --prefetch on --rerank on --paths $P,$P --no-cuvs --busy --out "$out/bang_3m.json" > "$out/bang_3m.log" 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s"; python3 scripts/device/bang_rows.py "$out/bang_3m.log" | tee "$out/summary_3m.txt"
