#!/usr/bin/env bash
. scripts/device/common.sh
for kind in current current write_then_advise memcpy plain sync_after prefetch_after dummy_first; do
  for rows in 6000 1000000; do
    timeout 60 $py scripts/device/s38_debug3.py $kind $rows 2>&1 | grep -v -i warn
  done
done
