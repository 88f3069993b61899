#!/usr/bin/env bash
# Fortieth session, third call (nvidia-h200, no peers; issue 16): why 20M one call read 1.07-1.10M
# QPS at beam 32 in the second call where the thirty-ninth session read 1.18-1.20M. The re-rank
# three ways in one process: rows read by id by bang_rerank_exact (now), rows copied into a buffer
# first (-rowsfirst), and those rows' distances by einsum (-einsum: the thirty-ninth session's
# re-rank; with -loadtab its whole search path). Profiled calls too.
. scripts/device/common.sh
P=new-onecall-mapped,new-onecall-mapped-rowsfirst,new-onecall-mapped-rowsfirst-einsum,new-onecall-mapped-loadtab-rowsfirst-einsum
KNNKIT_PROGRESS=0 timeout ${BT:-420} $py benchmarks/bang_bench.py --n ${N:-20000000} --d 96 --beams 32,48 --widths 4 \
  --prefetch on --rerank on --paths $P,$P --no-cuvs --busy --out "$out/bang_ab.json" > "$out/bang_ab.log" 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s"; python3 scripts/device/bang_rows.py "$out/bang_ab.log" | tee "$out/summary_ab.txt"
KNNKIT_PROGRESS=0 timeout 150 $py benchmarks/bang_bench.py --n 3000000 --d 96 --beams 32 --widths 4 --prefetch on \
  --rerank on --paths new-onecall-mapped,new-onecall-mapped-loadtab-rowsfirst-einsum --no-cuvs --profile \
  --out "$out/prof.json" > "$out/prof.log" 2>&1
python3 scripts/device/bang_prof.py "$out/prof.json"
