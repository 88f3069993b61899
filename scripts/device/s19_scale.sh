#!/usr/bin/env bash
# Nineteenth session, 2 x H200: where the shared descent's time goes (GPU time by step, one GPU and
# two), and strong scaling at 4M and 10M x 96 (1 worker: the single-device build; 2: the shared
# descent), lists left on the workers.
#   OUT=/some/folder scripts/device/s19_scale.sh   (from the repository root)
. scripts/device/common.sh
export NCCL_NVLS_ENABLE=0
$py -m pip install -q --no-index --no-deps .wheels/dask/*.whl > "$out/pip.log" 2>&1; echo "pip rc=$?"
timeout 120 $py - > "$out/phases_single.json" 2> "$out/phases_single.log" <<'PY'
import json, time, cupy as cp
from knnkit.datasets import make_clustered
from knnkit.graph.nndescent._gpu import nndescent_gpu
X, _ = make_clustered(4_000_000, 96, n_queries=1, n_clusters=1000, random_state=0, device="gpu")
X = cp.ascontiguousarray(X, dtype=cp.float32)
nndescent_gpu(X[:200_000], 64, sample=16, max_iters=30, delta=0.001, metric="l2")
for rep in range(2):
    t = time.perf_counter()
    I, D, st = nndescent_gpu(X, 64, sample=16, max_iters=30, delta=0.001, metric="l2")
    cp.cuda.get_current_stream().synchronize()
    print(json.dumps({"n": 4_000_000, "rep": rep, "seconds": round(time.perf_counter() - t, 3),
                      "iterations": st["iterations"], "phase_ms": st["phase_ms"]}), flush=True)
PY
echo "single phases rc=$? $(( $(date +%s) - t0 )) s"; cat "$out/phases_single.json"
for N in 4000000 10000000; do
timeout 280 $py benchmarks/dask_scaling.py --n $N --benches graph --partition descent \
    --part-factors 1 --graph-compute false > "$out/scaling_$N.json" 2> "$out/scaling_$N.log"
echo "scaling $N rc=$? $(( $(date +%s) - t0 )) s"
$py -c "
import json; d = json.load(open('$out/scaling_$N.json'))
for r in d['runs']: print(r.get('bench'), r.get('workers'), r.get('seconds'), r.get('recall'), r.get('recall_estimate'), r.get('stats_method'), r.get('phases'), r.get('rank_s'), r.get('phase_ms'))
" 2>&1 | tail -6 | cut -c1-900
done
