#!/usr/bin/env bash
# Twenty-sixth session, second batch (nvidia-h200, no peers): the exact engine's GPU tests after its
# re-rank went to float64 accumulation, the edge-sweep GPU variants with the cosine tolerance, and
# the robustness harness's order of calls before tight_c1000's index build (knn_graph, graph_recall,
# then GraphIndex.build, twice), whose build read 6.8 s in the suite against 2.6-4.0 s alone.
. scripts/device/common.sh
timeout ${TESTS_S:-330} $py -m pytest -q -m gpu -p no:cacheprovider -W ignore::DeprecationWarning \
    tests/test_brute_force.py tests/test_fused_topk.py tests/test_edge_sweep.py > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"; tail -1 "$out/tests.log"; grep -E "^FAILED" "$out/tests.log" | head
KNNKIT_PROGRESS=0 timeout 200 $py scripts/device/s26_harness_order.py > "$out/harness.log" 2>&1
echo "harness rc=$? $(( $(date +%s) - t0 )) s"; cat "$out/harness.log" | grep -v Deprec | tail -12
