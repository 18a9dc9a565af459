#!/usr/bin/env bash
# This GPU's tile tables, LoRA delta tiles and LoRA plan for both presets
# (lora_moe_lab/instruments/recorders/tune.py), in device
# calls of 10 minutes at most:
#   scripts/gpu_tune.sh [BUDGET_S]
# Each call goes on where the last stopped: the state lives in build/tune/ (kept between calls on a warm machine;
# on a fresh one, carry build/tune back). The call stops its tuner BUDGET_S seconds (default 540) after it began,
# the state saved. When both presets are done the tables are in build/tune/tile_tables/ (copy them into
# lora_moe_lab/kernels/tile_tables/ to commit them). Each call copies the state and the tables to $OUT/tune/.
# Exit 0: both presets done; 3: call it again; else an error. Needs GIT_COMMIT set when the tree has no .git.
# TUNE_PRESETS replaces the two presets, TUNE_ARGS adds the tuner's options (a CPU dry run: TUNE_PRESETS=tiny
# TUNE_ARGS="--allow-cpu --reps 1 --buckets 1 --only gemm").
set -uo pipefail
budget=${1:-540}
state=build/tune
mkdir -p "$state"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
start=$(date +%s)
rc=0
for preset in ${TUNE_PRESETS:-qwen3-30b-a3b qwen3-30b-a3b-tp4}; do
  left=$(( budget - ($(date +%s) - start) - 40 ))  # 40 s for the process's start and the float64 references
  if [ "$left" -le 30 ]; then rc=3; break; fi
  python3 -m lora_moe_lab.instruments.recorders.tune --preset "$preset" --auto-resume --budget-s "$left" \
    --out "$state" --tables "$state/tile_tables" ${TUNE_ARGS:-} 2>&1 | tee -a "$state.log"
  rc=${PIPESTATUS[0]}
  [ "$rc" -ne 0 ] && break
done
if [ -n "${OUT:-}" ]; then mkdir -p "$OUT/tune" && cp -r "$state"/. "$state.log" "$OUT/tune/" 2>/dev/null; fi
case $rc in 0) say="both presets done" ;; 3) say="the budget stopped it: call again" ;; *) say="error" ;; esac
echo "gpu_tune: exit $rc: $say"
exit $rc
