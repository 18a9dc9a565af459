"""Figures for instruments/analysers/idle.py: the HTA-style idle breakdown and the per-layer trace diff.

    hta_idle_figure(hta_idle_breakdown(t).streams)     stacked idle per stream, by HTA category
    trace_diff_figure(trace_diff(sync, cpu_flag, names=("sync", "cpu_flag")))

Pure functions: a DataFrame in, a plotly Figure out; every axis has a title.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..instruments.analysers import idle as I
from .plots import GAP_COLORS

__all__ = ["hta_idle_figure", "trace_diff_figure", "HTA_COLORS"]

# the same colours as plots.GAP_COLORS for the categories that map onto each other
HTA_COLORS = {"after_sync": GAP_COLORS["after_sync"], "host_wait": GAP_COLORS["host_launch_wait"],
              "kernel_wait": GAP_COLORS["kernel_to_kernel"], "other": GAP_COLORS["other"]}


def hta_idle_figure(streams: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Mean idle per forward of each (device, stream), stacked by HTA category (plus after_sync)."""
    cols = [f"{c}_ns" for c in I.HTA_CATEGORIES]
    g = streams.groupby(["device", "stream"], sort=True)[cols].mean().reset_index()
    labels = "GPU " + g["device"].astype(str) + " / stream " + g["stream"].astype(str)
    fig = go.Figure()
    for c in I.HTA_CATEGORIES:
        fig.add_trace(go.Bar(x=labels, y=g[f"{c}_ns"] / 1e3, name=c.replace("_", " "),
                             marker_color=HTA_COLORS[c],
                             hovertemplate="%{x}<br>%{y:.3f} us<extra>" + c + "</extra>"))
    fig.update_layout(barmode="stack", title=title or "GPU idle per stream (HTA categories)",
                      xaxis_title="CUDA stream", yaxis_title="idle per forward (us)",
                      legend=dict(orientation="h", y=-0.25))
    return fig


def trace_diff_figure(diff: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Three panels over the layer index (means over the forwards of the diff):
    top, GPU idle of each trace (after_sync part hatched); middle, the idle `a` adds;
    bottom, host time from each sync's end to the next launch, with the syncs per layer."""
    na, nb = diff.attrs.get("names", ("a", "b"))
    m = diff.groupby("layer_index", sort=True).mean(numeric_only=True).reset_index()
    x = m["layer_index"]
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("GPU idle per layer", f"idle {na} adds over {nb}",
                                        "host time from a sync's end to the next launch"))
    for side, name, color in (("a", na, "#d62728"), ("b", nb, "#1f77b4")):
        fig.add_trace(go.Bar(x=x, y=m[f"idle_ns_{side}"] / 1e3, name=f"{name}: idle",
                             marker_color=color, offsetgroup=side,
                             hovertemplate="layer %{x}<br>%{y:.3f} us<extra>" + name + "</extra>"),
                      row=1, col=1)
        # the after-sync part drawn over the same bar: the bubble the sync itself made
        fig.add_trace(go.Bar(x=x, y=m[f"after_sync_ns_{side}"] / 1e3, name=f"{name}: after sync",
                             marker=dict(color="rgba(0,0,0,0)", line=dict(color=color, width=1),
                                         pattern_shape="/"), offsetgroup=side, base=0,
                             hovertemplate="layer %{x}<br>%{y:.3f} us after sync<extra>"
                             + name + "</extra>"), row=1, col=1)
        fig.add_trace(go.Bar(x=x, y=m[f"sync_to_launch_ns_{side}"] / 1e3, marker_color=color,
                             name=f"{name}: sync to launch", offsetgroup=side,
                             text=[f"{v:g} sync" for v in m[f"n_syncs_{side}"]],
                             textposition="outside",
                             hovertemplate="layer %{x}<br>%{y:.3f} us<extra>" + name + "</extra>"),
                      row=3, col=1)
    fig.add_trace(go.Bar(x=x, y=m["added_idle_ns"] / 1e3, name=f"added idle ({na} - {nb})",
                         marker_color=["#d62728" if v > 0 else "#2ca02c" for v in m["added_idle_ns"]],
                         hovertemplate="layer %{x}<br>%{y:.3f} us<extra>added</extra>"),
                  row=2, col=1)
    fig.update_layout(barmode="group", height=720, legend=dict(orientation="h", y=-0.12),
                      title=title or f"{na} vs {nb}, per layer ({diff['forward'].nunique()} forwards)")
    fig.update_yaxes(title_text="idle (us)", row=1, col=1)
    fig.update_yaxes(title_text="added idle (us)", row=2, col=1)
    fig.update_yaxes(title_text="host time (us)", row=3, col=1)
    for r in (1, 2, 3):
        fig.update_xaxes(title_text="layer index", dtick=1, row=r, col=1)
    return fig
