"""Fit the cost model to recorded GPU data, and check it: predict / fit / validate against a
benchmark sweep (instruments/bench.py's CSV schema) and recorded traces."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from .cost import CostModel, _check_forward, _costs, _fast_forward_us, layer_spec, simulate_forward

_DTYPE_BYTES = {"bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "float32": 4, "fp32": 4, "float64": 8}


def _row_kwargs(row) -> dict:
    g = row.get if hasattr(row, "get") else (lambda k, d=None: getattr(row, k, d))
    return dict(shape=g("preset"), tokens=int(g("tokens")), guard=g("guard"), layers=int(g("layers")),
                mode=g("mode", "eager") or "eager", active=float(g("active", 0.0)), rank=int(g("rank", 16)),
                dtype_bytes=_DTYPE_BYTES.get(str(g("dtype", "bfloat16")), 2))


def _clean_sweep(df: pd.DataFrame) -> pd.DataFrame:
    need = {"preset", "layers", "tokens", "guard", "median_us"}
    miss = need - set(df.columns)
    if miss:
        raise ValueError(f"sweep table lacks columns {sorted(miss)}")
    d = df
    if "error" in d.columns:
        d = d[d["error"].isna() | (d["error"].astype(str) == "")]
    d = d[np.isfinite(d["median_us"].astype(float)) & (d["median_us"].astype(float) > 0)]
    return d.reset_index(drop=True)


def predict(df: pd.DataFrame, params: CostModel = CostModel()) -> pd.DataFrame:
    """Each sweep row with the model's forward time, syncs and idle time beside the measurement."""
    d = _clean_sweep(df).copy()
    out = [simulate_forward(params=params, **_row_kwargs(r)) for r in d.to_dict("records")]
    d["predicted_us"] = [o.forward_us for o in out]
    d["predicted_syncs"] = [o.syncs for o in out]
    d["predicted_idle_us"] = [o.device_idle_us for o in out]
    d["error_pct"] = 100.0 * (d["predicted_us"] - d["median_us"].astype(float)) / d["median_us"].astype(float)
    return d


def trace_rows(traces: Iterable) -> pd.DataFrame:
    """Sweep-like rows from recorded traces (paths or TraceTables with the labels that
    scripts/gpu_traces.py stores: preset, num_layers, guard, mode, M, adapters, max_rank, dtype),
    one per trace: median over its forwards of (end of the last GPU op - start of the forward on the
    host), the quantity bench.py times with CUDA events. Also the measured kernels per forward
    beside the model's count (`model_kernels`), a check of DEFAULT_LAUNCHES."""
    from ..instruments import trace as T

    rows = []
    for tr in traces:
        t = T.load_trace(tr)
        lab = t.labels
        need = {"preset", "num_layers", "guard", "mode", "M"}
        if not need <= set(lab):
            raise ValueError(f"trace {t.path or '<in memory>'} lacks labels {sorted(need - set(lab))}")
        m = T.forward_metrics(t)
        if not len(m):
            continue
        end = np.maximum(m["gpu_end_ns"].astype("float").fillna(0).to_numpy(), m["host_end_ns"].to_numpy(float))
        dur_us = (end - m["host_start_ns"].to_numpy(float)) / 1e3
        ads = lab.get("adapters") or []
        active = (sum(a is not None for a in ads) / len(ads)) if ads else float(lab.get("active", 0.0))
        row = dict(preset=lab["preset"], layers=int(lab["num_layers"]), tokens=int(lab["M"]), guard=lab["guard"],
                   active=active, rank=int(lab.get("max_rank", 16)), mode=lab["mode"],
                   dtype=str(lab.get("dtype", "bfloat16")), median_us=float(np.median(dur_us)),
                   kernels_per_forward=float(m["n_kernels"].median()), syncs_per_forward=float(m["n_syncs"].median()),
                   source=str(t.path or "trace"), error=None)
        kw = _row_kwargs(row)
        row["model_kernels"] = simulate_forward(**{k: v for k, v in kw.items() if k != "shape"},
                                                shape=kw["shape"]).device_ops
        rows.append(row)
    return pd.DataFrame(rows)


FIT_PARAMS = ("launch_us", "sync_us", "graph_launch_us", "kernel_us", "tflops", "tbps")
# For recorded GPU data: the Python launchers of the Triton kernels cost the host far more than a
# PyTorch op (notebook 02 on the H200: ~90 us to issue a LoRA launch vs ~13 us for an empty Triton
# kernel), so their extra host cost is fitted too rather than assumed 0.
FIT_PARAMS_RECORDED = FIT_PARAMS + ("triton_extra_us",)


def _nelder_mead(f, x0: np.ndarray, *, step: float = 0.3, iters: int = 400, tol: float = 1e-10) -> np.ndarray:
    """Plain Nelder-Mead (no scipy in the base install)."""
    n = len(x0)
    simplex = [x0.copy()] + [x0 + step * np.eye(n)[i] for i in range(n)]
    vals = [f(x) for x in simplex]
    for _ in range(iters):
        order = np.argsort(vals)
        simplex = [simplex[i] for i in order]
        vals = [vals[i] for i in order]
        if abs(vals[-1] - vals[0]) <= tol * (abs(vals[0]) + tol):
            break
        c = np.mean(simplex[:-1], axis=0)
        xr = c + (c - simplex[-1])
        fr = f(xr)
        if fr < vals[0]:
            xe = c + 2.0 * (c - simplex[-1])
            fe = f(xe)
            simplex[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            simplex[-1], vals[-1] = xr, fr
        else:
            xc = c + 0.5 * (simplex[-1] - c)
            fc = f(xc)
            if fc < vals[-1]:
                simplex[-1], vals[-1] = xc, fc
            else:
                simplex = [simplex[0]] + [simplex[0] + 0.5 * (s - simplex[0]) for s in simplex[1:]]
                vals = [vals[0]] + [f(s) for s in simplex[1:]]
    return simplex[int(np.argmin(vals))]


@dataclass
class FitResult:
    params: CostModel
    rms_log_error: float  # root mean square of log(predicted / measured) over the fitted rows
    rows: int
    fitted: tuple[str, ...]
    sources: list[str] = field(default_factory=list)


def _trace_init(init: CostModel, kernels: pd.DataFrame | None, runtime: pd.DataFrame | None) -> tuple[CostModel, list[str]]:
    """Starting values from trace tables (columns name, start_ns, end_ns): median launch-call
    duration, median sync-call duration, a low percentile of kernel durations as the device floor."""
    kw, src = {}, []

    def durs(t, pat):
        m = t["name"].astype(str).str.contains(pat, case=False, regex=True)
        return (t.loc[m, "end_ns"] - t.loc[m, "start_ns"]).astype(float) / 1000.0

    if runtime is not None and len(runtime):
        m = runtime["name"].astype(str).str.contains(r"LaunchKernel|cuLaunch", case=False, regex=True)
        st = np.sort(runtime.loc[m, "start_ns"].to_numpy(dtype=np.int64))
        gaps = np.diff(st) / 1000.0
        gaps = gaps[(gaps > 0) & (gaps < 100.0)]  # launch to launch inside a busy host stretch
        if len(gaps):  # host cost of one launch = dispatch + the call: the spacing of launch calls
            kw["launch_us"] = float(np.median(gaps))
            src.append("trace:launch")
        d = durs(runtime, r"GraphLaunch")
        if len(d):
            kw["graph_launch_us"] = float(d.median())
            src.append("trace:graph_launch")
    if kernels is not None and len(kernels):
        d = (kernels["end_ns"] - kernels["start_ns"]).astype(float) / 1000.0
        if len(d):
            kw["kernel_us"] = max(float(np.percentile(d, 10)), 0.5)
            src.append("trace:kernel_floor")
    return init.with_(**kw), src


def fit(sweep: pd.DataFrame | None = None, *, traces: Iterable | None = None, kernels: pd.DataFrame | None = None,
        runtime: pd.DataFrame | None = None, init: CostModel = CostModel(),
        params: Sequence[str] = FIT_PARAMS, iters: int = 400) -> FitResult:
    """Fit the cost model to recorded data.

    Trace tables (kernels/runtime calls with name, start_ns, end_ns) give starting values; `traces`
    (recorded trace files or TraceTables with labels) give both starting values and rows
    (`trace_rows`); the sweep (bench.py CSV: preset, layers, tokens, guard, active, rank, mode,
    median_us) and the trace rows are then matched by
    minimising the squared log-ratio of simulated to measured forward time over the chosen
    parameters (Nelder-Mead in log space: all parameters stay positive). Without a sweep only the
    trace starting values are returned.
    """
    if traces is not None:
        from ..instruments import trace as T

        tabs = [T.load_trace(t) for t in traces]
        ks = [t.kernels for t in tabs] + ([kernels] if kernels is not None else [])
        rs = [t.runtime for t in tabs] + ([runtime] if runtime is not None else [])
        kernels = pd.concat(ks, ignore_index=True) if ks else None
        runtime = pd.concat(rs, ignore_index=True) if rs else None
        tr = trace_rows(tabs)
        sweep = tr if sweep is None else pd.concat([sweep, tr], ignore_index=True)
    start, src = _trace_init(init, kernels, runtime)
    if sweep is None or not len(sweep):
        return FitResult(start, float("nan"), 0, (), src)
    d = _clean_sweep(sweep)
    if not len(d):
        raise ValueError("the sweep has no usable rows (all errored or non-positive)")
    names = tuple(params)
    bad = [p for p in names if p not in {f.name for f in fields(CostModel)}]
    if bad:
        raise ValueError(f"unknown cost-model parameters {bad}")
    rows = [_row_kwargs(r) for r in d.to_dict("records")]
    specs = []
    for r in rows:  # the work of each row does not depend on the parameters: build it once
        shape, L, graph = _check_forward(r["shape"], r["layers"], r["mode"])
        kw = {k: v for k, v in r.items() if k not in ("shape", "tokens", "guard", "layers", "mode")}
        specs.append((layer_spec(shape, r["tokens"], r["guard"], graph=graph, **kw), L, graph))
    meas = np.log(d["median_us"].astype(float).to_numpy())
    # graph rows carry no information on eager/sync costs and vice versa; drop parameters no row
    # can see so they do not wander.
    modes = {r["mode"] for r in rows}
    guards = {r["guard"] for r in rows}
    names = tuple(p for p in names if not (p == "graph_launch_us" and "graph" not in modes)
                  and not (p == "sync_us" and not ({"sync"} & guards and "eager" in modes))
                  and not (p == "launch_us" and "eager" not in modes))
    # Log-space search: a parameter whose start is 0 (e.g. triton_extra_us) starts at 1 us instead.
    start = start.with_(**{p: 1.0 for p in names if getattr(start, p) <= 0})
    x0 = np.log([getattr(start, p) for p in names])

    def model(x):
        return start.with_(**{p: float(v) for p, v in zip(names, np.exp(x))})

    def loss(x):
        if np.any(np.abs(x - x0) > math.log(1e3)):  # stay within 1000x of the start: no runaway values
            return 1e30
        pm = model(x)
        pred = np.log([_fast_forward_us(_costs(s, pm, g, 1), L, pm.graph_launch_us if g else 0.0)[0]
                       for s, L, g in specs])
        return float(np.mean((pred - meas) ** 2))

    x = x0
    for _ in range(3):  # restarts: Nelder-Mead stalls on the max() kinks of the queue model
        x = _nelder_mead(loss, x, iters=iters)
    pm = model(x)
    return FitResult(pm, math.sqrt(loss(x)), len(rows), names, src + ["sweep"])


def validate(sweep: pd.DataFrame, params: CostModel, *, target_pct: float = 15.0) -> pd.DataFrame:
    """Predicted vs measured, per guard (and mode): n, mean/max absolute % error, share of rows
    within `target_pct`, and whether every row is within it."""
    p = predict(sweep, params)
    p["abs_err_pct"] = p["error_pct"].abs()
    keys = ["guard"] + (["mode"] if "mode" in p.columns else [])
    g = p.groupby(keys, sort=True)
    t = pd.DataFrame({
        "n": g.size(),
        "mean_abs_err_pct": g["abs_err_pct"].mean(),
        "max_abs_err_pct": g["abs_err_pct"].max(),
        "within_target_frac": g["abs_err_pct"].apply(lambda s: float((s <= target_pct).mean())),
    }).reset_index()
    t["target_pct"] = target_pct
    t["ok"] = t["max_abs_err_pct"] <= target_pct
    return t


