#!/usr/bin/env bash
# Prepared in the twentieth session for the next session's first GPU call (one GPU is enough):
# what the twentieth session changed after its last GPU run --
# (1) both RobustPrune kernels now gather and rank candidates through pr_gather_sorted (compiled with
#     nvcc, not run): the tensor-core tests (bitwise against the fp32 kernel) and the build tests;
# (2) the build A/B fp32 vs tensor cores on broad / uniform 128-d 1M (graphs must stay identical);
# (3) then every GPU test file (session_check.sh, 4 shards; carry .wheels for test_dask).
#   OUT=/some/folder scripts/device/s21_first.sh   (from the repository root)
. scripts/device/common.sh
timeout 200 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_prune_tc_gpu.py tests/test_graph_build_gpu.py \
    > "$out/prune_tests.log" 2>&1
echo "prune tests rc=$? $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|FAILED|Error" "$out/prune_tests.log" | tail -4
timeout 200 $py benchmarks/build_flag_ab.py --flag tc --sets broad_d128,uniform_d128 --rounds 1 --beams 64,256 \
    --out "$out" > "$out/ab.log" 2>&1
echo "ab rc=$? $(( $(date +%s) - t0 )) s"; grep -E '"graphs_identical"' "$out/ab.log"
FIRST="tests/test_prune_tc_gpu.py tests/test_graph_index_gpu.py tests/test_dask.py" SHARD_S=${SHARD_S:-300} \
    bash scripts/device/session_check.sh
