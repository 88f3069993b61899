#!/usr/bin/env bash
# Forty-first session, second call (nvidia-h200, no peers; issue 16): the call's setup per call
# instead of per batch, no fill kernels before the fused walk, results in place, lazy statistics,
# one reduction for the queries' checks, and the re-rank on a stream of the highest priority.
# 3M x 96 under the budget and in one call, beams 24 / 32 / 48: this tree (A), the fortieth
# session's tree b86c674 (carried as .oldtree, B) on the same saved index, this tree again (C);
# timelines and busy fractions; then every BANG GPU test.
. scripts/device/common.sh
C3=${TMPDIR:-/tmp}/c3m
P=new-onecall-mapped,new-mapped,new-mapped-rrsame
B="--n 3000000 --d 96 --beams 24,32,48 --widths 4 --prefetch on --rerank on --no-cuvs --cache $C3"
KNNKIT_PROGRESS=0 timeout 200 $py benchmarks/bang_bench.py $B --paths $P --timeline --busy --out "$out/a.json" > "$out/a.log" 2>&1
echo "A rc=$? $(( $(date +%s) - t0 )) s"; python3 scripts/device/bang_rows.py "$out/a.log"
KNNKIT_PROGRESS=0 PYTHONPATH=.oldtree/src timeout 100 $py benchmarks/bang_bench.py $B --paths new-onecall-mapped,new-mapped --busy \
  --out "$out/b_old.json" > "$out/b_old.log" 2>&1
echo "B rc=$? $(( $(date +%s) - t0 )) s"; python3 scripts/device/bang_rows.py "$out/b_old.log"
KNNKIT_PROGRESS=0 timeout 100 $py benchmarks/bang_bench.py $B --paths $P --busy --out "$out/c.json" > "$out/c.log" 2>&1
echo "C rc=$? $(( $(date +%s) - t0 )) s"; python3 scripts/device/bang_rows.py "$out/c.log"
grep '"timeline"' "$out/a.log" | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line); s = {k: r.get(k) for k in ("timeline", "beam", "wall_us", "first_walk_start_us", "walk_span_us", "gpu_end_us", "tail_us", "kernel_union_us", "kernels")}
    print(s, "gaps>100us:", [g for g in r.get("gaps", []) if g[1] > 100])'
timeout 280 $py -m pytest -q -m gpu tests/test_bang.py tests/test_bang_call.py tests/test_bang_width.py tests/test_bang_opq.py -p no:cacheprovider > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$out/tests.log")"
