"""What notebooks 01-04 check and say about a live figure: pure functions of timings and trace gaps,
tested on the CPU, so a GPU run can only fail on the hardware, never on its explanation.

    t = guard_table(Recording(samples))      # per M: medians, sync/cpu_flag with its interval, regime
    m = lesson_min_tokens(load_guards().paired())   # from this M up every recorded interval is > 0
    v = guard_verdict(t.iloc[0], m)          # must the lesson hold here? does it? the text says why
    g = attribute_sync_gaps(idle_gaps(tr))   # host re-issue gaps after a sync charged to the sync

Regimes. Eager, the host issues every kernel of a layer in Python while the GPU runs the queue.
When the host needs longer per layer than the GPU (few tokens), the GPU's queue is nearly empty:
a sync drains a queue that holds almost nothing, and costs the round trip and the host's restart,
not a bubble. When the GPU needs longer (thousands of tokens), the host runs ahead, and every
`.item()` ends that overlap: the GPU then idles while the host issues the next kernels.
The eager `cpu_flag` forward over a CUDA-graph replay of it (one host call for the whole forward,
so about the GPU's own time) says which regime a point is in.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

HOST_BOUND_ABOVE = 1.5  # eager / graph replay above this: the host, not the GPU, sets the forward's time
# the method of a recording read before intervals were bootstrapped (recordings.py names its own)
METHOD_ORDER_STAT = "order-statistic 95 % interval of the median paired difference (distribution-free)"


class LessonError(AssertionError):
    """A live figure contradicts a lesson the notebook must teach (the message has the numbers)."""


def regime(eager_us: float, graph_us: float) -> tuple[str, float]:
    """("host-bound" | "GPU-bound" | "unknown", eager / graph replay)."""
    if not (graph_us and graph_us > 0 and np.isfinite(graph_us)):
        return "unknown", math.nan
    r = eager_us / graph_us
    return ("host-bound" if r > HOST_BOUND_ABOVE else "GPU-bound"), r


def guard_table(rec, baseline: str = "cpu_flag") -> pd.DataFrame:
    """One row per (preset, layers, tokens, active) of a guards recording or live samples
    (`recordings.Recording`): the median forward per variant (ms), sync / baseline and
    launch_always / baseline with their intervals (METHOD), the time lost per sync, the regime."""
    s = rec.summary()
    keys = ["preset", "layers", "tokens", "active"]
    wide = s.pivot_table(index=keys, columns="variant", values="median_us", dropna=False).div(1e3)
    wide.columns = [f"{c}_ms" for c in wide.columns]
    out = wide.reset_index()
    variants = set(s["variant"])
    for v in [v for v in ("sync", "launch_always") if v in variants and baseline in variants]:
        p = rec.paired(v, baseline).set_index(keys)
        if "ratio_lo95" in p:  # the recording's own interval of the ratio (paired bootstrap)
            lo, hi = p["ratio_lo95"], p["ratio_hi95"]
        else:  # 1 + the median paired difference's interval over the baseline's median
            lo, hi = 1 + p["lost_lo95_us"] / p["t_baseline_us"], 1 + p["lost_hi95_us"] / p["t_baseline_us"]
        r = pd.DataFrame({f"{v}_over_{baseline}": p["ratio"], f"{v}_lo": lo, f"{v}_hi": hi, "n": p["n"]})
        if v == "sync":
            r = r.assign(syncs=p["syncs"], us_per_sync=p["us_per_sync"], us_per_sync_lo=p["us_per_sync_lo95"],
                         us_per_sync_hi=p["us_per_sync_hi95"],
                         method=p["method"] if "method" in p else METHOD_ORDER_STAT,
                         status=p["status"] if "status" in p else "unchecked")
        out = out.merge(r.reset_index(), on=keys, how="left", suffixes=("", "_dup"))
        out = out.drop(columns=[c for c in out.columns if c.endswith("_dup")])
    if "graph_ms" in out and f"{baseline}_ms" in out:
        rg = [regime(e, g) for e, g in zip(out[f"{baseline}_ms"], out["graph_ms"])]
        out["eager_over_graph"] = [r for _, r in rg]
        out["regime"] = [n for n, _ in rg]
    return out


def lesson_min_tokens(paired: pd.DataFrame, preset: str | None = None, active: float | None = None) -> int:
    """The smallest recorded M from which every recorded interval of the time lost per sync lies
    above zero: where the recording says the lesson must hold. For one preset and adapter mix when
    the recording has them (a live run is compared with its own setting), else over all of them."""
    d = paired
    if preset is not None and (d["preset"] == preset).any():
        d = d[d["preset"] == preset]
        if active is not None and np.isclose(d["active"], active).any():
            d = d[np.isclose(d["active"], active)]
    lo = d.groupby("tokens")["us_per_sync_lo95"].min().sort_index()
    ok = (lo > 0)[::-1].cummin()[::-1]  # True at M when every M' >= M is above zero
    if not ok.any():
        raise ValueError("no recorded token count from which every interval lies above zero")
    return int(ok[ok].index.min())


def lesson_scope(paired: pd.DataFrame, preset: str | None = None, active: float | None = None) -> str:
    """In words, which recorded points `lesson_min_tokens` read for these arguments."""
    if preset is not None and (paired["preset"] == preset).any():
        if active is not None and np.isclose(paired[paired["preset"] == preset]["active"], active).any():
            return f"{preset}, active {active:g}"
        return f"{preset}, every adapter mix"
    return "every recorded preset and adapter mix"


@dataclass(frozen=True)
class Verdict:
    must_hold: bool  # the recording says sync > cpu_flag here: a live run must agree
    holds: bool  # sync slower than cpu_flag (paired median difference > 0)
    text: str

    def check(self) -> None:
        """Raise LessonError when the lesson must hold here and does not."""
        if self.must_hold and not self.holds:
            raise LessonError(self.text)


def _iv(lo, hi, fmt="{:.0f}") -> str:
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "[no 95 % interval: fewer than 6 repetitions]"
    return "[" + fmt.format(lo) + ", " + fmt.format(hi) + "]"


def needs_retime(row, *, gpu: bool = True) -> bool:
    """Whether a live GPU point has no figure: its repetitions never settled (GPU clocks still moving), so the
    notebook times it once more, with twice the repetitions, before the verdict. Every such point, not only
    where the lesson must hold: a host-bound point without a figure explains nothing either. One retry only;
    a point still unsettled then gets guard_verdict's "no figure" (which fails where the lesson must hold)."""
    return bool(gpu and not np.isfinite(row["us_per_sync"]))


def interval_method(tbl: pd.DataFrame) -> str:
    """The interval method(s) of a table of points (guard_table, Recording.paired), read from the points that
    have a figure: an unsettled point's method is blank, and it may be the first row."""
    methods = [m for m in (tbl["method"] if "method" in tbl else []) if isinstance(m, str) and m]
    return "; ".join(dict.fromkeys(methods)) or "none: no point settled, so no interval was computed"


def guard_verdict(row, min_tokens: int, *, gpu: bool = True) -> Verdict:
    """Whether sync must be slower than cpu_flag at this point, whether it is, and why, in words
    that quote the row's numbers. On a CPU nothing must hold: there is no device queue to drain."""
    M = int(row["tokens"])
    must = gpu and M >= min_tokens
    if not np.isfinite(row["us_per_sync"]):  # recordings.py: an arm never settled (warm-up drift)
        return Verdict(must, False, f"M={M}: the repetitions never settled ({row.get('status', '')}): no figure, "
                       "not averaged; run again with more repetitions.")
    holds = bool(row["us_per_sync"] > 0)
    ratio = (f"sync {row['sync_ms']:.2f} ms, cpu_flag {row['cpu_flag_ms']:.2f} ms: sync / cpu_flag "
             f"{row['sync_over_cpu_flag']:.3f} {_iv(row['sync_lo'], row['sync_hi'], '{:.3f}')}, "
             f"{row['us_per_sync']:.0f} us per sync {_iv(row['us_per_sync_lo'], row['us_per_sync_hi'])} "
             f"over {int(row['syncs'])} syncs ({int(row['n'])} paired repetitions)")
    if not gpu:
        return Verdict(False, holds, f"M={M}, CPU wall clock: {ratio}. On a CPU `.item()` reads memory the host "
                       "already has: no queue drains, no GPU idles, so this ratio is the host's noise, not a bubble.")
    reg, r = row.get("regime", "unknown"), row.get("eager_over_graph", math.nan)
    where = (f"eager cpu_flag {row['cpu_flag_ms']:.2f} ms against a graph replay of the same forward "
             f"{row['graph_ms']:.2f} ms ({r:.2f}x): {reg}") if np.isfinite(r) else "no graph replay timed"
    if must:
        why = (f"From M={min_tokens} up every interval of the recording lies above zero, so here the sync must cost: "
               + ("it does." if holds else "IT DOES NOT - the lesson fails live; look at the GPU's clocks and "
                  "other processes before trusting this run."))
    elif reg == "host-bound":
        why = (f"Host-bound: the GPU runs the forward's kernels in about {row['graph_ms']:.2f} ms but the host needs "
               f"{row['cpu_flag_ms']:.2f} ms to issue them, so the GPU's queue is nearly empty whenever the host "
               "reaches a guard; a sync drains almost nothing and costs the round trip and the host's restart. "
               + ("That cost is what the sync adds here." if holds and np.isfinite(row["us_per_sync_lo"])
                  and row["us_per_sync_lo"] > 0 else
                  "Here it is within the host's own run-to-run spread (the interval includes zero or lies below "
                  "it): a small or reversed gap at this size is not a contradiction of the lesson."))
    else:
        why = (f"Below M={min_tokens} the recording's own intervals include zero; this point is {reg}, "
               + ("and the sync costs time." if holds else "and the sync cost no measurable time here."))
    return Verdict(must, holds, f"M={M}: {ratio}; {where}. {why}")


# ----------------------------------------------------------------------------------------------
# Idle gaps: what a sync is to blame for
# ----------------------------------------------------------------------------------------------
def attribute_sync_gaps(gaps: pd.DataFrame) -> pd.DataFrame:
    """`idle_gaps` rows with a `cause` column: `after_sync` (the gap right after a sync drained the
    queue), `sync_reissue` (a host-launch-wait gap later in the SAME layer as an after-sync gap: the
    queue is empty because of the sync and the host is re-issuing the layer's small ops one by one,
    so the GPU waits for each: still the sync's fault), else the gap's own category."""
    g = gaps.sort_values(["forward", "start_ns"]).copy()
    cat = g["category"].astype(str)
    seen = (cat == "after_sync").astype(int).groupby([g["forward"], g["layer"].fillna("")]).cummax().astype(bool)
    g["cause"] = np.where((cat == "host_launch_wait") & seen, "sync_reissue", cat)
    return g


SYNC_CAUSES = ("after_sync", "sync_reissue")


def idle_by_cause(gaps_by_guard: dict[str, pd.DataFrame], busy_us: dict[str, float] | None = None) -> pd.DataFrame:
    """Per guard: mean GPU idle per forward (us) by cause (attribute_sync_gaps), the part the sync is to
    blame for, and (with busy_us) the busy time; rows in the guards' order."""
    rows = []
    for gname, gaps in gaps_by_guard.items():
        a = attribute_sync_gaps(gaps)
        nf = max(a["forward"].nunique(), 1)
        per = a.groupby("cause")["dur_ns"].sum() / nf / 1e3
        row = {"guard": gname, **{f"idle_{c}_us": float(per.get(c, 0.0)) for c in
                                  ("after_sync", "sync_reissue", "host_launch_wait", "kernel_to_kernel", "other")}}
        row["idle_us"] = float(per.sum())
        row["sync_blamed_us"] = row["idle_after_sync_us"] + row["idle_sync_reissue_us"]
        if busy_us is not None:
            row["busy_us"] = float(busy_us.get(gname, math.nan))
        rows.append(row)
    return pd.DataFrame(rows).set_index("guard")


def explain_sync_idle(tbl: pd.DataFrame, baseline: str = "cpu_flag") -> str:
    """How much of the sync's extra GPU idle over `baseline` its syncs explain, in numbers: the
    after-sync gaps, plus the host-launch wait it has beyond the baseline's (mostly sync_reissue)."""
    if not {"sync", baseline} <= set(tbl.index):
        return ""
    s, b = tbl.loc["sync"], tbl.loc[baseline]
    extra = s["idle_us"] - b["idle_us"]
    wait_s = s["idle_sync_reissue_us"] + s["idle_host_launch_wait_us"]
    wait_b = b["idle_sync_reissue_us"] + b["idle_host_launch_wait_us"]
    both = s["idle_after_sync_us"] + wait_s - wait_b
    rest = extra - both
    return (f"sync idles the GPU {s['idle_us']:.0f} us per forward, {baseline} {b['idle_us']:.0f} us: {extra:+.0f} us. "
            f"Right after the syncs (after_sync): {s['idle_after_sync_us']:.0f} us. The rest shows as waiting for the "
            f"host's launches: sync {wait_s:.0f} us, {s['idle_sync_reissue_us']:.0f} us of it later in a layer "
            f"after its "
            f"sync while the host re-issues the layer's small ops into the emptied queue (sync_reissue), against "
            f"{wait_b:.0f} us for {baseline}, whose host was ahead of the GPU: {wait_s - wait_b:+.0f} us. Both are the "
            f"sync's doing: {s['idle_after_sync_us']:.0f} {wait_s - wait_b:+.0f} = {both:.0f} us of the "
            f"{extra:+.0f} us "
            f"(the remaining {rest:+.0f} us: kernel-to-kernel and other gaps).")
