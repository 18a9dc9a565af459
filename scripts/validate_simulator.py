"""Fit the host/device queue model to every recorded H200 timing and write its error table.

    python scripts/validate_simulator.py     -> data/simulator/simulator_validation.csv, simulator_fit.json,
                                                simulator_vs_production.csv

Inputs: data/sweep/*.csv (the sequential sweep and the side-by-side run) and data/traces/*.json.gz.
Deterministic (Nelder-Mead from fixed starting values), CPU only.
"""
import glob
import json
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from lora_moe_lab import bench, simulate as sim, trace  # noqa: E402


def main():
    sweep = bench.load_recorded_sweeps(ROOT / "data/sweep")
    traces = [trace.load_trace(f) for f in sorted(glob.glob(str(ROOT / "data/traces/*.json.gz")))]
    fr = sim.fit(sweep, traces=traces, iters=400, params=sim.FIT_PARAMS_RECORDED)
    tables = []
    for name, d in [("sequential sweep", sweep[sweep["variant"].isna()]),
                    ("side by side", sweep[sweep["variant"].notna()])]:
        tables.append(sim.validate(d, fr.params).assign(data=name))
    v = pd.concat(tables, ignore_index=True)
    v.to_csv(ROOT / "data/simulator/simulator_validation.csv", index=False)
    json.dump(dict(fitted=fr.params.as_dict(), fitted_names=list(fr.fitted), rows=fr.rows,
                   rms_log_error=fr.rms_log_error, sources=fr.sources,
                   recorded_on=sorted(set(sweep["gpu"].dropna().astype(str))),
                   commits=sorted(set(sweep["git_commit"].dropna().astype(str)))),
              open(ROOT / "data/simulator/simulator_fit.json", "w"), indent=1)
    cmp = sim.compare_production(sim.extrapolate(fr.params))
    cmp.to_csv(ROOT / "data/simulator/simulator_vs_production.csv", index=False)
    print(cmp.round(2).to_string(index=False))
    print(f"fitted on {fr.rows} rows, rms log error {fr.rms_log_error:.3f}")
    print(v.round(1).to_string(index=False))


if __name__ == "__main__":
    main()
