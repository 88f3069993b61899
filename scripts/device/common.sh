# Sourced by the device scripts (from the repository root): the output folder ($OUT, made), the
# import path, unbuffered output, the data folder carried as .data, the interpreter ($py) and the
# start time ($t0) the scripts' progress lines count from.
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1 KNNKIT_DATA=${KNNKIT_DATA:-$PWD/.data}
py=${PYTHON:-python3}
t0=$(date +%s)
