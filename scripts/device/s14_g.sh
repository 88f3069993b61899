#!/usr/bin/env bash
# Fourteenth session, 2 x H100 (issue 17): the replicated search's 2-worker scaling repeated
# (benchmarks/dask_scaling.py --search-repeats $REPEATS, default 3), 2M x 96, 1M queries resident on
# the workers, numpy blocks and CuPy blocks; and whether the machine has nsys / ncu (issue 16's profile).
#   OUT=/some/folder [REPEATS=3] bash scripts/device/s14_g.sh   (carry .wheels/dask)
set -u
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the output folder}"
export PYTHONPATH="${PYTHONPATH:-src}" PYTHONUNBUFFERED=1
PY=python3
for w in .wheels/dask/*.whl; do "$PY" -m pip install -q --no-index --no-deps "$w" 2>/dev/null || echo "skipped $(basename "$w")"; done
{ nvidia-smi -L; echo "nsys: $(command -v nsys || echo none)"; echo "ncu: $(command -v ncu || echo none)";
  ls /usr/local/cuda*/bin 2>/dev/null | grep -E "^(nsys|ncu)$" | sort -u; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
t0=$(date +%s)
for mode in host dev; do
  extra=$([ $mode = dev ] && echo --device-queries)
  timeout 250 "$PY" benchmarks/dask_scaling.py --n 2000000 --queries 1000000 --benches search --resident-queries \
      $extra --search-repeats "${REPEATS:-3}" --part-factors 1 > "$OUT/search_$mode.json" 2> "$OUT/search_$mode.log"
  echo "$mode rc=$? $(( $(date +%s) - t0 )) s"
done
"$PY" - "$OUT"/search_host.json "$OUT"/search_dev.json <<'PYEOF'
import json, sys
for f in sys.argv[1:]:
    try:
        d = json.load(open(f))
    except Exception as e:
        print(f, "unreadable", e); continue
    runs = [r for r in d["runs"] if r["bench"] == "replicated_search"]
    for beam in (32, 64, 128):
        one = [r["seconds"] for r in runs if r["beam"] == beam and r["workers"] == 1]
        two = [r["seconds"] for r in runs if r["beam"] == beam and r["workers"] == 2]
        if one and two:
            print(f.rsplit("/", 1)[-1], "beam", beam, "1w", one, "2w", two,
                  "ratio of medians %.2f" % (sorted(one)[len(one) // 2] / sorted(two)[len(two) // 2]))
PYEOF
