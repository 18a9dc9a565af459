"""The TP emulation study's blocks (scripts/readme_tables.py collects `BLOCKS`): TP=4 predicted on one GPU,
checked first against TP=2 measured (`tp4`), and the README's one-line TP=4 figure (`tp4-headline`)."""
from __future__ import annotations

import re

import pandas as pd

from studies._render import _gain

BLOCK_DATA = {"tp4": "tp_emulation", "tp4-headline": "tp_emulation"}  # block -> the data folder it reads


def _tp4_figures():
    from lora_moe_lab.sim import tp_emulation as E

    sessions = E.load_sessions()
    if not sessions:
        return None
    return sessions, E.tp2_validation(sessions), E.tp4_prediction(sessions), E.allreduce_cost()


def _clock_note(sessions) -> str:
    logged = {n: s.clocks for n, s in sessions.items() if s.clocks is not None and len(s.clocks)}
    if not logged:
        return "No session logged the SM clock."
    parts = [f"{n}: SM clock {c.sm_mhz.min():.0f}–{c.sm_mhz.max():.0f} MHz, power up to {c.power_w.max():.0f} W"
             for n, c in logged.items()]
    return ("Clocks (`clocks.csv`, every 100 ms): " + "; ".join(parts) + " (cap 700 W: no power-cap rebate).")


TP4_HEADLINE_TASK = "tp4_prodlike_C16384"  # production's regime and the lab's headline chunk


def tp4_headline_block() -> str | None:
    f = _tp4_figures()
    if f is None:
        return None
    sessions, v, p, _ = f
    from lora_moe_lab.sim import PRODUCTION

    r = p[(p.task == TP4_HEADLINE_TASK) & (p.metric == "fix_throughput_gain_pct")]
    if not len(r):
        return None
    r = r.iloc[0]
    per = ", ".join(f"{r[s]:+.1f}" for s in sessions if s in r and pd.notna(r[s]))
    return (f"TP=4, **predicted** on one H200 (one rank's shapes, each all-reduce replaced by its measured time; "
            f"the method passed {int(v.passed.sum())} of {len(v)} points of its TP=2 check): the fix gains "
            f"{_gain(r)} input throughput in the production-like regime at C=16384 (the sessions' medians {per} %"
            f"{'' if r.agree else ', which disagree'}); production measured "
            f"{PRODUCTION['input_throughput_gain_pct']:+.1f} % at TP=4.")


def tp4_block() -> str | None:
    f = _tp4_figures()
    if f is None:
        return None
    sessions, v, p, cost = f
    names = " and ".join(sessions)
    lines = [f"**Predicted, not measured** (`studies/tp_emulation/record.py`, `sim/tp_emulation.py`; sessions "
             f"{names}, each on a freshly started H200). One GPU runs one rank's "
             f"shapes (`model/tp.py: EmulatedTPGroup`); each all-reduce is a GPU spin of NCCL's measured time for "
             f"those bytes ({cost.bus_gbps:.1f} GB/s bus bandwidth on two H200s, scaled by the ring's 2(n-1)/n). 48 "
             f"layers, bf16, no adapter in use, 12 interleaved repetitions, unprofiled. Forward times: the median "
             f"chunk with its order-statistic 95 % interval; gains: paired bootstrap 95 %; across sessions their mean "
             f"and the union of their intervals.", "",
             "The check first: TP=2 emulated against TP=2 measured on two GPUs (`data/production/tp2_*`, one "
             "session of 5 repetitions, 2.5–97.5 percentiles); a point passes within ±5 % or inside that range.", "",
             "| point | emulated | measured | error (%) | passes |",
             "|---|---:|---:|---:|---|"]

    def point(s):  # "tp2_gs5.42_C16384 sync: forward ms" -> "260 syncs, `sync` forward (ms)"
        s = re.sub(r"tp2_gs([\d.]+)_C\d+", lambda m: f"{round(48 * float(m.group(1)))} syncs", s)
        return (s.replace(" sync: forward ms", ", `sync` forward (ms)")
                .replace(" cpu_flag: forward ms", ", `cpu_flag` forward (ms)")
                .replace(": the fix's gain, % (its error: of the ratio sync / cpu_flag)",
                         ", the fix's gain (%; error: of `sync / cpu_flag`)"))

    for r in v.itertuples():
        lo_hi = f" [{r.emulated_lo:.1f}, {r.emulated_hi:.1f}]" if pd.notna(r.emulated_lo) else ""
        lines.append(f"| {point(r.point)} | {r.emulated:.1f}{lo_hi} | {r.measured:.1f} "
                     f"[{r.measured_lo:.1f}, {r.measured_hi:.1f}] | {r.err_pct:+.1f} | "
                     f"{'yes' if r.passed else '**no**'} |")
    from lora_moe_lab.config import get_shape
    from lora_moe_lab.model.tp import tp_shape

    r4 = tp_shape(get_shape("qwen3-30b-a3b"), 4)
    lines += ["", f"Then TP=4 (expert intermediate {r4.intermediate}, {r4.num_heads} query heads, "
                  f"{r4.num_kv_heads} KV head per rank), 64 requests × 2048 tokens:", "",
              "| regime, chunk | the fix: input throughput | the fix: TTFT | sessions' medians | agree |",
              "|---|---:|---:|---|---|"]
    titles = {"tp4_default": "lab's own (lean host)", "tp4_prodlike": "production-like"}
    for task, g in p.groupby("task", sort=False):
        g = g.set_index("metric")
        thr, tt = g.loc["fix_throughput_gain_pct"], g.loc["fix_ttft_change_pct"]
        head, c = task.rsplit("_C", 1)
        per = ", ".join(f"{thr[s]:+.1f}" for s in sessions if s in thr and pd.notna(thr[s]))
        lines.append(f"| {titles.get(head, head)}, C={c} | {_gain(thr)} | {_gain(tt)} | {per} | "
                     f"{'yes' if thr.agree else '**no**'} |")
    lines += ["", "Where the sessions disagree, the host-bound `sync` forward follows each machine's host speed. "
                  + _clock_note(sessions) + " Left out: another rank's host stall arriving late at a collective, "
                  "NCCL's own algorithm at four ranks."]
    return "\n".join(lines)


BLOCKS = {"tp4": tp4_block, "tp4-headline": tp4_headline_block}
