#!/usr/bin/env bash
# Thirty-fourth session (nvidia-h200, cuVS 26.10 staged in the lease): the host-placed search's GPU
# tests on the final tree, then 20M x 96 clustered against cuVS IVF-PQ + host refine with the peer
# measured before knnkit's build and again after its rows (how much the peer drifts within a lease).
. scripts/device/common.sh
. scripts/device/peer_env.sh
timeout 220 $py -m pytest -q -m gpu tests/test_bang_call.py tests/test_bang.py -p no:cacheprovider > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$out/tests.log")"
KNNKIT_PROGRESS=0 timeout 340 $py benchmarks/bang_bench.py --n 20000000 --d 96 --beams 24,32,48 --widths 4 \
  --prefetch on --rerank on --paths new-onecall,new-onecall --cuvs-probes 4,6,8,12 --cuvs-twice \
  --out "$out/bang_20m_twice.json" > "$out/bang_20m.log" 2>&1
echo "20m rc=$? $(( $(date +%s) - t0 )) s"
python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    if r.get("method", "").startswith("cuvs"):
        print("cuvs", r["when"], "probes", r["n_probes"], round(r["recall"], 4), round(r["qps"]))
    else:
        print(r["path"], "L", r["beam"], round(r["recall"], 4), round(r["qps"]), "gather_ms", round(1e3 * r["host_gather_s"], 2))
print("stages", json.dumps({k: v for k, v in d["stages"].items() if k.endswith("_s")}), d.get("cuvs_error", ""))
' "$out/bang_20m_twice.json"
