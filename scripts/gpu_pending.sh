#!/usr/bin/env bash
# The GPU verification still owed, in device calls of 10 minutes at most, each step a call of its own:
#   scripts/gpu_pending.sh STEP [STEP ...]
# Steps, in the order to call them:
#   tests      the whole suite over 14 workers (scripts/gpu_check.py --what tests), the wheels installed first
#   launch     where an eager LoRA launch's host time goes, per path (studies/launch_cost/record.py, ~1 min), and
#              the functions that take it (studies/launch_cost/hotspots.py)
#   notebooks  every notebook live (scripts/gpu_check.py --what notebooks); MERGE=<the tests' JSON, carried back>
#              makes one log of both calls
#   tune       this card's tile tables and LoRA plan, resumable (scripts/gpu_tune.sh; call it again on exit 3)
#   cap24      the workbench as a 24 GB card sees it: the notebooks and the probe (scripts/gpu_reader_cards.sh)
# Everything lands in $OUT (gc/: the check's log and JSON; launch_cost/; tune/; cap24/), to copy into data/.
# Needs GIT_COMMIT (and GIT_DIRTY) set where the tree has no .git, and the notebook wheels in .whl.
set -uo pipefail
: "${OUT:=build/gpu_pending}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || { echo "gpu_pending: no GPU" >&2; exit 2; }
rc=0
for step in "$@"; do
  case $step in
    tests) timeout 560 python3 scripts/gpu_check.py --wheels .whl --out "$OUT/gc" --build /tmp/gc --what tests \
             --pytest-args "-n 14 --dist load" 2>&1 | tail -40 || rc=1 ;;
    launch) timeout 300 python3 studies/launch_cost/record.py --out "$OUT/launch_cost" || rc=1
            timeout 120 python3 -m studies.launch_cost.hotspots --calls 1000 > "$OUT/launch_cost/hotspots.txt" 2>&1 ;;
    notebooks) timeout 560 python3 scripts/gpu_check.py --wheels .whl --out "$OUT/gc" --build /tmp/gcn \
                 ${MERGE:+--merge "$MERGE"} --what notebooks 2>&1 | tail -40 || rc=1 ;;
    tune) OUT=$OUT scripts/gpu_tune.sh 520 || rc=$? ;;
    cap24) WHEELS=.whl OUT=$OUT timeout 560 scripts/gpu_reader_cards.sh 24 notebooks probe || rc=1 ;;
    *) echo "gpu_pending: unknown step $step (tests, launch, notebooks, tune, cap24)" >&2; exit 2 ;;
  esac
done
exit $rc
