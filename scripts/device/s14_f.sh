#!/usr/bin/env bash
# Fourteenth session, sixth GPU call: GPU tests of host placement (the build's walk check), then
# the check at 2M x 96 with 12-byte OPQ codes (its cost, what it finds, the warning) and with the
# default codes.
#   OUT=/some/folder scripts/device/s14_f.sh   (from the repository root)
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
t0=$(date +%s)
timeout 250 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_bang.py tests/test_bang_call.py tests/test_bang_opq.py tests/test_bang_width.py > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|FAILED|Error" "$out/tests.log" | tail -8
for c in "--pq-bytes 12 --compression opq" ""; do
  tag=$([ -n "$c" ] && echo opq12 || echo default)
  timeout 150 $py benchmarks/bang_bench.py --n 2000000 $c --beams 32,64 --widths 4 --prefetch on --rerank on --no-cuvs \
      --out "$out/bang_check_$tag.json" > "$out/bang_check_$tag.log" 2>&1
  echo "$tag rc=$? $(( $(date +%s) - t0 )) s"; grep -i "RuntimeWarning\|raised" "$out/bang_check_$tag.log" | cut -c1-400
  grep -o '"host_check[^}]*}\|"default_beam": [0-9]*' "$out/bang_check_$tag.json" | tr -d '\n '; echo
  grep -o '"host_check": [0-9.]*' "$out/bang_check_$tag.json"
  grep -o '"beam": [0-9]*\|"recall": [0-9.]*\|"qps": [0-9.]*' "$out/bang_check_$tag.log" | paste -sd' '
done
