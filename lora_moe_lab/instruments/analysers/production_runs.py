"""The production-setting sessions (studies/production/record.py: one folder per device session, with its
meta.json), read once for the README, notebook 06 and the tests: one loader, one combination rule.

    load_sessions(paths)     -> dict session -> Session(summary, rows, forwards, syncs, meta); paths: session
                                folders, or a folder holding them; none: the catalog's "production.sessions"
    headline(sessions)       -> one row per task: the fix's gain per session and the reader's
                                figure (stats.between_sessions: the wider interval when they disagree)
    signature_table(sessions)-> one row per task: the host side of the per-sync signature (unprofiled,
                                medians of the kept repetitions) and the GPU idle after the syncs
                                (profiled steady forwards), beside production's (PRODUCTION_SIGNATURE)

Quantities, never mixed: host_blocked_* are host time spent in `.item()` (production's ~100 ms per
forward is this kind); gpu_idle_* is GPU time with nothing to run (what a sync actually costs).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ...provenance import catalog, normalize_meta
from . import schemas, stats

TASK_TITLES = {"default_C16384": "lab, own regime, C=16384", "default_C8192": "lab, own regime, C=8192",
               "prodlike_C16384": "lab, production-like regime, C=16384"}


@dataclass
class Session:
    name: str
    summary: pd.DataFrame
    rows: pd.DataFrame
    forwards: pd.DataFrame  # profiled steady forwards, per task and guard (signature.per_forward)
    syncs: pd.DataFrame  # per sync of those forwards (signature.per_sync)
    meta: dict
    clocks: pd.DataFrame | None = None  # nvidia-smi samples every 100 ms (studies/production/record.py: ClockLog)


def _cat(files, kind: str) -> pd.DataFrame:
    """The files of one kind, each checked (schemas.read_csv: schema, seal in the session's meta.json), stacked."""
    files = list(files)
    return pd.concat([schemas.read_csv(f, kind) for f in files], ignore_index=True) if files else pd.DataFrame()


def session_name(folder: str | Path, prefix: str = "") -> str:
    """A session folder's label: <what>_<session>/ -> <session> (`prefix` given: the name without it)."""
    n = Path(folder).name
    return n.removeprefix(prefix) if prefix else n.split("_", 1)[-1]


def session_folders(paths=None, prefix: str = "") -> list[Path]:
    """The session folders (each with a meta.json) among `paths`, in order: a folder holding session folders
    (those whose names start with `prefix`), one session folder, or a list of them; none: the catalog's
    "production.sessions"."""
    if paths is None:
        cands = catalog("production.sessions")
    elif isinstance(paths, (str, Path)):
        p = Path(paths)
        cands = [p] if (p / "meta.json").is_file() else sorted(p.glob(prefix + "*"))
    else:
        cands = [Path(x) for x in paths]
    return [d for d in cands if d.is_dir() and (d / "meta.json").is_file()]


def load_session(d: str | Path, name: str | None = None) -> Session:
    """One session folder: its summaries, rows, profiled forwards and syncs, meta.json, clock log."""
    d = Path(d)
    name = session_name(d) if name is None else name
    meta = normalize_meta(schemas.read_json(d / "meta.json"))  # first: a broken meta.json is named as such
    return Session(name, _cat(d.glob("*.summary.csv"), "production_summary"),
                   _cat((f for f in d.glob("*.csv") if f.name.count(".") == 1 and f.name != "clocks.csv"),
                        "production_task"),
                   _cat(d.glob("*.signature.csv"), "production_signature"),
                   _cat(d.glob("*.syncs.csv"), "production_syncs"),
                   meta,
                   schemas.read_csv(d / "clocks.csv", "clocks") if (d / "clocks.csv").is_file() else None)


def load_sessions(paths=None, prefix: str = "") -> dict[str, Session]:
    """Every session folder among `paths` (session_folders), oldest first: label -> Session."""
    out = {}
    for d in session_folders(paths, prefix):
        name = session_name(d, prefix)
        out[name] = load_session(d, name)
    return out


def _sync_row(s: pd.DataFrame, task: str) -> pd.Series | None:
    x = s[(s["task"] == task) & (s["guard"] == "sync")]
    return x.iloc[0] if len(x) else None


def headline(sessions: dict[str, Session]) -> pd.DataFrame:
    """Per task and metric (throughput, net throughput, TTFT): each session's (estimate, lo, hi) and
    the reader's figure. With one session the reader's figure is that session's, flagged."""
    rows = []
    tasks = sorted({t for s in sessions.values() for t in s.summary.get("task", pd.Series(dtype=str)).unique()})
    for task in tasks:
        for metric in ("fix_throughput_gain_pct", "fix_throughput_gain_net_pct", "fix_ttft_change_pct"):
            per = {}
            for name, s in sessions.items():
                r = _sync_row(s.summary, task)
                if r is not None and np.isfinite(r[metric]):
                    per[name] = (float(r[metric]), float(r[metric + "_lo"]), float(r[metric + "_hi"]))
            if not per:
                continue
            row = dict(task=task, metric=metric, sessions=len(per))
            for name, v in per.items():
                row[f"{name}"], row[f"{name}_lo"], row[f"{name}_hi"] = v
            b = stats.between_sessions(*per.values())  # one session: its figure; several: the union
            row.update(estimate=b["estimate"], lo=b["lo"], hi=b["hi"],
                       spread=b["spread"] if len(per) > 1 else np.nan, agree=b["agree"] if len(per) > 1 else np.nan)
            rows.append(row)
    return pd.DataFrame(rows, columns=None if rows else ["task", "metric", "sessions", "estimate", "lo", "hi"])


SIG_HOST = ("syncs_per_forward", "host_blocked_ms", "first_blocked_ms", "first_share", "later_blocked_mean_us",
            "later_blocked_median_us")
SIG_GPU = ("idle_after_ms", "idle_after_first_us", "idle_after_later_median_us", "first_lead_ms",
           "later_lead_median_us", "nccl_ms")


def signature_table(sessions: dict[str, Session]) -> pd.DataFrame:
    """Per task and session: the `sync` guard's host-side signature (unprofiled, medians of the kept
    repetitions' per-prefill medians over steady forwards) and its GPU side (medians over the
    profiled steady forwards), plus the GPU idle per forward of both guards."""
    rows = []
    for name, s in sessions.items():
        for task, g in s.summary.groupby("task", sort=False):
            r = _sync_row(s.summary, task)
            if r is None:
                continue
            row = dict(task=task, session=name, **{k: float(r[k]) for k in SIG_HOST})
            f = s.forwards[(s.forwards["task"] == task) & (s.forwards["guard"] == "sync")] if len(s.forwards) else []
            for k in SIG_GPU:
                row[k] = float(f[k].median()) if len(f) else np.nan
            cf = g[g["guard"] == "cpu_flag"]
            row["gpu_idle_ms_sync"] = float(r["gpu_idle_ms"])
            row["gpu_idle_ms_cpu_flag"] = float(cf["gpu_idle_ms"].iloc[0]) if len(cf) else np.nan
            for k in ("forward_median_ms", "input_tok_per_s", "host_us_per_layer", "overlap_ms", "chunk", "requests",
                      "reps", "warmup_dropped"):
                row[k] = float(r[k]) if k in r else np.nan
            row["forward_median_ms_cpu_flag"] = float(cf["forward_median_ms"].iloc[0]) if len(cf) else np.nan
            rows.append(row)
    return pd.DataFrame(rows)


def clocks_by_guard(session: Session) -> pd.DataFrame:
    """The card's SM clock, power and temperature while each guard's timed prefills ran (samples
    inside [t_unix, t_unix + prefill_ms] of every row), per task and guard: median and the 10-90 %
    range, and the share of samples in which the software power cap held the clocks down.
    Empty when the session has no clock log or its rows have no t_unix."""
    c, r = session.clocks, session.rows
    if c is None or not len(c) or "t_unix" not in r or r["t_unix"].isna().all():
        return pd.DataFrame()
    c = c.drop(columns=[k for k in ("throttle",) if k in c]).apply(pd.to_numeric, errors="coerce")
    t = c["t_unix"].to_numpy()
    out = []
    for (task, guard), g in r.groupby(["task", "guard"], sort=False):
        sel = np.zeros(len(c), bool)
        for a, ms in zip(g["t_unix"], g["prefill_ms"]):
            sel |= (t >= a) & (t <= a + ms / 1e3)
        x = c[sel]
        row = dict(task=task, guard=guard, samples=int(sel.sum()))
        # clocks event reasons, bit 0x4: the software power cap held the clocks down (the board's limit)
        reason = (session.clocks.loc[sel, "throttle"].astype(str) if "throttle" in session.clocks
                  else pd.Series([], dtype=str))
        bits = reason.map(lambda v: int(v, 16) if v.startswith("0x") else 0)
        row["power_capped_share"] = float((bits & 0x4).astype(bool).mean()) if len(bits) else np.nan
        for k in ("sm_mhz", "power_w", "temp_c"):
            v = x[k].dropna()
            row[k] = float(v.median()) if len(v) else np.nan
            row[k + "_p10"], row[k + "_p90"] = ((float(v.quantile(0.1)), float(v.quantile(0.9))) if len(v)
                                                else (np.nan, np.nan))
        out.append(row)
    return pd.DataFrame(out)
