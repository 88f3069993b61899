#!/usr/bin/env bash
# Thirtieth session (nvidia-h200, no peers): (1) the GPU tests of the host-placed search and of the
# exact engine (its CPU reference now takes the block-pair path on 16 threads), with the CPU tests
# of test_brute_force.py on 16 threads; (2) rolling batches under the bench's memory budget, 3M x 96:
# "new" (batches refilled as they finish) against "new-calls" (the twenty-ninth session's
# consecutive calls) and "new-onecall" (no bound), same process, with a profiled and a busy call.
. scripts/device/common.sh
timeout 240 $py -m pytest -q -p no:cacheprovider tests/test_bang_call.py tests/test_bang.py tests/test_bang_width.py \
  > "$out/bang_tests.log" 2>&1 &
timeout 240 $py -m pytest -q -p no:cacheprovider tests/test_brute_force.py tests/test_progress.py > "$out/exact_tests.log" 2>&1 &
wait
echo "tests $(( $(date +%s) - t0 )) s"; tail -2 "$out/bang_tests.log"; tail -2 "$out/exact_tests.log"
KNNKIT_PROGRESS=0 timeout ${BENCH_S:-330} $py benchmarks/bang_bench.py --n 3000000 --d 96 --beams 16,20,32,64 \
  --paths new,new-calls,new-onecall,new --no-cuvs --profile --busy --out "$out/bang_3m_rolling.json" > "$out/bang.log" 2>&1
echo "bang rc=$? $(( $(date +%s) - t0 )) s"
grep -v "it/s\|iter/s\|Deprec" "$out/bang.log" | grep '"method"' | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(r["path"], r["beam"], round(r["recall"], 4), round(r["qps"]), "calls", r.get("calls"), "chunks", r.get("chunks"))
'
grep '"busy"' "$out/bang.log" | cut -c1-300
