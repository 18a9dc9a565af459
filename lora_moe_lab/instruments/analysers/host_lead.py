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

Across GPU models the lead alone does not carry: the gain is the time the syncs add over the forward they
sit in, so a GPU that runs the same forward longer gains less from the same bubbles. The second relation prices
that directly: each sync of a lean host costs a bubble `b` (the host's restart after the queue drained: sync
return, re-issue, the first kernel reaching the GPU), which is a property of the host and the launch path, not of
the GPU; the gain of removing n syncs from a `sync` forward of T ms is n*b / (T - n*b). The probe measures T (its
lead step times the `sync` forwards) before it predicts, and `b` is fitted on the other sessions' lean points:

    sav = fit_saving(pts)                # b: the median per-sync saving of the lean points
    sav.predict(sync_forward_ms=374.0, syncs_per_forward=260)
    validate(pts, by="gpu")              # per GPU model: predicted from a fit without any point of that model

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
GOAL_PP = 3.0  # the probe's goal: every session's prediction within +-3 percentage points of its measurement
MIN_LEAD_SPAN_US = 100.0  # a slope from leads closer than this is noise (two runs of one machine differ by ~30 us)
FORWARD_COLUMNS = ["sync_forward_ms", "syncs_per_forward", "gpu"]  # the saving relation's inputs, where recorded


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
    cols = POINT_COLUMNS + FORWARD_COLUMNS
    df = pd.concat([f.reindex(columns=cols) for f in frames], ignore_index=True)
    df["gpu"] = df["gpu"].astype(object).fillna("not recorded").astype(str)  # an all-NaN column is float
    ok = np.isfinite(df["lead_us"].astype(float)) & np.isfinite(df["measured_gain_pct"].astype(float))
    return df[ok].reset_index(drop=True)


def fit(pts: pd.DataFrame, exclude: str | None = None) -> Relation:
    """Least squares gain on lead over the points (without session `exclude`)."""
    p = pts if exclude is None else pts[pts["session"] != exclude]
    if len(p) < 2 or p["lead_us"].max() - p["lead_us"].min() < MIN_LEAD_SPAN_US:
        raise RelationError(f"a relation needs >= 2 points whose leads span >= {MIN_LEAD_SPAN_US:g} us; have "
                            f"{len(p)}"
                            + (f" without session {exclude!r}" if exclude else ""))
    slope, intercept = np.polyfit(p["lead_us"].astype(float), p["measured_gain_pct"].astype(float), 1)
    return Relation(float(intercept), float(slope), len(p), tuple(sorted(p["session"].unique())))


@dataclass(frozen=True)
class SavingRelation:
    saving_us: float  # b: the time one sync adds to a lean host's forward
    n: int
    sessions: tuple[str, ...]

    def predict(self, sync_forward_ms: float, syncs_per_forward: float) -> float:
        for name, v in (("sync_forward_ms", sync_forward_ms), ("syncs_per_forward", syncs_per_forward)):
            if not math.isfinite(v) or v <= 0:
                raise ValueError(f"{name} must be a finite number > 0, got {v!r}")
        added_ms = syncs_per_forward * self.saving_us / 1e3
        if added_ms >= sync_forward_ms:
            raise ValueError(f"{syncs_per_forward:g} syncs of {self.saving_us:.0f} us exceed the whole forward "
                             f"({sync_forward_ms:.1f} ms): not a lean host's forward")
        return 100.0 * added_ms / (sync_forward_ms - added_ms)

    def describe(self) -> str:
        return (f"gain = n x {self.saving_us:.0f} us / (T - n x {self.saving_us:.0f} us) for n syncs in a sync "
                f"forward of T ({self.n} lean points)")


def saving_us(pts: pd.DataFrame) -> pd.Series:
    """Each point's implied per-sync saving (us): T * g / (1 + g) / n."""
    g = pts["measured_gain_pct"].astype(float) / 100.0
    return pts["sync_forward_ms"].astype(float) * 1e3 * g / (1.0 + g) / pts["syncs_per_forward"].astype(float)


def fit_saving(pts: pd.DataFrame, exclude: str | None = None, by: str = "session") -> SavingRelation:
    """b as the median implied saving of the lean points that recorded their forward (without `exclude`)."""
    p = pts[(pts["host_us_per_layer"] == 0) & np.isfinite(pts["sync_forward_ms"].astype(float))]
    p = p if exclude is None else p[p[by] != exclude]
    if len(p) < 1:
        raise RelationError("the saving relation needs >= 1 lean point with its forward time"
                            + (f" without {by} {exclude!r}" if exclude else ""))
    return SavingRelation(float(np.median(saving_us(p))), len(p), tuple(sorted(p["session"].unique())))


def validate(pts: pd.DataFrame, hosts: dict | None = None, by: str = "session") -> pd.DataFrame:
    """One row per session and relation: its lean-host point (host_us_per_layer 0) predicted from the points of
    the OTHER sessions (`by="session"`) or of the other GPU models (`by="gpu"`: no point of its own model), beside
    what it measured. `within_goal`: |predicted - measured| <= GOAL_PP."""
    if by not in ("session", "gpu"):
        raise ValueError(f"by must be 'session' or 'gpu', got {by!r}")
    pts = points([pts])  # the forward columns and `gpu` where a table lacks them
    rows = []
    for s, g in pts[pts["host_us_per_layer"] == 0].groupby("session", sort=True):
        r = g.iloc[0]
        for kind in ("lead", "saving"):
            try:
                if kind == "lead":
                    rel = fit(pts if by == "session" else pts[pts["gpu"] != r["gpu"]], exclude=s)
                    pred = rel.predict(float(r["lead_us"]))
                else:
                    rel = fit_saving(pts, exclude=r[by], by=by)
                    pred = rel.predict(float(r["sync_forward_ms"]), float(r["syncs_per_forward"]))
            except (RelationError, ValueError):
                rel, pred = None, math.nan
            err = pred - float(r["measured_gain_pct"])
            rows.append(dict(session=s, gpu=r["gpu"], host=(hosts or {}).get(s, "not recorded"),
                             relation=kind, left_out=by, lead_us=float(r["lead_us"]), predicted_gain_pct=pred,
                             measured_gain_pct=float(r["measured_gain_pct"]),
                             measured_gain_pct_lo=float(r["measured_gain_pct_lo"]),
                             measured_gain_pct_hi=float(r["measured_gain_pct_hi"]), error_pp=err,
                             within_goal=bool(abs(err) <= GOAL_PP), fitted_on=", ".join(rel.sessions) if rel else ""))
    return pd.DataFrame(rows)


def host_label(meta: dict) -> str:
    """The host of a recording's metadata in one short string (provenance.host_state)."""
    h = (meta or {}).get("host") or {}
    if not h:
        return "not recorded"
    mhz = h.get("cpu_mhz_max") or h.get("cpu_mhz_median")
    return f"{h.get('cpu_model', '?')}, {h.get('cores_usable', h.get('cores', '?'))} cores" + \
        (f", {mhz / 1e3:.1f} GHz" if mhz else "")
