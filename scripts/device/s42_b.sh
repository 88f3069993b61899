#!/usr/bin/env bash
# Forty-second session (nvidia-h200, cuVS 26.10 staged; issue 16): N x 96 clustered (default 20M)
# beside cuVS IVF-PQ + refine in the same process (the peer before knnkit's build and after its
# rows), under the budget (1/8 of graph + vectors) and in one call, alternated; busy fractions and
# timelines. The forty-first session's final tree had no peer beside it (cuVS did not import).
. scripts/device/common.sh
. scripts/device/peer_env.sh
export TMPDIR=/tmp/knnkit-s42; rm -rf "$TMPDIR"; mkdir -p "$TMPDIR"
N=${N:-20000000}; TAG=${TAG:-20m}
KNNKIT_PROGRESS=0 timeout ${BT:-540} $py benchmarks/bang_bench.py --n $N --d 96 --beams ${BEAMS:-24,32,48} --widths 4 \
  --prefetch on --rerank on --paths ${PATHS:-new-mapped,new-onecall-mapped,new-mapped,new-onecall-mapped,new-mapped} \
  --cuvs-probes ${PROBES:-4,6,8,12} --cuvs-twice ${EXTRA:---busy --timeline} --out "$out/bang_$TAG.json" > "$out/bang_$TAG.log" 2>&1
echo "$TAG rc=$? $(( $(date +%s) - t0 )) s"; python3 scripts/device/bang_rows.py "$out/bang_$TAG.log" | tee "$out/summary_$TAG.txt"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("stages", {k: v for k, v in d["stages"].items() if k.endswith("_s")}, d.get("cuvs_error", ""))
for t in d.get("timeline", []):
    s = t.get("summary", t); print(t["path"], t["beam"], {k: s.get(k) for k in ("wall_us", "first_walk_start_us", "gpu_end_us", "kernel_union_us")})
for r in d["rows"]:
    if r.get("method", "").startswith("cuvs"): print(r["method"], r["when"], r.get("n_probes"), round(r["recall"], 4), round(r["qps"]))
    elif "busy" not in r and "seed_method" in r: print(r["path"], r["beam"], "seeds", r["seed_method"], "calls", r["calls"])' "$out/bang_$TAG.json"
free -g | head -2; df -h /tmp | tail -1
rm -rf "$TMPDIR"
