#!/usr/bin/env bash
# knnkit.dask on 2 GPUs (issue 17), after the Dask path's own cost was cut (query blocks sent
# straight to the workers that use them, each exact-search partition prepared once, dask arrays
# in -> dask arrays out, fewer tasks per query block): 1 vs 2 GPU workers, with the per-phase
# breakdown (client seconds by call: scatter / submit / wait / gather / other; workers' transfer
# seconds; per worker and task prefix compute seconds).
#
# 1. search: benchmarks/dask_scaling.py, 2M x 96 make_clustered, one shard replicated on 1 / 2
#    workers, 1M queries resident on the workers (persisted dask array, results persisted there),
#    beam 32 / 64 / 128; plus the same queries from the client's memory (numpy, beam 32).
# 2. knn_graph: benchmarks/dask_scaling.py, 4M x 96 make_clustered, partition rows and tree
#    (default second stages), 1 / 2 workers, and the single-process knnkit.knn_graph.
# 3. the path's own cost on this host's CPUs: benchmarks/dask_path_cost.py (engine stubbed,
#    2 CPU worker processes), as benchmarks/results/cpu/dask_path_cost_2026-11-26c.md.
# About 8.5 minutes (timeouts 180 + 240 + 70 s); 8 files under $OUT. knn_graph is timed with its lists
# gathered to the client (compute=True, as the earlier runs) and left on the workers (compute=False).
#
#   OUT=/some/dir bash scripts/device/dask_2gpu_v2.sh      (from the repository root)
set -u
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the output folder}"
export PYTHONPATH="${PYTHONPATH:-src}"
PY=python3
for w in .wheels/dask/*.whl; do "$PY" -m pip install -q --no-index --no-deps "$w" 2>/dev/null || echo "skipped $(basename "$w")"; done
{
    "$PY" -c "import dask, distributed; print('dask', dask.__version__, 'distributed', distributed.__version__)"
    "$PY" -c "import dask_cuda; print('dask_cuda', dask_cuda.__version__)" 2>&1 | tail -1
    nvidia-smi -L 2>&1
    echo "cpus $(nproc)"
    echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)"
} > "$OUT/env.txt"

# 1. replicated search, resident and numpy queries
timeout 180 "$PY" benchmarks/dask_scaling.py --n 2000000 --queries 1000000 --benches search --resident-queries \
    --part-factors 1 > "$OUT/search_2M.json" 2> "$OUT/search_2M.log"
echo "search rc=$?" >> "$OUT/env.txt"

# 2. knn_graph 4M x 96, rows and tree
timeout 240 "$PY" benchmarks/dask_scaling.py --n 4000000 --benches graph --partition rows,tree --part-factors 1 \
    --graph-compute true,false \
    > "$OUT/graph_4M.json" 2> "$OUT/graph_4M.log"
echo "graph rc=$?" >> "$OUT/env.txt"

# 3. the path's own cost, engine stubbed, on this host's CPUs (SKIP_PATH_COST=1 skips it)
[ "${SKIP_PATH_COST:-0}" = 1 ] || timeout 70 "$PY" benchmarks/dask_path_cost.py --reps 2 > "$OUT/path_cost.json" 2> "$OUT/path_cost.log"
echo "path_cost rc=$?" >> "$OUT/env.txt"

# summary: per run wall s, QPS / recall, client phases and transfers; 2 workers against 1
"$PY" - "$OUT/search_2M.json" "$OUT/graph_4M.json" <<'EOF' > "$OUT/summary.txt" 2>&1
import json, sys
for path in sys.argv[1:]:
    try:
        runs = json.load(open(path))["runs"]
    except Exception as e:  # a run cut by its timeout leaves no JSON: the log has its lines
        print(path.rsplit("/", 1)[-1], "no JSON:", type(e).__name__)
        continue
    base = {}
    for r in runs:
        key = (r["bench"], r.get("schedule"), r.get("beam"), r.get("compute"))
        if r.get("workers", 1) == 1:
            base[key] = r["seconds"]
        ratio = base.get(key, 0) / r["seconds"] if r.get("workers", 1) > 1 and r["seconds"] else None
        print(r["bench"], r.get("schedule", ""), "compute", r.get("compute", ""), "workers", r.get("workers", ""), "beam", r.get("beam", ""),
              "s", r["seconds"], "qps", r.get("qps", ""), "recall", r.get("recall"),
              "vs 1 worker %.2fx" % ratio if ratio else "", "client", r.get("client"),
              "transfer_s", r.get("transfer_s"), "phases", r.get("phases", ""))
EOF
cat "$OUT/summary.txt"
