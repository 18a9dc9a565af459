"""Record the relation behind the probe on one freshly started H200: the probe's points, one CSV and its meta.

    PYTHONPATH=. GIT_COMMIT=<sha> GIT_DIRTY=0 python3 -m studies.probe.record --session p1 --out $OUT
    PYTHONPATH=. python3 -m studies.probe.record --smoke --out /tmp/probe     # CPU: tiny, seconds

Per host-work level (0: the lab's lean host; 2000 us per layer stands in for a slower host, shortening the
lead by about 500 us per call point) the probe (lora_moe_lab/instruments/recorders/probe.py) measures the
host's lead, predicts the gain from the relation recorded so far (other sessions only), then measures the
gain: 12 interleaved paired repetitions after a warm-up. Writes $OUT/probe_<session>.csv and
probe_<session>.meta.json (provenance with the host: CPU model, cores, clock, load, the Python build).
Another session is another freshly started machine: the host is what differs.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import pandas as pd

from lora_moe_lab.instruments.recorders import probe as PB
from lora_moe_lab.instruments.recorders import tables
from lora_moe_lab.provenance import metadata

LEVELS = [0.0, 2000.0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--session", required=True, help="this device session's label (p1, p2, ...)")
    ap.add_argument("--out", default=os.environ.get("OUT", "build/probe"), help="default: $OUT, else build/probe")
    ap.add_argument("--reps", type=PB.pos_int, default=12)
    ap.add_argument("--levels", type=PB.nonneg_float, nargs="+", default=LEVELS, help="host us per layer")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args(argv)
    out = Path(a.out)
    csv, meta_path = out / f"probe_{a.session}.csv", out / f"probe_{a.session}.meta.json"
    if csv.exists():
        ap.error(f"{csv} exists: a session is recorded once")
    t0 = time.monotonic()
    lab, plan, names = PB.build(a.smoke)
    rel = None if a.smoke else PB.relation(exclude=a.session)
    meta = metadata(params=dict(session=a.session, reps=a.reps, levels=a.levels, smoke=a.smoke))
    rows = []
    for h in a.levels:
        rows.append(dict(session=a.session, **PB.probe(lab, plan, names, reps=a.reps, host_us_per_layer=h, rel=rel,
                                                       log=lambda s: print(s, flush=True)), **PB.host_columns(),
                         gpu=meta["gpu"], commit=meta["commit"], date=meta["date"]))
        out.mkdir(parents=True, exist_ok=True)
        # after every level: the table whole (temp file + rename), then its metadata and seal; a killed call keeps
        # what it measured, and a kill between the two leaves a table its seal refuses, never half a table
        tables.write_text_atomic(csv, pd.DataFrame(rows).to_csv(index=False))
        meta.update(wall_s=round(time.monotonic() - t0, 1), rows=len(rows),
                    relation=rel.describe() if rel else "none recorded before this session")
        tables.write_json_atomic(meta_path, {**meta, "files": tables.read_meta(meta_path).get("files", {})})
        tables.seal(csv, meta_path)
    print(f"total {time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
