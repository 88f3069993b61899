#!/usr/bin/env bash
# Thirty-second session (nvidia-h200, no peers): the host step now bounds the walk (gathers ~0.21 ms
# of ~0.32 ms per batch step, 3/4 of the bytes being stashed vectors). 3M x 96: the re-rank rows
# stashed during the walk (default) against gathered after it ("-host"), one call and under the
# bench's budget, alternated, busy time per configuration; then the GPU tests of test_bang_call.py
# (gather_walk is one parallel loop now).
. scripts/device/common.sh
KNNKIT_PROGRESS=0 timeout ${BENCH_S:-150} $py benchmarks/bang_bench.py --n 3000000 --d 96 --beams 16,20,32,64 \
  --widths 4 --prefetch on --rerank on --paths new-onecall,new-onecall-host,new,new-host,new-onecall,new-onecall-host \
  --no-cuvs --busy --out "$out/bang_3m_host_rerank.json" > "$out/bang.log" 2>&1
echo "bang rc=$? $(( $(date +%s) - t0 )) s"
grep '^{"method"' "$out/bang.log" | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(r["path"], r["beam"], round(r["recall"], 4), round(r["qps"]), "calls", r.get("calls"), r["rerank_mode"],
          "gather_ms", round(1e3 * r["host_gather_s"], 2), "launch_ms", round(1e3 * r["host_launch_s"], 2),
          "wait_ms", round(1e3 * r["host_wait_s"], 2), "rerank_ms", round(1e3 * r["rerank_s"], 2))
'
grep '^{"busy"' "$out/bang.log" | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print("busy", r["busy"], r["beam"], "kernel", round(r["kernel_frac"], 3), "busy", round(r["busy_frac"], 3))
'
timeout 150 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_bang_call.py > "$out/bang_call_tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"; tail -2 "$out/bang_call_tests.log"
