#!/usr/bin/env bash
# Thirty-eighth session, second call (nvidia-h200, no peers; issue 16): mapped access from managed
# memory (configure(mapped_memory=)). GPU tests of the host-placed search, then 3M x 96: the host
# gather against mapped managed and mapped page-locked memory, one call and under the budget,
# alternated, with the kernels' share of the call (--busy).
. scripts/device/common.sh
$py -m pytest -q -m gpu tests/test_bang_call.py tests/test_bang_width.py -p no:cacheprovider \
  > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$out/tests.log")"
summ() { python3 scripts/device/bang_rows.py "$1"; }
P=new-onecall,new-onecall-mapped,new-onecall-mapped-pinned
KNNKIT_PROGRESS=0 timeout 330 $py benchmarks/bang_bench.py --n 3000000 --d 96 --beams 20,32,64 --widths 4 --prefetch on \
  --rerank on --paths $P,$P,new,new-mapped --no-cuvs --busy --out "$out/bang_3m_managed.json" > "$out/bang_3m.log" 2>&1
echo "3m rc=$? $(( $(date +%s) - t0 )) s"; summ "$out/bang_3m.log" | tee "$out/summary_3m.txt"
python3 -c 'import json,sys; print("stages", json.load(open(sys.argv[1]))["stages"])' "$out/bang_3m_managed.json"
