#!/usr/bin/env bash
# First call of a GPU session: everything merged since the last GPU run, checked on the GPU.
#   OUT=/some/folder scripts/device/session_check.sh        (from the repository root)
# Steps, each with its own limit, about 9 minutes in all (3 files under $OUT):
#   1. the changes no GPU has run yet, first (so that a cut-short suite still answers them):
#      tests/test_fuzz.py -m gpu (the float32-resolution check on the GPU paths: wide-range data
#      exact, near-duplicates never on the float64 path), tests/test_dask.py -m gpu (CuPy lists stay
#      CuPy on GPU workers) -> first.log;
#   2. the whole GPU suite with the 30 slowest tests named -> gpu_suite.log (393 passed, 4 skipped in
#      394 s on an H200 at the start of the tenth session).
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
  git rev-parse HEAD 2>/dev/null; date -u; } > "$out/env.txt"
cat "$out/env.txt"
if [ -d .wheels/dask ]; then  # the dask tests run when the wheels were carried
  for w in .wheels/dask/*.whl; do $py -m pip install -q --no-index --no-deps "$w" 2>/dev/null; done
fi
echo "=== 1. changes not yet run on a GPU (limit 100 s)"
timeout 100 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_fuzz.py tests/test_dask.py > "$out/first.log" 2>&1
tail -5 "$out/first.log"
echo "=== 2. whole GPU suite (limit 450 s)"
timeout 450 $py -m pytest -q -m gpu -p no:cacheprovider --durations=30 > "$out/gpu_suite.log" 2>&1
grep -E "passed|failed|FAILED|Error" "$out/gpu_suite.log" | tail -20
