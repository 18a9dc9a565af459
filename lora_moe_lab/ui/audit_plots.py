"""Figures of a sync audit (instruments/recorders/audit.py): where the syncs are in time, and what they cost.

    timeline_figure(rep)     GPU ops and the syncs on one time axis (CUDA); on a CPU the syncs of
                             the first audited call in host time, one row per kind
    cost_table_figure(rep)   the audit's table, sorted by cost, as a plotly table

Pure functions: a report in, a plotly Figure out; every axis has a title.
"""

from __future__ import annotations

import math

import plotly.graph_objects as go

from ..instruments.recorders.audit import KINDS, AuditReport

__all__ = ["timeline_figure", "cost_table_figure", "pattern_costs_figure", "KIND_COLORS"]

KIND_COLORS = {
    "item": "#d62728",
    "tolist": "#ff7f0e",
    "d2h": "#8c564b",
    "shape": "#9467bd",
    "pageable": "#e377c2",
    "synchronize": "#7f7f7f",
    "allocator": "#bcbd22",
    "other": "#17becf",
}


def timeline_figure(rep: AuditReport, title: str | None = None) -> go.Figure:
    fig = go.Figure()
    if rep.trace is not None and len(rep.trace.kernels) and rep.ranges:
        k = rep.trace.kernels
        t0 = int(min(k["start_ns"].min(), min(s for rs in rep.ranges.values() for s, _ in rs)))
        xs = []
        for s, e in zip(k["start_ns"], k["end_ns"]):
            xs += [(s - t0) / 1e6, (e - t0) / 1e6, None]
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=["GPU ops"] * len(xs),
                mode="lines",
                line=dict(width=14, color="#1f77b4"),
                name="GPU op",
                hoverinfo="skip",
            )
        )
        for (site, kind), rs in rep.ranges.items():
            fig.add_trace(
                go.Scatter(
                    x=[(s - t0) / 1e6 for s, _ in rs],
                    y=["host: syncs"] * len(rs),
                    mode="markers",
                    marker=dict(symbol="line-ns-open", size=18, color=KIND_COLORS.get(kind, "#000")),
                    name=f"{kind} @ {site}",
                    hovertemplate=f"{site} ({kind})<br>%{{x:.3f}} ms<extra></extra>",
                )
            )
        xt = "time in the profiled call (ms, GPU clock of the trace)"
    else:
        evs = [e for e in rep.events if e.rep == 0]
        for kind in sorted({e.kind for e in evs}):
            sel = [e for e in evs if e.kind == kind]
            fig.add_trace(
                go.Scatter(
                    x=[e.t_ns / 1e6 for e in sel],
                    y=[kind] * len(sel),
                    mode="markers",
                    marker=dict(symbol="line-ns-open", size=16, color=KIND_COLORS.get(kind, "#000")),
                    name=kind,
                    text=[e.site for e in sel],
                    hovertemplate="%{text}<br>%{x:.3f} ms<extra>" + kind + "</extra>",
                )
            )
        xt = f"time in the first audited call (ms, {rep.timed_on} host clock)"
    fig.update_layout(
        title=title or f"Syncs of the audited forward ({rep.count:g} per call, {rep.timed_on})",
        xaxis_title=xt,
        yaxis_title="row",
        height=320,
        legend=dict(orientation="h", y=-0.3),
    )
    return fig


def _fmt(v, digits=1):
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def cost_table_figure(rep: AuditReport, top: int = 30, title: str | None = None) -> go.Figure:
    t = rep.table().head(top)
    cols = [
        "site",
        "function",
        "kind",
        "count / call",
        f"host blocked, µs each ({rep.timed_on})",
        "GPU idle after, µs / call",
        "saving if removed, µs / call",
        "estimate",
    ]
    cells = [
        t["site"],
        t["function"],
        t["kind"],
        [f"{v:g}" for v in t["count_per_call"]],
        [_fmt(v) for v in t["host_blocked_us"]],
        [_fmt(v) for v in t["gpu_idle_after_us"]],
        [_fmt(v) for v in t["saving_us"]],
        t["estimate"],
    ]
    fig = go.Figure(go.Table(header=dict(values=cols, align="left"), cells=dict(values=cells, align="left")))
    fig.update_layout(
        title=title
        or "Syncs by cost (saving, then GPU idle, then count); kinds: "
        + ", ".join(sorted(set(t["kind"]) & set(KINDS))),
        height=120 + 28 * max(1, len(t)),
    )
    return fig


def pattern_costs_figure(rec, title: str | None = None) -> go.Figure:
    """The recorded cost per occurrence of each hidden-sync pattern (analysers.hidden_sync_runs.recorded()), with
    its 95 % interval (over sessions: the union of the sessions' intervals)."""
    d = rec.dropna(subset=["per_occ_us"])
    fig = go.Figure(
        go.Bar(
            x=d["pattern"],
            y=d["per_occ_us"],
            error_y=dict(
                type="data",
                symmetric=False,
                array=d["per_occ_hi_us"] - d["per_occ_us"],
                arrayminus=d["per_occ_us"] - d["per_occ_lo_us"],
            ),
            marker_color=[KIND_COLORS.get(k, "#000") for k in d["kind"]],
            text=d["kind"],
            hovertemplate="%{x} (%{text})<br>%{y:.1f} us per occurrence<extra></extra>",
        )
    )
    gpu = str(d["gpu"].iloc[0]) if len(d) and "gpu" in d else "GPU"
    fig.update_layout(
        title=title or f"Cost per occurrence of each hidden sync ({gpu}, recorded; 95 % intervals)",
        xaxis_title="pattern",
        yaxis_title="forward time per sync (us)",
        height=380,
    )
    return fig
