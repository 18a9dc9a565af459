"""Plot builders for benchmark sweeps and the simulator: pure functions returning go.Figure.

    sweep_figure(sweep_df)                      forward time vs M per guard (a panel per preset)
    sync_cost_figure(sweep_df)                  us lost per sync vs M
    predicted_vs_measured(simulate.predict(...))   model vs GPU, with the +-15 % band
    extrapolation_figure(extrap, compare)       production-shape forward per guard, beside production
    what_if_figure(simulate.what_if(...))       forward time while one knob moves
    sim_timeline(result)                        a simulated forward in plots.timeline's lanes
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..model.guards import guard_color


MODE_DASH = {"eager": "solid", "graph": "dot"}
MODE_SYMBOL = {"eager": "circle", "graph": "diamond"}


def _color(guard: str) -> str:
    return guard_color(guard)


def _log_axis(values) -> bool:
    v = [float(x) for x in values if pd.notna(x) and float(x) > 0]
    return bool(v) and max(v) / min(v) > 20


def sweep_figure(sweep: pd.DataFrame, *, title: str = "Forward time by guard") -> go.Figure:
    """Median forward time (ms, p10-p90 as error bars) vs tokens, a line per guard x mode x active,
    one panel per preset."""
    from ..instruments.recorders.bench import clean

    d = clean(sweep)
    presets = sorted(d["preset"].unique()) or [""]
    fig = make_subplots(rows=1, cols=len(presets), subplot_titles=presets, shared_yaxes=False)
    seen = set()
    for c, preset in enumerate(presets, start=1):
        dp = d[d["preset"] == preset]
        for (guard, mode, active), g in dp.groupby(["guard", "mode", "active"], sort=True):
            g = g.sort_values("tokens")
            name = f"{guard} {mode} active={active:g}"
            fig.add_trace(go.Scatter(
                x=g["tokens"], y=g["median_us"] / 1e3, mode="lines+markers", name=name, legendgroup=name,
                showlegend=name not in seen,
                line=dict(color=_color(guard), dash=MODE_DASH.get(mode, "solid"), width=2 if active else 1.2),
                marker=dict(symbol=MODE_SYMBOL.get(mode, "circle")),
                error_y=dict(type="data", symmetric=False, array=(g["p90_us"] - g["median_us"]) / 1e3,
                             arrayminus=(g["median_us"] - g["p10_us"]) / 1e3, thickness=1),
                customdata=g[["syncs_per_forward"]].to_numpy(),
                hovertemplate="M=%{x}<br>%{y:.3f} ms<br>syncs/forward=%{customdata[0]}<extra>" + name + "</extra>"),
                row=1, col=c)
            seen.add(name)
        fig.update_xaxes(title_text="tokens per forward (M)", type="log", row=1, col=c)
        fig.update_yaxes(title_text="median forward (ms)" if c == 1 else None, type="log", row=1, col=c)
    fig.update_layout(title=title, template="plotly_white", legend=dict(font=dict(size=10)))
    return fig


def sync_cost_figure(sweep: pd.DataFrame, *, title: str = "Time lost per guard sync") -> go.Figure:
    """(t_sync - t_cpu_flag) / syncs vs tokens, per preset and active fraction (eager rows)."""
    from ..instruments.recorders.bench import time_lost_per_sync

    t = time_lost_per_sync(sweep)
    t = t[t["mode"] == "eager"] if "mode" in t else t
    fig = go.Figure()
    for (preset, active), g in t.groupby(["preset", "active"], sort=True):
        g = g.sort_values("tokens")
        fig.add_trace(go.Scatter(x=g["tokens"], y=g["us_per_sync"], mode="lines+markers",
                                 name=f"{preset} active={active:g}", customdata=g[["ratio"]].to_numpy(),
                                 hovertemplate="M=%{x}<br>%{y:.1f} us per sync<br>sync/cpu_flag %{customdata[0]:.3f}"))
    fig.add_hline(y=0, line=dict(color="#999", width=1))
    fig.update_layout(title=title, template="plotly_white", xaxis=dict(title="tokens per forward (M)", type="log"),
                      yaxis=dict(title="us lost per sync"))
    return fig


def predicted_vs_measured(pred: pd.DataFrame, *, target_pct: float = 15.0,
                          title: str = "Simulator vs measurement") -> go.Figure:
    """Measured median (x) vs predicted forward time (y), log-log, the y = x line and a +-target band.
    `pred` is simulate.predict(sweep, params)."""
    fig = go.Figure()
    lo = float(min(pred["median_us"].min(), pred["predicted_us"].min())) / 1e3
    hi = float(max(pred["median_us"].max(), pred["predicted_us"].max())) / 1e3
    lo, hi = lo / 1.3, hi * 1.3
    xs = [lo, hi]
    f = target_pct / 100.0
    fig.add_trace(go.Scatter(x=xs + xs[::-1], y=[x * (1 + f) for x in xs] + [x * (1 - f) for x in xs[::-1]],
                             fill="toself", fillcolor="rgba(150,150,150,0.15)", line=dict(width=0),
                             name=f"+-{target_pct:g} %", hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=xs, y=xs, mode="lines", line=dict(color="#666", dash="dash"), name="y = x",
                             hoverinfo="skip"))
    mode_col = "mode" if "mode" in pred else None
    for keys, g in pred.groupby(["guard"] + ([mode_col] if mode_col else []), sort=True):
        keys = keys if isinstance(keys, tuple) else (keys,)
        guard, mode = keys[0], (keys[1] if mode_col else "eager")
        cd = g[["preset", "tokens", "active", "error_pct"]].to_numpy()
        err = None  # the measurement's 95 % interval, where the recording has one
        if {"lo95_us", "hi95_us"} <= set(g.columns) and g["hi95_us"].notna().any():
            err = dict(type="data", symmetric=False, array=((g["hi95_us"] - g["median_us"]) / 1e3).fillna(0),
                       arrayminus=((g["median_us"] - g["lo95_us"]) / 1e3).fillna(0), thickness=1)
        fig.add_trace(go.Scatter(
            x=g["median_us"] / 1e3, y=g["predicted_us"] / 1e3, mode="markers", name=f"{guard} {mode}", error_x=err,
            marker=dict(color=_color(guard), symbol=MODE_SYMBOL.get(mode, "circle"), size=8), customdata=cd,
            hovertemplate="%{customdata[0]} M=%{customdata[1]} active=%{customdata[2]}<br>measured %{x:.3f} ms"
                          "<br>predicted %{y:.3f} ms (%{customdata[3]:+.1f} %)<extra></extra>"))
    fig.update_layout(title=title, template="plotly_white",
                      xaxis=dict(title="measured (ms)", type="log", range=[math.log10(lo), math.log10(hi)]),
                      yaxis=dict(title="predicted (ms)", type="log", range=[math.log10(lo), math.log10(hi)]))
    return fig


_METRIC_TITLES = {"syncs_per_forward": "syncs / forward",
                  "stall_ms_per_forward": "GPU time lost, ms / forward (model only)",
                  "input_throughput_gain_pct": "input throughput gain %", "ttft_change_pct": "TTFT change %"}


def extrapolation_figure(extrap: pd.DataFrame, compare: pd.DataFrame | None = None, *,
                         title: str = "Production shapes (TP=4 rank, 48 layers): model vs production") -> go.Figure:
    """Left: predicted forward time per guard for each prefill chunk. Right: one panel per production
    figure, the model's value for each chunk beside the production number (`compare` is
    simulate.compare_production(extrap); computed when not given)."""
    from ..sim import compare_production

    compare = compare_production(extrap) if compare is None else compare
    metrics = [m for m in _METRIC_TITLES if m in set(compare["metric"])]
    fig = make_subplots(rows=1, cols=1 + len(metrics),
                        column_widths=[0.32] + [0.68 / max(len(metrics), 1)] * len(metrics),
                        subplot_titles=["forward time (ms)"] + [_METRIC_TITLES[m] for m in metrics])
    e = extrap[extrap["mode"] == "eager"] if "mode" in extrap else extrap
    for guard, g in e.groupby("guard", sort=False):
        fig.add_trace(go.Bar(x=[f"{t} tok" for t in g["tokens"]], y=g["forward_ms"], name=guard,
                             marker_color=_color(guard), legendgroup=guard,
                             customdata=g[["syncs_per_forward", "chunks_per_batch"]].to_numpy(),
                             hovertemplate="%{x}: %{y:.2f} ms<br>syncs %{customdata[0]}, "
                                           "%{customdata[1]} chunks per batch<extra>" + guard + "</extra>"),
                      row=1, col=1)
    for c, m in enumerate(metrics, start=2):
        g = compare[compare["metric"] == m]
        prod = float(g["production"].iloc[0])
        # a production figure of another quantity (host time blocked, against the model's GPU time
        # lost) is not drawn beside the model's: the panel shows the model alone
        xs = [f"model {t}" for t in g["tokens"]] + (["production"] if np.isfinite(prod) else [])
        ys = list(g["predicted"]) + ([prod] if np.isfinite(prod) else [])
        fig.add_trace(go.Bar(x=xs, y=ys, marker_color=["#9467bd"] * len(g) + ["#444444"], showlegend=False,
                             text=[f"{y:.3g}" for y in ys], textposition="outside",
                             hovertemplate="%{x}: %{y:.3g}<extra>" + _METRIC_TITLES[m] + "</extra>"), row=1, col=c)
    fig.update_xaxes(title_text="prefill chunk (tokens)", row=1, col=1)
    fig.update_yaxes(title_text="forward time (ms)", row=1, col=1)
    for c, m in enumerate(metrics, start=2):
        fig.update_xaxes(title_text="model vs production", row=1, col=c)
        fig.update_yaxes(title_text=_METRIC_TITLES[m], row=1, col=c)
    fig.update_layout(title=title, template="plotly_white", barmode="group", height=420)
    return fig


def what_if_figure(whatif: pd.DataFrame, *, title: str | None = None) -> go.Figure:
    """Forward time per guard vs the knob of simulate.what_if (launch cost, sync cost, tokens, ...)."""
    vary = str(whatif["vary"].iloc[0]) if len(whatif) else ""
    fig = go.Figure()
    for guard, g in whatif.groupby("guard", sort=False):
        g = g.sort_values("value")
        fig.add_trace(go.Scatter(x=g["value"], y=g["forward_ms"], mode="lines+markers", name=guard,
                                 line=dict(color=_color(guard)), customdata=g[["syncs", "device_idle_ms"]].to_numpy(),
                                 hovertemplate=vary + "=%{x}<br>%{y:.3f} ms<br>syncs %{customdata[0]}, device idle "
                                               "%{customdata[1]:.3f} ms<extra>" + guard + "</extra>"))
    label = {"launch_us": "host launch cost per kernel (us)", "sync_us": "sync overhead (us)",
             "host_layer_us": "extra host work per layer (us)", "tokens": "tokens per forward (M)"}.get(vary, vary)
    fig.update_layout(title=title or f"What if: forward time vs {label}", template="plotly_white",
                      xaxis=dict(title=label, type="log" if _log_axis(whatif["value"]) else "linear"),
                      yaxis=dict(title="forward (ms)"))
    return fig


def sim_timeline(result_or_timeline, **kw) -> go.Figure:
    """A simulated forward drawn by plots.timeline (the recorded traces' lanes and gap colours)."""
    from . import plots
    from ..sim import SimResult, to_trace_tables

    tl = result_or_timeline.timeline if isinstance(result_or_timeline, SimResult) else result_or_timeline
    if tl is None:
        raise ValueError("this SimResult has no timeline: simulate it with timeline=True")
    fig = plots.timeline(to_trace_tables(tl), **kw)
    fig.update_layout(title=kw.get("title") or "Simulated forward (queue model)")
    return fig
