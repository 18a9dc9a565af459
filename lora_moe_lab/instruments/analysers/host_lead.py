"""The fix's gain as a function of the host's lead: the relation the recordings show, and its check.

Why the gain moves between machines. With the `sync` guard each guard decision waits for the GPU to
drain its queue; the host then issues the next kernels into an empty queue. How long the host waited
(`lead_us`: the median host time blocked in the later syncs of a forward) is how far it had run ahead
of the GPU. A host that runs far ahead refills the queue before the GPU starves; a host with a short
lead leaves the GPU idle after each sync, and removing the syncs (`cpu_flag`) buys more. So one GPU
model gives different gains on hosts of different speed, and a point measured on one machine is not
the reader's number: the relation is.

    pts = points(frames)                 # one row per (session, host work) point, from the recordings
    rel = fit(pts)                       # least squares gain_pct = a + b * lead_us
    rel.predict(850.0)                   # the gain this relation predicts for a lead of 850 us
    validate(pts)                        # per session: its lead-0 point predicted from the OTHER sessions

A point: `session`, `host_us_per_layer` (engine host work added per layer, 0 = the lab's lean host; more
work stands in for a slower host), `lead_us`, `measured_gain_pct` with its paired-bootstrap 95 % interval
(`_lo`, `_hi`). The check leaves each session out of the fit that predicts it (leave-one-session-out), so
no session predicts itself.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

POINT_COLUMNS = ["session", "host_us_per_layer", "lead_us", "measured_gain_pct", "measured_gain_pct_lo",
                 "measured_gain_pct_hi"]
GOAL_PP = 5.0  # the probe's goal: every session's prediction within +-5 percentage points of its measurement


class RelationError(ValueError):
    """Too few points, or points that cannot define a slope."""


@dataclass(frozen=True)
class Relation:
    intercept: float
    slope: float  # percentage points of gain per us of lead (negative: a longer lead, a smaller gain)
    n: int
    sessions: tuple[str, ...]

    def predict(self, lead_us: float) -> float:
        if not math.isfinite(lead_us) or lead_us < 0:
            raise ValueError(f"lead_us must be a finite time >= 0, got {lead_us!r}")
        return self.intercept + self.slope * lead_us

    def describe(self) -> str:
        return (f"gain = {self.intercept:.1f} % {self.slope * 100:+.2f} pp per 100 us of lead "
                f"({self.n} points, {len(self.sessions)} sessions)")


def points(frames) -> pd.DataFrame:
    """The points of one or more tables (each with POINT_COLUMNS), stacked; rows without a finite lead or
    gain (an unstable point) are left out, never guessed."""
    df = pd.concat([f[POINT_COLUMNS] for f in frames], ignore_index=True)
    ok = np.isfinite(df["lead_us"].astype(float)) & np.isfinite(df["measured_gain_pct"].astype(float))
    return df[ok].reset_index(drop=True)


def fit(pts: pd.DataFrame, exclude: str | None = None) -> Relation:
    """Least squares gain on lead over the points (without session `exclude`)."""
    p = pts if exclude is None else pts[pts["session"] != exclude]
    if len(p) < 2 or p["lead_us"].nunique() < 2:
        raise RelationError(f"a relation needs >= 2 points with different leads; have {len(p)}"
                            + (f" without session {exclude!r}" if exclude else ""))
    slope, intercept = np.polyfit(p["lead_us"].astype(float), p["measured_gain_pct"].astype(float), 1)
    return Relation(float(intercept), float(slope), len(p), tuple(sorted(p["session"].unique())))


def validate(pts: pd.DataFrame, hosts: dict | None = None) -> pd.DataFrame:
    """One row per session: its lean-host point (host_us_per_layer 0) predicted from the other sessions'
    points, beside what it measured. `within_goal`: |predicted - measured| <= GOAL_PP."""
    rows = []
    for s, g in pts[pts["host_us_per_layer"] == 0].groupby("session", sort=True):
        r = g.iloc[0]
        try:
            rel = fit(pts, exclude=s)
            pred = rel.predict(float(r["lead_us"]))
        except RelationError:
            rel, pred = None, math.nan
        rows.append(dict(session=s, host=(hosts or {}).get(s, "not recorded"), lead_us=float(r["lead_us"]),
                         predicted_gain_pct=pred, measured_gain_pct=float(r["measured_gain_pct"]),
                         measured_gain_pct_lo=float(r["measured_gain_pct_lo"]),
                         measured_gain_pct_hi=float(r["measured_gain_pct_hi"]),
                         error_pp=pred - float(r["measured_gain_pct"]),
                         within_goal=bool(abs(pred - float(r["measured_gain_pct"])) <= GOAL_PP),
                         fitted_on=", ".join(rel.sessions) if rel else ""))
    return pd.DataFrame(rows)


def host_label(meta: dict) -> str:
    """The host of a recording's metadata in one short string (provenance.host_state)."""
    h = (meta or {}).get("host") or {}
    if not h:
        return "not recorded"
    mhz = h.get("cpu_mhz_max") or h.get("cpu_mhz_median")
    return f"{h.get('cpu_model', '?')}, {h.get('cores_usable', h.get('cores', '?'))} cores" + \
        (f", {mhz / 1e3:.1f} GHz" if mhz else "")
