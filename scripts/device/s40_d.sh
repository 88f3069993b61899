#!/usr/bin/env bash
# Fortieth session, fourth call (nvidia-h200, cuVS 26.10 staged; issue 16): 20M x 96 beside cuVS
# IVF-PQ + refine in the same process, the timed calls with CuPy's pool warm (the steady state of
# repeated calls) and cold (-coldpool: every temporary a new cudaMalloc, as the bench measured
# before), and the thirty-ninth session's whole path (-loadtab-rowsfirst-einsum-coldpool) as the
# bridge to its numbers.
. scripts/device/common.sh
N=${N:-20000000} TAG=${TAG:-20m} TESTS=0 BT=${BT:-480} BEAMS=${BEAMS:-24,32,48} EXTRA=${EXTRA:---cuvs-twice} \
  PATHS=${PATHS:-new-onecall-mapped,new-mapped,new-mapped-coldpool,new-onecall-mapped-loadtab-rowsfirst-einsum-coldpool,new-onecall-mapped,new-mapped} \
  bash scripts/device/s38_c.sh
