"""The what-if bench: the validated replay engine (sim/replay.py) on the lab's recorded traces, with the
unprofiled measurement of the predicted configuration beside each prediction where one exists.

    sources()                                   the recorded traces it can load, one row each
    w = run("moe M=4096 sync eager", "remove_syncs")
    w.predicted_ms, w.measured, w.err_pct, w.passed      cpu_flag at M=4096, predicted and measured
    w.tables()                                  the replayed forward as TraceTables (plots.timeline)
    guard_predictions(4096, layers=48)          the validated model per guard at a traced M (notebook 04)
    simulator_vs_replay()                       the queue simulator beside the replay on the same points

The recipe is studies/replay/record.py's: the source trace's steady forward (forward 1); the 8-layer
MoE traces tiled to 48 layers; the source's host factor (the profiler slows the host) read from
data/replay/validation.csv (`alpha`), never refitted here; a chunked prefill of 64 x 2048 tokens
from an idle GPU for the decoder, one forward from an idle GPU for the MoE model. The pass rule is
the validation's: within +-5 % of the sessions' mean, or inside the union of their 95 % intervals.
"""

from __future__ import annotations

import dataclasses
import re
import time
from functools import lru_cache

import numpy as np
import pandas as pd

from ..instruments.analysers import schemas, stats
from ..instruments.analysers import trace as T
from ..provenance import catalog
from . import replay as R
from . import replay_transforms as X

__all__ = [
    "sources",
    "run",
    "WhatIf",
    "measured",
    "host_factor",
    "guard_predictions",
    "simulator_vs_replay",
    "replay_tables",
    "validation",
    "BENCH_TRANSFORMS",
    "TOL",
    "TracedPointError",
    "UnknownSourceError",
]

TOL = 0.05
SPIN_NS = 500_000  # as studies/replay/record.py: longer host gaps are the engine's busy-wait
# the recordings it reads, by catalog name (data/catalog.json): the validation, the decoder's and the MoE model's traces
VALIDATION = "replay.validation"
DEC_TRACES = "production.signature_traces"
MOE_TRACES = "traces.moe"
_DEC = re.compile(r"qwen3-30b-a3b_L48_tp1_C(\d+)_gs5\.41667_(h[\d.]+_f0_o70_)?none_(\w+?)_rank0\.json\.gz$")
_MOE = re.compile(r"(qwen3-30b-a3b)_(sync|cpu_flag|launch_always)_(eager|graph)_M(\d+)\.json\.gz$")
# the other configuration a guard template comes from (studies/replay/record.py's DEC_OTHER / MOE_OTHER)
OTHER = {
    "default_C16384": "default_C8192",
    "default_C8192": "default_C16384",
    "prodlike_C16384": "default_C16384",
    "16": "4096",
    "4096": "16",
}
# transformation -> its parameters (name: default) in the bench; what it predicts is in _target
BENCH_TRANSFORMS = {
    "none": {},
    "remove_syncs": {},
    "add_syncs": {},
    "graph_launch": {},
    "scale_host": {"factor": 0.5},
    "add_early_exit": {"k": 2, "d_us": 3.0},
    "scale_collectives": {"factor": 0.5},
}


class UnknownSourceError(R.ReplayError, KeyError):
    def __str__(self):
        return str(self.args[0]) if self.args else ""


class TracedPointError(R.ReplayError, ValueError):
    """No recorded trace for the point asked (the replay predicts only from a profiled forward)."""


# --- the recorded traces ------------------------------------------------------------------------
@lru_cache(maxsize=1)
def sources() -> pd.DataFrame:
    """One row per recorded trace the bench loads: name, model (dec / moe), config (validation.csv's
    key), guard, mode, tokens (chunk or M), steps (forwards per measurement), layers (as replayed: the
    8-layer eager MoE traces tiled to 48; a graph-mode trace holds one launch of 8 layers), path."""
    rows = []
    for p in _traces(DEC_TRACES):
        m = _DEC.search(p.name)
        if m:
            cfg = f"{'prodlike' if m[2] else 'default'}_C{m[1]}"
            rows.append(
                dict(
                    name=f"decoder {cfg} {m[3]}",
                    model="dec",
                    config=cfg,
                    guard=m[3],
                    mode="eager",
                    tokens=int(m[1]),
                    steps=64 * 2048 // int(m[1]),
                    layers=48,
                    path=p,
                )
            )
    for p in _traces(MOE_TRACES):
        m = _MOE.search(p.name)
        if m:
            rows.append(
                dict(
                    name=f"moe M={m[4]} {m[2]} {m[3]}",
                    model="moe",
                    config=m[4],
                    guard=m[2],
                    mode=m[3],
                    tokens=int(m[4]),
                    steps=1,
                    layers=48 if m[3] == "eager" else 8,
                    path=p,
                )
            )
    if not rows:
        raise FileNotFoundError(f"no recorded traces in the catalog's {DEC_TRACES!r} or {MOE_TRACES!r}")
    return pd.DataFrame(rows).set_index("name", drop=False)


def _traces(name: str) -> list:
    """The catalog's trace files under `name`; none recorded: []."""
    try:
        return catalog(name)
    except FileNotFoundError:
        return []


def _source(name: str) -> pd.Series:
    s = sources()
    if name not in s.index:
        raise UnknownSourceError(f"no recorded trace named {name!r}; have: {', '.join(s.index)}")
    return s.loc[name]


@lru_cache(maxsize=32)
def _base(name: str) -> R.Graph:
    """The source's steady forward (forward 1) as a graph, as traced."""
    return R.build_graph(_source(name).path, forward=1)


@lru_cache(maxsize=32)
def _graph(name: str) -> R.Graph:
    """The source's forward at 48 layers: MoE traces (8 layers) tiled 6 times."""
    g = _base(name)
    if not g.layers:  # a graph-mode trace: one cudaGraphLaunch of its 8 layers, no layer ranges to tile
        return g
    return X.tile_layers(g, 48 // len(g.layers)) if len(g.layers) < 48 else g


def _find(model: str, config: str, guard: str, mode: str = "eager") -> str:
    s = sources()
    m = s[(s.model == model) & (s.config == str(config)) & (s.guard == guard) & (s["mode"] == mode)]
    if not len(m):
        raise TracedPointError(f"no recorded trace of {model} {config} {guard} {mode}")
    return str(m.index[0])


@lru_cache(maxsize=1)
def validation() -> pd.DataFrame:
    """The replay's held-out points (catalog "replay.validation", written by studies/replay/record.py)."""
    try:
        f = catalog(VALIDATION)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{e}: run studies/replay/record.py") from None
    return schemas.read_csv(f, "replay_validation", dtype={"config": str})


def host_factor(model: str, config: str, guard: str, mode: str = "eager") -> tuple[float, str]:
    """The host factor of a source trace as the validation used it, and where it comes from. A trace
    the validation did not use takes the cpu_flag trace's factor of the same configuration (the same
    host path, without the guard); a graph-mode trace has no host work to scale (factor 1)."""
    if mode == "graph":
        return 1.0, "1 (a graph launch: no host work to scale)"
    v = validation()
    for g, how in (
        (guard, "validation.csv"),
        ("cpu_flag", f"the {config} cpu_flag trace's (validation.csv)"),
    ):
        r = v[(v.model == model) & (v.config == str(config)) & (v.source == g)]
        if len(r):
            return float(r.alpha.iloc[0]), f"{r.alpha.iloc[0]:.3f}: {how}, {r.alpha_from.iloc[0]}"
    return 1.0, "1 (no unprofiled measurement calibrates this trace)"


# --- the unprofiled measurements ------------------------------------------------------------------
@lru_cache(maxsize=1)
def _measurements() -> dict:
    """(model, config, guard, mode) -> [(median, lo, hi) per session], ms: the decoder's chunked prefills
    (instruments/analysers/production_runs.py) and the MoE guards recording at active 0.5
    (instruments/analysers/recordings.py)."""
    from ..instruments.analysers import production_runs, recordings

    out = {}
    for s in production_runs.load_sessions().values():
        for r in s.summary.itertuples():
            out.setdefault(("dec", r.task, r.guard, "eager"), []).append(
                (r.forward_median_ms, r.forward_median_ms_lo, r.forward_median_ms_hi)
            )
    d = recordings.load_guards().samples
    d = d[
        (d["preset"] == "qwen3-30b-a3b")
        & (d["active"] == 0.5)
        & (d["status"] == "ok")
        & (~d["warmup_drift"].astype(bool))
    ]
    for (m, guard, mode, _sess), x in d.groupby(["tokens", "guard", "mode", "session"]):
        out.setdefault(("moe", str(int(m)), guard, mode), []).append(
            stats.median_ci(x["us"].to_numpy() / 1e3)
        )
    return out


def measured(model: str, config: str, guard: str, mode: str = "eager") -> dict | None:
    """The unprofiled measurement of a configuration (ms): estimate, lo, hi over its sessions (the mean
    with the union of the 95 % intervals), or None where the lab has none."""
    per = _measurements().get((model, str(config), guard, mode))
    return stats.between_sessions(*per) if per else None


def judge(pred: float, m: dict | None) -> tuple[float, bool | None, str]:
    """(error %, passed, by) against a measurement by the validation's rule; (nan, None, '') without one."""
    if m is None:
        return float("nan"), None, ""
    err = pred / m["estimate"] - 1
    within = m["lo"] <= pred <= m["hi"]
    return (
        100 * err,
        bool(abs(err) <= TOL or within),
        "±5 %" if abs(err) <= TOL else "interval" if within else "",
    )


# --- one what-if --------------------------------------------------------------------------------
@dataclasses.dataclass
class WhatIf:
    source: str
    transform: str
    kwargs: dict
    graph: R.Graph  # the transformed graph, host factor applied
    result: R.ReplayResult
    predicted_ms: float
    source_ms: float  # the source replayed with the same host factor and no transformation
    alpha: float
    alpha_from: str
    target: str  # what the prediction is a prediction of
    measured: dict | None
    err_pct: float
    passed: bool | None
    by: str
    held_out: bool  # one of data/replay/validation.csv's held-out points
    replay_s: float

    def tables(self, step: int = 0) -> T.TraceTables:
        return replay_tables(self.graph, self.result, step=step, title=f"{self.source} · {self.transform}")

    def summary(self) -> dict:
        m = self.measured or {}
        return dict(
            source=self.source,
            transform=self.transform,
            target=self.target,
            source_ms=self.source_ms,
            predicted_ms=self.predicted_ms,
            measured_ms=m.get("estimate", np.nan),
            measured_lo=m.get("lo", np.nan),
            measured_hi=m.get("hi", np.nan),
            err_pct=self.err_pct,
            passed=self.passed,
            held_out=self.held_out,
            syncs=self.graph.n_syncs,
            alpha=self.alpha,
            replay_s=self.replay_s,
        )


def _target(src: pd.Series, transform: str) -> tuple[str, str] | None:
    """(guard, mode) whose measurement the transformation predicts, None where the lab measured none
    (every measurement is of 48 layers)."""
    if src.layers != 48:
        return None
    if transform == "none":
        return src.guard, src["mode"]
    if transform == "remove_syncs" and src.guard == "sync":
        return "cpu_flag", src["mode"]
    if transform == "add_syncs" and src.guard == "cpu_flag":
        return "sync", src["mode"]
    if transform == "graph_launch" and src["mode"] == "eager" and src.guard == "cpu_flag":
        return "cpu_flag", "graph"
    return None


def _scaled(g: R.Graph, a: float) -> R.Graph:
    return g if a == 1.0 else X.scale_host(g, a, calls=True, below_ns=SPIN_NS)


def run(source: str, transform: str = "none", **kw) -> WhatIf:
    """Replay a recorded trace after a transformation (BENCH_TRANSFORMS) and set the measurement of the
    predicted configuration beside it where one exists."""
    if transform not in BENCH_TRANSFORMS:
        raise R.UnknownTransformationError(
            f"unknown bench transformation {transform!r}; known: {', '.join(BENCH_TRANSFORMS)}"
        )
    src = _source(source)
    if transform == "add_syncs" and src.guard == "sync":
        raise R.GraphError(f"{source} already syncs at its guard sites: add_syncs puts the guard's syncs on a "
                           "cpu_flag or launch_always trace (remove_syncs predicts this one without them)")
    a, a_from = host_factor(src.model, src.config, src.guard, src["mode"])
    g = _scaled(_graph(source), a)
    t0 = time.perf_counter()
    if transform == "add_syncs":  # the guard of the other configuration's sync trace, as the validation did
        other = OTHER[str(src.config)]
        tpl = _scaled(_graph(_find(src.model, other, "sync")), a)
        out = X.add_syncs(g, X.guard_template(tpl), **kw)
    elif transform == "none":
        out = g
    else:
        out = X.apply(g, transform, **kw)
    r = R.replay(out, steps=int(src.steps), init="idle")
    dt = time.perf_counter() - t0
    base = R.replay(g, steps=int(src.steps), init="idle").forward_ms if transform != "none" else r.forward_ms
    tgt = _target(src, transform)
    m = measured(src.model, src.config, *tgt) if tgt else None
    what = f"{src.model} {src.config} {tgt[0]} {tgt[1]}" if tgt else "a configuration the lab did not measure"
    err, ok, by = judge(r.forward_ms, m)
    held = transform in ("remove_syncs", "add_syncs") and tgt is not None and src["mode"] == "eager"
    return WhatIf(
        source, transform, dict(kw), out, r, r.forward_ms, base, a, a_from, what, m, err, ok, by, held, dt
    )


# --- the replayed forward as trace tables ---------------------------------------------------------
def replay_tables(g: R.Graph, r: R.ReplayResult, step: int = 0, title: str = "") -> T.TraceTables:
    """One replayed step as TraceTables (runtime calls, kernels, syncs, layer ranges), so plots.timeline
    and the trace analyses read a replayed forward as they read a recorded one."""
    nh, nk = g.n_host, g.n_kernels
    hs, he = r.h_start[step * nh : (step + 1) * nh], r.h_end[step * nh : (step + 1) * nh]
    ks, ke = r.k_start[step * nk : (step + 1) * nk], r.k_end[step * nk : (step + 1) * nk]
    h, k = g.host, g.kern
    sync = h["kind"] == R.SYNC
    rt = pd.DataFrame(
        dict(
            name=h["name"].astype(str),
            cat="cuda_runtime",
            pid=1,
            tid=1,
            start_ns=hs,
            end_ns=he,
            dur_ns=he - hs,
            correlation=np.arange(nh),
            external_id=None,
            is_sync=sync,
            forward=0,
        )
    )
    kh = k["host"]
    names = k["name"].astype(str)
    kind = np.where(pd.Series(names).str.contains("Memcpy|memcpy"), "memcpy", "kernel")
    kern = pd.DataFrame(
        dict(
            name=names,
            kind=kind,
            device=0,
            stream=k["stream"],
            start_ns=ks,
            end_ns=ke,
            dur_ns=ke - ks,
            correlation=kh,
            external_id=None,
            launch_name=rt["name"].to_numpy()[kh],
            launch_start_ns=hs[kh],
            launch_end_ns=he[kh],
            launch_tid=1,
            forward=0,
        )
    )
    t0 = int(min(hs.min(), ks.min()))
    end = int(max(he.max(), ke.max()))
    def span(name, start, stop):  # one annotation range of the replayed forward
        return dict(name=name, pid=1, tid=1, start_ns=start, end_ns=stop, dur_ns=stop - start, external_id=None,
                    forward=0)

    ann = [span("forward", t0, end)]
    lay = h["layer"]
    pattern = "moe_layer_{}" if any(str(n).startswith("moe") for n in g.layers) else "decoder_layer_{}"
    for li in np.unique(lay[lay >= 0]):
        i = np.nonzero(lay == li)[0]
        s, e = int(hs[i[0]]), int(he[i[-1]])
        ann.append(span(pattern.format(int(li)), s, e))
    syncs = rt[rt["is_sync"]].assign(source="runtime", kind=None, stream=None)
    return T.TraceTables(
        kernels=T.frame(kern.to_dict("records"), T.KERNEL_COLUMNS),
        runtime=T.frame(rt.to_dict("records"), T.RUNTIME_COLUMNS),
        syncs=T.frame(syncs.to_dict("records"), T.SYNC_COLUMNS),
        memcpys=kern[kern["kind"] == "memcpy"].assign(direction=None),
        annotations=T.frame(ann, T.ANNOTATION_COLUMNS),
        gpu_annotations=T.frame([], T.ANNOTATION_COLUMNS),
        cpu_ops=T.frame([], T.ANNOTATION_COLUMNS),
        forwards=pd.DataFrame([dict(forward=0, name="forward", start_ns=t0, end_ns=end, dur_ns=end - t0)]),
        doc={"labels": {"source": "replay", "title": title}},
        path=None,
    )


# --- the validated model per guard (notebook 04's sliders) ---------------------------------------
def guard_predictions(
    tokens: int,
    layers: int = 48,
    mode: str = "eager",
    guards=("sync", "cpu_flag", "launch_always"),
) -> pd.DataFrame:
    """The MoE model's forward per guard at a traced M, from the validated model. Eager: sync and cpu_flag
    predicted held out (from the other guard's trace, as validated); launch_always gets cpu_flag's
    prediction (with half the requests on an adapter it launches the same kernels; its own profiled
    trace ran a slower host that no factor calibrates). Graph mode: the cpu_flag eager trace with each
    layer's launches replaced by one graph launch, for every guard (all record the same kernels under
    capture). layers: a multiple of the traces' 8 (the trace tiled layers/8 times)."""
    have = sources()
    traced = sorted(have[have.model == "moe"].tokens.unique())
    if int(tokens) not in traced:
        raise TracedPointError(
            f"no profiled forward at M={tokens}: the replay predicts from recorded traces "
            f"only (M = {', '.join(map(str, traced))})"
        )
    if layers % 8:
        raise TracedPointError(
            f"layers={layers}: the traces hold 8 layers; the replay tiles them to multiples of 8"
        )
    rows = []
    for guard in guards:
        if mode == "eager" and guard in ("sync", "cpu_flag"):
            other = "cpu_flag" if guard == "sync" else "sync"
            how, tr, held = "held out", ("add_syncs" if guard == "sync" else "remove_syncs"), True
            name = _find("moe", str(tokens), other, mode)
        elif mode == "graph":  # every guard records the same kernels under capture, and nothing syncs
            how, tr, held = "graph_launch of the eager cpu_flag trace", "graph_launch", False
            name = _find("moe", str(tokens), "cpu_flag", "eager")
        else:  # launch_always: with an adapter active it launches cpu_flag's kernels
            how, tr, held = (
                "as cpu_flag (the same kernels with an adapter active), held out",
                "remove_syncs",
                True,
            )
            name = _find("moe", str(tokens), "sync", mode)
        w = _run_layers(name, tr, layers)
        m = measured("moe", str(tokens), guard, mode)
        rows.append(
            dict(
                guard=guard,
                tokens=int(tokens),
                layers=layers,
                mode=mode,
                forward_ms=w.predicted_ms,
                syncs_per_forward=w.graph.n_syncs,
                method=f"{how}: {name} · {tr}",
                held_out=held,
                measured_ms=m["estimate"] if m and layers == 48 else np.nan,
                source="replay",
            )
        )
    return pd.DataFrame(rows)


def _run_layers(name: str, transform: str, layers: int) -> WhatIf:
    key = (name, transform, layers)
    if key in _LAYER_CACHE:
        return _LAYER_CACHE[key]
    if layers == 48:
        _LAYER_CACHE[key] = run(name, transform)
        return _LAYER_CACHE[key]
    src = _source(name)  # a shorter forward: the trace's 8 layers tiled layers/8 times
    a, a_from = host_factor(src.model, src.config, src.guard, src["mode"])
    g = _scaled(X.tile_layers(_base(name), layers // 8), a)
    if transform == "add_syncs":
        tpl = _scaled(_graph(_find(src.model, OTHER[str(src.config)], "sync")), a)
        g = X.add_syncs(g, X.guard_template(tpl))
    elif transform in ("remove_syncs", "graph_launch"):
        g = X.apply(g, transform)
    r = R.replay(g, steps=1, init="idle")
    _LAYER_CACHE[key] = WhatIf(
        name, transform, {}, g, r, r.forward_ms, np.nan, a, a_from, "", None, np.nan, None, "", False, 0.0
    )
    return _LAYER_CACHE[key]


_LAYER_CACHE: dict = {}


# --- the queue simulator beside the replay ------------------------------------------------------
SIM_NOTES = {
    "dec": "the queue model has the MoE blocks only (no attention, no collectives): its decoder forward "
    "is short by "
    "the attention's time; it takes whole syncs per layer (5: 240 per forward where the trace has 260)",
    "prodlike": "the queue model has no engine host work per layer and no earlier batch queued before each "
    "forward (instruments/recorders/prefill.py: EngineCosts): not simulated",
    "moe_host": "one fitted host cost per launch for every op and size: "
    "the host time at small M is not followed",
}


def simulator_vs_replay(params=None) -> pd.DataFrame:
    """The queue simulator (sim/cost.py, the cost model fitted in data/simulator unless `params`) beside the
    replay on the same points: the held-out validation points, the other MoE traces (launch_always eager,
    graph mode), and per configuration the GPU time lost to the guard (sync - cpu_flag, per forward; the
    decoder's per sync). agrees: the simulator within +-5 % of the replay."""
    from .calibration import load_calibration
    from .cost import forward_us

    params = load_calibration().params if params is None else params
    rows = []

    def add(model, config, guard, mode, layers, quantity, rep, method, m, simv, note=""):
        err_s, ok_s, _ = judge(simv, m) if np.isfinite(simv) else (np.nan, None, "")
        err_r, ok_r, _ = judge(rep, m)
        d = 100 * (simv / rep - 1) if np.isfinite(simv) else np.nan
        rows.append(
            dict(
                model=model,
                config=config,
                guard=guard,
                mode=mode,
                layers=layers,
                quantity=quantity,
                replay_ms=rep,
                replay_method=method,
                simulator_ms=simv,
                sim_vs_replay_pct=d,
                agrees=bool(abs(d) <= 100 * TOL) if np.isfinite(d) else False,
                measured_ms=m["estimate"] if m else np.nan,
                measured_lo=m["lo"] if m else np.nan,
                measured_hi=m["hi"] if m else np.nan,
                replay_err_pct=err_r,
                replay_passed=ok_r,
                simulator_err_pct=err_s,
                simulator_passed=ok_s,
                note=note,
            )
        )

    for M in sorted(sources().query("model == 'moe'").config.unique(), key=int):
        kw = dict(active=0.5, rank=16, params=params)
        per = {}
        for mode in ("eager", "graph"):
            p = guard_predictions(
                int(M),
                48,
                mode,
                guards=("sync", "cpu_flag", "launch_always") if mode == "eager" else ("cpu_flag",),
            )
            for r in p.itertuples():
                simv = forward_us("qwen3-30b-a3b", int(M), r.guard, layers=48, mode=mode, **kw) / 1e3
                per[(r.guard, mode)] = (r.forward_ms, simv)
                add(
                    "moe",
                    M,
                    r.guard,
                    mode,
                    48,
                    "forward",
                    r.forward_ms,
                    r.method.split(":")[0],
                    measured("moe", M, r.guard, mode),
                    simv,
                    SIM_NOTES["moe_host"] if int(M) <= 128 else "",
                )
        for g_ in (
            "cpu_flag",
            "launch_always",
        ):  # the graph-mode traces themselves (8 layers, no measurement)
            name = _find("moe", M, g_, "graph")
            add(
                "moe",
                M,
                g_,
                "graph",
                8,
                "forward",
                run(name).predicted_ms,
                "its own trace replayed",
                None,
                forward_us("qwen3-30b-a3b", int(M), g_, layers=8, mode="graph", **kw) / 1e3,
            )
        (rs, ss), (rc, sc) = per[("sync", "eager")], per[("cpu_flag", "eager")]
        ms, mc = measured("moe", M, "sync"), measured("moe", M, "cpu_flag")
        lost = dict(estimate=ms["estimate"] - mc["estimate"], lo=np.nan, hi=np.nan) if ms and mc else None
        add(
            "moe",
            M,
            "sync - cpu_flag",
            "eager",
            48,
            "GPU time lost per forward",
            rs - rc,
            "held out",
            lost,
            ss - sc,
        )
    for cfg in sorted(sources().query("model == 'dec'").config.unique()):
        pr = {}
        for guard, srcg, tr in (("cpu_flag", "sync", "remove_syncs"), ("sync", "cpu_flag", "add_syncs")):
            w = run(_find("dec", cfg, srcg), tr)
            C = int(cfg.split("_C")[1])
            simv = (
                np.nan
                if cfg.startswith("prodlike")
                else forward_us(
                    "qwen3-30b-a3b", C, guard, layers=48, params=params, active=0.0, syncs_per_layer=5
                )
                / 1e3
            )
            pr[guard] = (w.predicted_ms, simv, w.graph.n_syncs if guard == "sync" else 0)
            add(
                "dec",
                cfg,
                guard,
                "eager",
                48,
                "forward",
                w.predicted_ms,
                "held out",
                w.measured,
                simv,
                SIM_NOTES["prodlike" if cfg.startswith("prodlike") else "dec"],
            )
        (rs, ss, n), (rc, sc, _) = pr["sync"], pr["cpu_flag"]
        ms, mc = measured("dec", cfg, "sync"), measured("dec", cfg, "cpu_flag")
        lost = (
            dict(estimate=(ms["estimate"] - mc["estimate"]) / n, lo=np.nan, hi=np.nan) if ms and mc else None
        )
        add(
            "dec",
            cfg,
            "sync - cpu_flag",
            "eager",
            48,
            "GPU time lost per sync",
            (rs - rc) / n,
            "held out",
            lost,
            (ss - sc) / 240,
            SIM_NOTES["prodlike" if cfg.startswith("prodlike") else "dec"],
        )
    return pd.DataFrame(rows)
