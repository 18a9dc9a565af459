#!/usr/bin/env bash
# On the GPU machine (device tool): install carried notebook wheels, then run the given steps.
#   bash scripts/gpu_run.sh tests checks kernels traces sweep notebooks
# Each step writes under $OUT/<step>/ ; a failing step does not stop the next.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --find-links .whl papermill ipykernel plotly ipywidgets nbconvert nbformat nbclient >/dev/null 2>&1 \
  || echo "wheel install failed (notebook steps will fail)"
python3 -m ipykernel install --user --name python3 >/dev/null 2>&1 || true
export GIT_COMMIT=${GIT_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
# per-step time limits (seconds): STEP_LIMIT_<step>=N in the environment
declare -A STEP_LIMIT
for v in $(env | grep -o '^STEP_LIMIT_[a-z]*=[0-9]*'); do k=${v%%=*}; STEP_LIMIT[${k#STEP_LIMIT_}]=${v#*=}; done
for step in "$@"; do
  mkdir -p "$OUT/$step"; t0=$(date +%s)
  lim=${STEP_LIMIT[$step]:-600}
  case $step in
    tests)     timeout $lim python3 -m pytest -q -p no:cacheprovider -m "not notebook and not browser" 2>&1 | tee "$OUT/$step/pytest.log" | tail -25 ;;
    testsall)  python3 -m pytest -q -p no:cacheprovider 2>&1 | tail -25 ;;
    checks)    python3 scripts/gpu_checks.py --out "$OUT/checks" 2>&1 | tail -40 ;;
    kernels)   python3 scripts/gpu_kernels.py --out "$OUT/kernels" 2>&1 | tail -40 ;;
    traces)    python3 scripts/gpu_traces.py --out "$OUT/traces" 2>&1 | tail -30 ;;
    sweep)     python3 scripts/gpu_sweep.py --out "$OUT/sweep" 2>&1 | tail -40 ;;
    backends)  timeout $lim python3 scripts/gpu_backends.py --out "$OUT/backends" $BACKENDS_ARGS 2>&1 | tail -20 ;;
    side)      timeout $lim python3 scripts/gpu_side_by_side.py --out "$OUT/side" $SIDE_ARGS 2>&1 | tail -45 ;;
    notebooks) timeout $lim python3 -m lora_moe_lab.nb.runner --out "$OUT/notebooks" --params gpu 2>&1 | tail -20 ;;
    *) echo "unknown step $step" ;;
  esac
  echo "== step $step took $(( $(date +%s) - t0 )) s"
  # the device tool returns at most 8 files: one archive per step
  if [ -n "$(ls -A "$OUT/$step")" ]; then tar -C "$OUT" -czf "$OUT/$step.tgz" "$step"; fi
  rm -rf "$OUT/$step"
done
