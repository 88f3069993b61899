#!/usr/bin/env bash
# Twenty-ninth session, second call (nvidia-h200, no peers): the host-placed search under the
# bench's memory budget, 3M x 96: the per-call bound (10k queries in calls of >= 4,096, "new")
# against every query in one walk ("new-onecall", as before the bound), same process, with a
# profiled and a busy-time call per configuration.
. scripts/device/common.sh
KNNKIT_TEST_SEED=2866403618 timeout 100 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_sweet_gpu.py \
  > "$out/sweet_tests.log" 2>&1
echo "sweet tests rc=$? $(( $(date +%s) - t0 )) s"; tail -2 "$out/sweet_tests.log"
KNNKIT_PROGRESS=0 timeout ${BENCH_S:-500} $py benchmarks/bang_bench.py --n 3000000 --d 96 --beams 16,20,32,64 \
  --paths new,new-onecall,new --no-cuvs --profile --busy --out "$out/bang_3m_bound.json" > "$out/bang.log" 2>&1
echo "bang rc=$? $(( $(date +%s) - t0 )) s"
grep -v "it/s\|iter/s\|Deprec" "$out/bang.log" | grep '"method"' | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(r["path"], r["beam"], round(r["recall"], 4), round(r["qps"]), "calls", r.get("calls"))
'
