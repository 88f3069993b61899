#!/usr/bin/env bash
# Forty-second session (nvidia-h200; issue 16): the robustness suite with placement="host" on the
# GPU at the tree with one code byte a dimension up to 8-d and the check to 16x, real sets carried
# as .data (siftsmall, skin); then the GPU tests of test_bang.py (the build check, CPU reference).
. scripts/device/common.sh
KNNKIT_PROGRESS=0 timeout ${BT:-240} $py benchmarks/robustness.py --device gpu --scale small --no-peers --no-graph \
  --placement host --max-beam 2048 --out "$out" > "$out/robustness_host.log" 2>&1
echo "robustness rc=$? $(( $(date +%s) - t0 )) s"; grep "n=" "$out/robustness_host.log"
timeout ${TT:-200} $py -m pytest -q -m gpu tests/test_bang.py -p no:cacheprovider > "$out/tests_bang.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$out/tests_bang.log")"
