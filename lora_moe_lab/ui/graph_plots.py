"""The graph-strategies comparison (model/graph_strategies.py, data/graphs/strategies_*) in one figure.

    strategies_figure(load_graph_strategies(), model="moe")

Left: the median step time of each strategy relative to one_graph (paired per repetition,
95 % interval as error bars) over the batch size, with no adapter active (solid) and with one
(dashed). Right: what each strategy pays up front: capture seconds of all its graphs, with the
graph count and the graph pool's memory on the bars. Pure: a recording in, a Figure out.
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..model.graph_strategies import STRATEGIES

__all__ = ["strategies_figure", "STRATEGY_COLORS"]

STRATEGY_COLORS = {"one_graph": "#1f77b4", "per_active_count": "#9467bd", "lora_split": "#ff7f0e"}


def strategies_figure(rec, model: str = "moe", title: str | None = None) -> go.Figure:
    s = rec.summary()
    s = s[s["model"] == model]
    fig = make_subplots(rows=1, cols=2, column_widths=[0.64, 0.36], horizontal_spacing=0.12,
                        subplot_titles=("step time relative to one_graph", "capture, all batch sizes"))
    for v in STRATEGIES:
        for active, dash in ((0, "solid"), (1, "dash")):
            d = s[(s["variant"] == v) & (s["active"] == active)].sort_values("tokens")
            pct = (d["vs_one_graph"] - 1) * 100
            fig.add_trace(go.Scatter(
                x=d["tokens"], y=pct, mode="lines+markers", line=dict(color=STRATEGY_COLORS[v], dash=dash),
                name=f"{v}, {active} adapter{'s' if active != 1 else ''} active",
                error_y=dict(type="data", symmetric=False, array=(d["vs_hi95"] - d["vs_one_graph"]) * 100,
                             arrayminus=(d["vs_one_graph"] - d["vs_lo95"]) * 100, thickness=1),
                hovertemplate="M=%{x}: %{y:+.1f} %<extra>" + v + "</extra>"), row=1, col=1)
    cap = rec.capture[rec.capture["model"] == model].groupby("strategy", sort=False)[
        ["graphs", "capture_s", "pool_mib"]].sum().reindex(list(STRATEGIES))
    fig.add_trace(go.Bar(x=cap.index, y=cap["capture_s"], marker_color=[STRATEGY_COLORS[v] for v in cap.index],
                         text=[f"{int(g)} graphs<br>{p:.0f} MiB" for g, p in zip(cap["graphs"], cap["pool_mib"])],
                         textposition="auto", showlegend=False,
                         hovertemplate="%{x}: %{y:.2f} s<extra></extra>"), row=1, col=2)
    fig.update_xaxes(type="log", title_text="tokens per step (M)", row=1, col=1)
    fig.update_yaxes(title_text="vs one_graph (%)", zeroline=True, row=1, col=1)
    fig.update_xaxes(title_text="strategy", row=1, col=2)
    fig.update_yaxes(title_text="capture time (s)", row=1, col=2)
    fig.update_layout(title=title or f"LoRA under CUDA graphs: three strategies ({model}, {rec.label})",
                      legend=dict(orientation="h", y=-0.3), height=480)
    return fig
