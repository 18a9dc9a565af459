#!/bin/bash
# device call 3: expand (third session: loop, d64, the dense build) and layer (committed vs previous table vs candidate)
export GIT_COMMIT=6dc8b10945d42ede5a310e15563f7ee6a578ab21 GIT_DIRTY=0 PYTHONPATH=$PWD
D=$OUT/s3; mkdir -p $D
T0=$(date +%s)
finish() { cd $OUT && tar czf all.tgz s3 && rm -rf s3; }
trap finish EXIT
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $D/gpu.txt
timeout 400 python3 scripts/record_kernels_fold.py --out $D --sections expand,layer --reps 20 > $D/stdout.log 2>&1
echo "timing rc=$? at $(( $(date +%s) - T0 ))s" >> $D/progress.txt
