"""Interactive panels for notebook 04 (live micro-benchmarks; `whatif_bench.py` holds the replay panels).

Two layers:
  * pure functions (no ipywidgets): `simulated_curve`, `recorded_rows`, `bench_view_figure`,
    `results_figure` return DataFrames / plotly Figures and are tested alone;
  * thin panels (`BenchPanel`): controls whose observers call one `update(...)`
    that re-displays a fresh `go.Figure` in an `ipywidgets.Output` (never a FigureWidget, which
    stores megabytes of JavaScript in every executed notebook).

Without a frontend (papermill) a notebook builds the panel and calls `panel.update(...)` /
`panel.run(blocking=True)` itself, so every output exists. A long run (`BenchPanel.run`) goes on a
background thread when started from the Run button, shows an `IntProgress`, and checks the Stop
button's flag between repetitions: the kernel stays free to receive the click.
"""
from __future__ import annotations

import threading
from typing import Callable

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from .. import sim
from ..config import PRESETS
from ..model.guards import guard_color, guard_names
from ..model.lab import LabCache

TOKENS = tuple(2 ** i for i in range(15))  # 1 .. 16384
RANKS = (4, 8, 16, 32, 64)
SOURCE_SYMBOLS = {"simulator": "line", "recorded": "diamond", "live": "circle"}
# The simulator's cost model has no routing input: its lines are the uniform router's at any skew.
SKEW_NOTE = "skew: the simulator ignores it (its lines assume uniform routing); recorded and live points use it"


# ----------------------------------------------------------------------------------------------
# Pure builders
# ----------------------------------------------------------------------------------------------
def simulated_curve(cost: sim.CostModel, preset: str, layers: int, active: float, rank: int, mode: str,
                    tokens=TOKENS, guards=None) -> pd.DataFrame:
    """Simulated forward time (ms) per guard over a range of token counts."""
    rows = []
    for g in guard_names() if guards is None else guards:
        for m in tokens:
            us = sim.forward_us(preset, int(m), g, layers=layers, mode=mode, params=cost, active=active, rank=rank)
            rows.append(dict(guard=g, tokens=int(m), forward_ms=us / 1e3, source="simulator"))
    return pd.DataFrame(rows)


def recorded_rows(sweep: pd.DataFrame | None, preset: str, layers: int, active: float, rank: int,
                  mode: str, *, label: str | None = None, skew: float = 0.0) -> pd.DataFrame:
    """Rows of a recorded sweep (the canonical recording's `as_sweep()`, or a bench.py CSV) at this
    preset / layers / active / rank / mode. lo_ms / hi_ms: the median's 95 % interval (lo95_us,
    hi95_us) where the recording has it, else p10 / p90; `interval` says which. A recording without
    a skew column ran the uniform router: it matches skew 0 only."""
    cols = ["guard", "tokens", "forward_ms", "lo_ms", "hi_ms", "interval", "source"]
    if sweep is None or not len(sweep):
        return pd.DataFrame(columns=cols)
    from ..instruments.recorders.bench import clean

    d = clean(sweep)
    m = ((d["preset"] == preset) & (d["layers"].astype(int) == int(layers))
         & np.isclose(d["active"].astype(float), active)
         & (d["rank"].astype(int) == int(rank)) & (d["mode"] == mode))
    # no skew column, or an empty cell: recorded before skew existed, i.e. the uniform router
    d_skew = pd.to_numeric(d["skew"], errors="coerce").fillna(0.0) if "skew" in d else pd.Series(0.0, index=d.index)
    d = d[m & np.isclose(d_skew, float(skew))]
    gpu = d["gpu"].iloc[0] if "gpu" in d and len(d) else "GPU"
    ci = "lo95_us" in d and d["lo95_us"].notna().any()
    lo, hi = ("lo95_us", "hi95_us") if ci else ("p10_us", "p90_us")
    return pd.DataFrame(dict(guard=d["guard"], tokens=d["tokens"].astype(int), forward_ms=d["median_us"] / 1e3,
                             lo_ms=d[lo].astype(float) / 1e3, hi_ms=d[hi].astype(float) / 1e3,
                             interval="95 % CI of the median" if ci else "p10-p90",
                             source=f"recorded ({label or gpu})")).reset_index(drop=True)


def agreement(sim_ms: float, recorded: pd.DataFrame, guard: str, tokens: int, *, target_pct: float = 15.0) -> str:
    """The simulator's value at one point against the recorded one, by the validation's rule
    (sim/fit.py: judge): within +-target_pct, or inside the measurement's 95 % interval where that
    is wider. "" when nothing was recorded there."""
    r = recorded[(recorded["guard"] == guard) & (recorded["tokens"] == int(tokens))] if recorded is not None else ()
    if not len(r):
        return ""
    r = r.iloc[0]
    ci = r["interval"].startswith("95") if "interval" in r else False
    j = sim.judge(pd.DataFrame(dict(median_us=[r["forward_ms"]], predicted_us=[sim_ms],
                                    error_pct=[100.0 * (sim_ms / r["forward_ms"] - 1.0)],
                                    lo95_us=[r["lo_ms"] if ci else np.nan], hi95_us=[r["hi_ms"] if ci else np.nan])),
                  target_pct=target_pct).iloc[0]
    verdict = "agrees" if j["passes"] else f"MISSES (outside +-{target_pct:g} % and the 95 % interval)"
    return f"recorded {r['forward_ms']:.3f} ms: simulator {j['error_pct']:+.1f} %, {verdict}"


def bench_view_figure(curve: pd.DataFrame, recorded: pd.DataFrame | None, live: pd.DataFrame | None,
                      sel: dict, *, note: str = "", target_pct: float = 15.0) -> go.Figure:
    """Forward time vs tokens, a line per guard (simulator), recorded and live points on top, the
    selected (guard, tokens) marked. `sel` holds preset, layers, tokens, guard, active, rank, mode."""
    fig = go.Figure()
    for g, d in curve.groupby("guard", sort=False):
        d = d.sort_values("tokens")
        fig.add_trace(go.Scatter(x=d["tokens"], y=d["forward_ms"], mode="lines", name=f"{g} (simulator)",
                                 line=dict(color=guard_color(g), width=3 if g == sel["guard"] else 1.2,
                                           dash="solid" if g == sel["guard"] else "dot"),
                                 hovertemplate="M=%{x}<br>%{y:.3f} ms<extra>" + g + " simulator</extra>"))
    for frame, symbol in ((recorded, "diamond"), (live, "circle")):
        if frame is None or not len(frame):
            continue
        for (g, src), d in frame.groupby(["guard", "source"], sort=False):
            d = d.sort_values("tokens")
            fig.add_trace(go.Scatter(x=d["tokens"], y=d["forward_ms"], mode="markers", name=f"{g} {src}",
                                     marker=dict(color=guard_color(g), symbol=symbol, size=9,
                                                 line=dict(width=1, color="black")),
                                     hovertemplate="M=%{x}<br>%{y:.3f} ms<extra>" + f"{g} {src}" + "</extra>"))
    pick = curve[(curve["guard"] == sel["guard"]) & (curve["tokens"] == int(sel["tokens"]))]
    y = float(pick["forward_ms"].iloc[0]) if len(pick) else float("nan")
    fig.add_trace(go.Scatter(x=[int(sel["tokens"])], y=[y], mode="markers", name="selected",
                             marker=dict(symbol="star", size=18, color=guard_color(sel["guard"]),
                                         line=dict(width=1.5, color="black")),
                             hovertemplate="selected<br>M=%{x}<br>%{y:.3f} ms<extra></extra>"))
    title = (f"{sel['preset']}, {sel['layers']} layers, active {sel['active']:g}, rank {sel['rank']}, {sel['mode']}"
             f" — {sel['guard']} at M={int(sel['tokens'])}: {y:.3f} ms (simulator)")
    agree = agreement(y, recorded, sel["guard"], sel["tokens"], target_pct=target_pct)
    if agree:
        title += f"<br>{agree}"
    fig.update_layout(title=dict(text=title, font=dict(size=14)), template="plotly_white", height=430,
                      xaxis=dict(title="tokens per forward (M)", type="log"),
                      yaxis=dict(title="forward time (ms)", type="log"), legend=dict(font=dict(size=10)),
                      annotations=[dict(text=note, xref="paper", yref="paper", x=0, y=-0.22, showarrow=False,
                                        font=dict(size=11, color="#555"), align="left")] if note else [])
    return fig


def results_figure(results: pd.DataFrame) -> go.Figure:
    """One bar per result row (median forward ms, whiskers: its lo_ms-hi_ms interval), coloured by
    guard, grouped by configuration; the source (live / recorded / simulator) in the label."""
    fig = go.Figure()
    axes = dict(xaxis_title="configuration (preset, layers, tokens, active fraction, mode)",
                yaxis_title="median forward time (ms)")
    if results is None or not len(results):
        fig.update_layout(title="no results yet: press Run", template="plotly_white", height=300, **axes)
        return fig
    r = results.copy()
    r["config"] = (r["preset"] + " L" + r["layers"].astype(str) + " M" + r["tokens"].astype(str) + " a"
                   + r["active"].map(lambda a: f"{a:g}") + " " + r["mode"])
    if "skew" in r:  # a skewed router's rows get their own bars
        r["config"] += r["skew"].fillna(0.0).map(lambda s: f" skew{s:g}" if s else "")
    for (g, src), d in r.groupby(["guard", "source"], sort=False):
        err = None
        if {"lo_ms", "hi_ms"} <= set(d.columns) and d["hi_ms"].notna().any():
            err = dict(type="data", symmetric=False, array=(d["hi_ms"] - d["median_ms"]).fillna(0),
                       arrayminus=(d["median_ms"] - d["lo_ms"]).fillna(0))
        fig.add_trace(go.Bar(x=d["config"], y=d["median_ms"], name=f"{g} · {src}", error_y=err,
                             marker=dict(color=guard_color(g), pattern_shape="" if src.startswith("live") else
                                         ("/" if src.startswith("recorded") else ".")),
                             hovertemplate="%{x}<br>%{y:.3f} ms<extra>" + f"{g} · {src}" + "</extra>"))
    fig.update_layout(barmode="group", title="Results (median forward time; whiskers: the row's interval)",
                      template="plotly_white", height=380, legend=dict(font=dict(size=10)), **axes)
    return fig


def _bundle(obj) -> dict:
    """A display_data output for an Output widget. Figures go as the plotly mimetype only (rendered
    by JupyterLab's plotly extension): `append_display_data(fig)` would call the figure's own
    display hook, which prints into the running cell instead of the widget."""
    if isinstance(obj, go.Figure):
        import plotly.io as pio

        data = dict(pio.renderers["plotly_mimetype"].to_mimebundle(obj.to_dict()))
        data["text/plain"] = f"<plotly figure: {obj.layout.title.text or 'untitled'}>"
        return {"output_type": "display_data", "data": data, "metadata": {}}
    from IPython.core.formatters import format_display_data

    data, md = format_display_data(obj)
    return {"output_type": "display_data", "data": data, "metadata": md}


def _show(out, *objs) -> None:
    """Replace an Output widget's content in one state update; safe from a background thread
    (no `with out:` capture, which follows the kernel's current message)."""
    out.outputs = tuple(_bundle(o) for o in objs)



def _set_controls(panel, values: dict) -> None:
    """Set several controls of `panel` while its observers hold off (one redraw, not one per control)."""
    unknown = set(values) - set(panel.controls)
    if unknown:
        raise ValueError(f"unknown control(s) {sorted(unknown)}; have {list(panel.controls)}")
    panel._hold = True
    try:
        for k, v in values.items():
            panel.controls[k].value = v
    finally:
        panel._hold = False

class BenchPanel:
    """Controls (preset, layers, tokens, guard, active fraction, rank, eager/graph, router skew), Run and Stop
    buttons, a progress bar, a view figure that follows the controls, and a results table + chart.

    live=True (a GPU): Run measures the forward with `instruments.recorders.timing.time_once` (CUDA events; graph replay
    in graph mode via `model.graphs.GraphForward`), the guards interleaved, one repetition at a time (`_measure`).
    live=False: Run reports the simulator (`cost`) and the matching rows of the recorded sweep instead, and says so.
    """

    def __init__(self, *, live: bool, sweep: pd.DataFrame | None = None, cost: sim.CostModel = sim.CostModel(),
                 defaults: dict | None = None, reps: int = 10, warmup: int = 3, all_guards: bool = True,
                 build: Callable | None = None, note: str = "", label: str | None = None,
                 target_pct: float = 15.0):
        import ipywidgets as W

        self.live, self.sweep, self.cost = live, sweep, cost
        self.reps, self.warmup, self.note = reps, warmup, note
        self.label, self.target_pct = label, target_pct  # the recording's label; the agreement rule's target
        self._labs = LabCache(build)
        self.results = pd.DataFrame()
        self.last_samples: pd.DataFrame | None = None  # the last live run's repetitions (recording schema)
        self.last_figure: go.Figure | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._hold = False
        d = dict(preset="tiny", layers=4, tokens=16, guard="sync", active=0.5, rank=16, mode="eager", skew=0.0)
        d.update(defaults or {})
        lay = dict(width="420px")
        sty = dict(description_width="110px")
        self.controls = {
            "preset": W.Dropdown(options=sorted(PRESETS), value=d["preset"], description="preset", layout=lay,
                                 style=sty),
            "layers": W.IntSlider(value=d["layers"], min=1, max=48, description="layers", layout=lay, style=sty),
            "tokens": W.SelectionSlider(options=list(TOKENS), value=int(d["tokens"]), description="tokens (M)",
                                        layout=lay, style=sty),
            "guard": W.Dropdown(options=list(guard_names()), value=d["guard"], description="guard", layout=lay,
                                style=sty),
            "active": W.FloatSlider(value=float(d["active"]), min=0.0, max=1.0, step=0.125,
                                    description="active fraction", layout=lay, style=sty),
            "rank": W.Dropdown(options=list(RANKS), value=int(d["rank"]), description="LoRA rank", layout=lay,
                               style=sty),
            "mode": W.ToggleButtons(options=["eager", "graph"], value=d["mode"], description="mode", style=sty),
            # 0: uniform routing; 1.0 (model/moe.py: SERVING_SKEW): about a fifth of the experts take 90 % of the
            # assignments
            "skew": W.FloatSlider(value=float(d["skew"]), min=0.0, max=3.0, step=0.25, description="router skew",
                                  layout=lay, style=sty),
        }
        self.all_guards = W.Checkbox(value=all_guards, description="Run all three guards", indent=False)
        self.run_button = W.Button(description="Run", button_style="primary", icon="play")
        self.stop_button = W.Button(description="Stop", button_style="danger", icon="stop", disabled=True)
        self.progress = W.IntProgress(value=0, min=0, max=1, description="progress", style=sty)
        self.status = W.HTML(value="")
        self.view_out = W.Output()
        self.results_out = W.Output()
        for w in self.controls.values():
            w.observe(self._on_change, names="value")
        self.run_button.on_click(lambda _: self.run(blocking=False))
        self.stop_button.on_click(lambda _: self.stop())
        self.widget = W.VBox([
            W.HBox([W.VBox(list(self.controls.values())[:4]),
                    W.VBox(list(self.controls.values())[4:] + [self.all_guards])]),
            W.HBox([self.run_button, self.stop_button, self.progress]), self.status, self.view_out, self.results_out])

    # --- state ------------------------------------------------------------------------------
    def params(self) -> dict:
        return {k: w.value for k, w in self.controls.items()}

    def set(self, **values) -> None:
        """Set controls without one update per control; then update once."""
        _set_controls(self, values)

    def _on_change(self, _change) -> None:
        if not self._hold:
            self.update()

    # --- the view that follows the controls -----------------------------------------------
    def view_figure(self, **values) -> go.Figure:
        p = {**self.params(), **values}
        curve = simulated_curve(self.cost, p["preset"], p["layers"], p["active"], p["rank"], p["mode"])
        rec = recorded_rows(self.sweep, p["preset"], p["layers"], p["active"], p["rank"], p["mode"], label=self.label,
                            skew=p["skew"])
        live = None
        if len(self.results):
            r = self.results
            m = ((r["preset"] == p["preset"]) & (r["layers"] == p["layers"]) & np.isclose(r["active"], p["active"])
                 & (r["rank"] == p["rank"]) & (r["mode"] == p["mode"]) & r["source"].str.startswith("live")
                 & np.isclose(r["skew"], p["skew"]))
            live = r[m].rename(columns={"median_ms": "forward_ms"})
        note = " | ".join(n for n in (self.note, SKEW_NOTE if p["skew"] else "") if n)
        return bench_view_figure(curve, rec, live, p, note=note, target_pct=self.target_pct)

    def update(self, **values) -> go.Figure:
        """Set any controls given, then redraw the view figure (what every control change calls)."""
        if values:
            self.set(**values)
        fig = self.view_figure()
        self.last_figure = fig
        _show(self.view_out, fig)
        return fig

    # --- Run / Stop -----------------------------------------------------------------------------
    def stop(self) -> None:
        self._stop.set()
        self.status.value = "<b>stopping after the current repetition…</b>"

    def run(self, blocking: bool = True) -> pd.DataFrame | None:
        """Measure (GPU) or report simulator + recorded rows (CPU) for the current controls. From the
        Run button it runs on a thread; blocking=True (papermill) runs here and returns the rows."""
        if self._thread is not None and self._thread.is_alive():
            self.status.value = "<b>a run is in progress</b>: press Stop first"
            return None
        self._stop.clear()
        p = self.params()
        if blocking:
            return self._run(p)
        self._thread = threading.Thread(target=self._run, args=(p,), daemon=True)
        self._thread.start()
        return None

    def _run(self, p: dict) -> pd.DataFrame:
        guards = list(guard_names()) if self.all_guards.value else [p["guard"]]
        self.run_button.disabled, self.stop_button.disabled = True, False
        rows = []
        try:
            if self.live:
                rows = self._measure(p, guards)
            else:
                rows = self._report(p, guards)
        except Exception as e:  # noqa: BLE001 - shown in the panel, then re-raised
            self.status.value = f"<b style='color:#d62728'>{type(e).__name__}: {e}</b>"
            raise
        finally:
            self.run_button.disabled, self.stop_button.disabled = False, True
        new = pd.DataFrame(rows)
        self.results = pd.concat([self.results, new], ignore_index=True) if len(self.results) else new
        self.show_results()
        self.update()
        return new

    def _report(self, p: dict, guards: list[str]) -> list[dict]:
        self.progress.max, self.progress.value = len(guards), 0
        rec = recorded_rows(self.sweep, p["preset"], p["layers"], p["active"], p["rank"], p["mode"], label=self.label,
                            skew=p["skew"])
        rows, misses = [], []
        for g in guards:
            if self._stop.is_set():
                break
            r = sim.simulate_forward(p["preset"], int(p["tokens"]), g, layers=p["layers"], mode=p["mode"],
                                     params=self.cost, active=p["active"], rank=p["rank"])
            base = {k: p[k] for k in ("preset", "layers", "tokens", "active", "rank", "mode", "skew")}
            agree = agreement(r.forward_us / 1e3, rec, g, p["tokens"], target_pct=self.target_pct)
            if "MISSES" in agree:
                misses.append(g)
            rows.append(dict(base, guard=g, source="simulator", median_ms=r.forward_us / 1e3, lo_ms=np.nan,
                             hi_ms=np.nan, interval="", syncs_per_forward=r.syncs, reps=0, vs_recorded=agree))
            hit = rec[(rec["guard"] == g) & (rec["tokens"] == int(p["tokens"]))]
            for h in hit.itertuples():
                rows.append(dict(base, guard=g, source=h.source, median_ms=h.forward_ms, lo_ms=h.lo_ms,
                                 hi_ms=h.hi_ms, interval=h.interval, syncs_per_forward=np.nan, reps=np.nan,
                                 vs_recorded=""))
            self.progress.value += 1
        n_rec = sum(r["source"].startswith("recorded") for r in rows)
        self.status.value = ("No GPU here: these rows come from the <b>simulator</b> (queue model)"
                             + (f" and <b>{n_rec} recorded GPU rows</b>" if n_rec else
                                " — no recorded row matches these controls") + ", not from a live measurement."
                             + (f" The simulator <b>misses</b> the recorded value for {', '.join(misses)}."
                                if misses else "") + (f" ({SKEW_NOTE}.)" if p["skew"] else ""))
        return rows

    def _lab_for(self, p: dict):
        return self._labs.get(adapter=("bench", p["rank"]), preset=p["preset"], num_layers=p["layers"], max_loras=4,
                              max_rank=p["rank"], dtype="bfloat16", device="cuda", backend="triton",
                              **({"skew": p["skew"]} if p["skew"] else {}))  # a `build` without skew works at 0

    def _measure(self, p: dict, guards: list[str]) -> list[dict]:
        """Interleaved repetitions (instruments/recorders/timing.py: rotated): repetition r runs every guard once,
        in an order rotated by r, each from an idle device, so a slow drift of the host lands on all
        guards alike and their ratios are honest. Stop ends after the current forward; only whole
        repetitions are kept, so the guards stay paired. `last_samples`: one row per (guard,
        repetition) in the guards recording's schema (instruments/analysers/recordings.py)."""
        import torch

        from .. import runtime
        from ..instruments.analysers.recordings import median_ci
        from ..instruments.recorders.timing import rotated, time_once
        from ..model.graphs import GraphForward
        from ..model.guards import count_guard_syncs
        from ..model.lab import split_tokens

        self.progress.max, self.progress.value = len(guards) * self.reps, 0
        self.status.value = f"building {p['preset']} with {p['layers']} layers…"
        lab = self._lab_for(p)
        R = min(8, int(p["tokens"]))
        n_active = round(p["active"] * R)
        batch, tensors = lab.make_batch(["bench" if i < n_active else None for i in range(R)],
                                        split_tokens(int(p["tokens"]), R))
        x = lab.random_input(int(p["tokens"]))
        cuda = lab.device.type == "cuda"  # CUDA events on the GPU the lab lives on, else the wall clock
        gpu = torch.cuda.get_device_name(lab.device) if cuda else "cpu"
        fns, graphs, syncs = {}, [], {}
        samples = {g: [] for g in guards}
        with torch.no_grad():
            for g in guards:
                def fwd(g=g):
                    return lab.model(x, batch, tensors, guard=g)

                self.status.value = f"{g}: warm-up{' and capture' if p['mode'] == 'graph' else ''}…"
                graph = GraphForward(fwd, warmup=self.warmup) if p["mode"] == "graph" else None
                fns[g] = graph.replay if graph is not None else fwd
                graphs.append(graph)
                with count_guard_syncs() as c:
                    fns[g]()
                syncs[g] = c.count
                for _ in range(self.warmup):
                    fns[g]()
                runtime.synchronize()
            for r in range(self.reps):
                for g in rotated(guards, r):
                    if self._stop.is_set():
                        break
                    samples[g].append(time_once(fns[g], cuda)[0])
                    self.progress.value += 1
                if self._stop.is_set():
                    break
                self.status.value = f"repetition {r + 1}/{self.reps}: " + ", ".join(
                    f"{g} {samples[g][-1] / 1e3:.3f} ms" for g in guards)
            del graphs
        n = min(len(v) for v in samples.values())  # whole repetitions only: pairs stay pairs
        key = {k: p[k] for k in ("preset", "layers", "tokens", "active", "rank", "mode", "skew")}
        self.last_samples = pd.DataFrame([dict(preset=p["preset"], layers=p["layers"], tokens=int(p["tokens"]),
                                               active=float(p["active"]), variant=g, guard=g, mode=p["mode"], rep=i,
                                               us=samples[g][i], syncs_per_forward=syncs[g],
                                               timer="cuda_events" if cuda else "wall")
                                          for g in guards for i in range(n)])
        rows = []
        for g in guards if n else []:
            med, lo, hi = median_ci(samples[g][:n])
            ci = np.isfinite(lo) and np.isfinite(hi)  # the order-statistic interval needs >= 6 repetitions
            if not ci:
                lo, hi = np.percentile(samples[g][:n], 10), np.percentile(samples[g][:n], 90)
            rows.append(dict(key, guard=g, source=f"live ({gpu})", median_ms=med / 1e3, lo_ms=lo / 1e3, hi_ms=hi / 1e3,
                             interval="95 % CI of the median" if ci else "p10-p90", syncs_per_forward=syncs[g], reps=n))
        self.status.value = ("stopped early: " if self._stop.is_set() else "done: ") + \
            (f"measured live on {gpu} ({'CUDA events' if cuda else 'wall clock'}, median of {n} "
             f"interleaved repetitions after {self.warmup} warm-up calls)")
        return rows

    def show_results(self) -> None:
        cols = ["source", "preset", "layers", "tokens", "guard", "active", "rank", "skew", "mode", "median_ms", "lo_ms",
                "hi_ms", "interval", "syncs_per_forward", "reps", "vs_recorded"]
        tbl = self.results[[c for c in cols if c in self.results]] if len(self.results) else self.results
        _show(self.results_out, tbl.round(4) if len(tbl) else tbl, results_figure(self.results))


