#!/usr/bin/env bash
# Seventeenth session, second benchmark call (cuVS staged): Sweet KNN against knnkit's GEMM path
# and cuVS brute_force (skin, uniform / clustered 3-D 500k, all points, k = 1 and 20; issue 13),
# then time to recall on broad 1M x 128 and Fashion-MNIST for rsfk / nnd / knn_graph beside cuVS
# nn_descent (issue 14).
#   OUT=/some/folder scripts/device/s17_b.sh   (from the repository root; .data carried)
. scripts/device/common.sh
. scripts/device/peer_env.sh
timeout 200 $py benchmarks/bench_sweet.py --device gpu --repeats 3 --cases skin,uniform_d3,clustered_d3 --ks 1,20 \
    --out "$out" > "$out/sweet.log" 2>&1
echo "sweet rc=$? $(( $(date +%s) - t0 )) s"; grep times_s "$out/sweet.log" | cut -c1-400
timeout 360 $py benchmarks/bench_rsfk.py --device gpu --datasets broad-1M-128,fmnist-70k-784 --skip-variants \
    --out "$out" > "$out/rsfk.log" 2>&1
echo "rsfk rc=$? $(( $(date +%s) - t0 )) s"; $py -c "
import json,sys
d=json.load(open(sys.argv[1]))
for s in d['datasets']:
    for m,b in s['time_to_recall'].items():
        print(s['name'], m, {t:(round(x['time_s'],3) if x else None) for t,x in b.items()})
" "$out/bench_rsfk_gpu.json"
