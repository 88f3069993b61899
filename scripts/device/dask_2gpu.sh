#!/usr/bin/env bash
# knnkit.dask.knn_graph on 2 GPUs (issue 17): the second stage on both workers.
#
# 1. benchmarks/dask_second_stage.py at 4M x 96 (make_clustered, 1000 clusters, k = 10), data in
#    host memory: single-process knnkit.knn_graph, knnkit.dask.knn_graph on 1 worker (one
#    partition: the single-device build in one task), and on 2 workers (one per GPU) the tree and
#    rows schedules with second_stage="search" (cross searches on both workers, the new default)
#    and second_stage="graph" (the previous second stage: one slab graph / one GGM merge on ONE
#    worker), 2 repetitions interleaved. Records wall s, recall@10 on 2,000 rows against exact
#    neighbours, stats phases, per-worker task timelines and per-task thread CPU s.
# 2. benchmarks/dask_overhead.py with the data as cupy blocks on the workers' GPUs (--device-blocks),
#    1 and 2 workers: the same schedules on device-resident input.
# Under 8 minutes (timeouts 300 + 140 s); JSON lines / JSON and logs under $OUT.
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
nproc >> "$OUT/gpus.txt"
git rev-parse HEAD > "$OUT/commit.txt" 2>/dev/null || true

# 1. the second stage: single process vs 1 worker vs 2 workers (search / graph), host-resident data
timeout 300 "$PY" benchmarks/dask_second_stage.py --device gpu --n 4000000 --d 96 --reps 2 \
    --schedules tree,rows --second-stages search,graph --label h2gpu \
    > "$OUT/dask_second_stage_4M.jsonl" 2> "$OUT/dask_second_stage_4M.log"
echo "dask_second_stage rc=$?" | tee -a "$OUT/rc.txt"

# 2. device-resident input (cupy blocks on each worker's GPU), default second stage
timeout 140 "$PY" benchmarks/dask_overhead.py --n 4000000 --d 96 --device gpu --device-blocks --reps 2 \
    --workers 1,2 > "$OUT/dask_overhead_gpu_4M.json" 2> "$OUT/dask_overhead_gpu_4M.log"
echo "dask_overhead rc=$?" | tee -a "$OUT/rc.txt"

# summary: wall s and recall per run (the JSON lines hold the timelines)
"$PY" - "$OUT/dask_second_stage_4M.jsonl" <<'EOF' | tee "$OUT/summary.txt"
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("bench") == "header":
        continue
    print(r["bench"], r.get("schedule", ""), r.get("workers", ""), r.get("second_stage", ""), r.get("rep"),
          "wall", r["seconds"], "recall", r["recall"], "phases", r.get("phases"))
EOF
