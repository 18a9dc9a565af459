"""Fit the host/device queue model to every recorded H200 timing and write its error table.

    python scripts/validate_simulator.py     -> data/simulator/simulator_validation.csv, simulator_fit.json,
                                                simulator_vs_production.csv

Inputs: data/sweep/*.csv (the sequential sweep and the side-by-side run) and data/traces/*.json.gz.
Deterministic (Nelder-Mead from fixed starting values), CPU only.
"""
import argparse
import json
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lora_moe_lab import sim  # noqa: E402
from lora_moe_lab.instruments import bench, trace  # noqa: E402
from lora_moe_lab.provenance import DATA  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DATA / "simulator", help="folder for the three tables")
    out = ap.parse_args(argv).out
    out.mkdir(parents=True, exist_ok=True)
    sweep = bench.load_recorded_sweeps(DATA / "sweep")  # older files' git_commit column is read as commit
    traces = [trace.load_trace(f) for f in sorted((DATA / "traces").glob("*.json.gz"))]
    fr = sim.fit(sweep, traces=traces, iters=400, params=sim.FIT_PARAMS_RECORDED)
    tables = []
    for name, d in [("sequential sweep", sweep[sweep["variant"].isna()]),
                    ("side by side", sweep[sweep["variant"].notna()])]:
        tables.append(sim.validate(d, fr.params).assign(data=name))
    v = pd.concat(tables, ignore_index=True)
    v.to_csv(out / "simulator_validation.csv", index=False)
    with open(out / "simulator_fit.json", "w") as f:
        json.dump(dict(fitted=fr.params.as_dict(), fitted_names=list(fr.fitted), rows=fr.rows,
                       rms_log_error=fr.rms_log_error, sources=fr.sources,
                       recorded_on=sorted(set(sweep["gpu"].dropna().astype(str))),
                       commits=sorted(set(sweep["commit"].dropna().astype(str)))), f, indent=1)
    cmp = sim.compare_production(sim.extrapolate(fr.params))
    cmp.to_csv(out / "simulator_vs_production.csv", index=False)
    print(cmp.round(2).to_string(index=False))
    print(f"fitted on {fr.rows} rows, rms log error {fr.rms_log_error:.3f}")
    print(v.round(1).to_string(index=False))


if __name__ == "__main__":
    main()
