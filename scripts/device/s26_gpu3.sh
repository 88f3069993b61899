#!/usr/bin/env bash
# Twenty-sixth session, third batch (nvidia-h200, no peers): the unseen-shapes benchmark on the GPU
# (20k, every set), and exact k-NN on heavy-tailed rows against Gaussian ones (certificate).
. scripts/device/common.sh
KNNKIT_PROGRESS=0 timeout 150 $py scripts/device/s26_cauchy_gpu.py > "$out/cauchy.log" 2>&1
echo "cauchy rc=$? $(( $(date +%s) - t0 )) s"; grep -v Deprec "$out/cauchy.log" | tail -8
KNNKIT_PROGRESS=0 timeout 300 $py benchmarks/unseen_shapes.py --device gpu --out "$out/unseen" > "$out/unseen.log" 2>&1
echo "unseen rc=$? $(( $(date +%s) - t0 )) s"; grep -c '"name"' "$out/unseen.log"
