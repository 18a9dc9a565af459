"""TP=4 PREDICTED on one GPU: a rank's shapes, each all-reduce replaced by its measured time.

No machine here has four GPUs. One rank of a TP=n group does the same work whatever the other
ranks do, except at the all-reduces, where its stream waits for theirs. So one GPU runs one rank's
shapes (model/tp.py: EmulatedTPGroup: a 1/n share of heads and expert intermediate) and each
all-reduce becomes a GPU spin of the time NCCL took for those bytes on two real H200s
(`allreduce_cost`: the median NCCL kernel of the profiled TP=2 forwards, catalog "production.traces",
as a bus bandwidth). The method is checked first where the answer is known: TP=2 emulated
against TP=2 measured on two GPUs (catalog "production.tp2_summaries"). Only then is it run at
TP=4 (studies/tp_emulation/record.py: one emulation_<session>/ folder per device session).

    cost = allreduce_cost()                 # AllReduceCost from the catalog's "tp_emulation.allreduce"
    sessions = load_sessions()              # the emulation sessions (production_runs layout)
    tp2_validation(sessions)                # emulated vs measured TP=2, per guard and for the fix
    tp4_prediction(sessions)                # the fix at TP=4, per regime and chunk, both sessions

What the emulation leaves out, said beside every figure: another rank's host stall arriving late
at a collective (under `sync` each rank blocks at its own syncs at slightly different times, and
the all-reduce waits for the later one), NCCL's algorithm at four ranks (the bus bandwidth of two
is carried over), and the spin's clock (it counts SM cycles; a power-capped clock lengthens it).
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from ..instruments.analysers import production_runs as PR, schemas, stats
from ..model.tp import AllReduceCost
from ..provenance import catalog

PASS_PCT = 5.0  # the what-if issue's bar: +-5 %, or the measurement's own interval where wider
NCCL = re.compile(r"(?i)nccl")


def fit_allreduce(trace_paths, hidden: int, dtype_bytes: int = 2, size: int = 2) -> tuple[AllReduceCost, dict]:
    """A bus bandwidth from the NCCL kernels of profiled TP=`size` forwards. Each trace's name holds
    its chunk (`_C<tokens>_`); every all-reduce of the decoder sums a (chunk, hidden) activation.
    Only `cpu_flag` traces: under `sync` an NCCL kernel also spins while the other rank's host is
    stalled, and that is not the collective's own time."""
    from ..instruments.analysers import trace as T

    durs, per = [], {}
    for p in map(Path, trace_paths):
        if "_cpu_flag_" not in p.name:
            continue
        m = re.search(r"_C(\d+)_", p.name)
        if m is None:
            raise ValueError(f"{p.name}: no _C<chunk>_ in the trace's name")
        k = T.load_trace(p).kernels
        d = k[(k["forward"] >= 0) & k["name"].str.contains(NCCL)]["dur_ns"].to_numpy() / 1e3
        if not len(d):
            raise ValueError(f"{p.name}: no NCCL kernel in its forward: not a TP trace")
        durs.append((int(m.group(1)), d))
        per[p.name] = dict(chunk=int(m.group(1)), n=len(d), median_us=float(np.median(d)))
    if not durs:
        raise ValueError("no cpu_flag TP trace among the paths")
    chunks = {c for c, _ in durs}
    if len(chunks) > 1:
        raise ValueError(f"traces of several chunks {sorted(chunks)}: fit one message size at a time")
    chunk = chunks.pop()
    us = float(np.median(np.concatenate([d for _, d in durs])))
    nbytes = chunk * hidden * dtype_bytes
    bus = nbytes * 2 * (size - 1) / size / us / 1e3  # bytes/us -> GB/s
    cost = AllReduceCost(bus_gbps=bus, latency_us=0.0,
                         source=f"median of {sum(len(d) for _, d in durs)} NCCL all-reduce kernels of "
                                f"{nbytes / 2**20:.0f} MiB in {len(durs)} profiled TP={size} cpu_flag forwards")
    return cost, dict(median_us=us, nbytes=nbytes, chunk=chunk, size=size, traces=per)


def allreduce_cost(path=None) -> AllReduceCost:
    """The fitted all-reduce cost in `path` (fit_allreduce's JSON); none: the catalog's "tp_emulation.allreduce"."""
    d = schemas.read_json(Path(catalog("tp_emulation.allreduce") if path is None else path))
    return AllReduceCost(bus_gbps=float(d["bus_gbps"]), latency_us=float(d["latency_us"]), source=d["source"])


def load_sessions(paths=None) -> dict:
    """The emulation sessions among `paths` (production_runs.load_sessions: session folders or a folder holding
    them); none: the catalog's "tp_emulation.sessions"."""
    return PR.load_sessions(catalog("tp_emulation.sessions") if paths is None else paths)


_GUARD_SITES = re.compile(r"_(gs[\d.]+?)\.summary\.csv$")


def tp2_measured(paths=None) -> dict[str, Path]:
    """guard sites ("gs5.42") -> the TP=2 measured summary (<...>_gs<sites>.summary.csv), in the order handed;
    none: the catalog's "production.tp2_summaries"."""
    out = {}
    for p in map(Path, catalog("production.tp2_summaries") if paths is None else paths):
        m = _GUARD_SITES.search(p.name)
        if m is None:
            raise ValueError(f"{p.name}: no _gs<sites>.summary.csv in the name of a TP=2 summary")
        out[m[1]] = p
    return out


def _guard_row(summary: pd.DataFrame, task: str, guard: str):
    x = summary[(summary["task"] == task) & (summary["guard"] == guard) & (summary["adapters"] == "none")]
    return x.iloc[0] if len(x) else None


def tp2_validation(sessions: dict, measured: dict | None = None) -> pd.DataFrame:
    """One row per point: emulated TP=2 (per session and the reader's figure) beside TP=2 measured
    on two GPUs (`measured`: guard sites -> summary file; none: tp2_measured()). Points: each guard's
    forward time (the median chunk), and the fix's gain computed from them. Passes within PASS_PCT,
    or inside the measurement's interval where that is wider."""
    rows = []
    for gs, path in (tp2_measured() if measured is None else measured).items():
        if not Path(path).is_file():
            continue
        real = schemas.read_csv(path, "prefill_summary")
        real = real[real["adapters"] == "none"]
        task = f"tp2_{gs}_C16384"
        for guard in ("sync", "cpu_flag"):
            m = real[real["guard"] == guard]
            if not len(m):
                continue
            m = m.iloc[0]
            per = {}
            for name, s in sessions.items():
                r = _guard_row(s.summary, task, guard)
                if r is not None and np.isfinite(r["forward_median_ms"]):
                    per[name] = (float(r["forward_median_ms"]), float(r["forward_median_ms_lo"]),
                                 float(r["forward_median_ms_hi"]))
            if not per:
                continue
            b = stats.between_sessions(*per.values())
            meas, lo, hi = (float(m["forward_median_ms"]), float(m["forward_median_ms_lo"]),
                            float(m["forward_median_ms_hi"]))
            err = 100 * (b["estimate"] / meas - 1)
            inside = lo <= b["estimate"] <= hi
            rows.append(dict(point=f"{task} {guard}: forward ms", guard_sites=gs, guard=guard,
                             emulated=b["estimate"], emulated_lo=b["lo"], emulated_hi=b["hi"], sessions=len(per),
                             **{f"emulated_{k}": v[0] for k, v in per.items()},
                             measured=meas, measured_lo=lo, measured_hi=hi, measured_reps=int(m["reps"]),
                             err_pct=err, passed=bool(abs(err) <= PASS_PCT or inside)))
        fix = [r for r in rows if r["guard_sites"] == gs]
        if len(fix) == 2:
            s_, c_ = fix
            gain = 100 * (s_["emulated"] / c_["emulated"] - 1)
            mg = float(real[real["guard"] == "sync"]["fix_throughput_gain_pct"].iloc[0])
            mlo = float(real[real["guard"] == "sync"]["fix_throughput_gain_pct_lo"].iloc[0])
            mhi = float(real[real["guard"] == "sync"]["fix_throughput_gain_pct_hi"].iloc[0])
            # the gain is derived: it is judged as the forward ratio sync / cpu_flag, by the same rule
            err = 100 * ((1 + gain / 100) / (1 + mg / 100) - 1)
            rows.append(dict(point=f"{task}: the fix's gain, % (its error: of the ratio sync / cpu_flag)",
                             guard_sites=gs, guard="fix", emulated=gain,
                             sessions=min(s_["sessions"], c_["sessions"]),
                             measured=mg, measured_lo=mlo, measured_hi=mhi, measured_reps=s_["measured_reps"],
                             err_pct=err, passed=bool(mlo <= gain <= mhi or abs(err) <= PASS_PCT)))
    return pd.DataFrame(rows)


def tp4_prediction(sessions: dict) -> pd.DataFrame:
    """The fix at TP=4, per regime and chunk: the throughput gain and TTFT change per session
    (paired bootstrap 95 % interval) and the reader's figure (stats.between_sessions). PREDICTED:
    emulated ranks, not four GPUs."""
    h = PR.headline(sessions)
    if not len(h):
        return h
    h = h[h["task"].str.startswith("tp4_")].copy()
    h["kind"] = "predicted"
    return h.reset_index(drop=True)


def passed(validation: pd.DataFrame) -> bool:
    """The gate for a TP=4 figure: every TP=2 point passed."""
    return bool(len(validation)) and bool(validation["passed"].all())
