#!/usr/bin/env bash
# Thirty-ninth session, first call (nvidia-h200, no peers; issue 16): the fused mapped walk
# (bang_walk: one launch per batch) and the walk-sized Bloom filter. GPU tests of the host-placed
# search, then 3M x 96: mapped fused against mapped by steps (and the host gather), one call and
# under the budget, alternated, with the kernels' share of the call (--busy).
. scripts/device/common.sh
$py -m pytest -q -x -m gpu tests/test_bang_call.py tests/test_bang_width.py -p no:cacheprovider \
  > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$out/tests.log")"
summ() { python3 scripts/device/bang_rows.py "$1"; }
P=new-onecall-mapped,new-onecall-mapped-steps
KNNKIT_PROGRESS=0 timeout ${BT:-360} $py benchmarks/bang_bench.py --n ${N:-3000000} --d 96 --beams ${BEAMS:-20,32,64} --widths 4 \
  --prefetch on --rerank on --paths $P,new-onecall,$P,new-mapped,new-mapped-steps --no-cuvs --busy \
  --out "$out/bang_${TAG:-3m}.json" > "$out/bang_${TAG:-3m}.log" 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s"; summ "$out/bang_${TAG:-3m}.log" | tee "$out/summary_${TAG:-3m}.txt"
python3 -c 'import json,sys; print("stages", json.load(open(sys.argv[1]))["stages"])' "$out/bang_${TAG:-3m}.json"
