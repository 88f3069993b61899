#!/usr/bin/env bash
# Thirty-second session, first call (nvidia-h200, no peers): (1) the GPU tests of the host-placed
# search (graph steps against the calls one by one, bit for bit, among them); (2) 3M x 96: each walk
# step as one CUDA graph launch ("new", "new-onecall") against its calls one by one ("-calls"),
# alternated in one process, with a profiled and a busy-time call per configuration.
. scripts/device/common.sh
timeout 260 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_bang_call.py tests/test_bang.py tests/test_bang_width.py \
  > "$out/bang_tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"; tail -3 "$out/bang_tests.log"
KNNKIT_PROGRESS=0 timeout ${BENCH_S:-280} $py benchmarks/bang_bench.py --n 3000000 --d 96 --beams 16,20,32,64 \
  --prefetch on --rerank on --paths new-onecall,new-onecall-calls,new,new-calls,new-onecall,new-onecall-calls \
  --no-cuvs --profile --busy --out "$out/bang_3m_graphs.json" > "$out/bang.log" 2>&1
echo "bang rc=$? $(( $(date +%s) - t0 )) s"
grep -v "it/s\|iter/s\|Deprec" "$out/bang.log" | grep '"method"' | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(r["path"], r["beam"], round(r["recall"], 4), round(r["qps"]), "calls", r.get("calls"), "graph", r.get("graph_steps"),
          "launch_ms", round(1e3 * r["host_launch_s"], 2), "gather_ms", round(1e3 * r["host_gather_s"], 2),
          "wait_ms", round(1e3 * r["host_wait_s"], 2), "refused", r.get("graph_refused"))
'
grep '"busy"' "$out/bang.log" | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print("busy", r["busy"], r["beam"], {k: round(v, 3) for k, v in r.items() if isinstance(v, float)})
'
