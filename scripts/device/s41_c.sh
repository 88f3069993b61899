#!/usr/bin/env bash
# Forty-first session, third call (nvidia-h200, cuVS 26.10 staged; issue 16): the seed selection's
# GPU time by GEMM and direct (seeds_host_micro.py); 20M x 96 beside cuVS IVF-PQ + refine in the
# same process, one call and under the budget (1/8 of graph + vectors), the re-rank on the
# highest-priority stream or its batch's (-rrsame); busy fractions and timelines.
. scripts/device/common.sh
export PYTHONPATH=/tmp/peer-site:$PYTHONPATH
$py scripts/device/seeds_host_micro.py > "$out/seeds_micro.json" 2>&1; echo "micro rc=$? $(( $(date +%s) - t0 )) s"; tail -12 "$out/seeds_micro.json"
N=${N:-20000000}; TAG=${TAG:-20m}
KNNKIT_PROGRESS=0 timeout ${BT:-470} $py benchmarks/bang_bench.py --n $N --d 96 --beams ${BEAMS:-24,32,48} --widths 4 --prefetch on \
  --rerank on --paths ${PATHS:-new-onecall-mapped,new-mapped,new-mapped-rrsame,new-onecall-mapped,new-mapped} \
  --cuvs-probes 4,6,8,12 --cuvs-twice --busy --timeline --out "$out/bang_$TAG.json" > "$out/bang_$TAG.log" 2>&1
echo "$TAG rc=$? $(( $(date +%s) - t0 )) s"; python3 scripts/device/bang_rows.py "$out/bang_$TAG.log" | tee "$out/summary_$TAG.txt"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("stages", {k: v for k, v in d["stages"].items() if k.endswith("_s")})
for t in d.get("timeline", []):
    s = t.get("summary", t); print(t["path"], t["beam"], {k: s.get(k) for k in ("wall_us", "first_walk_start_us", "walk_span_us", "gpu_end_us", "kernel_union_us", "kernels")})
for r in d["rows"]:
    if "rerank_stream_priority" in r and "busy" not in r: print(r["path"], r["beam"], "prio", r["rerank_stream_priority"], "seeds", r.get("seed_method"), "calls", r.get("calls"))' "$out/bang_$TAG.json"
