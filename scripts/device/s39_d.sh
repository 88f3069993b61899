#!/usr/bin/env bash
# Thirty-ninth session, last call (nvidia-h200, no peers; issue 16): every GPU test of the BANG
# search at the final tree, then a profiled 3M x 96 call of the fused walk (where a call goes now).
. scripts/device/common.sh
timeout 330 $py -m pytest -q -m gpu tests/test_bang.py tests/test_bang_call.py tests/test_bang_width.py \
  tests/test_bang_opq.py -p no:cacheprovider > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$out/tests.log")"
KNNKIT_PROGRESS=0 timeout 100 $py benchmarks/bang_bench.py --n 3000000 --d 96 --beams 32,64 --widths 4 --prefetch on \
  --rerank on --paths new-onecall-mapped --no-cuvs --profile --out "$out/prof.json" > "$out/prof.log" 2>&1
python3 scripts/device/bang_prof.py "$out/prof.json"
