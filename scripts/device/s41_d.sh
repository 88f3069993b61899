#!/usr/bin/env bash
# Forty-first session, fourth call (nvidia-h200, no peers; issue 16): the final tree. 3M x 96
# under the budget (the seed GEMM's products counted: seeds "direct", one call) and in one call,
# beams 24 / 32 / 48, busy fractions and timelines; then every BANG GPU test.
. scripts/device/common.sh
KNNKIT_PROGRESS=0 timeout 200 $py benchmarks/bang_bench.py --n 3000000 --d 96 --beams 24,32,48 --widths 4 --prefetch on \
  --rerank on --no-cuvs --paths new-onecall-mapped,new-mapped,new-onecall-mapped,new-mapped --busy --timeline \
  --out "$out/bang_3m.json" > "$out/bang_3m.log" 2>&1
echo "3m rc=$? $(( $(date +%s) - t0 )) s"; python3 scripts/device/bang_rows.py "$out/bang_3m.log" | tee "$out/summary_3m.txt"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))
for t in d.get("timeline", []):
    s = t.get("summary", t); print(t["path"], t["beam"], {k: s.get(k) for k in ("wall_us", "first_walk_start_us", "walk_span_us", "gpu_end_us", "kernel_union_us", "kernels")})
for r in d["rows"]:
    if "busy" not in r and "seed_method" in r: print(r["path"], r["beam"], "seeds", r.get("seed_method"), "calls", r.get("calls"), "in place", r.get("results_in_place"))' "$out/bang_3m.json"
timeout 300 $py -m pytest -q -m gpu tests/test_bang.py tests/test_bang_call.py tests/test_bang_width.py tests/test_bang_opq.py \
  -p no:cacheprovider > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$out/tests.log")"
