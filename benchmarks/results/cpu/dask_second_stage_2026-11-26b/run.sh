set -u
cd .
F=$OUT
echo "start $(date -u +%FT%T) $(uptime)" > $F/run.log
for i in 1 2; do for src in src src; do
  lab=$([ $src = src ] && echo before || echo after)
  PYTHONPATH=$src timeout 900 python benchmarks/dask_second_stage.py --n 200000 --d 32 --schedules tree,rows --label $lab-$i >> $F/second_stage_200k.jsonl 2>>$F/second_stage_200k.log
  echo "$lab-$i rc=$? $(uptime)" >> $F/run.log
done; done
PYTHONPATH=src timeout 900 python benchmarks/dask_plumbing.py --n 4000000 --d 96 --workers 2 --slab-quantile 0.3 --schedules tree --reps 2 > $F/plumbing_4M_2w_before.json 2>$F/plumbing_before.log
echo "plumb before rc=$? $(uptime)" >> $F/run.log
PYTHONPATH=src timeout 900 python benchmarks/dask_plumbing.py --n 4000000 --d 96 --workers 2 --slab-quantile 0.3 --schedules tree,rows --reps 2 > $F/plumbing_4M_2w_after.json 2>$F/plumbing_after.log
echo "plumb after rc=$? $(uptime)" >> $F/run.log
echo done >> $F/run.log
# parts_200k.jsonl (same tree of the code for these tasks, run 10 minutes earlier):
# for i in 1 2; do NUMBA_NUM_THREADS=1 PYTHONPATH=src python benchmarks/dask_second_stage_parts.py --n 200000 --d 32 --label parts-$i; done
