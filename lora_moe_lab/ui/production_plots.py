"""Figures of the production-shaped prefill (notebook 06): pure functions returning go.Figure.

    config_label(df)                 "TP=2 · C=16384 · none" per row
    guard_bars(summary, "input_tok_per_s", lo/hi columns, reference=production's figure)
    rank_timeline({rank: TraceTables}, align="allreduce")   one forward, every rank, on one axis

Why every rank on one axis: under tensor parallelism each layer ends in an all-reduce, a
rank-rank sync on the GPU. A host sync (`.item()`) on one rank drains that rank's queue; its GPU
idles until the host issues again, and the other ranks' all-reduce kernels sit waiting for it.
Aligned on the all-reduce, the lanes show each rank's bubble and where it meets the collective.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ..instruments.analysers import trace as T
from ..model.guards import guard_color
from .plots import GAP_COLORS, _aggregate, _bars

ALLREDUCE_COLOR = "#9467bd"
KERNEL_COLOR = "#1f77b4"
SYNC_COLOR = "#d62728"


def config_label(df: pd.DataFrame) -> pd.Series:
    parts = [("TP=", "tp"), ("C=", "chunk"), ("sites/layer ", "guard_sites"), ("", "adapters")]
    out = pd.Series([""] * len(df), index=df.index)
    for pre, c in parts:
        if c in df:
            v = df[c].map(lambda x: f"{x:.3g}" if isinstance(x, float) else str(x))
            out = out + np.where(out == "", "", " · ") + pre + v
    return out


def guard_bars(summary: pd.DataFrame, y: str, *, lo: str | None = None, hi: str | None = None,
               guards=None, reference: float | None = None, reference_name: str = "production",
               title: str = "", yaxis_title: str = "", extrapolated: pd.DataFrame | None = None,
               extrapolated_y: str | None = None) -> go.Figure:
    """Bars of `y` per configuration (x) and guard (colour), with [lo, hi] error bars; a dashed
    line at `reference`; optional hatched bars of an extrapolation (column `extrapolated_y`,
    x = its `config`), labelled as extrapolated."""
    d = summary.assign(config=config_label(summary))
    guards = list(dict.fromkeys(d["guard"])) if guards is None else list(guards)
    fig = go.Figure()
    for g in guards:
        s = d[d["guard"] == g]
        if not len(s):
            continue
        err = None
        if lo and hi:
            err = dict(type="data", symmetric=False, array=(s[hi] - s[y]).to_numpy(),
                       arrayminus=(s[y] - s[lo]).to_numpy())
        fig.add_trace(go.Bar(x=s["config"], y=s[y], name=g, marker_color=guard_color(g), error_y=err,
                             hovertemplate="%{x}<br>" + g + ": %{y:.4g}<extra></extra>"))
    if extrapolated is not None and len(extrapolated):
        e = extrapolated
        fig.add_trace(go.Bar(x=e["config"], y=e[extrapolated_y or y], name="sync, EXTRAPOLATED",
                             marker=dict(color=guard_color("sync"), pattern_shape="/", opacity=0.55),
                             hovertemplate="%{x}<br>extrapolated: %{y:.4g}<extra></extra>"))
    if reference is not None:
        fig.add_hline(y=reference, line_dash="dash", line_color="black",
                      annotation_text=f"{reference_name}: {reference:g}", annotation_position="top left")
    fig.update_layout(barmode="group", title=title,
                      xaxis_title="configuration (TP size · chunk · guard sites per layer · adapters)",
                      yaxis_title=yaxis_title, legend_title="guard", margin=dict(t=60, b=60))
    return fig


def _first_forward(t: T.TraceTables) -> int:
    return int(t.forwards["forward"].iloc[0]) if len(t.forwards) else 0


def _allreduce(k: pd.DataFrame) -> pd.Series:
    return k["name"].str.contains("nccl|allreduce|all_reduce", case=False, regex=True)


def rank_timeline(traces: dict, *, align: str = "allreduce", title: str = "one forward, every rank",
                  window_us: tuple[float, float] | None = None, max_events: int = 4000) -> go.Figure:
    """One forward of every rank's trace on one time axis (us). align="allreduce": each rank is
    shifted so that its first all-reduce kernel ends where rank 0's does (a collective ends on
    all ranks together); "clock": the traces' own timestamps (one host, one clock). window_us:
    only (from, to) us after the first kernel (a few layers show each bubble; the whole forward
    is merged into time buckets above `max_events` spans)."""
    if align not in ("allreduce", "clock"):
        raise ValueError(f"align must be 'allreduce' or 'clock', got {align!r}")
    if not traces:
        raise ValueError("no traces given")
    parts, anchors = {}, {}
    for r, t in sorted(traces.items()):
        t = T.load_trace(t) if not isinstance(t, T.TraceTables) else t
        f = _first_forward(t)
        k = t.kernels[t.kernels["forward"] == f]
        gaps = T.idle_gaps(t)
        gaps = gaps[gaps["forward"] == f]
        lo, hi = (int(k["start_ns"].min()), int(k["end_ns"].max())) if len(k) else (0, 0)
        sy = t.syncs[(t.syncs["end_ns"] >= lo) & (t.syncs["start_ns"] <= hi)]
        ar = k[_allreduce(k)] if len(k) else k
        anchors[r] = int(ar["end_ns"].iloc[0]) if (align == "allreduce" and len(ar)) else lo
        parts[r] = (k, gaps, sy)
    r0 = min(parts)
    t0 = min(int(parts[r][0]["start_ns"].min()) - anchors[r] + anchors[r0] for r in parts if len(parts[r][0]))
    fig = go.Figure()
    budget = max(max_events // (6 * len(parts)), 20)
    lanes = []
    shown = set()

    def bars(df, lane, color, legend):
        _bars(fig, _aggregate(df, budget), lane, t0, color, legend, showlegend=legend not in shown)
        shown.add(legend)

    def place(df, shift):
        df = df.assign(start_ns=df["start_ns"] + shift, end_ns=df["end_ns"] + shift)
        if window_us is None:
            return df
        lo, hi = t0 + 1e3 * window_us[0], t0 + 1e3 * window_us[1]
        return df[(df["end_ns"] >= lo) & (df["start_ns"] <= hi)]

    for r, (k, gaps, sy) in parts.items():
        shift = anchors[r0] - anchors[r]
        k, gaps, sy = place(k, shift), place(gaps, shift), place(sy, shift)
        lane_h, lane_g, lane_i = f"rank {r} · host sync", f"rank {r} · GPU", f"rank {r} · GPU idle"
        lanes += [lane_h, lane_g, lane_i]
        if len(sy):
            bars(sy, lane_h, SYNC_COLOR, "host blocked in a sync")
        if len(k):
            is_ar = _allreduce(k)
            bars(k[~is_ar], lane_g, KERNEL_COLOR, "kernel")
            bars(k[is_ar], lane_g, ALLREDUCE_COLOR, "all-reduce (NCCL)")
        for cat, color in GAP_COLORS.items():
            sub = gaps[gaps["category"] == cat]
            if len(sub):
                bars(sub.assign(name=cat + " idle"), lane_i, color, f"idle: {cat}")
    if window_us is not None:
        fig.update_xaxes(range=list(window_us))
    fig.update_layout(barmode="overlay", bargap=0.3, height=160 + 50 * len(lanes), title=title,
                      xaxis_title=f"time (us from rank {r0}'s first kernel; aligned by {align})",
                      yaxis_title="rank · lane", yaxis=dict(categoryorder="array", categoryarray=lanes[::-1]),
                      legend=dict(orientation="h", y=-0.2), margin=dict(l=150, r=20, t=50, b=40))
    return fig


def signature_along_forward(syncs: pd.DataFrame, *, production: dict | None = None,
                            title: str = "Each sync of one forward: host blocked and GPU idle after it") -> go.Figure:
    """Two panels over the syncs of one steady forward, in order (instruments.analysers.signature.per_sync
    rows; one trace per `label` column value): top, the host time blocked in the sync (log scale);
    bottom, the GPU idle that follows it. Production published only totals for its forward: its
    first sync (~70 ms) and the mean of the other 259 (~116 us) are drawn as markers on the top
    panel, never on the bottom one (they are host time)."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("host time blocked in the sync (µs, log)", "GPU idle after the sync (µs)"))
    palette = ["#d62728", "#ff7f0e", "#2ca02c", "#9467bd"]
    for i, (lab, g) in enumerate(syncs.groupby("label", sort=False)):
        c = palette[i % len(palette)]
        fig.add_trace(go.Scatter(x=g["sync_index"], y=g["host_blocked_us"].clip(lower=0.1), mode="markers",
                                 marker=dict(size=4, color=c), name=f"{lab}: host blocked"), row=1, col=1)
        fig.add_trace(go.Scatter(x=g["sync_index"], y=g["idle_after_us"], mode="markers",
                                 marker=dict(size=4, color=c, symbol="diamond"), name=f"{lab}: GPU idle after"),
                      row=2, col=1)
    if production:
        n = int(production["syncs_per_forward"])
        fig.add_trace(go.Scatter(x=[0], y=[1e3 * production["first_sync_ms"]], mode="markers",
                                 marker=dict(size=12, color="black", symbol="star"),
                                 name="production: first sync (host blocked)"), row=1, col=1)
        fig.add_trace(go.Scatter(x=[1, n - 1], y=[production["later_blocked_mean_us"]] * 2, mode="lines",
                                 line=dict(color="black", dash="dash"),
                                 name="production: mean of the other syncs (host blocked)"), row=1, col=1)
    fig.update_yaxes(type="log", title_text="µs", row=1, col=1)
    fig.update_yaxes(title_text="µs", row=2, col=1)
    fig.update_xaxes(title_text="sync, in order within the forward", row=2, col=1)
    fig.update_xaxes(title_text="sync, in order within the forward", row=1, col=1)
    fig.update_layout(title=title, height=560, legend=dict(orientation="h", y=-0.18))
    return fig
