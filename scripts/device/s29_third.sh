#!/usr/bin/env bash
# Twenty-ninth session, third call (nvidia-h200): the Sweet GPU test again with the seed that failed
# (its id comparison now skips float32 ties against float64 order), then knn_graph / GraphIndex
# defaults on the unseen generators at 200k on the GPU.
. scripts/device/common.sh
KNNKIT_TEST_SEED=2866403618 timeout 100 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_sweet_gpu.py \
  > "$out/sweet_tests.log" 2>&1
echo "sweet tests rc=$? $(( $(date +%s) - t0 )) s"; tail -2 "$out/sweet_tests.log"
KNNKIT_PROGRESS=0 timeout ${PROBE_S:-400} $py scripts/device/s29_unseen.py ${N:-200000} gpu 2>&1 | grep -v "Warn\|warn" \
  | tee "$out/unseen_gpu.txt"
echo "probe done $(( $(date +%s) - t0 )) s"
