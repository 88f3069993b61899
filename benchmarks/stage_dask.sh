#!/usr/bin/env bash
# Stage the wheels that knnkit.dask and its benchmark need on the GPU machine (Python 3.12,
# manylinux x86_64, no network, no dask): dask, distributed, dask-cuda and their dependencies,
# downloaded HERE into the git-ignored folder .wheels/dask (carry it to the device run).
#
#   bash benchmarks/stage_dask.sh            # download + check that pip resolves from the folder alone
#
# On the device, install from the folder only:
#   pip install --no-index --find-links .wheels/dask dask distributed dask-cuda
#
# numpy is left out (the device has its own, newer than the wheels here would pin); every other
# dependency is in the folder. dask-cuda pins dask/distributed through rapids-dask-dependency, so
# the folder holds that exact dask (pip picks it; the version is printed below).
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=.wheels/dask
CHECK=.wheels/check   # numpy for the resolution check only (not carried)
PLAT=(--platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 --platform any)
mkdir -p "$DEST" "$CHECK"
pip download "dask-cuda>=25" dask distributed --only-binary=:all: --python-version 3.12 "${PLAT[@]}" -d "$DEST" -q
mv -f "$DEST"/numpy-*.whl "$CHECK"/ 2>/dev/null || true
echo "staged in $DEST: $(ls "$DEST" | wc -l) wheels, $(du -sm "$DEST" | cut -f1) MiB"
ls "$DEST" | grep -E '^(dask|distributed|dask_cuda|rapids)' || true
# resolution check: from the folder (plus numpy) alone. With a Python 3.12 here, a real install
# into a fresh venv (and the imports); otherwise a dry run for 3.12 into an empty target.
PY312=$(command -v python3.12 || true)
if [ -n "$PY312" ] && "$PY312" -c "import sys; assert sys.version_info[:2] == (3, 12)" 2>/dev/null; then
    rm -rf /tmp/knnkit-dask-venv
    "$PY312" -m venv /tmp/knnkit-dask-venv
    /tmp/knnkit-dask-venv/bin/pip install -q --no-index --find-links "$DEST" --find-links "$CHECK" dask distributed dask-cuda
    /tmp/knnkit-dask-venv/bin/python -c "import dask, distributed, dask.array, dask_cuda; print('py3.12 venv: dask', dask.__version__, 'distributed', distributed.__version__, 'dask_cuda', dask_cuda.__version__)"
else
    rm -rf /tmp/knnkit-dask-resolve
    pip install --dry-run --no-index --find-links "$DEST" --find-links "$CHECK" --python-version 3.12 \
        --ignore-requires-python --only-binary=:all: "${PLAT[@]}" --target /tmp/knnkit-dask-resolve \
        dask distributed dask-cuda | tail -1
fi
