#!/usr/bin/env bash
# knnkit.dask on 2 GPUs (issue 17): reruns the measurements of
# benchmarks/results/dask-h200x2-2026-11-26/README.md at 4M x 96 (1 vs 2 workers, knn_graph with
# the rows and tree schedules, replicated search with resident queries) and the single-worker
# overhead run (single-process knnkit.knn_graph vs knnkit.dask.knn_graph on 1 and 2 workers, data
# persisted as cupy blocks on the workers' GPUs). Under 8 minutes; JSON and logs under $OUT.
#
#   PYTHONPATH=src OUT=/some/dir bash scripts/device/dask_2gpu.sh      (from the repository root)
#
# Needs the wheels staged by benchmarks/stage_dask.sh in .wheels/dask (installed one by one:
# the folder holds a wheel for another platform, which makes a single pip install fail).
set -u
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the output folder}"
export PYTHONPATH="${PYTHONPATH:-src}"
PY=python3
for w in .wheels/dask/*.whl; do "$PY" -m pip install -q --no-index --no-deps "$w" 2>/dev/null || echo "skipped $(basename "$w")"; done
"$PY" -c "import dask, distributed; print('dask', dask.__version__, 'distributed', distributed.__version__)" | tee "$OUT/versions.txt"
"$PY" -c "import dask_cuda; print('dask_cuda', dask_cuda.__version__)" >> "$OUT/versions.txt" 2>&1 || true
nvidia-smi -L > "$OUT/gpus.txt" 2>&1 || true
git rev-parse HEAD > "$OUT/commit.txt" 2>/dev/null || true

# 1. single-worker overhead: single process vs 1 and 2 Dask workers, data on the workers' GPUs
timeout 150 "$PY" benchmarks/dask_overhead.py --n 4000000 --d 96 --device gpu --device-blocks --reps 2 \
    --workers 1,2 > "$OUT/dask_overhead_gpu_4M.json" 2> "$OUT/dask_overhead_gpu_4M.log"
echo "dask_overhead rc=$?" | tee -a "$OUT/rc.txt"

# 2. the README's run: host-resident data (numpy blocks), graph + replicated search, 1 vs 2 workers
timeout 290 "$PY" benchmarks/dask_scaling.py --n 4000000 --queries 1000000 --part-factors 1 --partition rows,tree \
    --benches graph,search --resident-queries > "$OUT/dask_scaling_4M.json" 2> "$OUT/dask_scaling_4M.log"
echo "dask_scaling rc=$?" | tee -a "$OUT/rc.txt"
