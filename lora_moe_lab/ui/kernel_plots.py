"""Figures of the fused LoRA kernel: the exit-code map (which program exited where, and why). The kernels
study's figures of its recordings are in studies/kernels/plots.py."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import torch

from ..instruments.recorders.early_exit import Case, item_programs
from ..kernels import exits

EXIT_COLORS = {0: "#2ca02c", 1: "#7f7f7f", 2: "#1f77b4", 3: "#c7c7c7", 4: "#ff7f0e"}


def exit_map_figure(codes, case: Case | None = None, title: str = "exit code per (slot, token block)") -> go.Figure:
    """Heatmap: one cell per (slot, token block), coloured by exit code; with `case`, the hover names
    the block's expert, the slot's num_tokens_post_padded and the program that takes the block."""
    c = np.asarray(codes.cpu() if isinstance(codes, torch.Tensor) else codes)
    S, nb = c.shape
    present = sorted({int(v) for v in np.unique(c)})
    # discrete colours: codes -7 (never written, red), 0..4 -> indices 0..5, one band each
    allc = [-7, 0, 1, 2, 3, 4]
    cols = {**EXIT_COLORS, -7: "#d62728"}
    n = len(allc)
    scale = []
    for i, v in enumerate(allc):
        scale += [[i / n, cols[v]], [(i + 1) / n, cols[v]]]
    idx = np.vectorize(lambda v: allc.index(int(v)) if int(v) in allc else 0)(c)
    names = {**exits.names("fused_moe_lora_kernel"), exits.NEVER_WRITTEN: "NEVER WRITTEN"}
    text = np.vectorize(lambda v: names.get(int(v), str(v)))(c)
    custom = None
    if case is not None:
        ei = case.align.expert_ids.cpu().numpy()
        ntpp = case.align.num_tokens_post_padded.cpu().numpy()
        custom = np.stack([ei, np.repeat(ntpp[:, None], nb, 1), item_programs(case)], -1)
    fig = go.Figure(go.Heatmap(
        z=idx, x=list(range(nb)), y=[f"slot {s}" for s in range(S)], zmin=-0.5, zmax=n - 0.5,
        colorscale=scale, showscale=False, text=text, xgap=2, ygap=2, customdata=custom,
        hovertemplate=("%{y}, block %{x}<br>%{text}" + ("<br>expert id %{customdata[0]}"
                                                        "<br>num_tokens_post_padded %{customdata[1]}"
                                                        "<br>program %{customdata[2]} of the normal launch "
                                                        "(-1: no work item)"
                                                        if custom is not None else "") + "<extra></extra>")))
    for v in present:  # legend entries for the codes on the map
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=names.get(v, str(v)),
                                 marker=dict(size=12, symbol="square", color=cols.get(v, "black"))))
    fig.update_layout(title=title, xaxis_title="token block b (BLOCK_M rows of one expert)", height=170 + 28 * S,
                      yaxis=dict(autorange="reversed", title="adapter slot"), plot_bgcolor="white",
                      legend=dict(orientation="h", y=-0.35), margin=dict(l=70, r=20, t=50, b=40))
    return fig
