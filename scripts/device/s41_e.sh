#!/usr/bin/env bash
# Forty-first session, fifth call (nvidia-h200, no peers; issue 16): 3M x 96 under the budget with
# the seeds "direct" where its blocks serve >= 4 queries (2707 entry points: one call instead of
# three), and in one call; then the GPU tests of the seed selection and the host-placed calls.
. scripts/device/common.sh
KNNKIT_PROGRESS=0 timeout 150 $py benchmarks/bang_bench.py --n 3000000 --d 96 --beams 24,32,48 --widths 4 --prefetch on \
  --rerank on --no-cuvs --paths new-mapped,new-onecall-mapped,new-mapped --busy --out "$out/bang_3m.json" > "$out/bang_3m.log" 2>&1
echo "3m rc=$? $(( $(date +%s) - t0 )) s"; python3 scripts/device/bang_rows.py "$out/bang_3m.log" | tee "$out/summary_3m.txt"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))
for r in d["rows"]:
    if "busy" not in r and "seed_method" in r: print(r["path"], r["beam"], "seeds", r.get("seed_method"), "calls", r.get("calls"))' "$out/bang_3m.json"
timeout 200 $py -m pytest -q -m gpu tests/test_bang_call.py tests/test_graph_index_gpu.py -k "seed or gpu_new or bounded or mapped" \
  -p no:cacheprovider > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$out/tests.log")"
