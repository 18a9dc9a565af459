#!/bin/bash
# device call 2: expand (second session, + d64), window (second W1S session), layer (committed vs previous table),
# ncu of d64, then the 1000-case packed differential in 8 shards with what time is left
export GIT_COMMIT=3466e022792a98717c5e50389200cffae35e5c97 GIT_DIRTY=0 PYTHONPATH=$PWD
D=$OUT/s2; mkdir -p $D
T0=$(date +%s)
finish() { cd $OUT && tar czf all.tgz s2 && rm -rf s2; }
trap finish EXIT
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $D/gpu.txt
timeout 330 python3 scripts/record_kernels_fold.py --out $D --sections expand,window,layer --reps 20 > $D/stdout.log 2>&1
echo "timing rc=$? at $(( $(date +%s) - T0 ))s" >> $D/progress.txt
mkdir -p $D/ncu
timeout 60 /usr/local/cuda/bin/ncu --clock-control none --profile-from-start off --csv --page raw --print-units base \
  --log-file $D/ncu/ncu_raw.csv --section SpeedOfLight --section Occupancy --section WarpStateStats \
  --section MemoryWorkloadAnalysis --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,smsp__inst_executed.sum,sm__cycles_active.avg,sm__cycles_active.max \
  python3 scripts/record_kernels_fold.py --out $D/ncu --ncu-run --ncu-builds packed_slot,packed_slot_d64 > $D/ncu/ncu_stdout.log 2>&1
echo "ncu rc=$? at $(( $(date +%s) - T0 ))s" >> $D/progress.txt
python3 scripts/record_kernels_base.py --out $D/ncu --ncu-parse $D/ncu/ncu_raw.csv --ncu-stem kernels_fold_ncu >> $D/ncu/ncu_stdout.log 2>&1
gzip -f $D/ncu/ncu_raw.csv
LEFT=$(( 580 - ( $(date +%s) - T0 ) ))
echo "diff budget ${LEFT}s" >> $D/progress.txt
if [ $LEFT -gt 150 ]; then
for K in 0 1 2 3 4 5 6 7; do
  timeout $LEFT python3 scripts/record_kernels_fold.py --out $D/c$K --sections check --diffs packed --cases 125 --cases-from $((K*125)) > $D/c${K}.log 2>&1 &
done
wait
fi
echo "end at $(( $(date +%s) - T0 ))s" >> $D/progress.txt
