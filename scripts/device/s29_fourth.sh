#!/usr/bin/env bash
# Twenty-ninth session, fourth call (nvidia-h200): the Sweet GPU test with the seed that failed
# (a cold machine compiles first: 300 s), then the 3M bench of the second call again after the
# split calls keep two pipelined batches.
. scripts/device/common.sh
KNNKIT_TEST_SEED=2866403618 timeout 300 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_sweet_gpu.py \
  > "$out/sweet_tests.log" 2>&1
echo "sweet tests rc=$? $(( $(date +%s) - t0 )) s"; tail -2 "$out/sweet_tests.log"
KNNKIT_PROGRESS=0 timeout ${BENCH_S:-240} $py benchmarks/bang_bench.py --n 3000000 --d 96 --beams 16,20,32,64 \
  --paths new,new-onecall,new --prefetch on --rerank on --no-cuvs --busy --out "$out/bang_3m_bound.json" > "$out/bang.log" 2>&1
echo "bang rc=$? $(( $(date +%s) - t0 )) s"
grep '"method"' "$out/bang.log" | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(r["path"], r["beam"], round(r["recall"], 4), round(r["qps"]), "calls", r.get("calls"), "batches", r.get("batches"))
'
grep '"busy"' "$out/bang.log" | cut -c1-400
