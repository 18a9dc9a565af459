"""The probe: what the fix buys on THIS machine, predicted from the host's lead, then measured.

    make gpu-probe                                              # about two minutes on an H200
    python -m lora_moe_lab.instruments.recorders.probe --reps 10 --out build/probe.csv
    python -m lora_moe_lab.instruments.recorders.probe --smoke  # CPU: a tiny model, the pipeline only

The Qwen3-30B-A3B-shaped decoder (48 layers, bf16, 260 guard syncs per forward, no adapter in use)
prefills 64 requests x 2048 tokens in chunks of C=16384 tokens, the lab's lean-host regime
(docs/glossary.md). Three steps, printed as they finish:

  1. lead     three `sync` prefills after a warm-up: the median host time blocked in the later syncs
              of a forward (`lead_us`), i.e. how far this host runs ahead of this GPU
  2. predict  the gain the recorded relation gives (analysers/host_lead.py over the catalog's
              "probe.points": every recorded session's points): each sync's recorded saving over the
              `sync` forward this GPU just ran (the relation that carries across GPU models)
  3. measure  `sync` against `cpu_flag`, interleaved paired repetitions after one untimed prefill
              each, the warm-up drift check, and the fix's input-throughput gain with its paired
              bootstrap 95 % interval (prefill.summarize)

`--host-us-per-layer` adds engine host work per layer (a stand-in for a slower host): the study
(studies/probe/record.py) records the relation's points with it.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ...provenance import catalog, host_state, metadata
from ..analysers import host_lead
from . import prefill as P
from .cli import arg_type, pos_int

GUARD_SITES = 260 / 48  # production's 260 guard syncs per forward over 48 layers
LEAD_RUNS = 3
BLOCKS = 3  # blocks of paired repetitions tried before the probe says the timings never settled
nonneg_float = arg_type(float, lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0")


def build(smoke: bool):
    """The decoder lab and the prefill plan of the lean regime (tiny shapes under --smoke)."""
    # None: the preset's 48 layers, or as many as this card holds (model/sizing.py); the guard syncs stay
    # production's per-layer rate, so the gain is the same quantity at any layer count
    preset, layers, L, C, R = ("tiny", 2, 8, 16, 8) if smoke else ("qwen3-30b-a3b", None, 2048, 16384, 64)
    lab = P.build(preset, layers, max_loras=4, max_rank=16, dtype="auto", device="auto", backend="auto", seed=0,
                  guard_sites=GUARD_SITES)
    names = P.load_adapters(lab, 2, 16)
    return lab, P.make_plan(R, L, C), names


def measure_lead(driver: P.PrefillDriver, runs: int = LEAD_RUNS) -> dict:
    """Median over `runs` sync prefills of their later syncs' median blocked time (the host's lead)."""
    res = [driver.run("sync") for _ in range(runs)]
    return dict(lead_us=float(np.median([r["later_blocked_median_us"] for r in res])),
                lead_mean_us=float(np.median([r["later_blocked_mean_us"] for r in res])),
                host_blocked_ms=float(np.median([r["host_blocked_ms"] for r in res])),
                sync_forward_ms=float(np.median([r["forward_median_ms"] for r in res])))


def launch_us(lab, n: int = 2000) -> float:
    """Host time per launch of a tiny kernel (a 1-element add), the host's own speed at issuing work,
    independent of the model: the queue stays far from full in n launches, so nothing here waits."""
    import torch

    a = torch.zeros(1, device=lab.device)
    for _ in range(200):
        a.add_(1.0)
    P.runtime.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        a.add_(1.0)
    dt = time.perf_counter() - t
    P.runtime.synchronize()
    return dt / n * 1e6


def relation(path=None, exclude: str | None = None, kind: str = "saving"):
    """The recorded relation (catalog "probe.points"): "saving" (per-sync saving over the measured forward, the
    one that carries across GPU models) or "lead" (gain on lead); None when there is none to read."""
    try:
        p = Path(path) if path else catalog("probe.points")
    except (KeyError, FileNotFoundError):  # no catalog, or no entry: nothing recorded yet
        return None
    if not Path(p).exists():
        return None
    from ..analysers import schemas
    pts = host_lead.points([schemas.read_csv(p, "probe_points")])  # sealed, schema and ranges checked
    try:
        return host_lead.fit_saving(pts, exclude=exclude) if kind == "saving" else host_lead.fit(pts, exclude)
    except host_lead.RelationError:
        return None


def probe(lab, plan, names, *, reps: int = 10, host_us_per_layer: float = 0.0, rel=None, log=print) -> dict:
    """One point: the lead, the prediction (NaN without a relation), the measured gain."""
    costs = P.EngineCosts(host_us_per_layer=host_us_per_layer)
    d = P.PrefillDriver(lab, plan, P.request_adapters(plan.requests, "none", names), costs=costs)
    for g in ("sync", "cpu_flag"):
        d.warmup(g)
    t = time.monotonic()
    lead = dict(measure_lead(d), launch_us=launch_us(lab))
    n_syncs = GUARD_SITES * lab.shape.num_layers
    pred = rel.predict(lead["sync_forward_ms"], n_syncs) if rel is not None else math.nan
    log(f"lead: the later syncs block the host {lead['lead_us']:.0f} us (median); a sync forward takes "
        f"{lead['sync_forward_ms']:.1f} ms with {n_syncs:.0f} syncs"
        + (f" -> predicted gain {pred:+.1f} %  [{rel.describe()}]" if rel
           else ": no prediction (no recorded relation)"))
    key = dict(preset=lab.shape.name, layers=lab.shape.num_layers, tp=1, requests=plan.requests,
               input_len=plan.input_len, chunk=plan.chunk, guard_sites=GUARD_SITES)
    for block in range(1, BLOCKS + 1):  # a block whose timings never settle has no figure: measure another
        rows = P.measure({"none": d}, ["sync", "cpu_flag"], reps, key=key, profile=False, progress=False,
                         warmup_reps=1)
        s = P.summarize(pd.DataFrame(rows, columns=P.COLUMNS))
        srow = s[s["guard"] == "sync"].iloc[0]
        if bool(srow["stable"]):
            break
        log(f"unstable: block {block} of {BLOCKS} of {reps} paired repetitions never settled "
            f"({srow.get('warmup_note', '')})" + ("; measuring again" if block < BLOCKS else
                                                   ": no measured gain on this machine now (the row keeps stable "
                                                   "False and NaN figures; make gpu-probe exits 3)"))
    out = dict(host_us_per_layer=host_us_per_layer, **lead, predicted_gain_pct=pred,
               measured_gain_pct=float(srow["fix_throughput_gain_pct"]),
               measured_gain_pct_lo=float(srow["fix_throughput_gain_pct_lo"]),
               measured_gain_pct_hi=float(srow["fix_throughput_gain_pct_hi"]),
               reps=int(srow["reps"]), warmup_dropped=int(srow["warmup_dropped"]), stable=bool(srow["stable"]),
               ci_method=str(srow["ci_method"]), **key, seconds=round(time.monotonic() - t, 1))
    if not out["stable"]:
        return out
    log(f"measured: the fix gains {out['measured_gain_pct']:+.1f} % [{out['measured_gain_pct_lo']:+.1f}, "
        f"{out['measured_gain_pct_hi']:+.1f}] input throughput (paired bootstrap 95 %, {out['reps']} repetitions)"
        + (f"; predicted {pred:+.1f} %, error {pred - out['measured_gain_pct']:+.1f} pp" if rel else ""))
    return out


def host_columns() -> dict:
    h = host_state()
    return dict(cpu_model=h.get("cpu_model", ""), cores=h.get("cores_usable", h.get("cores")),
                cpu_mhz_max=h.get("cpu_mhz_max", math.nan), python_build=h.get("python_build", ""))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=pos_int, default=10, help="paired repetitions (>= 10 for an interval)")
    ap.add_argument("--host-us-per-layer", type=nonneg_float, nargs="+", default=[0.0],
                    help="engine host work added per layer, one point each (default 0: the lean host)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, 2 layers (CPU or GPU): the pipeline only")
    ap.add_argument("--session", default="", help="a label for the rows (the study's session)")
    ap.add_argument("--out", default=None, help="CSV to write the points to (refused if it exists)")
    a = ap.parse_args(argv)
    if a.out and Path(a.out).exists():
        ap.error(f"--out {a.out} exists: name a new file")
    if a.reps < 10 and not a.smoke:
        ap.error(f"--reps {a.reps}: an interval needs >= 10 paired repetitions")
    if not a.smoke and not torch.cuda.is_available():  # before the 48-layer model is built (tens of GB on a CPU)
        ap.error("the probe times the 48-layer decoder on a CUDA GPU and none is visible here; "
                 "--smoke runs the pipeline on tiny shapes on this machine")
    lab, plan, names = build(a.smoke)
    rel = None if a.smoke else relation(exclude=a.session or None)
    meta, host = metadata(), host_columns()
    print(f"host: {host['cpu_model']}, {host['cores']} cores; GPU: {meta['gpu']}", flush=True)
    sized = lab.sizing.meta()
    print(f"build: {lab.sizing.describe()}; allocator: {P.runtime.allocator_settings()}", flush=True)
    rows = [dict(session=a.session, **probe(lab, plan, names, reps=a.reps, host_us_per_layer=h, rel=rel), **host,
                 gpu=meta["gpu"], gpu_total_gib=sized["gpu_total_gib"], commit=meta["commit"], date=meta["date"])
            for h in a.host_us_per_layer]
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(str(a.out) + ".tmp")
        pd.DataFrame(rows).to_csv(tmp, index=False)
        tmp.replace(a.out)  # whole or not at all
        print(f"wrote {a.out}")
    return 0 if all(r["stable"] for r in rows) else 3


if __name__ == "__main__":
    sys.exit(main())
