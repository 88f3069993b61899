#!/usr/bin/env bash
# Nineteenth session, 2 x H200, after the shared descent samples only its own rows (forward samples
# all-gathered, reverse samples drawn for its own nodes only) and skips untouched segments in the
# merge: the GPU tests again, then strong scaling at 10M and 4M x 96 with the data on the GPUs
# (cupy blocks on the workers; the single process's data on its GPU).
#   OUT=/some/folder scripts/device/s19_scale2.sh   (from the repository root)
. scripts/device/common.sh
export NCCL_NVLS_ENABLE=0
$py -m pip install -q --no-index --no-deps .wheels/dask/*.whl > "$out/pip.log" 2>&1; echo "pip rc=$?"
timeout 200 $py -m pytest -q -x -m gpu -p no:cacheprovider tests/test_descent_gpu.py > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|FAILED|Error|assert" "$out/tests.log" | tail -6
for N in ${NS:-10000000 4000000}; do
timeout 250 $py benchmarks/dask_scaling.py --n $N --benches graph --partition descent --device-data \
    --part-factors 1 --graph-compute false > "$out/scaling_$N.json" 2> "$out/scaling_$N.log"
echo "scaling $N rc=$? $(( $(date +%s) - t0 )) s"
$py -c "
import json; d = json.load(open('$out/scaling_$N.json'))
for r in d['runs']: print(r.get('bench'), r.get('workers'), r.get('seconds'), r.get('recall'), r.get('recall_estimate'), r.get('stats_method'), r.get('iterations'), r.get('phases'), r.get('rank_s'), r.get('phase_ms'))
" 2>&1 | tail -6 | cut -c1-1000
done
