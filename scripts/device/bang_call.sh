#!/usr/bin/env bash
# BANG per-call costs (issue 16) on the GPU machine. Run from the repository root:
#   PYTHONPATH=src OUT=/some/folder scripts/device/bang_call.sh
# 1. the GPU BANG tests (tests/test_bang.py, test_bang_width.py, test_bang_call.py, marker gpu): the
#    new search paths against the v2 path bit for bit, the stash fallback, the fused tables
#    -> $OUT/bang_call_tests.log
# 2. benchmarks/bang_bench.py: 3M x 96 float32 made on the GPU, graph degree 32, 48-byte PQ, 10k
#    queries, W = 4, prefetch on, re-rank on, L in {64, 32, 128} x path in {legacy (v2), new (vectors
#    over the budget: re-rank rows stashed during the walk), new-host (same, rows gathered after the
#    walk into pinned chunks), new-gpuvec (budget lifted: vectors on the GPU)}: timed call + profiled
#    call (per-phase times) each; cuVS IVF-PQ + host refine as the peer when cuvs imports
#    -> $OUT/bang_call.json, $OUT/bang_call.log
# Each step has its own time limit (150 s + 140 s) so the run stays under 5 minutes; the benchmark
# writes its JSON row by row, so a step cut short still leaves its rows.
set -uo pipefail
out=${OUT:?set OUT to the output folder}; mkdir -p "$out"
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
peers=${KNNKIT_PEER_SITE:-/tmp/peer-site}   # staged cuVS, as in scripts/gpu-check
if [ -d "$peers" ]; then
  export PYTHONPATH=$PYTHONPATH:$peers
  export LD_LIBRARY_PATH=$(ls -d "$peers"/lib*/lib64 "$peers"/lib*/lib "$peers"/nvidia/*/lib 2>/dev/null | tr '\n' ':')${LD_LIBRARY_PATH:-}
  export LD_PRELOAD=$(ls "$peers"/nvidia/*/lib/libnvJitLink.so.13 2>/dev/null | head -1)
fi
cuvs="--no-cuvs"; python3 -c "import cuvs" 2>/dev/null && cuvs=""
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; git rev-parse HEAD 2>/dev/null;
  date -u; nproc; echo "cuvs: ${cuvs:-present}"; } > "$out/bang_call_env.txt"
cat "$out/bang_call_env.txt"
rc=0
echo "=== GPU tests (limit 150 s)"
timeout 150 python3 -m pytest -q -m gpu tests/test_bang_call.py tests/test_bang.py tests/test_bang_width.py \
  > "$out/bang_call_tests.log" 2>&1 || rc=1
tail -15 "$out/bang_call_tests.log"
echo "=== per-call profile, before (legacy) / after (new, new-gpuvec) (limit 140 s)"
export TMPDIR=${TMPDIR:-/tmp}
timeout 140 python3 benchmarks/bang_bench.py --n 3000000 --d 96 --queries 10000 --beams 64,32,128 --widths 4 \
  --prefetch on --rerank on --paths legacy,new,new-host,new-gpuvec --profile --cuvs-probes 8,32 $cuvs \
  --out "$out/bang_call.json" > "$out/bang_call.log" 2>&1 || rc=1
tail -3 "$out/bang_call.log"
python3 - "$out/bang_call.json" <<'PY' || true
import json, sys
res = json.load(open(sys.argv[1]))
ms = lambda v: f"{1e3 * v:7.1f}"
for r in res.get("rows", []):
    if r["method"] != "knnkit-host":
        print(r)
    elif not r.get("profiled"):
        print(f"L={r['beam']:4d} {r['path']:11s} recall={r['recall']:.4f} qps={r['qps']:9.0f} ms={ms(r['seconds'])} "
              f"mode={r['rerank_mode']} iters={r['iterations']} setup={ms(r['setup_s'])} loop={ms(r['loop_s'])} "
              f"rerank={ms(r['rerank_s'])} wait={ms(r['host_wait_s'])} gather={ms(r['host_gather_s'])} "
              f"launch={ms(r['host_launch_s'])} reused={r['workspace_reused']} fallback={r['rerank_fallback_rows']}")
    else:
        ph = " ".join(f"{k}={ms(v)}" for k, v in r.get("phases", {}).items())
        gs = " ".join(f"{k}={ms(v)}" for k, v in sorted(r.get("gpu_s", {}).items(), key=lambda kv: -kv[1]))
        print(f"    profiled ({ms(r['seconds'])} ms): {ph}\n    gpu stream ms: {gs}")
print({k: res.get(k) for k in ("stages", "cuvs_error") if k in res})
PY
exit $rc
