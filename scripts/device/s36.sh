#!/usr/bin/env bash
# Thirty-sixth session (nvidia-h200, no peer): the out-of-core path of a host-placed build on the
# GPU (issue 16). (1) GPU tests of the changed modules; (2) the host memory (resident set, per step
# from the work folder's manifest) of the out-of-core candidate lists, 6M x 96, K = 64: this tree
# with 3 and with 6 shards, and the previous tree (.old_s36, carried) with 3; (3) the whole
# host-placed build out of core at 2M x 96 (lists on the GPU, the rest on the host), then a search.
. scripts/device/common.sh
export TMPDIR=/tmp/knnkit-s36; rm -rf "$TMPDIR"; mkdir -p "$TMPDIR"
free -g | head -2; nproc
timeout 240 $py -m pytest -q -x tests/test_out_of_core.py tests/test_bang.py > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"; tail -3 "$out/tests.log"
mem() {  # tree shards n via name
  KNNKIT_PROGRESS=0 timeout 200 $py "$1/benchmarks/bang_ooc_host_memory.py" --device gpu --n "$3" --shards "$2" \
    --via "$4" --out "$out/$5.json" > "$out/$5.log" 2>&1
  echo "$5 rc=$? $(( $(date +%s) - t0 )) s"
  $py -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["seconds"], "peak GB", round(d["peak_rss_bytes"]/1e9,2), "x lists", round(d["peak_over_lists"],2), "held", d.get("running_lists_held_max"), json.dumps(d.get("steps")), json.dumps(d.get("phase_s")))' "$out/$5.json"
}
mem . 3 6000000 engine new_6m_3
mem . 6 6000000 engine new_6m_6
mem .old_s36 3 6000000 engine old_6m_3
mem . 4 2000000 build build_2m_4
free -g | head -2
rm -rf "$TMPDIR"
