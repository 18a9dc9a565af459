"""Fit the cost model to recorded GPU data, and check it: predict / fit / validate (in-sample) /
holdout (points the fit did not see) against sweep rows (instruments/recorders/bench.py's schema, or the
archived guards recording's `as_sweep()`) and recorded traces."""
from __future__ import annotations

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
    studies/traces/record.py stores: preset, num_layers, guard, mode, M, adapters, max_rank, dtype),
    one per trace: median over its forwards of (end of the last GPU op - start of the forward on the
    host), the quantity bench.py times with CUDA events. Also the measured kernels per forward
    beside the model's count (`model_kernels`), a check of DEFAULT_LAUNCHES."""
    from ..instruments.analysers import trace as T

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

# Where each fitted parameter may go (wide, but physical for an H200 host + GPU): the fit runs in
# log space inside these bounds, so no parameter can run away to where no row constrains it.
FIT_BOUNDS = {
    "launch_us": (0.5, 200.0),  # one eager launch: a C++ cudaLaunchKernel (~2 us) .. a slow Python path
    "sync_us": (0.1, 2000.0),  # host work after a sync returns, before the next launch
    "graph_launch_us": (1.0, 5000.0),  # one cudaGraphLaunch of a whole forward
    "kernel_us": (0.1, 50.0),  # fixed device time per kernel (launch latency, tail of a small grid)
    "tflops": (10.0, 2000.0),  # H200 dense bf16 peak is ~990 TFLOP/s
    "tbps": (0.1, 6.0),  # H200 HBM3e peak is 4.8 TB/s
    "triton_extra_us": (0.1, 1000.0),  # a Triton kernel's Python launcher over a PyTorch op's launch
    "host_layer_us": (0.1, 1000.0),  # serving-engine Python per layer that launches nothing
    "skew_us": (0.1, 1000.0),  # how much later the slowest TP rank reaches a collective
}
# The model's own error, as a log ratio: a measurement whose 95 % interval is tighter than this
# does not weigh more than one that is this tight (the model cannot be right to 1 %).
MODEL_SIGMA = 0.05


@dataclass
class FitResult:
    params: CostModel
    rms_log_error: float  # root mean square of log(predicted / measured) over the fitted rows
    rows: int
    fitted: tuple[str, ...]
    sources: list[str] = field(default_factory=list)
    at_bound: tuple[str, ...] = ()  # fitted parameters that ended on a bound of FIT_BOUNDS


def _trace_init(init: CostModel, kernels: pd.DataFrame | None,
                runtime: pd.DataFrame | None) -> tuple[CostModel, list[str]]:
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


def _log_sigma(d: pd.DataFrame) -> np.ndarray:
    """Per row, the measurement's spread as a log ratio: half the 95 % interval's log width / 1.96
    (0 where the row has no interval), combined with MODEL_SIGMA."""
    s = np.zeros(len(d))
    if {"lo95_us", "hi95_us"} <= set(d.columns):
        lo, hi = d["lo95_us"].astype(float).to_numpy(), d["hi95_us"].astype(float).to_numpy()
        ok = np.isfinite(lo) & np.isfinite(hi) & (lo > 0) & (hi >= lo)
        s[ok] = (np.log(hi[ok]) - np.log(lo[ok])) / (2 * 1.96)
    return np.sqrt(s ** 2 + MODEL_SIGMA ** 2)


def fit(sweep: pd.DataFrame | None = None, *, traces: Iterable | None = None, kernels: pd.DataFrame | None = None,
        runtime: pd.DataFrame | None = None, init: CostModel = CostModel(),
        params: Sequence[str] = FIT_PARAMS) -> FitResult:
    """Fit the cost model to recorded data; deterministic (same rows -> same numbers).

    Trace tables (kernels/runtime calls with name, start_ns, end_ns) give starting values; `traces`
    (recorded trace files or TraceTables with labels) give both starting values and rows
    (`trace_rows`). The sweep rows (bench.py schema, or `Recording.as_sweep()`: preset, layers,
    tokens, guard, active, rank, mode, median_us, optionally lo95_us/hi95_us) are then matched by
    `scipy.optimize.least_squares` (trust-region reflective) over the log of each parameter inside
    FIT_BOUNDS, residual log(predicted / measured) per row divided by the row's spread
    (`_log_sigma`). Without a sweep only the starting values are returned.
    """
    from scipy.optimize import least_squares

    if traces is not None:
        from ..instruments.analysers import trace as T

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
    bad = [p for p in names if p not in {f.name for f in fields(CostModel)} or p not in FIT_BOUNDS]
    if bad:
        raise ValueError(f"unknown cost-model parameters {bad} (fittable: {sorted(FIT_BOUNDS)})")
    rows = [_row_kwargs(r) for r in d.to_dict("records")]
    specs = []
    for r in rows:  # the work of each row does not depend on the parameters: build it once
        shape, L, graph = _check_forward(r["shape"], r["layers"], r["mode"])
        kw = {k: v for k, v in r.items() if k not in ("shape", "tokens", "guard", "layers", "mode")}
        specs.append((layer_spec(shape, r["tokens"], r["guard"], graph=graph, **kw), L, graph))
    meas = np.log(d["median_us"].astype(float).to_numpy())
    weight = 1.0 / _log_sigma(d)
    # graph rows carry no information on eager/sync costs and vice versa; drop parameters no row
    # can see so they keep their starting value instead of wandering.
    modes = {r["mode"] for r in rows}
    guards = {r["guard"] for r in rows}
    names = tuple(p for p in names if not (p == "graph_launch_us" and "graph" not in modes)
                  and not (p == "sync_us" and not ({"sync"} & guards and "eager" in modes))
                  and not (p == "launch_us" and "eager" not in modes)
                  and not (p == "triton_extra_us" and "eager" not in modes))
    lo = np.log([FIT_BOUNDS[p][0] for p in names])
    hi = np.log([FIT_BOUNDS[p][1] for p in names])
    # fixed start: the starting model, clipped just inside the bounds (a 0 start, e.g.
    # triton_extra_us, starts at 1 us)
    x0 = np.log([getattr(start, p) if getattr(start, p) > 0 else 1.0 for p in names])
    x0 = np.clip(x0, lo + 1e-6, hi - 1e-6)

    def model(x):
        return start.with_(**{p: float(v) for p, v in zip(names, np.exp(x))})

    def log_pred(x):
        pm = model(x)
        return np.log([_fast_forward_us(_costs(s, pm, g, 1), L, pm.graph_launch_us if g else 0.0)[0]
                       for s, L, g in specs])

    if names:
        # each finite-difference step moves a parameter by 0.1 % (diff_step): wide enough to step
        # over the queue model's max() kinks (host-bound vs device-bound) instead of reading a zero
        # slope between them
        res = least_squares(lambda x: weight * (log_pred(x) - meas), x0, bounds=(lo, hi), method="trf",
                            diff_step=1e-3, x_scale=1.0, xtol=1e-10, ftol=1e-10, gtol=1e-10, max_nfev=400)
        x = res.x
    else:
        x = x0
    err = log_pred(x) - meas
    at = tuple(p for p, v, a, b in zip(names, x, lo, hi) if v - a < 1e-3 or b - v < 1e-3)
    return FitResult(model(x), float(np.sqrt(np.mean(err ** 2))), len(rows), names, src + ["sweep"], at)


def judge(pred: pd.DataFrame, *, target_pct: float = 15.0) -> pd.DataFrame:
    """The pass rule, per row of `predict`'s table: a prediction passes when it is within
    +-target_pct of the measured median, or inside the measurement's 95 % interval where that
    interval is wider (a noisy point cannot be asked to match better than it was measured).
    Adds in_interval, within_target, passes and, for a miss, why."""
    p = pred.copy()
    lo = p["lo95_us"].astype(float) if "lo95_us" in p else pd.Series(np.nan, index=p.index)
    hi = p["hi95_us"].astype(float) if "hi95_us" in p else pd.Series(np.nan, index=p.index)
    p["lo95_us"], p["hi95_us"] = lo, hi
    p["in_interval"] = (p["predicted_us"] >= lo) & (p["predicted_us"] <= hi)
    p["within_target"] = p["error_pct"].abs() <= target_pct
    p["passes"] = p["within_target"] | p["in_interval"]
    half = 100.0 * (hi - lo) / 2.0 / p["median_us"].astype(float)
    p["why"] = [
        "" if ok else (f"predicted {e:+.1f} % ({'above' if e > 0 else 'below'} the measured median); "
                       + (f"its 95 % interval is only +-{h:.2g} %" if np.isfinite(h) else "no interval recorded"))
        for ok, e, h in zip(p["passes"], p["error_pct"], half)]
    p["target_pct"] = target_pct
    return p


def summarize(points: pd.DataFrame) -> pd.DataFrame:
    """Per guard and mode: points, how many pass, mean and max |error| %, ok when all pass."""
    keys = ["guard"] + (["mode"] if "mode" in points.columns else [])
    p = points.assign(abs_err_pct=points["error_pct"].abs(), passes=points["passes"].astype(bool))
    g = p.groupby(keys, sort=True)
    t = pd.DataFrame({"n": g.size(), "passed": g["passes"].sum().astype(int),
                      "mean_abs_err_pct": g["abs_err_pct"].mean(),
                      "max_abs_err_pct": g["abs_err_pct"].max()}).reset_index()
    t["ok"] = t["passed"] == t["n"]
    return t


POINT_COLUMNS = ["fold", "preset", "layers", "tokens", "guard", "mode", "active", "median_us", "lo95_us", "hi95_us",
                 "predicted_us", "error_pct", "in_interval", "within_target", "passes", "why"]


@dataclass
class Validation:
    """Every validated point (`points`: predicted vs measured median, the 95 % interval, error %,
    pass / miss and why) and its per-guard `summary`."""
    points: pd.DataFrame
    target_pct: float = 15.0
    how: str = ""

    @property
    def summary(self) -> pd.DataFrame:
        return summarize(self.points)

    @property
    def misses(self) -> pd.DataFrame:
        return self.points[~self.points["passes"].astype(bool)]

    @property
    def ok(self) -> bool:
        return bool(self.points["passes"].all())

    def report(self) -> str:
        """The summary and the misses only (not every point)."""
        n, k = len(self.points), int(self.points["passes"].sum())
        head = (f"{k} of {n} points pass (within +-{self.target_pct:g} % of the measured median, or inside its "
                f"95 % interval where that is wider){'; ' + self.how if self.how else ''}")
        lines = [head, self.summary.round(1).to_string(index=False)]
        m = self.misses
        if len(m):
            lines.append(f"{len(m)} miss(es):")
            for r in m.itertuples():
                lines.append(f"  {r.preset} M={r.tokens} active={r.active:g} {r.guard}/{r.mode}: measured "
                             f"{r.median_us:.0f} us, predicted {r.predicted_us:.0f} us: {r.why}")
        return "\n".join(lines)


def validate(sweep: pd.DataFrame, params: CostModel, *, target_pct: float = 15.0) -> Validation:
    """Every row of `sweep` predicted with `params` and judged (`judge`): in-sample when `params`
    were fitted on these rows; `holdout` validates on rows the fit did not see."""
    p = judge(predict(sweep, params), target_pct=target_pct).assign(fold="in-sample")
    return Validation(p[[c for c in POINT_COLUMNS if c in p.columns]], target_pct, "in-sample")


def holdout(sweep: pd.DataFrame, *, by: str = "tokens", target_pct: float = 15.0, **fit_kw) -> Validation:
    """Held-out validation, k-fold by `by` (default: leave one token count out): for each value v
    of `by`, fit on every row whose `by` differs from v and predict the rows at v. Every row is
    predicted exactly once by a fit that never saw it; the folds are sorted, so the split is
    deterministic. At the smallest and largest token counts this is an extrapolation."""
    d = _clean_sweep(sweep)
    vals = sorted(d[by].unique())
    if len(vals) < 2:
        raise ValueError(f"held-out validation needs at least two values of {by!r}, got {vals}")
    out = []
    for v in vals:
        f = fit(d[d[by] != v], **fit_kw)
        out.append(judge(predict(d[d[by] == v], f.params), target_pct=target_pct).assign(fold=f"{by}={v}"))
    p = pd.concat(out, ignore_index=True)
    what = "token count" if by == "tokens" else f"{by} value"
    return Validation(p[[c for c in POINT_COLUMNS if c in p.columns]], target_pct,
                      f"held out: leave one {what} out, {len(vals)} folds")


def diagnose(points: pd.DataFrame, params: CostModel) -> pd.DataFrame:
    """Why each held-out miss misses, from the model itself: simulate the point with `params` and
    say which side of the queue sets its time. `bound`:
      host    the host's issue time (launches, Python, syncs) exceeds the GPU's busy time: the
              point is set by the per-launch host costs (launch_us, triton_extra_us, sync_us), one
              number each for every op and size, so a miss says the real host cost per launch at
              this size is not that number;
      device  the GPU's busy time exceeds the host's: the point is set by the kernel-time model
              (kernel_us, tflops, tbps), which has one math and one memory rate for every kernel
              shape, so a miss says these kernels run at another rate at this size;
    with host_share = host issue time / forward and device_share = GPU busy / forward."""
    rows = []
    for r in points.to_dict("records"):
        o = simulate_forward(params=params, **_row_kwargs(r))
        issue = o.host_end_us - o.host_blocked_us
        bound = "host" if issue > o.device_busy_us else "device"
        rows.append(dict(host_share=issue / o.forward_us, device_share=o.device_busy_us / o.forward_us, bound=bound))
    d = pd.concat([points.reset_index(drop=True), pd.DataFrame(rows)], axis=1)
    side = {"host": "the per-launch host costs (launch_us, triton_extra_us, sync_us)",
            "device": "the kernel-time model (kernel_us, tflops, tbps)"}
    d["why"] = [
        w if ok else (f"{w}. The model makes this point {b}-bound (host issue {h:.0%} of the forward, GPU busy "
                      f"{g:.0%}): {side[b]} set it, one value for every op and size, and the measurement says "
                      f"they are {'lower' if e > 0 else 'higher'} here")
        for ok, w, b, h, g, e in zip(d["passes"], d["why"], d["bound"], d["host_share"], d["device_share"],
                                     d["error_pct"])]
    return d
