#!/usr/bin/env bash
# BANG search width W (issue 16) on the GPU machine. Run from the repository root:
#   PYTHONPATH=src OUT=/some/folder scripts/device/bang_width.sh
# 1. the GPU BANG tests (tests/test_bang.py, tests/test_bang_width.py, marker gpu) -> $OUT/bang_gpu_tests.log
# 2. benchmarks/bang_bench.py: 3M x 96 float32 made on the GPU, graph degree 32, 10k queries,
#    beam L in {32, 64, 128} x W in {1, 2, 4, 8} x prefetch on/off, re-rank on; cuVS IVF-PQ + host
#    refine as the peer when cuvs imports (staged as for scripts/gpu-check) -> $OUT/bang_width.json
# Each step has its own time limit so the whole run stays under 6 minutes on an H100; the benchmark
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
  date -u; echo "cuvs: ${cuvs:-present}"; } > "$out/bang_width_env.txt"
cat "$out/bang_width_env.txt"
rc=0
echo "=== GPU tests (limit 140 s)"
timeout 140 python3 -m pytest -q -m gpu tests/test_bang.py tests/test_bang_width.py > "$out/bang_gpu_tests.log" 2>&1 || rc=1
tail -15 "$out/bang_gpu_tests.log"
echo "=== width sweep (limit 200 s)"
export TMPDIR=${TMPDIR:-/tmp}
timeout 200 python3 benchmarks/bang_bench.py --n 3000000 --d 96 --queries 10000 --beams 64,32,128 --widths 1,2,4,8 \
  --prefetch on,off --rerank on --cuvs-probes 8,32,128 $cuvs --out "$out/bang_width.json" \
  > "$out/bang_width.log" 2>&1 || rc=1
tail -5 "$out/bang_width.log"
python3 - "$out/bang_width.json" <<'PY' || true
import json, sys
res = json.load(open(sys.argv[1]))
for r in res.get("rows", []):
    if r["method"] == "knnkit-host":
        print(f"L={r['beam']:4d} W={r['width']} prefetch={int(r['prefetch'])} recall={r['recall']:.3f} "
              f"qps={r['qps']:9.0f} iters={r['iterations']} walk={r['walk_s']:.3f}s wait={r['host_wait_s']:.3f}s "
              f"gather={r['host_gather_s']:.3f}s launch={r['host_launch_s']:.3f}s")
    else:
        print(r)
print({k: res.get(k) for k in ("stages", "cuvs_error") if k in res})
PY
exit $rc
