#!/usr/bin/env bash
# Forty-second session, first call (nvidia-h200, cuVS 26.10 staged; issue 16): every BANG GPU test
# at the tree with the shared bang::pq_score helper; then broad 2M x 96 (make_broad_clusters, LID
# ~56) beside cuVS IVF-PQ + refine in the same process (the peer before knnkit's build and after),
# one call and under the budget (1/8 of graph + vectors): the last broad reading against the peer
# was the thirty-fourth session's (~1.35x at 0.90), before the fused walk.
. scripts/device/common.sh
. scripts/device/peer_env.sh
export TMPDIR=/tmp/knnkit-s42; rm -rf "$TMPDIR"; mkdir -p "$TMPDIR"
if [ "${TESTS:-1}" = 1 ]; then
  $py -m pytest -q -m gpu tests/test_bang.py tests/test_bang_call.py tests/test_bang_width.py tests/test_bang_opq.py \
    -p no:cacheprovider > "$out/tests.log" 2>&1
  echo "tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$out/tests.log")"
fi
KNNKIT_PROGRESS=0 timeout ${BT:-400} $py benchmarks/bang_bench.py --n ${N:-2000000} --d 96 --data broad \
  --beams ${BEAMS:-128,192,256,384,512} --widths 4 --prefetch on --rerank on \
  --paths ${PATHS:-new-onecall-mapped,new-mapped,new-onecall-mapped,new-mapped} \
  --cuvs-probes ${PROBES:-128,192,256,384,512,768} --cuvs-twice --busy --out "$out/bang_broad.json" > "$out/bang_broad.log" 2>&1
echo "broad rc=$? $(( $(date +%s) - t0 )) s"; python3 scripts/device/bang_rows.py "$out/bang_broad.log" | tee "$out/summary_broad.txt"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("stages", {k: v for k, v in d["stages"].items() if k.endswith("_s")}, d.get("cuvs_error", ""))
for r in d["rows"]:
    if r.get("method", "").startswith("cuvs"): print(r["method"], r["when"], r.get("n_probes"), round(r["recall"], 4), round(r["qps"]))
    elif "busy" not in r and "seed_method" in r: print(r["path"], r["beam"], "seeds", r["seed_method"], "calls", r["calls"])' "$out/bang_broad.json"
rm -rf "$TMPDIR"
