#!/usr/bin/env bash
# Fourteenth session, fifth GPU call (issue 16): BANG host placement with short codes (12 bytes for
# 96-d: 8 dimensions per subspace), PQ against OPQ on the GPU walk (QPS at a recall, training time);
# then a build whose memory budget forces out-of-core candidate lists on the GPU, searched under a
# budget of 1/10 of graph + vectors.
#   OUT=/some/folder scripts/device/s14_e.sh   (from the repository root)
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
t0=$(date +%s)
for c in pq opq; do
  timeout 170 $py benchmarks/bang_bench.py --n 2000000 --pq-bytes 12 --compression $c --beams 16,32,64,128 \
      --widths 4 --prefetch on --rerank on --no-cuvs --out "$out/bang_${c}12.json" > "$out/bang_${c}12.log" 2>&1
  echo "$c rc=$? $(( $(date +%s) - t0 )) s"; grep -o '"beam": [0-9]*\|"recall": [0-9.]*\|"qps": [0-9.]*' "$out/bang_${c}12.log" | paste -sd' ' | fold -w 300
  grep -o '"build_s": [0-9.]*\|"pq[a-z_]*": [0-9.]*' "$out/bang_${c}12.json" | head -8 | paste -sd' '
done
timeout 300 $py benchmarks/bang_bench.py --n 2000000 --build-budget-mb 1024 --budget-ratio 10 --beams 32,64 \
    --widths 4 --prefetch on --rerank on --no-cuvs --out "$out/bang_ooc.json" > "$out/bang_ooc.log" 2>&1
echo "ooc rc=$? $(( $(date +%s) - t0 )) s"; grep -v -i warn "$out/bang_ooc.log" | grep -o '"beam": [0-9]*\|"recall": [0-9.]*\|"qps": [0-9.]*\|"build_s": [0-9.]*' | paste -sd' '
grep -o '"candidates[^,]*,\|"out_of_core[^}]*}' "$out/bang_ooc.json" | head -5
