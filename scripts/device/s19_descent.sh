#!/usr/bin/env bash
# Nineteenth session, 2 x H200: the shared descent (knnkit.dask.knn_graph(partition="descent")).
# (1) the link between the GPUs and NCCL through CuPy; (2) its GPU tests (merge kernel, ranks as
# threads, the Dask schedule on two GPUs); (3) strong scaling at $N (1 worker: the single-device
# build; 2 workers: the shared descent), lists left on the workers.
#   OUT=/some/folder N=4000000 scripts/device/s19_descent.sh   (from the repository root)
. scripts/device/common.sh
export NCCL_NVLS_ENABLE=0
N=${N:-4000000}
$py -m pip install -q --no-index --no-deps .wheels/dask/*.whl > "$out/pip.log" 2>&1; echo "pip rc=$?"
nvidia-smi topo -m > "$out/topo.txt" 2>&1; head -5 "$out/topo.txt"
$py -c "
from cupy.cuda import nccl; print('nccl', nccl.get_version())
import cupy; print('gpus', cupy.cuda.runtime.getDeviceCount())
" 2>&1 | tail -2
if [ "${TESTS:-1}" = 1 ]; then
timeout 300 $py -m pytest -q -x -m gpu -p no:cacheprovider tests/test_descent_gpu.py > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|FAILED|Error|assert" "$out/tests.log" | tail -8
fi
timeout ${BENCH_S:-240} $py benchmarks/dask_scaling.py --n $N --benches graph --partition ${SCHED:-descent} \
    --part-factors 1 --graph-compute false > "$out/scaling_$N.json" 2> "$out/scaling_$N.log"
echo "scaling rc=$? $(( $(date +%s) - t0 )) s"; grep -E '"bench"' "$out/scaling_$N.log" | cut -c1-700; tail -3 "$out/scaling_$N.log" | cut -c1-400
$py -c "
import json; d = json.load(open('$out/scaling_$N.json'))
for r in d['runs']: print(r.get('bench'), r.get('workers'), r.get('seconds'), r.get('recall'), r.get('stats_method'), r.get('rank_s'), r.get('iterations'))
" 2>&1 | tail -6
