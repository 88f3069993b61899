#!/usr/bin/env bash
# Thirty-fifth session (nvidia-h200, cuVS 26.10 staged in the lease): the largest host-placed index
# one 10-minute call can generate, build and search beside its peer: 40M x 96 clustered (2x the
# 20M of earlier sessions), searched under 1/8 of graph + vectors, against cuVS IVF-PQ + host
# refine in the same process (issue 16). The build runs in GPU memory under an explicit 130,000 MiB
# budget (the automatic one, a share of the free memory, sends 40M out of core: ~11 min).
. scripts/device/common.sh
. scripts/device/peer_env.sh
# the bench's data and temporary files in a folder of its own, removed at the end (a killed run
# left 40 GB in /tmp, and the next run's memory map hit a full disk)
export TMPDIR=/tmp/knnkit-s35; rm -rf "$TMPDIR"; mkdir -p "$TMPDIR"
free -g | head -2
KNNKIT_PROGRESS=0 timeout 540 $py benchmarks/bang_bench.py --n 40000000 --d 96 --beams 24,32,48 --widths 4 \
  --prefetch on --rerank on --paths new-onecall,new-onecall,new --cuvs-probes 4,6,8,12 --build-budget-mb 130000 \
  --out "$out/bang_40m.json" > "$out/bang_40m.log" 2>&1
echo "40m rc=$? $(( $(date +%s) - t0 )) s"
python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    if r.get("method", "").startswith("cuvs"):
        print("cuvs probes", r["n_probes"], round(r["recall"], 4), round(r["qps"]))
    else:
        print(r["path"], "L", r["beam"], round(r["recall"], 4), round(r["qps"]), "gather_ms", round(1e3 * r["host_gather_s"], 2),
              "calls", r.get("calls"))
print("stages", json.dumps({k: v for k, v in d["stages"].items() if k.endswith("_s")}), d.get("cuvs_error", ""))
print("memory", json.dumps(d.get("memory")))
' "$out/bang_40m.json"
free -g | head -2
rm -rf "$TMPDIR"
