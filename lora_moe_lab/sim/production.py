"""Extrapolation to the production setting (TP ranks, 48 layers, a 128 x 2048 prefill in chunks)
and what-ifs, beside the production figures this lab is about."""
from __future__ import annotations

import math
from dataclasses import fields
from typing import Iterable

import numpy as np
import pandas as pd

from ..config import get_shape
from ..model.guards import guard_names
from .cost import CostModel, forward_us, simulate_forward
from .fit import fit, predict, trace_rows, validate

# Production figures this lab is about (docs/design.md): Qwen3-30B-A3B, TP=4, 48 MoE layers, batch 128,
# input length 2048, guard removed.
PRODUCTION = {
    "syncs_per_forward": 260.0,
    "stall_ms_per_forward": 100.0,
    "input_throughput_gain_pct": 14.4,
    "ttft_change_pct": -12.6,
}
PRODUCTION["stall_us_per_sync"] = 1000.0 * PRODUCTION["stall_ms_per_forward"] / PRODUCTION["syncs_per_forward"]
# What kind of time those figures are (sgl-project/sglang#25531's trace): the ~100 ms per forward is
# time the HOST spent blocked in cudaStreamSynchronize, not GPU time lost, and ~70 ms of it is the
# first sync of the forward ("it drains the entire pending GPU stream"); the other 259 share ~30 ms.
# sgl-project/sglang#24246 (GB300, TP=4): an average `bool .item()` took 291 us with LoRA, 7 us
# without. sgl-project/sglang#24262: removing per-layer host stalls cut NCCL all-reduce kernel time
# ~68 % (all-reduce kernels spin while another rank's host is stalled).
PRODUCTION_SIGNATURE = {
    "host_blocked_ms_per_forward": PRODUCTION["stall_ms_per_forward"],
    "first_sync_ms": 70.0,
    "syncs_per_forward": PRODUCTION["syncs_per_forward"],
    "gb300_item_us": 291.0,
    "gb300_item_no_lora_us": 7.0,
    "nccl_allreduce_cut_pct": 68.0,
}
PRODUCTION_SIGNATURE["first_share"] = PRODUCTION_SIGNATURE["first_sync_ms"] / PRODUCTION["stall_ms_per_forward"]
PRODUCTION_SIGNATURE["later_blocked_mean_us"] = 1000.0 * (
    PRODUCTION["stall_ms_per_forward"] - PRODUCTION_SIGNATURE["first_sync_ms"]) / (PRODUCTION["syncs_per_forward"] - 1)


def production_forward_ms() -> float:
    """The forward time without the stall that production's figures imply: a gain g from removing
    a stall S per forward means S / F = g, so F = S / g (about 0.7 s)."""
    return PRODUCTION["stall_ms_per_forward"] / (PRODUCTION["input_throughput_gain_pct"] / 100.0)


def extrapolate(params: CostModel = CostModel(), *, preset: str = "qwen3-30b-a3b-tp4", layers: int = 48,
                batch: int = 128, input_len: int = 2048, chunks: Iterable[int] = (8192, 16384),
                guards: Iterable[str] | None = None, active: float = 0.5, rank: int = 16, tp: int = 4,
                collective: bool = True, syncs_per_layer: int = 1, modes: Iterable[str] = ("eager",)) -> pd.DataFrame:
    """Predicted prefill of `batch` x `input_len` tokens in chunks of `chunk` tokens, per guard.

    One forward = one chunk through `layers` layers with TP-rank shapes and one all-reduce per
    layer. stall_ms_per_forward is the forward time lost to syncs (forward time minus the cpu_flag
    forward time with the same chunk). The model covers the MoE blocks only (no attention, no
    sampling): absolute times are below a serving engine's, the sync cost is not.
    """
    shape = get_shape(preset)
    guards = guard_names() if guards is None else guards
    total = batch * input_len
    rows = []
    for chunk in chunks:
        n_fwd = math.ceil(total / chunk)
        for mode in modes:
            for guard in guards:
                r = simulate_forward(shape, chunk, guard, layers=layers, mode=mode, params=params, active=active,
                                     rank=rank, tp=tp, collective=collective, syncs_per_layer=syncs_per_layer)
                rows.append(dict(preset=preset, layers=layers, tokens=chunk, chunks_per_batch=n_fwd, mode=mode,
                                 guard=guard, active=active, syncs_per_layer=syncs_per_layer,
                                 forward_ms=r.forward_us / 1e3, syncs_per_forward=r.syncs,
                                 device_idle_ms=r.device_idle_us / 1e3, sync_stall_ms=r.sync_stall_us / 1e3,
                                 prefill_ms=n_fwd * r.forward_us / 1e3,
                                 input_tok_per_s=total / (n_fwd * r.forward_us * 1e-6)))
    df = pd.DataFrame(rows)
    ref = df[df["guard"] == "cpu_flag"].set_index(["tokens", "mode"])["forward_ms"]
    base = df.set_index(["tokens", "mode"]).index.map(lambda k: ref.get(k, np.nan))
    df["stall_ms_per_forward"] = df["forward_ms"].to_numpy() - np.asarray(base, dtype=float)
    syn = df[df["guard"] == "sync"].set_index(["tokens", "mode"])["forward_ms"]
    sbase = np.asarray(df.set_index(["tokens", "mode"]).index.map(lambda k: syn.get(k, np.nan)), dtype=float)
    df["throughput_gain_vs_sync_pct"] = 100.0 * (sbase / df["forward_ms"] - 1.0)
    df["ttft_change_vs_sync_pct"] = 100.0 * (df["forward_ms"] / sbase - 1.0)
    return df


HOST_BLOCKED_METRICS = ("stall_ms_per_forward", "stall_us_per_sync")


def compare_production(extrap: pd.DataFrame, *, fix: str = "cpu_flag") -> pd.DataFrame:
    """Predicted (sync guard vs the fix) beside the production figures, one row per metric and chunk."""
    rows = []
    for (tokens, mode), g in extrap.groupby(["tokens", "mode"], sort=True):
        s = g[g["guard"] == "sync"]
        f = g[g["guard"] == fix]
        if not len(s) or not len(f):
            continue
        s, f = s.iloc[0], f.iloc[0]
        pred = {
            "syncs_per_forward": float(s["syncs_per_forward"]),
            "stall_ms_per_forward": float(s["forward_ms"] - f["forward_ms"]),
            "input_throughput_gain_pct": 100.0 * (s["forward_ms"] / f["forward_ms"] - 1.0),
            "ttft_change_pct": 100.0 * (f["forward_ms"] / s["forward_ms"] - 1.0),
        }
        pred["stall_us_per_sync"] = (1000.0 * pred["stall_ms_per_forward"] / pred["syncs_per_forward"]
                                     if pred["syncs_per_forward"] else np.nan)
        for m, v in pred.items():
            # production's stall figures are host time blocked in the syncs; the model's are GPU time
            # lost (forward difference): not the same quantity, so no ratio is formed
            same = m not in HOST_BLOCKED_METRICS
            prod = PRODUCTION[m] if same else np.nan
            rows.append(dict(tokens=tokens, mode=mode, metric=m, predicted=v, production=prod,
                             ratio=v / prod if same and prod else np.nan,
                             note="" if same else (f"production's {PRODUCTION[m]:g} is host time blocked, "
                                                   f"not time lost")))
    return pd.DataFrame(rows)


def sync_us_to_match(params: CostModel = CostModel(), *, target_us_per_sync: float = PRODUCTION["stall_us_per_sync"],
                     preset: str = "qwen3-30b-a3b-tp4", tokens: int = 16384, layers: int = 48, tp: int = 4,
                     collective: bool = True, active: float = 0.5, **kw) -> float:
    """The host time between a sync and the next launch (`sync_us`) at which one sync costs
    `target_us_per_sync` of forward time (default: production's 100 ms / 260 syncs), by bisection.
    It answers "how much host work after each sync would explain production's stall?"."""
    args = dict(layers=layers, tp=tp, collective=collective, active=active, **kw)

    def per_sync(s: float) -> float:
        p = params.with_(sync_us=s)
        ts = forward_us(preset, tokens, "sync", params=p, **args)
        tc = forward_us(preset, tokens, "cpu_flag", params=p, **args)
        return (ts - tc) / (layers * kw.get("syncs_per_layer", 1))

    lo, hi = 0.0, 1.0
    if per_sync(lo) >= target_us_per_sync:
        return 0.0
    while per_sync(hi) < target_us_per_sync:
        hi *= 2.0
        if hi > 1e7:
            raise ValueError("no sync overhead below 10 s reaches the target")
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if per_sync(mid) < target_us_per_sync else (lo, mid)
    return 0.5 * (lo + hi)


def what_if(params: CostModel = CostModel(), *, vary: str = "launch_us", values: Iterable[float] = (),
            preset: str = "qwen3-30b-a3b-tp4", layers: int = 48, tokens: int = 16384,
            guards: Iterable[str] | None = None, mode: str = "eager", **kw) -> pd.DataFrame:
    """Forward time per guard while one knob moves: a cost-model field (launch_us, sync_us,
    host_layer_us, ...) or "tokens" (per-layer work)."""
    guards = guard_names() if guards is None else guards
    rows = []
    for v in values:
        p, t = params, tokens
        if vary == "tokens":
            t = int(v)
        elif vary in {f.name for f in fields(CostModel)}:
            p = params.with_(**{vary: float(v)})
        else:
            raise ValueError(f"cannot vary {vary!r}: use 'tokens' or a CostModel field")
        for g in guards:
            r = simulate_forward(preset, t, g, layers=layers, mode=mode, params=p, **kw)
            rows.append(dict(vary=vary, value=float(v), guard=g, tokens=t, forward_ms=r.forward_us / 1e3,
                             syncs=r.syncs, device_idle_ms=r.device_idle_us / 1e3))
    return pd.DataFrame(rows)


def scale_model_report(sweep: pd.DataFrame | None = None, *, traces: Iterable | None = None,
                       init: CostModel = CostModel(), chunks: Iterable[int] = (8192, 16384),
                       target_pct: float = 15.0, **extrap_kw) -> dict:
    """Everything notebook 05 shows, from recorded data in one call: the fit, predictions beside
    measurements, the per-guard validation table, the production-shape extrapolation, its
    comparison with the production figures, and the sync overhead that would explain production's
    stall per sync. (The archived guards recording goes through sim/calibration.py instead.)"""
    f = fit(sweep, traces=traces, init=init)
    rows = sweep
    if traces is not None:
        tr = trace_rows(traces)
        rows = tr if rows is None else pd.concat([rows, tr], ignore_index=True)
    ex = extrapolate(f.params, chunks=chunks, **extrap_kw)
    return dict(fit=f, params=pd.Series(f.params.as_dict(), name="value"),
                predictions=predict(rows, f.params) if rows is not None else None,
                validation=validate(rows, f.params, target_pct=target_pct).summary if rows is not None else None,
                extrapolation=ex, comparison=compare_production(ex),
                sync_us_to_match=sync_us_to_match(f.params, tokens=max(chunks)))
