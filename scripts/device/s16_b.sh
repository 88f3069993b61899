#!/usr/bin/env bash
# Sixteenth session, one H200: what the fifteenth session changed without a GPU, measured.
#   OUT=/some/folder bash scripts/device/s16_b.sh        (from the repository root)
# 1. issue 13: method="auto" on the GPU against the better of Sweet KNN and the GEMM path, 250k
#    all-points joins, clustered and uniform 16/32/64-D, k = 1 and 20 (the level-1 floor went
#    0.5 -> 0.1 on the GPU): sweet_auto_gpu.json;
# 2. issue 16: bang_bench on broad 2M x 96 with the build's own graph degree (the fourteenth
#    session's 0.52-0.76 used a forced degree 32), no cuVS: bang_broad_auto.json;
# 3. issue 11: build_flag_ab --flag reverse on broad 1M x 128 (the first prune became one code
#    path; the graphs must stay identical): build_ab_reverse.json.
set -u
: "${OUT:?set OUT to the output folder}"
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; date -u; } > "$OUT/env.txt" 2>&1
t0=$(date +%s)
timeout 170 $py benchmarks/sweet_auto_paired_cpu.py --device gpu --n 250000 --dims 16,32,64 --ks 1,20 \
    --repeats 3 --out "$OUT/sweet_auto_gpu.json" > "$OUT/sweet_auto_gpu.log" 2>&1
echo "sweet auto rc=$? $(( $(date +%s) - t0 )) s"; tail -13 "$OUT/sweet_auto_gpu.log" | cut -c1-400
timeout 260 $py benchmarks/bang_bench.py --n 2000000 --data broad --beams 64,128,256,512 --widths 4 \
    --prefetch on --rerank on --no-cuvs --out "$OUT/bang_broad_auto.json" > "$OUT/bang_broad_auto.log" 2>&1
echo "bang rc=$? $(( $(date +%s) - t0 )) s"; tail -12 "$OUT/bang_broad_auto.log" | cut -c1-300
timeout 120 $py benchmarks/build_flag_ab.py --sets broad_d128 --out "$OUT" > "$OUT/build_ab.log" 2>&1
echo "build ab rc=$? $(( $(date +%s) - t0 )) s"; tail -6 "$OUT/build_ab.log" | cut -c1-300
