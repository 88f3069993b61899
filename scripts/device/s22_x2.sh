#!/usr/bin/env bash
# Twenty-second session, nvidia-h200-x2. PART=a: the GPU tests of this session's changes (shared
# descent with changed rows only, join kernel's dirty rows, deferred calibration beams), then the
# shared descent at 10M x 96 on two GPUs with the exchange A/B (changed rows vs whole shares) beside
# one worker and the single process (issue 17: >= 1.6x). PART=b: the index build A/B on broad /
# uniform 128-d 1M with the calibration's beams 3072 / 4096 deferred or not (issue 11: <= 2 s), GPU 0.
#   OUT=/some/folder PART=a scripts/device/s22_x2.sh   (from the repository root; carry .wheels)
. scripts/device/common.sh
export NCCL_NVLS_ENABLE=0
$py -m pip install -q --no-index --no-deps .wheels/dask/*.whl > "$out/pip.log" 2>&1; echo "pip rc=$?"
if [ "${PART:-a}" = c ]; then  # the largest graph this host builds with the shared descent (issue 17)
  nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv,noheader -l 2 > "$out/gpu_memory.csv" &
  smi=$!
  timeout ${GRAPH_S:-480} $py benchmarks/dask_scaling.py --n ${N:-40000000} --queries 10000 --benches graph \
      --partition descent --part-factors 1 --graph-compute false --device-data --exchange sparse ${EXTRA:-} \
      > "$out/graph_${N:-40000000}.json" 2> "$out/graph_${N:-40000000}.log"
  echo "graph rc=$? $(( $(date +%s) - t0 )) s"; kill $smi
  grep -o '"bench": "knn_graph[a-z_]*", [^{]*"seconds": [0-9.]*, "recall": [0-9.]*' "$out/graph_${N:-40000000}.log" | cut -c1-260
  grep -o '"phase_ms": \[[^]]*\]' "$out/graph_${N:-40000000}.log" | cut -c1-400
  sort -t, -k2 -n "$out/gpu_memory.csv" | tail -2
  grep -E "Error|error|Traceback" "$out/graph_${N:-40000000}.log" | head -5
elif [ "${PART:-a}" = a ]; then
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$out/env.txt"
  timeout ${TESTS_S:-300} $py -m pytest -v --durations=8 -m gpu -p no:cacheprovider tests/test_descent_gpu.py tests/test_nn_descent_gpu.py \
      "tests/test_graph_build_gpu.py::test_gpu_calibration_defers_its_largest_beams_until_a_target_needs_them" \
      > "$out/tests.log" 2>&1
  echo "tests rc=$? $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|FAILED|Error|s call" "$out/tests.log" | tail -14
  timeout ${GRAPH_S:-300} $py benchmarks/dask_scaling.py --n 10000000 --benches graph --partition descent \
      --part-factors 1 --graph-compute false --device-data --exchange sparse,whole \
      > "$out/graph_10M.json" 2> "$out/graph_10M.log"
  echo "graph rc=$? $(( $(date +%s) - t0 )) s"
  grep -o '"bench": "knn_graph[a-z_]*", [^{]*"seconds": [0-9.]*, "recall": [0-9.]*' "$out/graph_10M.log" | cut -c1-260
  grep -o '"phase_ms": \[[^]]*\]' "$out/graph_10M.log" | cut -c1-300
else
  CUDA_VISIBLE_DEVICES=0 timeout 400 $py benchmarks/build_flag_ab.py --flag defer --sets broad_d128,uniform_d128 \
      --rounds 2 --out "$out" > "$out/ab.log" 2>&1
  echo "ab rc=$? $(( $(date +%s) - t0 )) s"
  grep -o '"set": "[a-z_0-9]*", "n"[^}]*"defer": [a-z]*, "index_build_s": [0-9.]*' "$out/ab.log" | cut -c1-200
  grep -o '"first_target_0.99_s": [0-9.]*' "$out/ab.log"; grep -E '"graphs_identical"' "$out/ab.log"
  timeout 120 $py -m pytest -q -m gpu -p no:cacheprovider \
      "tests/test_graph_build_gpu.py::test_gpu_calibration_defers_its_largest_beams_until_a_target_needs_them" \
      > "$out/tests.log" 2>&1
  echo "tests rc=$? $(( $(date +%s) - t0 )) s"; tail -1 "$out/tests.log"
  if [ -n "${GRAPH:-}" ]; then
    timeout ${GRAPH_S:-200} $py benchmarks/dask_scaling.py --n 10000000 --benches graph --partition descent \
        --part-factors 1 --graph-compute false --device-data --exchange sparse > "$out/graph_10M.json" 2> "$out/graph_10M.log"
    echo "graph rc=$? $(( $(date +%s) - t0 )) s"
    grep -o '"bench": "knn_graph[a-z_]*", [^{]*"seconds": [0-9.]*, "recall": [0-9.]*' "$out/graph_10M.log" | cut -c1-260
    grep -o '"phase_ms": \[[^]]*\]' "$out/graph_10M.log" | cut -c1-400
  fi
fi
