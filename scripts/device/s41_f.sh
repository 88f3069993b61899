#!/usr/bin/env bash
# Forty-first session, sixth call (nvidia-h200, cuVS 26.10 staged; issue 16): the final tree at
# 20M x 96 beside cuVS IVF-PQ + refine in the same process (the peer after knnkit's build), under
# the budget (1/8 of graph + vectors) and in one call; busy fractions and timelines.
. scripts/device/common.sh
export PYTHONPATH=/tmp/peer-site:$PYTHONPATH
KNNKIT_PROGRESS=0 timeout ${BT:-330} $py benchmarks/bang_bench.py --n 20000000 --d 96 --beams 24,32,48 --widths 4 --prefetch on \
  --rerank on --paths new-mapped,new-onecall-mapped,new-mapped --cuvs-probes 4,6,8 --busy --timeline \
  --out "$out/bang_20m.json" > "$out/bang_20m.log" 2>&1
echo "20m rc=$? $(( $(date +%s) - t0 )) s"; python3 scripts/device/bang_rows.py "$out/bang_20m.log" | tee "$out/summary_20m.txt"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))
for t in d.get("timeline", []):
    s = t.get("summary", t); print(t["path"], t["beam"], {k: s.get(k) for k in ("wall_us", "first_walk_start_us", "gpu_end_us", "kernel_union_us")})
for r in d["rows"]:
    if r.get("method", "").startswith("cuvs"): print(r["method"], r.get("n_probes"), round(r["recall"], 4), round(r["qps"]))
    elif "busy" not in r and "seed_method" in r: print(r["path"], r["beam"], "seeds", r["seed_method"], "calls", r["calls"])' "$out/bang_20m.json"
