#!/usr/bin/env bash
# Twenty-third session, nvidia-h200-x2 (issue 17). The GPU tests of the shared descent (ranks as
# threads on one GPU, with the owners' rows shared beside the next sampling or not; the Dask
# descent on both GPUs), then the shared descent at 10M x 96 on two GPUs with that share
# overlapped or not (A/B in one cluster, "on" twice) beside one worker and the single process.
#   OUT=/some/folder scripts/device/s23_x2.sh   (from the repository root; carry .wheels)
. scripts/device/common.sh
export NCCL_NVLS_ENABLE=0
$py -m pip install -q --no-index --no-deps .wheels/dask/*.whl > "$out/pip.log" 2>&1; echo "pip rc=$?"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$out/env.txt"
timeout ${TESTS_S:-240} $py -m pytest -v --durations=8 -m gpu -p no:cacheprovider tests/test_descent_gpu.py \
    > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|FAILED|Error|s call" "$out/tests.log" | tail -14
timeout ${GRAPH_S:-300} $py benchmarks/dask_scaling.py --n ${N:-10000000} --benches graph --partition descent \
    --part-factors 1 --graph-compute false --device-data --exchange sparse --overlap ${OVERLAP:-on,off,on} \
    > "$out/graph_10M.json" 2> "$out/graph_10M.log"
echo "graph rc=$? $(( $(date +%s) - t0 )) s"
grep -o '"bench": "knn_graph[a-z_]*", [^{]*"seconds": [0-9.]*, "recall": [0-9.]*' "$out/graph_10M.log" | cut -c1-300
grep -o '"rank_s": \[[^]]*\]' "$out/graph_10M.log" | cut -c1-400
grep -o '"phase_ms": \[[^]]*\]' "$out/graph_10M.log" | cut -c1-400
grep -E "Error|error|Traceback" "$out/graph_10M.log" | head -5
