#!/usr/bin/env bash
# Thirty-second session, last call (nvidia-h200, no peers): (1) 3M x 96, the direct table kernel
# (default) against the GEMM expansion ("-gemm"), one call and under the bench's budget, alternated,
# with a profiled call per configuration (setup phase); (2) every GPU test (session_check.sh, the
# host-placed search's files first).
. scripts/device/common.sh
KNNKIT_PROGRESS=0 timeout ${BENCH_S:-170} $py benchmarks/bang_bench.py --n 3000000 --d 96 --beams 16,20,32,64 \
  --widths 4 --prefetch on --rerank on --paths new-onecall,new-onecall-gemm,new,new-gemm,new-onecall,new-onecall-gemm \
  --no-cuvs --profile --out "$out/bang_3m_direct.json" > "$out/bang.log" 2>&1
echo "bang rc=$? $(( $(date +%s) - t0 )) s"
grep '^{"method"' "$out/bang.log" | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(r["path"], r["beam"], round(r["recall"], 4), round(r["qps"]), "calls", r.get("calls"), "setup_ms", round(1e3 * r["setup_s"], 2))
'
grep '^{"profiled"' "$out/bang.log" | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print("profiled", r["profiled"], r["beam"], {k: round(1e3 * v, 2) for k, v in (r.get("phases") or {}).items()},
          "tables_ms", round(1e3 * (r.get("gpu_s") or {}).get("tables", 0), 2))
'
mkdir -p "$out/check"
FIRST="tests/test_bang.py tests/test_bang_call.py tests/test_bang_width.py tests/test_bang_opq.py" OUT="$out/check" \
  SHARD_S=${SHARD_S:-380} bash scripts/device/session_check.sh 2>&1 | tail -12
