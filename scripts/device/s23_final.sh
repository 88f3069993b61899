#!/usr/bin/env bash
# Twenty-third session, last call (nvidia-h200-x2): the GPU tests touched by this session's changes
# (device search width by beam, exact preparation in row chunks, shared descent's overlapped share,
# and the CPU index-build changes' GPU twins), then the shared descent at 20M x 96 on two GPUs
# beside the single process (issue 17's 1.53x at 20M was measured before the overlapped share).
#   OUT=/some/folder scripts/device/s23_final.sh   (from the repository root; carry .wheels)
. scripts/device/common.sh
export NCCL_NVLS_ENABLE=0
$py -m pip install -q --no-index --no-deps .wheels/dask/*.whl > "$out/pip.log" 2>&1; echo "pip rc=$?"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$out/env.txt"
timeout ${TESTS_S:-330} $py -m pytest -q -m gpu -p no:cacheprovider tests/test_delete.py \
    tests/test_filter.py tests/test_fuzz.py tests/test_graph_index.py tests/test_integration_gpu.py tests/test_progress.py \
    tests/test_stall_watch.py tests/test_graph_index_gpu.py tests/test_descent_gpu.py > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"; tail -2 "$out/tests.log"; grep -E "^FAILED|^ERROR" "$out/tests.log" | head
if [ -n "${GRAPH20:-}" ]; then
  timeout ${GRAPH_S:-240} $py benchmarks/dask_scaling.py --n 20000000 --benches graph --partition descent \
      --part-factors 1 --graph-compute false --device-data --exchange sparse --overlap on --worker-counts 2 \
      > "$out/graph_20M.json" 2> "$out/graph_20M.log"
  echo "graph rc=$? $(( $(date +%s) - t0 )) s"
  grep -o '"bench": "knn_graph[a-z_]*", [^{]*"seconds": [0-9.]*, "recall": [0-9.]*' "$out/graph_20M.log" | cut -c1-300
  python3 -c "import json;d=json.load(open('$out/graph_20M.json'));[print(r.get('bench'),r.get('workers'),r.get('seconds'),r.get('recall')) for r in d['runs']]"
fi
