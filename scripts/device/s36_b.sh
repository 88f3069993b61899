#!/usr/bin/env bash
# Thirty-sixth session, second call (nvidia-h200, no peer; issue 16): (1) the whole host-placed
# build out of core at 2M x 96 (lists on the GPU, prune/repair on the host) and a search;
# (2) the host-memory model checked on another shape (4M x 48, K = 32) and with shards sized for
# a host of 10 GB (3M x 96, K = 64); (3) GPU tests of the BANG module; (4) the previous tree
# (.old_s36) at 6M x 96 in 6 shards, against this tree's run of the first call.
. scripts/device/common.sh
export TMPDIR=/tmp/knnkit-s36; rm -rf "$TMPDIR"; mkdir -p "$TMPDIR"
mem() {  # tree name limit args...
  local tree=$1 name=$2 lim=$3; shift 3
  KNNKIT_PROGRESS=0 timeout "$lim" $py "$tree/benchmarks/bang_ooc_host_memory.py" --device gpu "$@" \
    --out "$out/$name.json" > "$out/$name.log" 2>&1
  echo "$name rc=$? $(( $(date +%s) - t0 )) s"
  [ -f "$out/$name.json" ] && $py -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["seconds"], "peak GB", round(d["peak_rss_bytes"]/1e9,2), "x lists", round(d["peak_over_lists"],2), "planned", d.get("planned"), "held", d.get("running_lists_held_max"), "phases", json.dumps(d.get("phase_s")))' "$out/$name.json"
}
mem . build_2m_4 170 --n 2000000 --shards 4 --via build
mem . model_4m_48_32 120 --n 4000000 --d 48 --K 32 --shards 4
mem . host10_3m 150 --n 3000000 --shards 2 --host-gb 10
timeout 120 $py -m pytest -q -x tests/test_bang.py > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"; tail -2 "$out/tests.log"
left=$(( 585 - ($(date +%s) - t0) ))
[ "$left" -gt 60 ] && mem .old_s36 old_6m_6 "$left" --n 6000000 --shards 6
rm -rf "$TMPDIR"
