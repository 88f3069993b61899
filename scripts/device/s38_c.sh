#!/usr/bin/env bash
# Thirty-eighth session, third call (nvidia-h200, cuVS 26.10 staged; issue 16): 20M x 96 clustered,
# the host gather against mapped access from managed memory, one call and under the budget (1/8 of
# graph + vectors), beside cuVS IVF-PQ + host refine in the same process; then the GPU tests of the
# host-placed search. N (default 20M) and TAG name another size.
. scripts/device/common.sh
. scripts/device/peer_env.sh
N=${N:-20000000}; TAG=${TAG:-20m}; BT=${BT:-420}
summ() { python3 scripts/device/bang_rows.py "$1"; }
P=new-onecall,new-onecall-mapped
KNNKIT_PROGRESS=0 timeout $BT $py benchmarks/bang_bench.py --n $N --d 96 --beams ${BEAMS:-24,32,48,64} --widths 4 --prefetch on \
  --rerank on --paths ${PATHS:-$P,new,new-mapped,$P} --cuvs-probes 4,6,8,12 ${EXTRA:-} --busy --out "$out/bang_$TAG.json" > "$out/bang_$TAG.log" 2>&1
echo "$TAG rc=$? $(( $(date +%s) - t0 )) s"; summ "$out/bang_$TAG.log" | tee "$out/summary_$TAG.txt"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("stages", {k: v for k, v in d["stages"].items() if k.endswith("_s")})' "$out/bang_$TAG.json"
if [ "${TESTS:-1}" = 1 ]; then
  $py -m pytest -q -m gpu tests/test_bang_call.py tests/test_bang_width.py -p no:cacheprovider > "$out/tests.log" 2>&1
  echo "tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$out/tests.log")"
fi
