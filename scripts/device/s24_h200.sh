#!/usr/bin/env bash
# Twenty-fourth session, nvidia-h200, cuVS staged in /tmp/peer-site in the same lease.
# PART=a (issue 16): GPU tests of host placement, then bang_bench.py at 3M x 96 (clustered, budget 1/8
#   of graph + vectors, W = 4) sweeping the number of pipelined query batches (2, 3, 4) at L = 16-32,
#   each once more under torch.profiler (busy share), cuVS IVF-PQ + host refine at 1-16 probes in the
#   same run (the issue's ratio at recall 0.90).
# PART=b / c (issue 11): the GPU robustness suite at full scale with CAGRA (degree 64) and cuVS
#   nn_descent in the same run, sweeping on to recall 0.999 (beams 6144 / 8192 where still short).
#   OUT=/some/folder PART=a scripts/device/s24_h200.sh   (from the repository root; .data carried for c)
. scripts/device/common.sh
. scripts/device/peer_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/env.txt"
$py -c "import cuvs; print('cuvs', cuvs.__version__)" 2>&1 | tail -1
if [ "${PART:-a}" = a ]; then
  [ "${TESTS:-0}" = 1 ] && timeout ${TESTS_S:-150} $py -m pytest -q -m gpu -p no:cacheprovider tests/test_bang*.py > "$out/tests_bang.log" 2>&1
  echo "tests rc=$? $(( $(date +%s) - t0 )) s"; tail -2 "$out/tests_bang.log"; grep -E "^FAILED" "$out/tests_bang.log" | head
  timeout ${BANG_S:-330} $py benchmarks/bang_bench.py --n 3000000 --d 96 --beams 16,20,24,32 --widths 4 --prefetch on \
      --rerank on --paths new --pipeline-batches 2,3,4 --busy --cuvs-probes 1,2,3,4,8,16 \
      --out "$out/bang_pipeline.json" > "$out/bang_pipeline.log" 2>&1
  echo "bang rc=$? $(( $(date +%s) - t0 )) s"
  grep -o '{"busy"[^}]*}' "$out/bang_pipeline.log" | cut -c1-300
  $py - "$out/bang_pipeline.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    if "busy" in r:
        continue
    print(r["method"], {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()
                        if k in ("beam", "pipeline_batches", "n_probes", "recall", "qps", "iterations",
                                 "host_wait_s", "host_gather_s", "host_launch_s", "loop_s", "total_s")})
print({k: v for k, v in d.items() if k in ("cuvs_error", "stages")})
PY
  grep -E "Error|Traceback" "$out/bang_pipeline.log" | head -3
fi
if [ "${PART:-a}" = b ]; then
  timeout ${ROB_S:-560} $py benchmarks/robustness.py --device gpu --scale full --no-real --more-beams 6144,8192 \
      --sets ${SETS:-broad_d128,uniform_d128,broad_clusters,tight_c1000,tight_c10000,uniform_d32,uniform_d960} \
      --out "$out/rob_a" > "$out/rob_a.log" 2>&1
  echo "rob rc=$? $(( $(date +%s) - t0 )) s"; grep -v -i warn "$out/rob_a.log" | tail -9 | cut -c1-300
  cat "$out"/rob_a/*.md 2>/dev/null | grep "^| [a-z]" | cut -c1-400
fi
if [ "${PART:-a}" = c ]; then
  timeout ${ROB_S:-560} $py benchmarks/robustness.py --device gpu --scale full --more-beams 6144,8192 \
      --sets ${SETS:-sift_like_u8,manifold,skewed_norms_ip,points_2d,duplicates,siftsmall,skin_u8,fashion_mnist_u8} \
      --out "$out/rob_b" > "$out/rob_b.log" 2>&1
  echo "rob rc=$? $(( $(date +%s) - t0 )) s"; grep -v -i warn "$out/rob_b.log" | tail -10 | cut -c1-300
  cat "$out"/rob_b/*.md 2>/dev/null | grep "^| [a-z]" | cut -c1-400
fi
if [ "${PART:-a}" = d ]; then
  # issue 16: the re-rank by its two kernels (bang_rerank_rows / bang_rerank_select) against ~35
  # CuPy calls, W = 4, each configuration twice, same run as IVF-PQ; GPU tests of the host placement first
  timeout ${TESTS_S:-200} $py -m pytest -q -m gpu -p no:cacheprovider tests/test_bang_call.py tests/test_bang.py \
      tests/test_bang_width.py > "$out/tests_bang.log" 2>&1
  echo "tests rc=$? $(( $(date +%s) - t0 )) s"; tail -2 "$out/tests_bang.log"; grep -E "^FAILED" "$out/tests_bang.log" | head
  timeout ${BANG_S:-330} $py benchmarks/bang_bench.py --n 3000000 --d 96 --beams ${BEAMS:-16,20,24,32} --widths 4 \
      --prefetch on --rerank on --paths new,new-cupy --pipeline-batches 2,2 --busy --cuvs-probes 2,3,4,5,6,8 \
      --out "$out/bang_rerank.json" > "$out/bang_rerank.log" 2>&1
  echo "bang rc=$? $(( $(date +%s) - t0 )) s"
  grep -o '{"busy"[^}]*}' "$out/bang_rerank.log" | grep -o '"beam": [0-9]*\|"width": [0-9]*\|"kernel_frac": [0-9.]*\|"busy_frac": [0-9.]*' | paste - - - - | head -20
  $py - "$out/bang_rerank.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    if "busy" in r:
        continue
    print(r["method"], {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()
                        if k in ("path", "beam", "width", "n_probes", "recall", "qps", "iterations",
                                 "host_wait_s", "host_gather_s", "host_launch_s", "host_finish_s", "loop_s", "setup_s", "total_s")})
print({k: v for k, v in d.items() if k in ("cuvs_error",)})
PY
  grep -E "Error|Traceback" "$out/bang_rerank.log" | head -3
fi
