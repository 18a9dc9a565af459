#!/usr/bin/env bash
# The workbench on smaller cards, on one GPU (one device call each step, 10 minutes at most):
#   scripts/gpu_reader_cards.sh CAP_GIB [notebooks] [probe] [probe3]
# CAP_GIB 0 runs on the whole card; 24 or 48 cap this process's GPU memory (LORA_MOE_LAB_GPU_GIB, torch's
# per-process memory fraction) so that the card stands in for a 24 GB or 48 GB one. Steps: notebooks (all 7 live
# through scripts/gpu_check.py), probe (make gpu-probe once), probe3 (three probes, each a fresh process that builds
# the model again: the independent runs of the headline interval); PROBE_ARGS go to the probe. Writes $OUT/cap<CAP>/ (logs, CSVs, JSON).
# Needs GIT_COMMIT set when the tree has no .git, and the notebook wheels in .whl on a machine without network.
set -uo pipefail
cap=${1:?CAP_GIB (0: the whole card)}; shift
out=${OUT:-build}/cap$cap; mkdir -p "$out"
[ "$cap" != 0 ] && export LORA_MOE_LAB_GPU_GIB=$cap
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
rc=0
for step in "$@"; do
  case $step in
    notebooks) python3 scripts/gpu_check.py ${WHEELS:+--wheels $WHEELS} --out "$out" --build /tmp/gc$cap \
                 --what notebooks || rc=1 ;;
    probe) python3 -m lora_moe_lab.instruments.recorders.probe ${PROBE_ARGS:-} --out "$out/probe.csv" 2>&1 \
             | tee "$out/probe.log" || rc=1 ;;
    probe3) for i in 1 2 3; do
              python3 -m lora_moe_lab.instruments.recorders.probe --session "run$i" --out "$out/probe_run$i.csv" \
                2>&1 | tee -a "$out/probe3.log" || rc=1
            done ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
exit $rc
