#!/usr/bin/env bash
# Thirty-seventh session, second call (nvidia-h200, issue 16): GPU tests of the BANG module and the
# out-of-core lists (among them the parameters chosen before the build decides where to build, and
# a real CuPy out-of-memory error falling back out of core); then the host-placed build of 50M x 96
# under the automatic build budget, now deciding with the candidates the build takes (K = 64).
. scripts/device/common.sh
export TMPDIR=/tmp/knnkit-s37; rm -rf "$TMPDIR"; mkdir -p "$TMPDIR"
timeout 200 $py -m pytest -q -x tests/test_bang.py tests/test_out_of_core.py > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s; $(tail -1 "$out/tests.log")" | tee "$out/summary.txt"
left=$(( 580 - ($(date +%s) - t0) ))
KNNKIT_PROGRESS=0 timeout "$left" $py benchmarks/bang_build_memory.py --n 50000000 --d 96 \
  --out "$out/build_50m_auto.json" > "$out/build_50m_auto.log" 2>&1
echo "build_50m rc=$? $(( $(date +%s) - t0 )) s" | tee -a "$out/summary.txt"
rm -rf "$TMPDIR"
