#!/bin/bash
# Thirty-eighth session, first call: does mapping host memory with large pages on the GPU's side
# (driver VMM API, managed memory) stop random row reads from slowing with the mapped range?
source scripts/device/common.sh
{
  echo "iommu: $(ls /sys/class/iommu 2>/dev/null | tr '\n' ' ')"
  echo "cmdline iommu: $(tr ' ' '\n' < /proc/cmdline | grep -i -E 'iommu|hugepage' | tr '\n' ' ')"
  echo "hugepages: $(grep -E 'HugePages_Total|Hugepagesize' /proc/meminfo | tr '\n' ' ')"
  nvidia-smi -q 2>/dev/null | grep -i -E 'Addressing Mode|Link Gen|Link Width|Bus Id|Driver Version|CUDA Version' | sed 's/  */ /g'
  nvidia-smi topo -m 2>/dev/null | head -5
  lscpu | grep -E 'Model name|NUMA node|Socket'
} > "$out/machine.txt" 2>&1
cat "$out/machine.txt"
$py benchmarks/bang_mapped_micro.py --sizes-gb "${SIZES:-0.25,1,4,12,24}" --reps 100 \
   --kinds "${KINDS:-device,register,vmm,vmm_numa,managed}" --out "$out/mapped_micro.json"
echo "done in $(( $(date +%s) - t0 )) s"
