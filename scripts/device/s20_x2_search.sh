#!/usr/bin/env bash
# Twentieth session, the last 400 s of device time on nvidia-h200-x2 (issue 17): replicated search
# throughput at 10M x 96 only (1M resident cupy query blocks, 1 vs 2 workers, beams 32 / 64 / 128,
# one repeat each; the issue asks >= 1.8x at recall 0.95).
#   OUT=/some/folder scripts/device/s20_x2_search.sh   (from the repository root; carry .wheels)
. scripts/device/common.sh
export NCCL_NVLS_ENABLE=0
$py -m pip install -q --no-index --no-deps .wheels/dask/*.whl > "$out/pip.log" 2>&1; echo "pip rc=$?"
timeout ${SEARCH_S:-300} $py benchmarks/dask_scaling.py --n 10000000 --queries 1000000 --benches search --resident-queries \
    --device-queries --search-repeats 1 > "$out/search_10M.json" 2> "$out/search_10M.log"
echo "search rc=$? $(( $(date +%s) - t0 )) s"; grep '"replicated_search' "$out/search_10M.log" | cut -c1-420
