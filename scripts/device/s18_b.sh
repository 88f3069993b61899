#!/usr/bin/env bash
# Eighteenth session, second call (cuVS staged in /tmp/peer-site; .data carried): the fixed GPU test
# of the near-exact fallback; then issue 14's time-to-recall table on broad 1M x 128 (the hard set)
# and Fashion-MNIST beside cuVS nn_descent in one run, with knn_graph's near-exact fallback.
#   OUT=/some/folder scripts/device/s18_b.sh   (from the repository root)
. scripts/device/common.sh
. scripts/device/peer_env.sh
$py -c "import cuvs; print('cuvs', cuvs.__version__)" 2>&1 | tail -1
timeout 120 $py -m pytest -q -m gpu -p no:cacheprovider tests/test_stall_watch.py > "$out/tests.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"; tail -2 "$out/tests.log"
mkdir -p "$out/peers"
timeout 300 $py benchmarks/bench_rsfk.py --device gpu --datasets broad-1M-128,fmnist-70k-784 --skip-variants \
    --out "$out/peers" > "$out/peers/rsfk.log" 2>&1
echo "rsfk rc=$? $(( $(date +%s) - t0 )) s"
$py -c "
import json, glob
d = json.load(open(glob.glob('$out/peers/*.json')[0]))
for s in d['datasets']:
    print(s['name'])
    for m, v in s['time_to_recall'].items():
        print('  ', m, {t: (round(x['time_s'], 3), round(x['recall'], 4)) if x else None for t, x in v.items()})
"
