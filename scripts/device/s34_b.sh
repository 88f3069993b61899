#!/usr/bin/env bash
# Thirty-fourth session (nvidia-h200, cuVS 26.10 staged in the lease): the host gather's prefetch
# alone (3M and 20M rows) and in the walk, alternated with "-nopf", beside cuVS IVF-PQ + refine in
# the same process: 20M x 96 clustered, then broad 2M x 96 at large beams (issue 16).
# Needs benchmarks/results/h200-2026-12-01-s34/gather_prefetch/gather_ahead.patch applied: the
# "-nopf" paths and configure(gather_ahead=) went with the reverted change.
. scripts/device/common.sh
. scripts/device/peer_env.sh
for n in 3000000 20000000; do
  timeout 90 $py benchmarks/bang_gather_micro.py --n $n --reps 100 --out "$out/gather_${n}.json" > "$out/gather_$n.log" 2>&1
  echo "gather n=$n rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$out/gather_$n.log")"
done
summ() {
  grep '^{"method"' "$1" | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(r["path"], "L", r["beam"], "W", r["width"], round(r["recall"], 4), round(r["qps"]), "it", r.get("iterations"),
          "gather_ms", round(1e3 * r.get("host_gather_s", 0), 2), "walk_ms", round(1e3 * r["walk_s"], 2),
          "calls", r.get("calls"))
'
  python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    if r.get("method", "").startswith("cuvs"):
        print("cuvs probes", r["n_probes"], round(r["recall"], 4), round(r["qps"]))
    elif "busy" in r:
        print("busy", r["path"], r["beam"], json.dumps(r["busy"]))
print("stages", json.dumps({k: v for k, v in d["stages"].items() if k.endswith("_s")}), d.get("cuvs_error", ""))
' "$2"
}
KNNKIT_PROGRESS=0 timeout 330 $py benchmarks/bang_bench.py --n 20000000 --d 96 --beams 20,24,32,48 --widths 4 \
  --prefetch on --rerank on --paths new-onecall,new-onecall-nopf,new-onecall,new-onecall-nopf,new \
  --cuvs-probes 4,6,8,12,16,32 --busy --out "$out/bang_20m.json" > "$out/bang_20m.log" 2>&1
echo "20m rc=$? $(( $(date +%s) - t0 )) s"; summ "$out/bang_20m.log" "$out/bang_20m.json"
KNNKIT_PROGRESS=0 timeout 160 $py benchmarks/bang_bench.py --n 2000000 --d 96 --data broad --beams 128,256,512 \
  --widths 4 --prefetch on --rerank on --paths new-onecall,new-onecall-nopf,new-onecall,new-onecall-nopf \
  --cuvs-probes 64,128,256,512,1024 --out "$out/bang_broad.json" > "$out/bang_broad.log" 2>&1
echo "broad rc=$? $(( $(date +%s) - t0 )) s"; summ "$out/bang_broad.log" "$out/bang_broad.json"
