"""TP=4 EXTRAPOLATED from chunked prefills measured at TP=1 and TP=2 (instruments/recorders/prefill.py).

No machine here has four GPUs, so production's TP=4 is reached in two measured numbers and two
simulated ratios:

    F   forward time of the fix (cpu_flag) per chunk, measured at TP=n
    s   time lost per guard sync: (sync forward - cpu_flag forward) / syncs per forward, measured
    F4 = F * sim(F at TP=4) / sim(F at TP=n)      s4 = s * sim(s at TP=4) / sim(s at TP=n)

sim(.) is the queue model (sim/cost.py) at the rank's shapes (heads and expert intermediate split
over the ranks, one all-reduce per layer) with the cost model fitted to H200 recordings. The
model covers the MoE blocks only: attention is assumed to scale with TP like them (its heads
split the same way). Then, for the same number of syncs per forward N:

    throughput gain of the fix  (F4 + N s4) / F4 - 1
    TTFT change of the fix      F4 / (F4 + N s4) - 1   (every chunk is one forward: TTFT ~ forward time)

Which source to trust: measured at TP=1, kernels ran faster in the `sync` forward than in the
`cpu_flag` one (the bubbles gave the fully loaded GPU slack; data/production traces, see notebook
06), which hides part of the stall; at TP=2 they did not, and the GPU idle added by the syncs
equals the forward time lost. A TP=4 rank is loaded less still: the TP=2 row is the better
source. Every row says `extrapolated`: it is not a measurement.

    extrapolate_tp(summary)   # summary = instruments.recorders.prefill.summarize(rows)
"""
from __future__ import annotations

import pandas as pd

from ..config import get_shape
from ..instruments.analysers import schemas
from ..provenance import catalog
from .cost import CostModel, forward_us

PRESET = "qwen3-30b-a3b"


def fitted_params(path=None) -> CostModel:
    """The cost model fitted to H200 recordings (`path`, else the catalog's "simulator.fit"), else defaults."""
    try:
        p = catalog("simulator.fit") if path is None else path
        fit = schemas.read_json(p)["fitted"]
    except (FileNotFoundError, KeyError):  # no fit recorded: the defaults (a damaged file is an error)
        return CostModel()
    return CostModel(**{k: float(v) for k, v in fit.items() if k in CostModel.__dataclass_fields__})


def rank_shape(tp: int, layers: int = 48):
    """What one rank of `tp` holds of Qwen3-30B-A3B: a 1/tp share of heads and expert intermediate."""
    full = get_shape(PRESET, num_layers=layers)
    if full.intermediate % tp or full.num_heads % tp:
        raise ValueError(f"tp={tp} does not split {PRESET} (intermediate {full.intermediate}, heads {full.num_heads})")
    return full.with_(name=f"{PRESET}-tp{tp}", intermediate=full.intermediate // tp,
                      num_heads=full.num_heads // tp, num_kv_heads=max(1, full.num_kv_heads // tp))


def _sim(tp: int, tokens: int, layers: int, params: CostModel, syncs_per_layer: int, active: float):
    """(cpu_flag forward us, us lost per sync) of the queue model at one rank of `tp`."""
    kw = dict(layers=layers, params=params, tp=tp, collective=tp > 1, active=active)
    f = forward_us(rank_shape(tp, layers), tokens, "cpu_flag", **kw)
    s = forward_us(rank_shape(tp, layers), tokens, "sync", syncs_per_layer=syncs_per_layer, **kw)
    return f, (s - f) / (layers * syncs_per_layer)


def extrapolate_tp(summary: pd.DataFrame, target_tp: int = 4, params: CostModel | None = None,
                   fix: str = "cpu_flag", guard: str = "sync") -> pd.DataFrame:
    """One row per measured configuration (tp, chunk, guard_sites, adapters) that has both the
    `guard` and the `fix`: measured F and s beside the TP=`target_tp` extrapolation."""
    params = fitted_params() if params is None else params
    rows = []
    keys = ["tp", "chunk", "guard_sites", "adapters", "layers"]
    for k, g in summary.groupby(keys, sort=True):
        g = g.set_index("guard")
        if guard not in g.index or fix not in g.index:
            continue
        tp, chunk, gs, adapters, layers = k
        n = float(g.loc[guard, "syncs_per_forward"])
        F = float(g.loc[fix, "forward_median_ms"])
        s = (float(g.loc[guard, "forward_median_ms"]) - F) / n if n else float("nan")
        spl = max(1, round(n / layers))
        active = 0.5 if adapters == "mix" else 0.0
        f_src, s_src = _sim(int(tp), int(chunk), int(layers), params, spl, active)
        f_dst, s_dst = _sim(target_tp, int(chunk), int(layers), params, spl, active)
        F4 = F * f_dst / f_src
        s4 = s * (s_dst / s_src if s_src > 0 else 1.0)
        rows.append(_row("cost model", int(tp), target_tp, chunk, gs, adapters, n, F, s, F4, s4))
        rows[-1].update(sim_forward_ratio=f_dst / f_src, sim_stall_ratio=s_dst / s_src if s_src > 0 else 1.0)
    return pd.DataFrame(rows)


def _row(method, src, target_tp, chunk, gs, adapters, n, F, s, F4, s4) -> dict:
    return dict(kind="extrapolated", method=method, source_tp=src, target_tp=target_tp, chunk=int(chunk),
                guard_sites=gs, adapters=adapters, syncs_per_forward=n, forward_ms=F, stall_ms_per_sync=s,
                forward_ms_tp4=F4, stall_ms_per_sync_tp4=s4, throughput_gain_pct=100.0 * (n * s4 / F4),
                ttft_change_pct=100.0 * (F4 / (F4 + n * s4) - 1.0))
