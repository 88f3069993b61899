#!/usr/bin/env bash
# Prepared in the nineteenth session for the next session's first GPU call (one GPU is enough):
# (1) what s19_first.sh was to check (connectivity repair's state byte, RSFK, the skewed-IP build),
# not run in the nineteenth session, which had two GPUs and spent them on issue 17;
# (2) the shared descent's one-GPU tests (merge kernel, ranks as threads; the Dask test needs 2 GPUs)
# after the nineteenth session's last changes (the rank watch, the small-n refusal: host code).
#   OUT=/some/folder scripts/device/s20_first.sh   (from the repository root)
. scripts/device/common.sh
timeout 120 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_descent_gpu.py > "$out/descent_tests.log" 2>&1
echo "descent tests rc=$? $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|FAILED|Error" "$out/descent_tests.log" | tail -3
bash scripts/device/s19_first.sh
