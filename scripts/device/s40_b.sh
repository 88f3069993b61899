#!/usr/bin/env bash
# Fortieth session, second call (nvidia-h200, cuVS 26.10 staged; issue 16): the GPU tests of the
# fused walk's plans (blocks making their tables, U centroids in flight per thread) and of
# bang_rerank_exact, then 20M x 96 beside cuVS IVF-PQ + refine in the same process: the fused walk
# with its blocks' tables and the row-free re-rank, one call and under the budget, against the
# tables loaded (-loadtab) under the budget.
. scripts/device/common.sh
$py -m pytest -q -m gpu tests/test_bang_call.py -k "fused_walk_plans or rerank_exact" -p no:cacheprovider \
  > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$out/tests.log")"
N=${N:-20000000} TAG=${TAG:-20m} TESTS=0 BT=${BT:-450} \
  PATHS=${PATHS:-new-onecall-mapped,new-mapped,new-mapped-loadtab,new-onecall-mapped,new-mapped} \
  EXTRA=${EXTRA:---cuvs-twice} BEAMS=${BEAMS:-24,32,48} bash scripts/device/s38_c.sh
