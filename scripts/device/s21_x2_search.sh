#!/usr/bin/env bash
# Twenty-first session, nvidia-h200-x2 (issue 17): replicated search throughput at 10M x 96 with 8M
# resident cupy queries in blocks of 250k (one search task each), 1 vs 2 workers, beams 16 / 24 /
# 32 / 64 (recall near 0.95 at the low end); the twentieth session's 1M queries gave 1.63-1.67x, with
# a fixed ~40 ms per call that more queries per call amortise (predicted ~1.9x at 8M).
#   OUT=/some/folder scripts/device/s21_x2_search.sh   (from the repository root; carry .wheels)
. scripts/device/common.sh
export NCCL_NVLS_ENABLE=0
$py -m pip install -q --no-index --no-deps .wheels/dask/*.whl > "$out/pip.log" 2>&1; echo "pip rc=$?"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$out/env.txt"
timeout ${SEARCH_S:-540} $py benchmarks/dask_scaling.py --n 10000000 --queries 8000000 --query-block 250000 \
    --benches search --resident-queries --device-queries --search-repeats 2 --beams 16,24,32,64 \
    > "$out/search_10M_8Mq.json" 2> "$out/search_10M_8Mq.log"
echo "search rc=$? $(( $(date +%s) - t0 )) s"
grep -o '"bench": "replicated_search[a-z_]*", "workers": [0-9], "replicas": [0-9], "beam": [0-9]*.\{0,160\}' "$out/search_10M_8Mq.log" | cut -c1-230
