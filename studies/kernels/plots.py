"""The kernels study's figures of its recordings (studies/kernels/README.md names the ones it shows): the aligned
delta's registers -> programs per SM -> bandwidth map, LoRA's share of the layer against its byte floor, the ncu
counters, the folded path against the separate deltas, the base GEMM against its roofline floor, and LoRA's added
time kernel by kernel. Each takes a reader's DataFrame (studies/kernels/read.py, read_floors.py, or
`recordings.load_kernel_run`) and returns a plotly Figure.

    from studies.kernels import plots, read, read_floors
    plots.fold_figure(read.fold_table()).show()
    plots.floors_figure(read_floors.goal_floors(read.versus_peers(), read_floors.ceilings())).show()
"""
from __future__ import annotations

import plotly.graph_objects as go

H200_SMS = 132  # multiprocessors of the H200 the kernel runs were recorded on (programs per SM = grid / 132)


def occupancy_figure(sweep, Ms=(512, 8192), title: str = "registers -> programs per SM -> bandwidth") -> go.Figure:
    """One point per swept tile variant of the aligned LoRA delta (rows of a `KernelRun` section
    'sweep' for one preset): registers per thread against % of the copy bandwidth, coloured by the
    programs per SM the registers allowed, marked by the prefetch level; one panel per (M, op)."""
    from plotly.subplots import make_subplots

    ops = ["gate_up", "down"]
    fig = make_subplots(rows=len(Ms), cols=2, shared_yaxes=True, horizontal_spacing=0.08, vertical_spacing=0.14,
                        subplot_titles=[f"{op}, M={m}" for m in Ms for op in ops])
    colors = {2: "#d62728", 3: "#ff7f0e", 4: "#2ca02c"}
    symbols = {0: "circle", 1: "diamond", 2: "square"}
    shown = set()
    for i, m in enumerate(Ms):
        for j, op in enumerate(ops):
            d = sweep[(sweep["M"] == m) & (sweep["op"] == op)]
            for _, r in d.iterrows():
                pps = int(round(r["grid"] / H200_SMS))
                pf = int(r.get("prefetch", 0) or 0)
                key = (pps, pf)
                fig.add_trace(go.Scatter(
                    x=[r["regs"]], y=[100 * r["bw_frac"]], mode="markers", legendgroup=str(key),
                    name=f"{pps} programs/SM, prefetch {pf}", showlegend=key not in shown,
                    marker=dict(size=11, color=colors.get(pps, "#7f7f7f"), symbol=symbols.get(pf, "x"),
                                line=dict(width=1, color="black")),
                    hovertemplate=(f"{r['config']}<br>{r['time_us']:.1f} us, %{{y:.0f}} % of copy<br>"
                                   f"%{{x}} registers, grid {int(r['grid'])}<extra></extra>")), row=i + 1, col=j + 1)
                shown.add(key)
            fig.update_xaxes(title_text="registers per thread", row=i + 1, col=j + 1)
            fig.update_yaxes(title_text="% of copy bandwidth", row=i + 1, col=j + 1)
    fig.update_layout(title=title, height=330 * len(Ms), plot_bgcolor="white", legend=dict(orientation="h", y=-0.15))
    return fig


def share_floor_figure(table, target: float = 0.25, title: str = "LoRA's share of the MoE layer and its byte floor"):
    """Bars per M: LoRA's measured share of the base layer with all adapters active (10-90 % whiskers)
    and the share its bytes alone would take at the copy bandwidth; one panel per preset
    (`KernelRun.share_floor()`)."""
    from plotly.subplots import make_subplots

    presets = list(dict.fromkeys(table["preset"]))
    fig = make_subplots(rows=1, cols=len(presets), shared_yaxes=True, subplot_titles=presets, horizontal_spacing=0.05)
    for j, pre in enumerate(presets):
        d = table[table["preset"] == pre].sort_values("M")
        x = [str(m) for m in d["M"]]
        fig.add_trace(go.Bar(x=x, y=100 * d["lora_share"], name="measured (median of paired rounds)",
                             marker_color="#1f77b4", showlegend=j == 0,
                             error_y=dict(type="data", symmetric=False,
                                          array=100 * (d["lora_share_p90"] - d["lora_share"]),
                                          arrayminus=100 * (d["lora_share"] - d["lora_share_p10"]))), row=1, col=j + 1)
        fig.add_trace(go.Bar(x=x, y=100 * d["floor_share"], name="byte floor (bytes / copy bandwidth)",
                             marker_color="#c7c7c7", showlegend=j == 0), row=1, col=j + 1)
        label = dict(annotation_text=f"target {100 * target:.0f} %") if j == 0 else {}
        fig.add_hline(y=100 * target, line_dash="dot", line_color="#d62728", row=1, col=j + 1, **label)
        fig.update_xaxes(title_text="tokens M", type="category", row=1, col=j + 1)
        fig.update_yaxes(title_text="% of the base layer's time", row=1, col=j + 1)
    fig.update_layout(title=title, barmode="group", height=380, plot_bgcolor="white",
                      legend=dict(orientation="h", y=-0.25))
    return fig


def counters_figure(ncu, title: str = "Nsight Compute: DRAM bytes against the byte floor, and the tensor pipe"):
    """Two panels from a base-GEMM recording's ncu rows (studies/kernels/read.py: BaseRun.ncu): each kernel's
    DRAM bytes read + written over its byte floor, and the share of the time its tensor pipe was busy."""
    from plotly.subplots import make_subplots

    d = ncu.copy()
    d["kernel"] = d["preset"].str.replace("qwen3-30b-a3b", "q3") + " " + d["op"] + " M=" + d["M"].astype(str)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("DRAM bytes / byte floor", "tensor pipe busy (%)"),
                        horizontal_spacing=0.12)
    colours = {"table": "#1f77b4", "rules": "#ff7f0e", "table_masked": "#2ca02c", "decode": "#9467bd"}
    for arm, g in d.groupby("arm", sort=False):
        c = colours.get(arm, "#7f7f7f")
        fig.add_trace(go.Bar(x=g["kernel"], y=g["dram_bytes_over_floor"], name=arm, marker_color=c), row=1, col=1)
        fig.add_trace(go.Bar(x=g["kernel"], y=g["tensor_pipe_pct"], name=arm, marker_color=c, showlegend=False),
                      row=1, col=2)
    fig.add_hline(y=1.0, line_dash="dot", line_color="#d62728", row=1, col=1)
    for col, ytitle in ((1, "bytes moved / floor"), (2, "% of the kernel's time")):
        fig.update_xaxes(title_text="kernel (preset, GEMM or delta, tokens)", tickangle=45, row=1, col=col)
        fig.update_yaxes(title_text=ytitle, row=1, col=col)
    fig.update_layout(title=title, barmode="group", height=480, plot_bgcolor="white",
                      legend=dict(title="tile", orientation="h", y=1.12))
    return fig


def fold_figure(t, title: str = "The folded LoRA path against the separate deltas (H200, paired, 95 %)"):
    """(base + folded delta) / (base + separate delta) per M for each (preset, GEMM) and build, with its
    bootstrap interval, from read.fold_table: `folded` dotted, the layer's build `rows_ptr`
    solid where the run has it. Above 1 the separate deltas are faster."""
    fig = go.Figure()
    builds = [("folded_over_separate", "folded", "dot")]
    if "rows_ptr_over_separate" in t and t["rows_ptr_over_separate"].notna().any():
        builds.append(("rows_ptr_over_separate", "rows_ptr", "solid"))
    for (pre, op), g in t.groupby(["preset", "op"], sort=False):
        g = g.sort_values("M")
        for col, build, dash in builds:
            fig.add_trace(go.Scatter(
                x=g["M"], y=g[col], mode="markers+lines", line=dict(dash=dash),
                name=f"{pre.replace('qwen3-30b-a3b', 'q3')} {op} {build}",
                error_y=dict(type="data", symmetric=False, array=g[f"{col}_hi"] - g[col],
                             arrayminus=g[col] - g[f"{col}_lo"])))
    fig.add_hline(y=1.0, line_dash="dot", line_color="gray")
    fig.update_layout(title=title, xaxis_title="tokens per batch (M)", xaxis_type="log",
                      yaxis_title="(base + folded delta) / (base + separate delta)", height=460, plot_bgcolor="white")
    return fig


def floors_figure(gf, title: str = "The base GEMM against its roofline floor, and what 1.15x vLLM would demand"):
    """From read_floors.goal_floors: per point (preset, GEMM, M) the fraction of the roofline floor that the
    table's kernel, vLLM's tuned kernel, and a kernel 1.15x faster than vLLM's reach (1.0 = at the floor: every
    byte at the measured copy bandwidth, or every FLOP at the measured matmul rate, whichever is larger)."""
    d = gf.copy()
    d["point"] = (d["preset"].str.replace("qwen3-30b-a3b", "q3") + " " + d["op"] + " M=" + d["M"].astype(str)
                  + " (" + d["bound"] + ")")
    fig = go.Figure()
    arms = (("vllm_of_floor", "vLLM tuned (carried)", "#ff7f0e"), ("ours_of_floor", "this lab's table", "#1f77b4"),
            ("goal_of_floor", "the goal: 1.15x vLLM", "#d62728"))
    for col, name, c in arms:
        fig.add_trace(go.Bar(x=d["point"], y=d[col], name=name, marker_color=c,
                             marker_pattern_shape="/" if col == "goal_of_floor" else ""))
    fig.add_hline(y=1.0, line_dash="dot", line_color="#000000", annotation_text="the floor")
    fig.update_xaxes(title_text="base GEMM (preset, GEMM, tokens; what bounds its floor)", tickangle=45)
    fig.update_yaxes(title_text="floor time / kernel time", range=[0, 1.1])
    fig.update_layout(title=title, barmode="group", height=480, plot_bgcolor="white",
                      legend=dict(orientation="h", y=1.12))
    return fig


LORA_PARTS = ("LoRA shrink", "LoRA slot order", "LoRA separate delta", "GEMM gate_up", "GEMM down", "alignment",
              "router (fp32, torch)")


def lora_parts_figure(parts, shares, title: str = "What LoRA adds to the layer, kernel by kernel, and its floor"):
    """Stacked bars per (preset, M): LoRA's added GPU time per part of the layer (read_floors.layer_parts, one
    profiled session), beside its floor with the deltas folded (floors.share_floors, `floor_us`) and the live paired
    figure (`added_us`), both as markers."""
    p = parts[parts.session == parts.session.iloc[-1]]
    live = shares.groupby(["preset", "M"])[["added_us", "floor_us"]].mean()
    keys = [k for k in live.index if k in set(zip(p.preset, p.M))]
    x = [f"{pr.removeprefix('qwen3-30b-a3b').lstrip('-') or 'tp1'} M={m}" for pr, m in keys]
    fig = go.Figure()
    for part in LORA_PARTS:
        y = [float(p[(p.preset == pr) & (p.M == m) & (p.part == part)].added_us.sum()) for pr, m in keys]
        if any(abs(v) > 0.5 for v in y):
            fig.add_trace(go.Bar(x=x, y=y, name=part))
    fig.add_trace(go.Scatter(x=x, y=[live.loc[k, "added_us"] for k in keys], mode="markers", name="added, live",
                             marker=dict(symbol="diamond", size=10, color="black")))
    fig.add_trace(go.Scatter(x=x, y=[live.loc[k, "floor_us"] for k in keys], mode="markers", name="floor",
                             marker=dict(symbol="line-ew-open", size=26, color="#d62728", line=dict(width=3))))
    fig.update_layout(title=title, barmode="relative", height=420, plot_bgcolor="white", yaxis_title="µs per forward",
                      xaxis_title="preset and tokens M",
                      legend=dict(orientation="h", y=-0.25))
    return fig
