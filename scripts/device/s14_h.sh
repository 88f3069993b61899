#!/usr/bin/env bash
# Fourteenth session, 2 x H100 (issue 17), second call: s14_g.sh again after the re-replication of a
# lost shard copy, with 2 search repeats.
#   OUT=/some/folder bash scripts/device/s14_h.sh   (carry .wheels/dask)
REPEATS=2 exec bash "$(dirname "$0")/s14_g.sh"
