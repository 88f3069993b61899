#!/usr/bin/env bash
# Eighteenth session, first benchmark call: knn_graph's exact fallback, certified vs near-exact
# lists (graph.NEAR_EXACT_EXTRA), on the 1M hard sets (A/B round-robin in one process); then the GPU
# tests of the change and the Dask tests (wheels carried in .wheels/dask).
#   OUT=/some/folder scripts/device/s18_a.sh   (from the repository root)
. scripts/device/common.sh
timeout 330 $py benchmarks/near_exact_fallback.py > "$out/near_exact.json" 2> "$out/near_exact.log"
echo "bench rc=$? $(( $(date +%s) - t0 )) s"; grep -v -i warn "$out/near_exact.log" | cut -c1-330
for w in .wheels/dask/*.whl; do $py -m pip install -q --no-index --no-deps "$w" 2>/dev/null; done
timeout 200 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_stall_watch.py tests/test_dask.py \
    tests/test_graph_build_gpu.py > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"; tail -3 "$out/tests.log"
