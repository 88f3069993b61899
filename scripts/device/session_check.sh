#!/usr/bin/env bash
# First call of a GPU session: everything merged since the last GPU run, checked on the GPU.
#   OUT=/some/folder scripts/device/session_check.sh        (from the repository root)
# The GPU tests run as 4 pytest processes side by side on the one GPU (the suite is bound by
# kernel compilation and host-side references, not by the GPU: ~400 s in one process):
#   shard 0: the test files of the changes no GPU has run yet, named in $FIRST (default
#            tests/test_fuzz.py tests/test_dask.py);
#   shards 1-3: every other test file with GPU tests, dealt by file size.
# Output (3 files under $OUT): env.txt, first.log (shard 0), gpu_suite.log (shards 1-3, each
# with its 15 slowest tests). Limit ${SHARD_S:-420} s per shard.
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
# files with GPU tests, largest first, dealt round-robin to shards 1-3
first=${FIRST:-tests/test_fuzz.py tests/test_dask.py}
skip=(); for f in $first; do skip+=(-e "$(basename "$f")"); done
mapfile -t files < <(grep -l "mark.gpu\|pytest.mark.gpu" tests/test_*.py | grep -v "${skip[@]}" | xargs ls -S)
shard=(); for i in 1 2 3; do shard[$i]=""; done
j=0; for f in "${files[@]}"; do i=$(( j % 3 + 1 )); shard[$i]="${shard[$i]} $f"; j=$((j+1)); done
t0=$(date +%s)
timeout ${SHARD_S:-420} $py -m pytest -q -m gpu -p no:cacheprovider $first > "$out/first.log" 2>&1 &
for i in 1 2 3; do
  timeout ${SHARD_S:-420} $py -m pytest -q -m gpu -p no:cacheprovider --durations=15 ${shard[$i]} > "$out/shard$i.log" 2>&1 &
done
wait
echo "wall $(( $(date +%s) - t0 )) s" | tee -a "$out/env.txt"
for i in 1 2 3; do echo "##### shard $i:${shard[$i]}"; cat "$out/shard$i.log"; done > "$out/gpu_suite.log"
rm -f "$out"/shard?.log
echo "=== first"; tail -3 "$out/first.log"
echo "=== suite"; grep -E "passed|failed|FAILED|Error" "$out/gpu_suite.log" | tail -30
