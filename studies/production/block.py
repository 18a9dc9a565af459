"""The production study's blocks (scripts/readme_tables.py collects `BLOCKS`): the per-sync signature beside
production's (`signature`), the TP=1 / TP=2 recording (`production`) and the README's one-line headline
(`lab-headline`), from data/production/ through `instruments.analysers.production_runs`."""
from __future__ import annotations

import functools

import pandas as pd

from lora_moe_lab.instruments.analysers import schemas
from lora_moe_lab.provenance import DATA, label, normalize_meta
from studies._render import _ci


def _tp1_busy_sentence() -> str:
    """What the TP=1 traces say about the kernels' busy time under `sync` vs `cpu_flag` (one
    profiled forward each, no adapter in use)."""
    from lora_moe_lab.instruments.analysers import trace

    busy = {}
    for g in ("sync", "cpu_flag"):
        f = sorted((DATA / "production" / "traces").glob(f"*_tp1_*_none_{g}_rank0.json.gz"))
        if not f:
            return ""
        busy[g] = float(trace.forward_metrics(trace.load_trace(f[0])).busy_ns.iloc[0]) / 1e6
    if busy["sync"] >= busy["cpu_flag"]:
        return ""
    return (f" At TP=1 part of the stall is hidden: in the profiled forward the kernels were busy {busy['sync']:.0f} "
            f"ms "
            f"with `sync` against {busy['cpu_flag']:.0f} ms with `cpu_flag` (the same kernels ran faster with bubbles "
            "between them; notebook 06).")


def signature_block() -> str | None:
    """Production's per-sync signature beside the lab's, in the lab's own regime and in a
    production-like one, with the fix's gain in each, from every recorded session
    (instruments/analysers/production_runs.py: the one loader and combination rule)."""
    from lora_moe_lab.instruments.analysers import production_runs as PR
    from lora_moe_lab.sim import PRODUCTION, PRODUCTION_SIGNATURE as PS

    sess = PR.load_sessions()
    if not sess:
        return None
    sig, head = PR.signature_table(sess), PR.headline(sess)
    names = list(sess)
    first = sess[names[0]]
    m = first.meta
    where = "; ".join(f"`{n}`: {label(s.meta)}{', dirty tree' if s.meta.get('dirty') else ''}"
                      for n, s in sess.items())
    reps = int(first.summary["reps"].min())
    n_s = len(names)
    lines = [
        f"From `data/production/signature_*` ({n_s} device session{'s' if n_s > 1 else ''}: {where}; "
        f"`studies/production/record.py`): the decoder, {int(m['params']['layers'])} layers, TP=1, "
        f"{int(first.summary['requests'].iloc[0])} requests × {int(m['params']['input_len'])} tokens, "
        f"no adapter in use, {reps} interleaved repetitions per session after the warm-up check. Host blocked: "
        f"unprofiled (perf_counter around each `.item()`); GPU idle: profiled, for the shape only.", "",
        "| | syncs / forward | host blocked / forward (ms) | first sync (ms) | later syncs, host "
        "blocked: mean / median (µs) | host's lead at a later sync, median (µs) | GPU idle / forward, sync / cpu_flag "
        "(ms, profiled) | fix: input throughput | fix: TTFT |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| production (sgl-project/sglang#25531; TP=4, 128 × 2048) | {PS['syncs_per_forward']:.0f} | "
        f"~{PS['host_blocked_ms_per_forward']:.0f} | ~{PS['first_sync_ms']:.0f} | "
        f"~{PS['later_blocked_mean_us']:.0f} / not published | not published | not published | "
        f"**{PRODUCTION['input_throughput_gain_pct']:+.1f} %** | **{PRODUCTION['ttft_change_pct']:+.1f} %** |"]
    for task in ("default_C16384", "default_C8192", "prodlike_C16384"):
        g = sig[sig.task == task]
        if not len(g):
            continue
        med = g.median(numeric_only=True)
        def sp(c, f="{:.1f}", g=g):  # one session's value, or the two sessions' range
            a, b = f.format(g[c].min()), f.format(g[c].max())
            return a if a == b else f"{a}–{b}"
        h = head[head.task == task].set_index("metric")
        thr, ttft = h.loc["fix_throughput_gain_pct"], h.loc["fix_ttft_change_pct"]
        dag = lambda r: " †" if r.sessions > 1 and r.agree in (False,) else ""  # noqa: E731
        lines.append(
            f"| {PR.TASK_TITLES[task]} | {med.syncs_per_forward:.0f} | "
            f"{sp('host_blocked_ms')} | {sp('first_blocked_ms', '{:.2f}')} | "
            f"{sp('later_blocked_mean_us', '{:.0f}')} / {sp('later_blocked_median_us', '{:.0f}')} | "
            f"{sp('later_lead_median_us', '{:.0f}')} | {sp('gpu_idle_ms_sync')} / {sp('gpu_idle_ms_cpu_flag')} | "
            f"{_ci(thr.estimate, thr.lo, thr.hi)}{dag(thr)} | {_ci(ttft.estimate, ttft.lo, ttft.hi)}{dag(ttft)} |")
    titles = {"fix_throughput_gain_pct": "input throughput", "fix_throughput_gain_net_pct":
              "input throughput net of the earlier batch", "fix_ttft_change_pct": "mean TTFT"}
    split = {}
    for r in head.itertuples():
        if r.sessions > 1 and r.agree not in (False,) and r.metric != "fix_throughput_gain_net_pct":
            continue
        if r.metric == "fix_throughput_gain_net_pct" and not r.task.startswith("prodlike"):
            continue
        per = ", ".join(f"{n} " + _ci(getattr(r, n), getattr(r, f"{n}_lo"), getattr(r, f"{n}_hi")).replace("**", "")
                        for n in names if n in head.columns and pd.notna(getattr(r, n, float("nan"))))
        if r.metric == "fix_throughput_gain_net_pct":
            per = _ci(r.estimate, r.lo, r.hi) + (" †" if r.agree in (False,) else "") + f" ({per})"
        short = PR.TASK_TITLES[r.task].removeprefix("lab, ").replace(" regime", "")
        split.setdefault(short, []).append(f"{titles[r.metric]} {per}")
    one = " (one session; the second is pending)" if len(names) < 2 else ""
    lines += ["", "a–b in a cell: the range of the sessions' medians (one value: they agree to the digit)."]
    lines += ["", f"The fix: the sessions' mean with the union of their paired-bootstrap 95 % intervals{one}; † the "
              "sessions' intervals do not overlap. Per session where they do not: "
              + "; ".join(f"{k}: " + ", ".join(v) for k, v in split.items()) + "."]
    d = sig[sig.task == "default_C16384"].median(numeric_only=True)
    p = sig[sig.task == "prodlike_C16384"].median(numeric_only=True)
    if len(sig[sig.task == "prodlike_C16384"]) and len(sig[sig.task == "default_C16384"]):
        lost_d = d.forward_median_ms - d.forward_median_ms_cpu_flag
        lost_p = p.forward_median_ms - p.forward_median_ms_cpu_flag
        thr = head[(head.task == "prodlike_C16384") & (head.metric == "fix_throughput_gain_pct")].iloc[0]
        lines += ["",
            f"- **The lab's own regime is not production's.** Its lean host runs ~{d.later_lead_median_us:.0f} µs "
            f"ahead of the GPU at a later sync, so an `.item()` blocks {1e3 * d.host_blocked_ms / 260:.0f} µs on "
            f"average against {1e3 * PS['host_blocked_ms_per_forward'] / 260:.0f} µs in production and "
            f"{PS['gb300_item_us']:.0f} µs on GB300 (sgl-project/sglang#24246).",
            f"- **Production's regime, reproduced.** {p.host_us_per_layer / 1e3:.2f} ms of host work per layer "
            f"(calibrated in the same call so later syncs block ~{PS['later_blocked_mean_us']:.0f} µs) and "
            f"{p.overlap_ms:.0f} ms of an earlier batch queued before each forward give production's signature "
            f"(the table); the fix then gains {thr.estimate:+.1f} % [{thr.lo:+.1f}, {thr.hi:+.1f}], "
            f"{'more' if thr.lo > PRODUCTION['input_throughput_gain_pct'] else 'not more'} than production's "
            f"{PRODUCTION['input_throughput_gain_pct']:+.1f} %." + _prodlike_sessions(sig, head),
            f"- **Host-blocked time is not GPU time lost.** The first sync's {p.first_blocked_ms:.0f} ms overlap the "
            f"earlier batch's GPU work; a later sync blocks only ~{p.later_blocked_mean_us:.0f} µs because the host is "
            f"barely ahead, and the GPU then waits while the host issues the next segment. That wait is what the fix "
            f"buys: {lost_p:.0f} ms per forward ({1e3 * lost_p / 260:.0f} µs per sync, unprofiled `sync` minus "
            f"`cpu_flag`), {lost_d:.1f} ms ({1e3 * lost_d / 260:.0f} µs) in the lab's own regime. Production's "
            f"signature fixes how far ahead its host was, not the gain: at {1e3 * lost_p / 260:.0f} µs per sync, "
            f"+{PRODUCTION['input_throughput_gain_pct']:.1f} % needs a "
            f"{lost_p / (PRODUCTION['input_throughput_gain_pct'] / 100):.0f} ms `cpu_flag` forward (the lab's: "
            f"{p.forward_median_ms_cpu_flag - p.overlap_ms:.0f} ms; a TP=4 rank also waits in all-reduces)."]
        lines += _profiled_vs_live(lost_d)
        lines += _chunk_sentence(sig)
    return "\n".join(lines)


def _trace_medians(chunk: int, guard: str) -> tuple[float, float, float] | None:
    """(span, busy, idle) ms, medians over the profiled steady forwards of the lab's own regime."""
    f = sorted((DATA / "production").glob(f"signature_*/traces/*_C{chunk}_gs5.41667_none_{guard}_rank0.json.gz"))
    if not f:
        return None
    m = _steady_forwards(f[0])
    return tuple(float(m[c].median()) / 1e6 for c in ("gpu_span_ns", "busy_ns", "idle_ns"))


@functools.lru_cache(maxsize=8)
def _steady_forwards(path):
    """The profiled steady forwards' metrics of one trace (the first forward is the warm-up), parsed once per
    process: two blocks read the C=16384 traces."""
    from lora_moe_lab.instruments.analysers import trace

    m = trace.forward_metrics(trace.load_trace(path))
    return m[m.forward >= 1]


def _chunk_sentence(sig) -> list[str]:
    """Why half the chunk gains several times more (the lab's own regime)."""
    t = {(c, g): _trace_medians(c, g) for c in (16384, 8192) for g in ("sync", "cpu_flag")}
    if any(v is None for v in t.values()):
        return []
    a = sig[sig.task == "default_C16384"].median(numeric_only=True)
    b = sig[sig.task == "default_C8192"].median(numeric_only=True)
    la, lb = a.forward_median_ms - a.forward_median_ms_cpu_flag, b.forward_median_ms - b.forward_median_ms_cpu_flag
    ra = t[16384, "cpu_flag"][1] - t[16384, "sync"][1]
    rb = t[8192, "cpu_flag"][1] - t[8192, "sync"][1]
    return [f"- **Why C=8192 gains more.** The bubbles stay (profiled `sync` idle {t[16384, 'sync'][2]:.0f} and "
            f"{t[8192, 'sync'][2]:.0f} ms) while the `cpu_flag` forward halves ({a.forward_median_ms_cpu_flag:.0f} → "
            f"{b.forward_median_ms_cpu_flag:.0f} ms) and the power-cap rebate falls ({ra:.1f} → {rb:.1f} ms): "
            f"{la:.1f} against {lb:.1f} ms lost per forward, unprofiled."]


def _prodlike_sessions(sig, head) -> str:
    """When the production-like sessions disagree: what differed between them."""
    h = head[(head.task == "prodlike_C16384") & (head.metric == "fix_throughput_gain_pct")]
    g = sig[sig.task == "prodlike_C16384"].sort_values("session")
    if not len(h) or h.iloc[0].sessions < 2 or h.iloc[0].agree is not False or len(g) < 2:
        return ""
    a, b = g.iloc[0], g.iloc[-1]
    return (f" The two sessions disagree (†): each calibrated its own host work from its own lean-regime syncs "
            f"({a.host_us_per_layer / 1e3:.2f} and {b.host_us_per_layer / 1e3:.2f} ms per layer). With more host work "
            f"`cpu_flag` itself is more host-bound (GPU idle {a.gpu_idle_ms_cpu_flag:.0f} against "
            f"{b.gpu_idle_ms_cpu_flag:.0f} ms per forward, profiled) and the fix gains less: where the host is barely "
            "ahead, the gain moves fast with the host's speed. The reader's figure is the union of both.")


def _profiled_vs_live(lost_live_ms: float) -> list[str]:
    """The lab's own regime: the profiled steady forwards' GPU span and busy time per guard against
    the unprofiled time lost (why a profiled run is never the timing)."""
    got = {}
    for g in ("sync", "cpu_flag"):
        f = sorted((DATA / "production").glob(f"signature_*/traces/*_C16384_gs5.41667_none_{g}_rank0.json.gz"))
        if not f:
            return []
        m = _steady_forwards(f[0])
        got[g] = (float(m.gpu_span_ns.median()) / 1e6, float(m.busy_ns.median()) / 1e6)
    (sp_s, bu_s), (sp_c, bu_c) = got["sync"], got["cpu_flag"]
    return [f"- **A profiled forward is a picture, not a timing.** Profiled, `sync` spans {sp_s - sp_c:.0f} ms more "
            f"GPU time than `cpu_flag` ({sp_s:.0f} against {sp_c:.0f} ms), unprofiled {lost_live_ms:.1f} ms: the "
            f"profiler's overhead sits in the host's re-issue after each sync. The same kernels were busy "
            f"{bu_c - bu_s:.0f} ms less under `sync` ({bu_s:.0f} against {bu_c:.0f} ms): " + _clock_sentence()]


def _clock_sentence() -> str:
    """Why the same kernels ran faster under `sync`: the card's clocks and power while each guard's
    timed prefills ran (sessions with a clock log)."""
    from lora_moe_lab.instruments.analysers import production_runs as PR

    for n, s in PR.load_sessions().items():
        c = PR.clocks_by_guard(s)
        if not len(c):
            continue
        c = c[c.task == "default_C16384"].set_index("guard")
        if not {"sync", "cpu_flag"} <= set(c.index):
            continue
        y, f = c.loc["sync"], c.loc["cpu_flag"]
        return (f"with bubbles the card holds a higher clock (session {n}, nvidia-smi every 100 ms, medians: "
                f"`cpu_flag` {f.power_w:.0f} of {s.meta.get('gpu_state', {}).get('power_limit', 700):.0f} W, "
                f"power-capped in {f.power_capped_share:.0%} of the samples, {f.sm_mhz:.0f} MHz; `sync` "
                f"{y.power_w:.0f} W, {y.power_capped_share:.0%}, {y.sm_mhz:.0f} MHz).")
    return "why is a hypothesis (clocks and power) until a session with a clock log backs it."


def production_block() -> str | None:
    """The first production-setting recording (data/production/*.summary.csv, 2026-11-30; the only
    TP=2 measurement), with what it is: one session, 5 repetitions, a percentile spread."""
    from lora_moe_lab.sim import PRODUCTION

    files = sorted((DATA / "production").glob("*.summary.csv"))
    if not files:
        return None
    d = pd.concat([schemas.read_csv(f, "prefill_summary") for f in files], ignore_index=True)
    meta_file = files[0].with_name(files[0].name.replace(".summary.csv", ".meta.json"))
    meta = normalize_meta(schemas.read_json(meta_file))
    reps = int(d.reps.min())
    lines = [f"The first recording (`data/production/*.csv`, {label(meta)}; the only TP=2 measurement): "
             f"{int(d.layers.iloc[0])} layers, {int(d.requests.iloc[0])} requests × {int(d.input_len.iloc[0])} tokens "
             f"in chunks of {int(d.chunk.iloc[0])}, bf16, **one session, {reps} repetitions**; brackets: the 2.5–97.5 "
             f"percentiles of the paired per-repetition changes, a spread of {reps} values, not a confidence "
             "interval.", "",
             "| TP | syncs per forward | adapters in use | the fix: input throughput | the fix: mean TTFT |",
             "|---:|---:|---|---:|---:|"]
    for k, g in d.groupby(["tp", "guard_sites", "adapters"], sort=True):
        g = g.set_index("guard")
        if not {"sync", "cpu_flag"} <= set(g.index):
            continue
        sy = g.loc["sync"]
        lines.append(
            f"| {k[0]} | {sy.syncs_per_forward:.0f} | {'none' if k[2] == 'none' else 'half'} "
            f"| {sy.fix_throughput_gain_pct:+.1f} % [{sy.fix_throughput_gain_pct_lo:+.1f}, "
            f"{sy.fix_throughput_gain_pct_hi:+.1f}] "
            f"| {sy.fix_ttft_change_pct:+.1f} % [{sy.fix_ttft_change_pct_lo:+.1f}, {sy.fix_ttft_change_pct_hi:+.1f}] |")
    lines.append(f"| production, TP=4 | {PRODUCTION['syncs_per_forward']:.0f} | none | "
                 f"**{PRODUCTION['input_throughput_gain_pct']:+.1f} %** | **{PRODUCTION['ttft_change_pct']:+.1f} %** |")
    la = d[d.guard == "launch_always"]
    if len(la):
        lines += ["", f"`launch_always` stays within {la.fix_throughput_gain_pct.abs().max():.1f} % of `cpu_flag` "
                      "in throughput at every TP size and adapter mix."]
    lines += ["", "Not recorded yet: the per-rank NCCL spin per guard (`signature.nccl_us`; sgl-project/sglang#24262 "
                  "saw it cut by ~68 %), which needs a TP=2 rerun on two GPUs."]
    return "\n".join(lines)


def lab_headline_block() -> str | None:
    """One line: the fix's gain at TP=1 in both regimes, per GPU model (every session, one rule)."""
    from lora_moe_lab.instruments.analysers import production_runs as PR

    sess = PR.load_sessions()
    if not sess:
        return None
    h = PR.headline(sess)
    h = h[h.metric == "fix_throughput_gain_pct"].set_index("task")
    if not {"default_C16384", "prodlike_C16384"} <= set(h.index):
        return None
    from studies.probe.block import lean_gpus, lean_range

    pl = h.loc["prodlike_C16384"]
    parts = []
    for gpu in lean_gpus():
        lo, hi, n = lean_range(gpu)
        pv = [pl[k] for k, s in sess.items() if s.meta.get("gpu") == gpu]
        prod = f"{min(pv):+.1f} to {max(pv):+.1f} % ({len(pv)})" if pv else "not recorded yet"
        parts.append(f"**{gpu.replace('NVIDIA ', '')}** {lo:+.1f} to {hi:+.1f} % ({n}) / {prod}")
    return ("The lab's reproduction, input throughput gained in the lean-host / production-like regime (medians of "
            "(n) sessions): " + "; ".join(parts) + ".")


BLOCKS = {"signature": signature_block, "production": production_block, "lab-headline": lab_headline_block}
