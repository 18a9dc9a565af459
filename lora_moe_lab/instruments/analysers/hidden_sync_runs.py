"""The recorded hidden-sync sessions (studies/hidden_syncs/record.py -> data/hidden_syncs/), read: one
row per pattern of recorders/hidden_syncs.py over the sessions (notebook 07, the audit plots)."""
from __future__ import annotations

import glob
import os
import re

import pandas as pd

from ...provenance import DATA
from .stats import between_sessions

__all__ = ["recorded"]


def recorded(folder=None):
    """One row per pattern over the recorded sessions (hidden_syncs_s*.csv): the cost per occurrence
    (µs) and the forward's saving (µs) as stats.between_sessions gives them (mean of the sessions,
    the union of their 95 % intervals, `agree`), with the method and the sessions read. None when
    nothing is recorded yet."""
    folder = str(folder or DATA / "hidden_syncs")
    files = sorted(
        f
        for f in glob.glob(os.path.join(folder, "hidden_syncs_s*.csv"))
        if re.fullmatch(r"hidden_syncs_s\d+\.csv", os.path.basename(f))
    )  # not a smoke run
    if not files:
        return None
    # the session is the file's (hidden_syncs_<session>.csv): one file per device session
    d = pd.concat(
        [pd.read_csv(f).assign(session=os.path.basename(f)[13:-4]) for f in files], ignore_index=True
    )
    rows = []
    for name, g in d.groupby("pattern", sort=False):
        ok = g[g["status"] == "ok"]
        occ = between_sessions(*ok[["per_occ_us", "per_occ_lo_us", "per_occ_hi_us"]].itertuples(index=False))
        fwd = between_sessions(*ok[["diff_us", "diff_lo_us", "diff_hi_us"]].itertuples(index=False))
        rows.append(
            dict(
                pattern=name,
                kind=g["kind"].iloc[0],
                occurrences=g["occurrences"].median(),
                per_occ_us=occ["estimate"],
                per_occ_lo_us=occ["lo"],
                per_occ_hi_us=occ["hi"],
                diff_us=fwd["estimate"],
                diff_lo_us=fwd["lo"],
                diff_hi_us=fwd["hi"],
                original_ms=ok["original_ms"].mean() if len(ok) else float("nan"),
                agree=occ["agree"],
                sessions=", ".join(ok["session"].astype(str)),
                unstable=", ".join(g.loc[g["status"] != "ok", "session"].astype(str)),
                n=int(ok["n"].min()) if len(ok) else 0,
                method=g["method"].iloc[0],
                gpu=g["gpu"].iloc[0] if "gpu" in g else "",
            )
        )
    return pd.DataFrame(rows)
