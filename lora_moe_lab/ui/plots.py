"""Trace plots: pure functions from trace tables / metric frames to plotly Figures.

    timeline(tables, forward=0)     host lanes (annotations, runtime calls, syncs) above GPU stream
                                    lanes, GPU idle gaps shaded by cause
    idle_breakdown(metrics)         GPU time per forward (or per guard / mode / M): busy + idle
                                    split by cause
    queue_depth_plot(tables)        kernels launched but not finished, over time

Spans are horizontal go.Bar traces with base= (one trace per lane kind and colour, not one per
event), so a 48-layer forward stays a handful of traces. Above `max_events` bars the small ones
are merged into time buckets ("37 ops") instead of being dropped.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ..instruments.analysers import trace as T

__all__ = ["timeline", "layers_window", "idle_breakdown", "queue_depth_plot", "GAP_COLORS"]

# sync_reissue: a host-launch-wait gap later in a layer after its sync (nb/lessons.py: attribute_sync_gaps)
GAP_COLORS = {"after_sync": "#d62728", "sync_reissue": "#ff9896", "host_launch_wait": "#ff7f0e",
              "kernel_to_kernel": "#7f7f7f", "other": "#bcbd22"}
_KIND_COLORS = {"kernel": "#1f77b4", "memcpy": "#9467bd", "memset": "#8c564b"}
_HOST_COLORS = {"launch": "#2ca02c", "sync": "#d62728", "other": "#98df8a"}


def _window(t: T.TraceTables, window, forward) -> tuple[int, int] | None:
    if window is not None:
        return int(window[0]), int(window[1])
    if forward is not None:
        return T.window_of_forwards(t, [forward])
    return None


def _clip(df: pd.DataFrame, w) -> pd.DataFrame:
    if w is None or not len(df):
        return df
    return df[(df["end_ns"] >= w[0]) & (df["start_ns"] <= w[1])]


def _aggregate(df: pd.DataFrame, max_bars: int) -> pd.DataFrame:
    """Merge rows into at most ~max_bars time buckets; each bucket spans its first start to its
    last end and is named 'N ops' (a single row keeps its own name)."""
    if len(df) <= max_bars or max_bars <= 0:
        return df.assign(n=1)
    df = df.sort_values("start_ns")
    edges = np.linspace(int(df["start_ns"].min()), int(df["end_ns"].max()) + 1, max_bars + 1)
    b = np.searchsorted(edges, df["start_ns"].to_numpy(np.int64), side="right") - 1
    g = df.assign(_b=b).groupby("_b", sort=True)
    out = g.agg(start_ns=("start_ns", "min"), end_ns=("end_ns", "max"), n=("name", "size"),
                busy_ns=("dur_ns", "sum"), name=("name", "first")).reset_index(drop=True)
    out["dur_ns"] = out["end_ns"] - out["start_ns"]
    out["name"] = np.where(out["n"] > 1, out["n"].astype(str) + " ops (merged)", out["name"])
    return out


def _bars(fig, df, lane, t0, color, legend, showlegend=True, extra_hover=""):
    if not len(df):
        return
    start_us = (df["start_ns"].to_numpy(np.int64) - t0) / 1e3
    dur_us = np.maximum(df["dur_ns"].to_numpy(np.int64), 1) / 1e3
    n = df["n"].to_numpy() if "n" in df else np.ones(len(df), int)
    fig.add_trace(go.Bar(
        y=[lane] * len(df), x=dur_us, base=start_us, orientation="h", name=legend,
        legendgroup=legend, showlegend=showlegend, marker=dict(color=color, line_width=0),
        customdata=np.stack([df["name"].astype(str).to_numpy(), df["dur_ns"].to_numpy(np.int64),
                             start_us, n], axis=-1),
        hovertemplate=("%{customdata[0]}<br>start %{customdata[2]:.3f} us"
                       "<br>dur %{customdata[1]} ns" + extra_hover + "<extra>" + legend + "</extra>"),
    ))


def layers_window(t: T.TraceTables, forward: int, layers: int, pattern: str = r"moe_layer_\d+$") -> tuple[int, int]:
    """(lo, hi) ns: from the forward's start to the end of its `layers`-th layer (host range) and
    the GPU ops launched inside those layers; the whole forward when it has no more layers."""
    lo, hi = T.window_of_forwards(t, [forward])
    a = t.annotations
    a = a[a["name"].str.match(pattern) & (a["start_ns"] >= lo) & (a["end_ns"] <= hi)].sort_values("start_ns")
    if len(a) <= layers:
        return lo, hi
    end = int(a["end_ns"].iloc[layers - 1])
    k = t.kernels[(t.kernels["forward"] == forward) & (_launch_ns(t.kernels) <= end)]
    return lo, max(end, int(k["end_ns"].max()) if len(k) else end)


def _launch_ns(k: pd.DataFrame) -> np.ndarray:
    ls = pd.to_numeric(k["launch_start_ns"], errors="coerce") if "launch_start_ns" in k else k["start_ns"]
    return np.where(pd.isna(ls), k["start_ns"], ls).astype(np.int64)


def timeline(tables, window: tuple[int, int] | None = None, forward: int | None = None,
             max_events: int = 6000, gaps: pd.DataFrame | None = None, title: str | None = None,
             show_annotations: bool = True, layers: int | None = None) -> go.Figure:
    """Host and GPU lanes of a trace on one time axis (microseconds from the window start).

    window: (lo, hi) in trace ns; or forward: one forward's window (with `layers`: only its first
    `layers` layers, `layers_window`: a 48-layer forward drawn whole is megabytes of bars). With
    neither, the whole trace is drawn if it has at most `max_events` spans, else only the first
    forward. Spans above `max_events` (after windowing) are merged into time buckets per lane."""
    t = T.load_trace(tables) if not isinstance(tables, T.TraceTables) else tables
    n_all = len(t.kernels) + len(t.runtime)
    if window is None and forward is None and n_all > max_events and len(t.forwards):
        forward = int(t.forwards["forward"].iloc[0])
    if window is None and forward is not None and layers is not None:
        window = layers_window(t, forward, layers)
    w = _window(t, window, forward)
    k = _clip(t.kernels, w)
    rt = _clip(t.runtime, w)
    sy = _clip(t.syncs, w)
    an = _clip(t.annotations, w) if show_annotations else t.annotations.iloc[:0]
    if gaps is None:
        gaps = T.idle_gaps(t)
    gp = _clip(gaps, w)
    t0 = w[0] if w is not None else int(min([d["start_ns"].min() for d in (k, rt, an) if len(d)],
                                             default=0))
    lanes_gpu = [f"GPU {d} stream {s}" for d, s in
                 k[["device", "stream"]].drop_duplicates().sort_values(["device", "stream"]).values]
    # bar groups: 2 annotation + 3 host + 3 kinds per GPU lane + 4 gap causes (+ sync markers)
    total = len(k) + len(rt) + len(sy) + len(an) + len(gp)
    budget = total if total <= max_events else max(max_events // (10 + 3 * len(lanes_gpu)), 10)

    fig = go.Figure()
    # host: annotations (forward > layers > guards, one lane per nesting depth is overkill:
    # forward ranges get their own lane, the rest share one)
    if len(an):
        fw = an[an["name"].isin(set(t.forwards["name"]))]
        rest = an.drop(fw.index)
        _bars(fig, _aggregate(fw, budget), "host: forward", t0, "#c7c7c7", "forward")
        _bars(fig, _aggregate(rest[~rest["name"].str.startswith("ProfilerStep#")], budget),
              "host: ranges", t0, "#aec7e8", "record_function")
    if len(rt):
        launched = set(k["correlation"].dropna()) if len(k) else set()
        is_launch = rt["correlation"].isin(launched) & ~rt["is_sync"]
        _bars(fig, _aggregate(rt[is_launch], budget), "host: runtime", t0, _HOST_COLORS["launch"],
              "launch call")
        _bars(fig, _aggregate(rt[~is_launch & ~rt["is_sync"]], budget), "host: runtime", t0,
              _HOST_COLORS["other"], "other runtime call")
    if len(sy):
        sy = _aggregate(sy, budget)
        _bars(fig, sy, "host: runtime", t0, _HOST_COLORS["sync"], "host sync (blocked)")
        fig.add_trace(go.Scatter(
            x=(sy["end_ns"].to_numpy(np.int64) - t0) / 1e3, y=["host: runtime"] * len(sy),
            mode="markers", marker=dict(symbol="x", size=9, color=_HOST_COLORS["sync"]),
            name="sync returns", customdata=np.stack([sy["name"].astype(str), sy["dur_ns"]], -1),
            hovertemplate="%{customdata[0]} returns<br>blocked %{customdata[1]} ns<extra></extra>"))
    for lane, (d, s) in zip(lanes_gpu, k[["device", "stream"]].drop_duplicates()
                            .sort_values(["device", "stream"]).values):
        kk = k[(k["device"] == d) & (k["stream"] == s)]
        for kind, color in _KIND_COLORS.items():
            sub = kk[kk["kind"] == kind]
            _bars(fig, _aggregate(sub, budget), lane, t0, color, f"GPU {kind}",
                  showlegend=not any(tr.name == f"GPU {kind}" for tr in fig.data))
    if len(gp):
        for cat, color in GAP_COLORS.items():
            sub = gp[gp["category"] == cat]
            if len(sub):
                sub = sub.assign(name=cat + " idle")
                _bars(fig, _aggregate(sub, budget), "GPU idle", t0, color, f"idle: {cat}")
    order = ["host: forward", "host: ranges", "host: runtime"] + lanes_gpu + ["GPU idle"]
    present = [l for l in order if any(tr.y is not None and len(tr.y) and tr.y[0] == l
                                       for tr in fig.data)]
    fig.update_layout(
        barmode="overlay", bargap=0.25, height=180 + 45 * len(present),
        title=title or ("timeline" + (f": forward {forward}" if forward is not None else "")),
        xaxis_title="time (us from window start)", hovermode="closest",
        yaxis=dict(title="lane (host thread / GPU stream)", categoryorder="array", categoryarray=present[::-1]),
        legend=dict(orientation="h", y=-0.25), margin=dict(l=130, r=20, t=50, b=40))
    return fig


def _group_cols(df: pd.DataFrame, by) -> list[str]:
    if by is not None:
        return [by] if isinstance(by, str) else list(by)
    cols = [c for c in ("guard", "mode", "M", "num_tokens") if c in df.columns]
    return cols or ["forward"]


def idle_breakdown(metrics: pd.DataFrame, by=None, include_busy: bool = True,
                   title: str | None = None, causes=None) -> go.Figure:
    """Stacked bars of GPU time: busy plus idle by cause (means over the rows of each group).

    metrics: forward_metrics() output (grouped by forward), or a frame with a `guard` column
    (and `mode`, `M` when present: one bar per combination), e.g. the GPU script's summary CSV.
    causes: the idle columns `idle_<cause>_ns` to stack (default: trace.GAP_CATEGORIES)."""
    df = metrics.copy()
    cols = _group_cols(df, by)
    causes = T.GAP_CATEGORIES if causes is None else tuple(causes)
    parts = (["busy_ns"] if include_busy else []) + [f"idle_{c}_ns" for c in causes]
    parts = [p for p in parts if p in df.columns]
    g = df.groupby(cols, sort=False, dropna=False)[parts].mean().reset_index()
    labels = g[cols].astype(str).agg(" / ".join, axis=1)
    fig = go.Figure()
    for p in parts:
        cat = p[len("idle_"):-len("_ns")] if p.startswith("idle_") else "busy"
        color = GAP_COLORS.get(cat, "#1f77b4")
        fig.add_trace(go.Bar(x=labels, y=g[p] / 1e3, name=cat if cat == "busy" else f"idle: {cat}",
                             marker_color=color,
                             hovertemplate="%{x}<br>%{y:.1f} us<extra>" + cat + "</extra>"))
    fig.update_layout(barmode="stack", yaxis_title="GPU time per forward (us)",
                      xaxis_title=" / ".join(cols), title=title or "GPU busy and idle time by cause",
                      legend=dict(orientation="h", y=-0.2))
    return fig


def queue_depth_plot(tables, forward: int | None = None, max_points: int = 5000) -> go.Figure:
    """The launch queue over time (step line); it drops to 0 at every host sync."""
    t = T.load_trace(tables) if not isinstance(tables, T.TraceTables) else tables
    q = T.queue_depth(t)
    if forward is not None:
        q = q[q["forward"] == forward]
    if len(q) > max_points:
        q = q.iloc[:: int(np.ceil(len(q) / max_points))]
    t0 = int(q["time_ns"].min()) if len(q) else 0
    fig = go.Figure(go.Scatter(x=(q["time_ns"].to_numpy(np.int64) - t0) / 1e3, y=q["depth"],
                               line_shape="hv", mode="lines", name="queue depth"))
    fig.update_layout(xaxis_title="time (us)", yaxis_title="ops launched, not finished",
                      title="launch-queue depth")
    return fig
