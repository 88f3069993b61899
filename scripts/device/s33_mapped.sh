#!/usr/bin/env bash
# Thirty-third session, first call (nvidia-h200, no peers): (1) the GPU tests of the host-placed
# search (mapped access: new kernels bang_gather_graph / bang_live; mapped = gather bit for bit);
# (2) 3M x 96: the host gather (BANG 4.3/4.6, default) against mapped access ("-mapped"), one call
# and under the bench's budget, alternated in one process, with a busy-time call per configuration.
. scripts/device/common.sh
timeout ${TEST_S:-200} $py -m pytest -q -m gpu -p no:cacheprovider tests/test_bang_call.py > "$out/bang_tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"; tail -3 "$out/bang_tests.log"
KNNKIT_PROGRESS=0 timeout ${BENCH_S:-300} $py benchmarks/bang_bench.py --n 3000000 --d 96 --beams 16,20,32,64 \
  --widths 4 --prefetch on --rerank on \
  --paths new-onecall,new-onecall-mapped,new,new-mapped,new-onecall,new-onecall-mapped \
  --no-cuvs --busy --out "$out/bang_3m_mapped.json" > "$out/bang.log" 2>&1
echo "bang rc=$? $(( $(date +%s) - t0 )) s"
grep -v "it/s\|iter/s\|Deprec" "$out/bang.log" | grep '^{"method"' | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(r["path"], r["beam"], round(r["recall"], 4), round(r["qps"]), "calls", r.get("calls"), r.get("access"),
          r.get("rerank_mode"), "iters", r["iterations"], "launches", r["launches"], "launch_ms", round(1e3 * r["host_launch_s"], 2),
          "gather_ms", round(1e3 * r["host_gather_s"], 2), "wait_ms", round(1e3 * r["host_wait_s"], 2))
'
grep '"busy"' "$out/bang.log" | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print("busy", r["busy"], r["beam"], "kernel", round(r["kernel_frac"], 3), "busy", round(r["busy_frac"], 3),
          "kernel_ms", round(1e3 * r["kernel_s"], 2))
'
grep -i "mapped\|Traceback\|Error" "$out/bang.log" | grep -v '^{' | head -5
python3 -c "import json; print(json.load(open('$out/bang_3m_mapped.json'))['stages'].get('mapped_register_s'))"
