"""The hidden-sync sessions (studies/hidden_syncs/record.py: <name>_<session>.csv, one file per device
session), read: one row per pattern of recorders/hidden_syncs.py over the sessions (notebook 07, the audit
plots). The files are the ones handed, else the catalog's "hidden_syncs"."""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from ...provenance import catalog
from . import schemas
from .stats import between_sessions

__all__ = ["recorded", "session_files"]

# <name>_<session>.csv with a session label s<N>: a smoke run (<name>_s1_smoke.csv) is never read as a recording
SESSION_FILE = re.compile(r".+_(s\d+)\.csv")


def session_files(path=None) -> list[Path]:
    """The session files among `path`: a folder's, one file, or a list of them; none: the catalog's
    "hidden_syncs" (none catalogued: [])."""
    if path is None:
        try:
            files = catalog("hidden_syncs")
        except FileNotFoundError:
            return []
    elif isinstance(path, (str, Path)):
        p = Path(path)
        files = sorted(p.glob("*.csv")) if p.is_dir() else [p]
    else:
        files = [Path(f) for f in path]
    return sorted(f for f in files if SESSION_FILE.fullmatch(f.name))


def recorded(path=None):
    """One row per pattern over the recorded sessions (session_files(path)): the cost per occurrence
    (µs) and the forward's saving (µs) as stats.between_sessions gives them (mean of the sessions,
    the union of their 95 % intervals, `agree`), with the method and the sessions read. None when
    nothing is recorded yet."""
    files = session_files(path)
    if not files:
        return None
    # the session is the file's (<name>_<session>.csv): one file per device session
    d = pd.concat(
        [schemas.read_csv(f, "hidden_syncs").assign(session=SESSION_FILE.fullmatch(f.name)[1]) for f in files],
        ignore_index=True
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
