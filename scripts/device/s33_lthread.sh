#!/usr/bin/env bash
# Thirty-third session (nvidia-h200, no peers): the host gather walk with a second host thread that
# queues each batch's step ("-lthread") against one thread, 3M x 96, one call and under the bench's
# budget, alternated in one process, busy time per configuration; then the same at 20M (one call).
. scripts/device/common.sh
timeout 120 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_bang_call.py -k "launch or mapped or new_equals" \
  > "$out/tests.log" 2>&1; echo "tests rc=$? $(( $(date +%s) - t0 )) s"; tail -1 "$out/tests.log"
show() {
grep '^{"method"' "$1" | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(r["path"], r["beam"], round(r["recall"], 4), round(r["qps"]), "calls", r.get("calls"), r.get("access"),
          "lthread", r.get("launch_thread"), "iters", r["iterations"], "launch_ms", round(1e3 * r["host_launch_s"], 2),
          "gather_ms", round(1e3 * r["host_gather_s"], 2), "wait_ms", round(1e3 * r["host_wait_s"], 2), "walk_ms", round(1e3 * r["walk_s"], 2))
'
grep '"busy"' "$1" | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print("busy", r["busy"], r["beam"], "kernel", round(r["kernel_frac"], 3), "busy", round(r["busy_frac"], 3))
'
}
KNNKIT_PROGRESS=0 timeout 200 $py benchmarks/bang_bench.py --n 3000000 --d 96 --beams 16,20,32,64 \
  --widths 4 --prefetch on --rerank on \
  --paths new-onecall,new-onecall-lthread,new,new-lthread,new-onecall,new-onecall-lthread \
  --no-cuvs --busy --out "$out/bang_3m_lthread.json" > "$out/bang3m.log" 2>&1
echo "3m rc=$? $(( $(date +%s) - t0 )) s"; show "$out/bang3m.log"
KNNKIT_PROGRESS=0 timeout ${BENCH_S:-300} $py benchmarks/bang_bench.py --n 20000000 --d 96 --beams 20,32,48,64 \
  --widths 4 --prefetch on --rerank on --paths new-onecall,new-onecall-lthread,new-onecall,new-onecall-lthread \
  --no-cuvs --busy --out "$out/bang_20m_lthread.json" > "$out/bang20m.log" 2>&1
echo "20m rc=$? $(( $(date +%s) - t0 )) s"; show "$out/bang20m.log"
grep -i "Traceback\|Error" "$out"/bang*.log | head -5
