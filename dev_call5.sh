#!/bin/bash
# device call 5: the whole suite, then every notebook live (gpu parameters), one log
export GIT_COMMIT=4fc992da9db9d4392602f053b0c2eec7e66a17f9 GIT_DIRTY=0 PYTHONPATH=$PWD
T0=$(date +%s)
python3 scripts/gpu_check.py --wheels .whl --out $OUT --build /tmp/gc --what tests --pytest-args "-n 12 --dist load" --test-timeout 200 > $OUT/tests_stdout.log 2>&1
echo "tests rc=$? at $(( $(date +%s) - T0 ))s" >> $OUT/progress.txt
python3 scripts/gpu_check.py --wheels .whl --out $OUT --build /tmp/gc --what notebooks --notebooks-tar --merge $OUT/gpu_check_${GIT_COMMIT:0:7}.json > $OUT/nb_stdout.log 2>&1
echo "notebooks rc=$? at $(( $(date +%s) - T0 ))s" >> $OUT/progress.txt
