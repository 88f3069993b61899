#!/usr/bin/env bash
# Thirty-second session, second call (nvidia-h200, no peers): (1) the GPU tests of the host-placed
# search (bfloat16 tables: bang_tables' bits against _pq.round_bf16, new = legacy = CPU twin);
# (2) 3M x 96: bfloat16 tables (default) against float32 ("-f32"), one call and under the bench's
# budget, W = 4 and 8, alternated in one process, with a busy-time call per configuration.
. scripts/device/common.sh
timeout 260 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_bang_call.py tests/test_bang.py tests/test_bang_width.py \
  tests/test_bang_opq.py > "$out/bang_tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"; tail -3 "$out/bang_tests.log"
KNNKIT_PROGRESS=0 timeout ${BENCH_S:-300} $py benchmarks/bang_bench.py --n 3000000 --d 96 --beams 16,20,32,64 \
  --widths 4,8 --prefetch on --rerank on \
  --paths new-onecall,new-onecall-f32,new,new-f32,new-onecall,new-onecall-f32 \
  --no-cuvs --busy --out "$out/bang_3m_bf16.json" > "$out/bang.log" 2>&1
echo "bang rc=$? $(( $(date +%s) - t0 )) s"
grep -v "it/s\|iter/s\|Deprec" "$out/bang.log" | grep '"method"' | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(r["path"], "W", r["width"], r["beam"], round(r["recall"], 4), round(r["qps"]), "calls", r.get("calls"),
          "iters", r["iterations"], "smem", r["table_in_smem"], "launch_ms", round(1e3 * r["host_launch_s"], 2),
          "gather_ms", round(1e3 * r["host_gather_s"], 2), "wait_ms", round(1e3 * r["host_wait_s"], 2))
'
grep '"busy"' "$out/bang.log" | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print("busy", r["busy"], "W", r["width"], r["beam"], "kernel", round(r["kernel_frac"], 3), "busy", round(r["busy_frac"], 3),
          "kernel_ms", round(1e3 * r["kernel_s"], 2))
'
