#!/usr/bin/env bash
# Forty-second session (nvidia-h200; issue 16): the GPU tests of the seed selection (the new
# seed_select_rows against seed_select's shared-memory mode, bit for bit) and of the host-placed
# search at the final tree; the selection's GPU time (seed_rows_micro.py); 3M x 96 under the
# budget and in one call with the seeds selected both ways, alternated in one process.
. scripts/device/common.sh
export TMPDIR=/tmp/knnkit-s42; rm -rf "$TMPDIR"; mkdir -p "$TMPDIR"
$py -m pytest -q -m gpu tests/test_graph_index_gpu.py -k "seed" -p no:cacheprovider > "$out/tests_seeds.log" 2>&1
echo "seed tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$out/tests_seeds.log")"
$py scripts/device/seed_rows_micro.py > "$out/seed_rows_micro.json" 2>&1; echo "micro rc=$?"; cat "$out/seed_rows_micro.json"
if [ "${TESTS:-1}" = 1 ]; then
  $py -m pytest -q -m gpu tests/test_bang.py tests/test_bang_call.py tests/test_bang_width.py tests/test_bang_opq.py \
    -p no:cacheprovider > "$out/tests_bang.log" 2>&1
  echo "bang tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$out/tests_bang.log")"
fi
P=new-mapped,new-mapped-seedsmem,new-onecall-mapped,new-onecall-mapped-seedsmem
KNNKIT_PROGRESS=0 timeout ${BT:-240} $py benchmarks/bang_bench.py --n ${N:-3000000} --d 96 --beams ${BEAMS:-24,32,48} --widths 4 \
  --prefetch on --rerank on --paths $P,$P --no-cuvs --out "$out/bang_3m.json" > "$out/bang_3m.log" 2>&1
echo "3m rc=$? $(( $(date +%s) - t0 )) s"; python3 scripts/device/bang_rows.py "$out/bang_3m.log" | tee "$out/summary_3m.txt"
rm -rf "$TMPDIR"
