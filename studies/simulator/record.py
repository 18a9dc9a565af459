"""Calibrate the host/device queue model on the canonical H200 recording and write its tables.

    python studies/simulator/record.py   -> data/simulator/simulator_fit.json       parameters + recording label
                                              data/simulator/simulator_validation.csv held-out points, pass / miss
                                              data/simulator/simulator_vs_production.csv  production extrapolation

Input: data/guards/h200_guards.csv (instruments/analysers/recordings.py: load_guards), one row per repetition;
the fit reads its per-point medians and 95 % intervals (`as_sweep()`). Validation leaves one token
count out at a time. Deterministic (least squares from fixed starting values), CPU only, ~10 s.
"""
import argparse
from pathlib import Path

from lora_moe_lab import sim
from lora_moe_lab.instruments.analysers.recordings import load_guards
from lora_moe_lab.provenance import catalog


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recording", type=Path, default=catalog("guards.archived"),
                    help="a guards recording (one row per repetition)")
    ap.add_argument("--out", type=Path, default=catalog("simulator"), help="folder for the three tables")
    a = ap.parse_args(argv)
    rec = load_guards(a.recording)
    cal = sim.calibrate(rec)
    cal.save(a.out)
    f = cal.fit
    print(f"recording: {cal.label} ({rec.path})")
    print(f"fitted {', '.join(f.fitted)} on {f.rows} points, rms log error {f.rms_log_error:.3f}"
          + (f"; at a bound: {', '.join(f.at_bound)}" if f.at_bound else ""))
    print("  " + ", ".join(f"{p} = {getattr(f.params, p):.4g}" for p in f.fitted))
    print(cal.validation.report())
    s = sim.PRODUCTION_SETTINGS
    print(f"production extrapolation ({s['preset']}, {s['layers']} layers, {s['syncs_per_layer']} sync per layer, "
          f"{s['batch']} x {s['input_len']} tokens in chunks of {list(s['chunks'])}):")
    print(cal.production.round(3).to_string(index=False))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
