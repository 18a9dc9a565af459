"""The canonical GPU recordings and the ONE loader each is read through: the guards (below), the
graph strategies (`load_graph_strategies`) and the kernel runs (`load_kernel_run`).

    rec = load_guards()                 # data/guards/h200_guards.csv + its .meta.json
    rec.label                           # "H200 · commit 1a2b3c4 · 2026-11-30" for every caption
    rec.summary()                       # per point and variant: median, 95 % interval, n
    rec.paired("sync", "cpu_flag")      # per point: the paired difference per repetition ->
                                        # lost_us and us_per_sync with their 95 % intervals, ratio

The recording holds every repetition (one row per sample), not only a median: the repetitions were
interleaved (each repetition runs every variant back to back in a rotating order, each from an
idle GPU), so the difference of two variants within one repetition is a paired measurement and
its spread says how much of an effect is noise.

Interval: a distribution-free 95 % confidence interval of the median from order statistics (the
k-th smallest and k-th largest of n samples, k from the binomial(n, 1/2) tails); it needs n >= 6.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ..provenance import DATA, label as _label, normalize_meta

GUARDS_CSV = DATA / "guards" / "h200_guards.csv"
KEYS = ["preset", "layers", "tokens", "active"]
SAMPLE_COLUMNS = KEYS + ["variant", "guard", "mode", "rep", "us", "syncs_per_forward"]


def median_ci(x, conf: float = 0.95) -> tuple[float, float, float]:
    """(median, lo, hi): the median and its distribution-free confidence interval."""
    s = np.sort(np.asarray(x, dtype=float))
    n = len(s)
    if n == 0:
        return (math.nan, math.nan, math.nan)
    med = float(np.median(s))
    # largest k with P(Binom(n, 1/2) <= k - 1) <= (1 - conf) / 2: then [s[k-1], s[n-k]] covers >= conf
    alpha, cdf, k = (1.0 - conf) / 2.0, 0.0, 0
    while k < n:
        p = math.comb(n, k) / 2.0 ** n
        if cdf + p > alpha:
            break
        cdf += p
        k += 1
    if k == 0:  # too few samples for this confidence: say so with an unbounded interval
        return (med, -math.inf, math.inf)
    return (med, float(s[k - 1]), float(s[n - k]))


@dataclass
class Recording:
    samples: pd.DataFrame  # one row per repetition (SAMPLE_COLUMNS)
    meta: dict = field(default_factory=dict)
    path: Path | None = None

    @property
    def label(self) -> str:
        return _label(self.meta)

    def summary(self) -> pd.DataFrame:
        """Per point and variant: median_us, lo95_us, hi95_us, n, syncs_per_forward."""
        rows = []
        for key, g in self.samples.groupby(KEYS + ["variant", "guard", "mode"], sort=True):
            med, lo, hi = median_ci(g["us"])
            rows.append(dict(zip(KEYS + ["variant", "guard", "mode"], key), median_us=med, lo95_us=lo,
                             hi95_us=hi, n=len(g), syncs_per_forward=int(g["syncs_per_forward"].iloc[0])))
        return pd.DataFrame(rows)

    def paired(self, variant: str = "sync", baseline: str = "cpu_flag") -> pd.DataFrame:
        """Per point: the per-repetition difference variant - baseline (paired: same repetition),
        its median and 95 % interval (lost_us), the same per sync of `variant` (us_per_sync), and the
        ratio of the medians."""
        s = self.samples
        a = s[s["variant"] == variant][KEYS + ["rep", "us", "syncs_per_forward"]]
        b = s[s["variant"] == baseline][KEYS + ["rep", "us"]].rename(columns={"us": "us_base"})
        j = a.merge(b, on=KEYS + ["rep"], how="inner")
        rows = []
        for key, g in j.groupby(KEYS, sort=True):
            d = g["us"] - g["us_base"]
            lost, lo, hi = median_ci(d)
            n_sync = int(g["syncs_per_forward"].iloc[0])
            per = (lambda v: v / n_sync) if n_sync else (lambda v: math.nan)
            rows.append(dict(zip(KEYS, key), variant=variant, baseline=baseline, n=len(g),
                             t_variant_us=float(g["us"].median()), t_baseline_us=float(g["us_base"].median()),
                             ratio=float(g["us"].median() / g["us_base"].median()),
                             lost_us=lost, lost_lo95_us=lo, lost_hi95_us=hi, syncs=n_sync,
                             us_per_sync=per(lost), us_per_sync_lo95=per(lo), us_per_sync_hi95=per(hi)))
        return pd.DataFrame(rows)

    def as_sweep(self) -> pd.DataFrame:
        """The summary in the benchmark-sweep row schema (instruments/bench.py), for the simulator fit
        and the widgets: one row per point and variant, with the interval as p10/p90's successors."""
        d = self.summary()
        return pd.DataFrame(dict(
            gpu=self.meta.get("gpu", ""), commit=self.meta.get("commit", ""), date=self.meta.get("date", ""),
            preset=d["preset"], layers=d["layers"], tokens=d["tokens"], guard=d["guard"], active=d["active"],
            rank=self.meta.get("params", {}).get("rank", 16), mode=d["mode"], dtype="bfloat16", backend="triton",
            requests=self.meta.get("params", {}).get("requests", 8), reps=d["n"], median_us=d["median_us"],
            lo95_us=d["lo95_us"], hi95_us=d["hi95_us"], syncs_per_forward=d["syncs_per_forward"], error=""))


def load_guards(path: str | Path | None = None) -> Recording:
    """The canonical guards recording (or another file written by scripts/gpu_side_by_side.py)."""
    path = Path(path) if path is not None else GUARDS_CSV
    if not path.exists():
        raise FileNotFoundError(f"no recording at {path}: scripts/gpu_side_by_side.py writes it on a GPU")
    df = pd.read_csv(path)
    missing = set(SAMPLE_COLUMNS) - set(df.columns)
    if missing:
        raise ValueError(f"{path} is not a guards recording (one row per repetition): missing {sorted(missing)}")
    mp = path.with_name(path.stem + ".meta.json")
    meta = normalize_meta(json.loads(mp.read_text())) if mp.exists() else {}
    return Recording(df, meta, path)


# ----------------------------------------------------------------------------------------------
# The graph-strategies recording (scripts/gpu_graphs.py -> data/graphs/strategies_*)
GRAPHS_DIR = DATA / "graphs"
STRATEGY_KEYS = ["model", "tokens", "requests", "tokens_per_request", "active"]


@dataclass
class GraphStrategiesRecording:
    capture: pd.DataFrame  # one row per (model, graph group, strategy): graphs, capture_s, pool_mib
    samples: pd.DataFrame  # one row per repetition of one whole step (pick + upload + replay)
    switches: pd.DataFrame  # replay after adapter switches vs eager
    meta: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return _label(self.meta)

    def summary(self) -> pd.DataFrame:
        """Per point and variant: median_us with its 95 % interval, and the paired per-repetition
        ratio to launch_always (median and interval)."""
        s = self.samples
        base = s[s["variant"] == "launch_always"][STRATEGY_KEYS + ["rep", "us"]].rename(columns={"us": "us_base"})
        j = s.merge(base, on=STRATEGY_KEYS + ["rep"], how="inner")
        rows = []
        for key, g in j.groupby(STRATEGY_KEYS + ["variant"], sort=True):
            med, lo, hi = median_ci(g["us"])
            r, rlo, rhi = median_ci(g["us"] / g["us_base"])
            rows.append(dict(zip(STRATEGY_KEYS + ["variant"], key), median_us=med, lo95_us=lo, hi95_us=hi, n=len(g),
                             vs_launch_always=r, vs_lo95=rlo, vs_hi95=rhi))
        return pd.DataFrame(rows)

    def table(self, model: str = "moe") -> pd.DataFrame:
        """The trade-offs in one table: per strategy, graphs captured, capture seconds, graph pool
        memory (all sizes of the model), and the median step time relative to launch_always at
        decode (1 and 64 tokens) and the largest prefill, with no adapter and with one."""
        cap = self.capture[self.capture["model"] == model].groupby("strategy", sort=False)[
            ["graphs", "capture_s", "pool_mib"]].sum()
        summ = self.summary()
        summ = summ[summ["model"] == model]
        big = int(summ["tokens"].max())
        out = cap.reset_index()
        for tokens, active in ((1, 0), (1, 1), (64, 0), (64, 1), (big, 0), (big, 1)):
            col = f"M={tokens}, {active} active"
            sel = summ[(summ["tokens"] == tokens) & (summ["active"] == active)].set_index("variant")
            out[col] = [sel["vs_launch_always"].get(v, math.nan) for v in out["strategy"]]
        return out


def load_graph_strategies(path: str | Path | None = None) -> GraphStrategiesRecording:
    d = Path(path) if path is not None else GRAPHS_DIR
    files = {n: d / f"strategies_{n}.csv" for n in ("capture", "replay", "switches")}
    for f in files.values():
        if not f.exists():
            raise FileNotFoundError(f"no recording at {f}: scripts/gpu_graphs.py writes it on a GPU")
    mp = d / "strategies_meta.json"
    meta = normalize_meta(json.loads(mp.read_text())) if mp.exists() else {}
    return GraphStrategiesRecording(*(pd.read_csv(f) for f in files.values()), meta)


# ----------------------------------------------------------------------------------------------
# The kernel runs of scripts/gpu_expand.py (data/kernels/expand_run*): tiles, bandwidth, LoRA's share
KERNELS_DIR = DATA / "kernels"


@dataclass
class KernelRun:
    rows: pd.DataFrame  # one row per (section, preset, M, op, config); sections: check, sweep, floor, layer_paired, ...
    meta: dict
    name: str

    @property
    def label(self) -> str:
        return _label(self.meta)

    def section(self, name: str) -> pd.DataFrame:
        s = self.rows[self.rows["section"] == name].copy()
        if s.empty:
            raise ValueError(f"{self.name} has no section {name!r}; it has {sorted(self.rows['section'].unique())}")
        if "M" in s:
            s["M"] = s["M"].astype(int)
        return s

    def share_floor(self) -> pd.DataFrame:
        """Per (preset, M) where the run has both the layer (paired) and the two deltas' bytes: LoRA's
        share of the base layer with all adapters active (median and 10-90 % of the paired rounds) and
        its byte floor: the bytes both deltas must move (each used adapter-expert's A and B once, x
        once, the output read and written) at the run's copy bandwidth, over the base layer's time."""
        lay = self.section("layer_paired").set_index(["preset", "M"])
        sw = self.section("sweep")
        nbytes = sw[sw["table"].astype(bool)].groupby(["preset", "M"])["bytes"].sum()
        out = lay.join(nbytes.rename("lora_bytes"), how="inner").reset_index()
        out["floor_us"] = out["lora_bytes"] / (self.meta["copy_gbps"] * 1e3)  # bytes / (GB/s) -> us
        out["floor_share"] = out["floor_us"] / out["base"]
        return out[["preset", "M", "base", "lora_all_active", "lora_share", "lora_share_p10", "lora_share_p90",
                    "lora_bytes", "floor_us", "floor_share"]]


def load_kernel_run(name: str = "expand_run7", path: str | Path | None = None) -> KernelRun:
    """One run of scripts/gpu_expand.py: `name`_kernels_expand.csv and its _meta.json in data/kernels."""
    d = Path(path) if path is not None else KERNELS_DIR
    f = d / f"{name}_kernels_expand.csv"
    if not f.exists():
        raise FileNotFoundError(f"no recording at {f}: scripts/gpu_expand.py writes it on a GPU")
    mp = d / f"{name}_kernels_expand_meta.json"
    meta = normalize_meta(json.loads(mp.read_text())) if mp.exists() else {}
    return KernelRun(pd.read_csv(f), meta, name)
