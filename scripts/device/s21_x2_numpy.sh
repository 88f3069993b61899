#!/usr/bin/env bash
# Twenty-first session, nvidia-h200-x2 (issue 17): the client-memory search's 7.5 s on two workers
# (1 worker 1.05 s) after 8M resident queries at 10M. Smaller: 1M x 96, 8M resident queries in 250k
# blocks, beam 16; the client-memory search of 1M queries right after the build and again after the
# resident searches, with its task stream.
#   OUT=/some/folder scripts/device/s21_x2_numpy.sh   (from the repository root; carry .wheels)
. scripts/device/common.sh
export NCCL_NVLS_ENABLE=0
$py -m pip install -q --no-index --no-deps .wheels/dask/*.whl > "$out/pip.log" 2>&1; echo "pip rc=$?"
timeout ${SEARCH_S:-400} $py benchmarks/dask_scaling.py --n 1000000 --queries 8000000 --query-block 250000 \
    --benches search --resident-queries --device-queries --search-repeats 1 --beams 16 --numpy-before \
    > "$out/numpy_1M.json" 2> "$out/numpy_1M.log"
echo "search rc=$? $(( $(date +%s) - t0 )) s"
grep -o '"bench": "replicated_search[a-z_]*", \("when": "[a-z]*", \)\?"workers": [0-9].\{0,130\}' "$out/numpy_1M.log" | cut -c1-200
grep -o '"when": "[a-z]*", "workers": 2.*' "$out/numpy_1M.log" | grep -o '"tasks": .*' | cut -c1-700
