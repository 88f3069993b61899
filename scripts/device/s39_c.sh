#!/usr/bin/env bash
# Thirty-ninth session, fifth call (nvidia-h200; issue 16; tree c44462f, its -together flag reverted
# after this call): the batches' fused walks one after the
# other (each batch's re-rank beside the next walk) against all at once, 3M x 96, two and four
# pipelined batches, one call and under the budget; the fused GPU tests first.
. scripts/device/common.sh
$py -m pytest -q -x -m gpu tests/test_bang_call.py -k "fused" -p no:cacheprovider > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$out/tests.log")"
P=new-onecall-mapped,new-onecall-mapped-together
KNNKIT_PROGRESS=0 timeout 300 $py benchmarks/bang_bench.py --n ${N:-3000000} --d 96 --beams 20,32,64 --widths 4 \
  --pipeline-batches 2,4 --prefetch on --rerank on --paths $P,$P,new-mapped,new-mapped-together --no-cuvs \
  --out "$out/bang_3m.json" > "$out/bang_3m.log" 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s"; python3 scripts/device/bang_rows.py "$out/bang_3m.log" | tee "$out/summary_3m.txt"
