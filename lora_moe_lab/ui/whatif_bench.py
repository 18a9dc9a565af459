"""The validated model (the trace-driven replay, sim/whatif.py) in the notebooks' panels.

    whatif_figure(w)              source, prediction and measurement (its interval) of one what-if
    replay_timeline(w, layers=2)  the replayed forward in plots.timeline's lanes (its first layers)
    WhatIfBench(...)              notebook 05: a recorded trace, a transformation, its parameters
    ReplayBenchPanel(...)         notebook 04: BenchPanel whose predictions come from the replay

Both panels redraw through one `update(...)` (papermill calls it; widgets call it on every move). A
replay takes well under a second, so they answer at once; a combination the engine refuses (a sync
removed from a trace without syncs, a graph launch over a layer that syncs) shows its named error.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ..model.guards import guard_color
from ..sim import replay as R
from ..sim import whatif as WI
from . import plots, widgets

# the configuration the MoE traces were profiled in (data/traces/*.meta.json: 2 of 4 requests on an adapter)
TRACED = dict(preset="qwen3-30b-a3b", active=0.5, rank=16, skew=0.0)


def whatif_figure(w: WI.WhatIf) -> go.Figure:
    """Bars: the source replayed as traced (host factor applied), the prediction, and the measurement of
    the predicted configuration with its interval where the lab has one."""
    m = w.measured
    xs = ["source, replayed", f"predicted ({w.transform})"] + (["measured"] if m else [])
    ys = [w.source_ms, w.predicted_ms] + ([m["estimate"]] if m else [])
    err = dict(
        type="data",
        symmetric=False,
        array=[0, 0] + ([m["hi"] - m["estimate"]] if m else []),
        arrayminus=[0, 0] + ([m["estimate"] - m["lo"]] if m else []),
    )
    fig = go.Figure(
        go.Bar(
            x=xs,
            y=ys,
            error_y=err,
            marker_color=["#aec7e8", "#1f77b4", "#444444"][: len(xs)],
            text=[f"{y:.2f}" for y in ys],
            textposition="outside",
            hovertemplate="%{x}: %{y:.3f} ms<extra></extra>",
        )
    )
    if m:
        verdict = f"{w.err_pct:+.1f} % — {'passes' if w.passed else 'MISSES'} (±5 % or the interval)" + (
            "; a held-out point of the replay's validation" if w.held_out else ""
        )
    else:
        verdict = "no measurement of this configuration: a prediction only"
    fig.update_layout(
        title=dict(text=f"{w.source} · {w.transform} → {w.target}<br>{verdict}", font=dict(size=13)),
        template="plotly_white",
        height=380,
        xaxis_title="what",
        yaxis_title="forward time (ms)",
    )
    return fig


def replay_timeline(w: WI.WhatIf, layers: int = 2) -> go.Figure:
    """The replayed forward's first `layers` layers (host calls and their kernels) on one time axis."""
    t = w.tables()
    a = t.annotations
    lay = a[a["name"].str.match(r"^(moe|decoder)_layer_\d+$")].sort_values("start_ns")
    if len(lay) > layers:
        hi_host = int(lay["end_ns"].iloc[layers - 1])
        k = t.kernels[t.kernels["launch_start_ns"] <= hi_host]
        window = (
            int(t.forwards["start_ns"].iloc[0]),
            int(max(hi_host, k["end_ns"].max() if len(k) else hi_host)),
        )
    else:
        window = None
    shown = f"first {layers} of {len(lay)} layers" if window else "the whole forward"
    return plots.timeline(
        t,
        window=window,
        title=f"Replayed: {w.source} · {w.transform} ({shown}; forward "
        f"{w.predicted_ms:.2f} ms, {w.graph.n_syncs} syncs)",
    )


class WhatIfBench:
    """Dropdowns for the recorded trace and the transformation, sliders for its parameters; every change
    replays and redraws the bar chart and the timeline."""

    def __init__(
        self,
        source: str,
        transform: str = "remove_syncs",
        factor: float = 0.5,
        k: int = 2,
        d_us: float = 3.0,
        layers_shown: int = 2,
    ):
        import ipywidgets as W

        sty, lay = dict(description_width="120px"), dict(width="460px")
        self.controls = {
            "source": W.Dropdown(
                options=list(WI.sources().index),
                value=source,
                description="recorded trace",
                style=sty,
                layout=lay,
            ),
            "transform": W.Dropdown(
                options=list(WI.BENCH_TRANSFORMS),
                value=transform,
                description="transformation",
                style=sty,
                layout=lay,
            ),
            "factor": W.FloatLogSlider(
                value=factor,
                base=10,
                min=-1,
                max=1,
                step=0.05,
                description="factor",
                style=sty,
                layout=lay,
                readout_format=".3g",
            ),
            "k": W.IntSlider(value=k, min=0, max=8, description="K launches/layer", style=sty, layout=lay),
            "d_us": W.FloatSlider(
                value=d_us, min=0.0, max=20.0, step=0.5, description="d (µs)", style=sty, layout=lay
            ),
            "layers_shown": W.IntSlider(
                value=layers_shown, min=1, max=8, description="timeline layers", style=sty, layout=lay
            ),
        }
        self.status = W.HTML()
        self.out = W.Output()
        self._hold = False
        self.last: WI.WhatIf | None = None
        self.last_figures: tuple = ()
        for c in self.controls.values():
            c.observe(lambda _c: None if self._hold else self.update(), names="value")
        self.widget = W.VBox([*self.controls.values(), self.status, self.out])

    def kwargs(self) -> dict:
        p = {k: c.value for k, c in self.controls.items()}
        return {k: p[k] for k in WI.BENCH_TRANSFORMS[p["transform"]]}

    def update(self, **values) -> WI.WhatIf | None:
        """Set any controls given, replay, redraw. A combination the engine refuses shows its error."""
        widgets._set_controls(self, values)
        p = {k: c.value for k, c in self.controls.items()}
        try:
            w = WI.run(p["source"], p["transform"], **self.kwargs())
        except R.ReplayError as e:
            self.last, self.last_figures = None, ()
            self.status.value = f"<b style='color:#d62728'>{type(e).__name__}: {e}</b>"
            widgets._show(self.out)
            return None
        self.last = w
        self.last_figures = (whatif_figure(w), replay_timeline(w, p["layers_shown"]))
        self.status.value = (
            f"replayed in {1e3 * w.replay_s:.0f} ms; host factor {w.alpha_from}; "
            f"{int(WI.sources().loc[p['source'], 'steps'])} forward(s) from an idle GPU"
        )
        widgets._show(self.out, *self.last_figures, pd.DataFrame([w.summary()]).round(3))
        return w


def replay_rows(p: dict) -> tuple[pd.DataFrame, str]:
    """The validated model at the panel's controls: one row per guard at every traced M (empty, with why,
    where no trace fits the controls)."""
    off = [
        f"{k}={p[k]}"
        for k, v in TRACED.items()
        if (p[k] != v if isinstance(v, str) else not np.isclose(p[k], v))
    ]
    if off:
        return pd.DataFrame(), (
            f"no profiled forward with {', '.join(off)}: the replay predicts from the recorded "
            f"traces only ({', '.join(f'{k}={v}' for k, v in TRACED.items())})"
        )
    if p["layers"] % 8:
        return (
            pd.DataFrame(),
            f"layers={p['layers']}: the traces hold 8 layers; the replay tiles them to multiples of 8",
        )
    ms = sorted(WI.sources().query("model == 'moe'").tokens.unique())
    return pd.concat(
        [WI.guard_predictions(int(m), p["layers"], p["mode"]) for m in ms], ignore_index=True
    ), ""


class ReplayBenchPanel(widgets.BenchPanel):
    """BenchPanel (ui/widgets.py) whose predicted forward times come from the validated replay: ▲ per
    guard at each traced M, held out where validated; without a GPU Run reports those and the recorded
    rows. The live path (a GPU) is BenchPanel's own, unchanged."""

    def _recorded(self, p: dict) -> pd.DataFrame:
        try:
            return widgets.recorded_rows(
                self.sweep,
                p["preset"],
                p["layers"],
                p["active"],
                p["rank"],
                p["mode"],
                label=self.label,
                skew=p["skew"],
            )
        except (
            KeyError
        ):  # recorded_rows on a sweep without p10/p90 and no matching row: nothing recorded here
            return pd.DataFrame(
                columns=["guard", "tokens", "forward_ms", "lo_ms", "hi_ms", "interval", "source"]
            )

    def view_figure(self, **values) -> go.Figure:
        p = {**self.params(), **values}
        pred, why = replay_rows(p)
        rec = self._recorded(p)
        fig = go.Figure()
        for frame, symbol, kind in ((pred, "triangle-up", "replay"), (rec, "diamond", None)):
            if not len(frame):
                continue
            for (g, src), d in frame.groupby(["guard", "source"], sort=False):
                d = d.sort_values("tokens")
                err = (
                    dict(
                        type="data",
                        symmetric=False,
                        array=d["hi_ms"] - d["forward_ms"],
                        arrayminus=d["forward_ms"] - d["lo_ms"],
                    )
                    if kind is None
                    else None
                )
                marker = dict(color=guard_color(g), symbol=symbol, size=11 if kind else 9,
                              line=dict(width=1, color="black"))
                fig.add_trace(go.Scatter(x=d["tokens"], y=d["forward_ms"], mode="markers", name=f"{g} {src}",
                                         error_y=err, marker=marker,
                                         hovertemplate="M=%{x}<br>%{y:.3f} ms<extra>" + f"{g} {src}" + "</extra>"))
        live = self.results[self.results["source"].str.startswith("live")] if len(self.results) else pd.DataFrame()
        for (g, src), d in live.groupby(["guard", "source"]) if len(live) else ():
            fig.add_trace(go.Scatter(x=d["tokens"], y=d["median_ms"], mode="markers", name=f"{g} {src}",
                                     marker=dict(color=guard_color(g), symbol="circle", size=9)))
        fig.update_layout(
            title=dict(text=self.headline(p, pred, rec, why), font=dict(size=13)),
            template="plotly_white",
            height=430,
            xaxis=dict(title="tokens per forward (M)", type="log"),
            yaxis=dict(title="forward time (ms)", type="log"),
            legend=dict(font=dict(size=10)),
        )
        return fig

    @staticmethod
    def headline(p: dict, pred: pd.DataFrame, rec: pd.DataFrame, why: str) -> str:
        head = f"{p['preset']}, {p['layers']} layers, active {p['active']:g}, rank {p['rank']}, {p['mode']}"
        sel = (
            pred[(pred["guard"] == p["guard"]) & (pred["tokens"] == int(p["tokens"]))] if len(pred) else pred
        )
        if not len(sel):
            traced = ", ".join(map(str, sorted(pred["tokens"].unique()))) if len(pred) else ""
            why = (
                why
                or f"no profiled forward at M={int(p['tokens'])} (traced: M = {traced}): no prediction here"
            )
            return f"{head} — {p['guard']} at M={int(p['tokens'])}: no replay prediction<br>{why}"
        return (
            f"{head} — {p['guard']} at M={int(p['tokens'])}: replay {sel['forward_ms'].iloc[0]:.3f} ms"
            + f" ({sel['method'].iloc[0].split(':')[0]})<br>{vs_recorded(sel.iloc[0], rec)}"
        )

    def _report(self, p: dict, guards: list[str]) -> list[dict]:
        pred, why = replay_rows(p)
        rec = self._recorded(p)
        base = {k: p[k] for k in ("preset", "layers", "tokens", "active", "rank", "mode", "skew")}
        rows = []
        for g in guards:
            sel = pred[(pred["guard"] == g) & (pred["tokens"] == int(p["tokens"]))] if len(pred) else pred
            for r in sel.itertuples():
                rows.append(
                    dict(
                        base,
                        guard=g,
                        source="replay",
                        median_ms=r.forward_ms,
                        lo_ms=np.nan,
                        hi_ms=np.nan,
                        interval="",
                        syncs_per_forward=r.syncs_per_forward,
                        reps=0,
                        vs_recorded=vs_recorded(r._asdict(), rec),
                        method=r.method,
                    )
                )
            if not len(sel):  # the row says why there is no prediction (Run always answers)
                rows.append(dict(base, guard=g, source="replay: none", median_ms=np.nan,
                                 lo_ms=np.nan, hi_ms=np.nan,
                                 interval="", syncs_per_forward=np.nan, reps=0, method="",
                                 vs_recorded=why or f"no profiled forward at M={int(p['tokens'])}"))
            for h in rec[(rec["guard"] == g) & (rec["tokens"] == int(p["tokens"]))].itertuples():
                rows.append(
                    dict(
                        base,
                        guard=g,
                        source=h.source,
                        median_ms=h.forward_ms,
                        lo_ms=h.lo_ms,
                        hi_ms=h.hi_ms,
                        interval=h.interval,
                        syncs_per_forward=np.nan,
                        reps=np.nan,
                        vs_recorded="",
                        method="",
                    )
                )
        n_rep = sum(r["source"] == "replay" for r in rows)
        self.status.value = (
            "No GPU here: "
            + (
                f"<b>{n_rep} replay predictions</b> (the validated model)"
                if n_rep
                else f"no replay prediction ({why or 'no profiled forward at M=' + str(p['tokens'])})"
            )
            + " and the recorded GPU rows, not a live measurement."
        )
        return rows


def vs_recorded(r, rec: pd.DataFrame) -> str:
    """A replay prediction against the recorded point by the validation's rule (±5 % or its interval)."""
    hit = rec[(rec["guard"] == r["guard"]) & (rec["tokens"] == int(r["tokens"]))] if len(rec) else rec
    if not len(hit):
        return "no recorded point here"
    h = hit.iloc[0]
    ci = str(h["interval"]).startswith("95")
    err, ok, by = WI.judge(
        float(r["forward_ms"]),
        dict(estimate=h["forward_ms"], lo=h["lo_ms"] if ci else np.inf, hi=h["hi_ms"] if ci else -np.inf),
    )
    verdict = "agrees" if ok else "MISSES"
    return f"recorded {h['forward_ms']:.3f} ms: replay {err:+.1f} %, {verdict} ({by or '±5 % / interval'})"
