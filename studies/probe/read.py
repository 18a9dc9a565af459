"""The probe study's recordings, read: every session's points of the relation gain(lead), and its check.

    points()       # one row per (session, host work): the probe's sessions (catalog "probe.sessions") and the
                   # production sessions' lean-host task (catalog "production.sessions", default_C16384)
    validation()   # per session: its lean-host gain predicted from the other sessions (analysers/host_lead.py)
    hosts()        # session -> the host it ran on (its metadata), "not recorded" before hosts were recorded

    PYTHONPATH=. python3 -m studies.probe.read --write    # data/probe/points.csv and validation.csv
"""
from __future__ import annotations

import sys

import pandas as pd

from lora_moe_lab.instruments.analysers import host_lead as H
from lora_moe_lab.instruments.analysers import production_runs as PR
from lora_moe_lab.instruments.analysers import schemas
from lora_moe_lab.provenance import DATA, catalog

LEAN_TASK = "default_C16384"  # the same quantity the probe measures: 64 x 2048 tokens, C=16384, no adapter


def _probe_files():
    """The catalog's probe sessions (an entry that matches nothing is an error, not an empty list)."""
    return catalog("probe.sessions")


def points() -> pd.DataFrame:
    rows = []
    for name, s in PR.load_sessions().items():
        t = s.summary[(s.summary["task"] == LEAN_TASK) & (s.summary["guard"] == "sync")]
        if len(t):
            r = t.iloc[0]
            rows.append(dict(session=f"production {name}", host_us_per_layer=0.0, lead_us=r["later_blocked_median_us"],
                             measured_gain_pct=r["fix_throughput_gain_pct"],
                             measured_gain_pct_lo=r["fix_throughput_gain_pct_lo"],
                             measured_gain_pct_hi=r["fix_throughput_gain_pct_hi"],
                             sync_forward_ms=r["forward_median_ms"], syncs_per_forward=r["syncs_per_forward"],
                             gpu=s.meta.get("gpu", "not recorded"), commit=s.meta.get("commit", ""),
                             date=s.meta.get("date", "")))
    probes = [schemas.read_csv(p, "probe") for p in _probe_files()]
    for f in probes:  # the probe records its layers and guard sites per layer: n syncs per forward
        f["syncs_per_forward"] = f["guard_sites"] * f["layers"]
    frames = [pd.DataFrame(rows)] + probes
    pts = H.points(frames)
    commits = pd.concat([f[["session", "commit", "date"]] for f in frames]).drop_duplicates("session")
    return pts.merge(commits, on="session", how="left")


def hosts() -> dict[str, str]:
    out = {}
    for p in _probe_files():
        meta = schemas.read_json(p.with_name(p.name.replace(".csv", ".meta.json")))
        out[meta["params"]["session"]] = H.host_label(meta)
    return out


def validation() -> pd.DataFrame:
    """Both relations, each session left out of its own fit, then each GPU model left out of its own."""
    pts, h = points(), hosts()
    return pd.concat([H.validate(pts, h, by="session"), H.validate(pts, h, by="gpu")], ignore_index=True)


def main(argv=None) -> int:
    if "--write" not in (argv or sys.argv[1:]):
        print(validation().to_string(index=False))
        return 0
    (DATA / "probe").mkdir(exist_ok=True)
    points().to_csv(DATA / "probe" / "points.csv", index=False)
    validation().to_csv(DATA / "probe" / "validation.csv", index=False)
    print(f"wrote {DATA / 'probe' / 'points.csv'} and validation.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
