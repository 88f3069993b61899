#!/usr/bin/env bash
# Thirty-ninth session, second call (nvidia-h200, no peers; issue 16): the fused walk with a step's
# code rows staged in shared memory. GPU tests of the mapped walk (every shared-memory plan) and the
# width tests, then 3M x 96: fused against steps, two and four pipelined batches, and a profile.
. scripts/device/common.sh
$py -m pytest -q -x -m gpu tests/test_bang_call.py tests/test_bang_width.py -k "mapped or fused or width" \
  -p no:cacheprovider > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$out/tests.log")"
summ() { python3 scripts/device/bang_rows.py "$1"; }
P=new-onecall-mapped,new-onecall-mapped-steps
KNNKIT_PROGRESS=0 timeout 300 $py benchmarks/bang_bench.py --n 3000000 --d 96 --beams 20,32,64 --widths 4 \
  --pipeline-batches 2,4 --prefetch on --rerank on --paths $P,$P,new-mapped --no-cuvs --busy \
  --out "$out/bang_3m.json" > "$out/bang_3m.log" 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s"; summ "$out/bang_3m.log" | tee "$out/summary_3m.txt"
KNNKIT_PROGRESS=0 timeout 200 $py benchmarks/bang_bench.py --n 3000000 --d 96 --beams 32,64 --widths 4 --prefetch on \
  --rerank on --paths new-onecall-mapped,new-onecall-mapped-steps --no-cuvs --profile --out "$out/prof.json" > "$out/prof.log" 2>&1
python3 scripts/device/bang_prof.py "$out/prof.json"
