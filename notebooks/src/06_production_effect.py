# %% [markdown]
# # 06 · The production effect, measured
#
# **Goal.** Set production's per-sync signature beside the lab's decoder in two regimes, host time
# blocked beside host time blocked, and measure what removing the guard gains, session by session.
#
# **The setting.** Production serves Qwen3-30B-A3B with LoRA on the MoE experts, tensor parallel
# over 4 GPUs, 48 layers. A prefill batch of 128 requests × 2048 input tokens is run in chunks of
# C tokens, one forward per chunk. Adapters are loaded, but in the measured traffic **no request
# used one**. The old guard asked the GPU "is any adapter active?" (`.any().item()`) at every
# LoRA call site: **260** host-device syncs per forward. Removing it (the host flag
# `has_active_lora`, guard `cpu_flag`) gave **+14.4 %** input throughput and **−12.6 %** TTFT
# (sgl-project/sglang#25531).
#
# **What production's trace measured** (sgl-project/sglang#25531): ~100 ms per forward of time in
# `cudaStreamSynchronize`, ~70 ms of it in the first sync ("it drains the entire pending GPU
# stream"), ~116 µs on average in each of the other 259. That is **host time blocked**. A sync
# blocks the host for as long as the GPU has work queued; the GPU is busy meanwhile. What the
# sync costs the GPU is the bubble *after* it, while the host issues again. This notebook sets
# host-blocked time beside host-blocked time and GPU idle beside GPU idle, never one beside the other.
#
# **Here** the same prefill runs through a decoder of the same shapes (attention with 32 query and
# 4 KV heads of dim 128, the 128-expert MoE block with LoRA; random weights) on H200s, per guard:
#
# * `sync` — the old guard, `guard_sites` = 260/48 decisions per layer: 260 syncs per forward;
# * `cpu_flag` — the fix: a Python bool, no sync;
# * `launch_always` — no host check: the LoRA kernels are launched and exit early on the GPU.
#
# Two regimes: **the lab's own** (a lean host) and a **production-like** one (`EngineCosts`: an
# engine's host work per layer, calibrated so the later syncs block the host as long as production's, and
# production's first-sync backlog (`sim/production.py`) of an earlier batch queued on the GPU before each forward, as an overlap scheduler leaves it).
# Each recording was made in separate device sessions; the reader's figure is their mean with the union of
# their 95 % intervals (the *union over sessions*). These terms, and C (the prefill chunk: tokens per
# forward), are defined in `docs/glossary.md`.
#
# On a CPU this notebook shows the **recorded** GPU data (`data/production/`) and makes a small
# **live** run on the CPU. On a GPU the live run is real and is checked against the lesson.

# %% tags=["parameters"]
preset = "tiny"                  # model shape of the live run: tiny, qwen3-30b-a3b, qwen3-30b-a3b-tp4
num_layers = 2                   # decoder layers of the live run
requests = 4                     # requests in the live prefill
input_len = 8                    # input tokens per request
chunk = 16                       # tokens per chunk: a multiple of input_len
guard_sites = 260 / 48           # guard decisions per layer (production: 260 syncs per forward over 48 layers)
guards = ["sync", "cpu_flag", "launch_always"]
adapter_modes = ["none", "mix"]  # none: adapters loaded, no request uses one; mix: half the requests use one
reps = 5                         # interleaved repetitions of the live run (20 leave 10 after a warm-up drift)
target_tp = 4                    # TP size of the extrapolation (production's)
live = True                      # run the small live prefill on this machine

# %%
import glob
import json
from pathlib import Path

import pandas as pd
import torch

from lora_moe_lab import runtime
from lora_moe_lab.instruments.recorders import prefill as P
from lora_moe_lab.instruments.analysers import production_runs as PR
from lora_moe_lab.instruments.analysers import trace as T
from lora_moe_lab.nb import params as nbp
from lora_moe_lab.nb.params import NotebookParameterError
from lora_moe_lab.provenance import DATA, label, normalize_meta
from lora_moe_lab.sim import PRODUCTION, PRODUCTION_SIGNATURE
from lora_moe_lab.sim.tp import extrapolate_tp
from lora_moe_lab.ui import production_plots as pp

nbp.reject_unknown_parameters()
nbp.check_preset(preset)
for _n in ("num_layers", "requests", "input_len", "chunk", "reps", "target_tp"):
    nbp.check_positive_int(_n, globals()[_n])
guards = nbp.check_guards(guards)
if not isinstance(adapter_modes, (list, tuple)) or not adapter_modes or set(adapter_modes) - set(P.ADAPTER_MODES):
    raise NotebookParameterError(f"bad notebook parameter adapter_modes={adapter_modes!r}: "
                                 f"a non-empty list from {list(P.ADAPTER_MODES)}")
if chunk % input_len:
    raise NotebookParameterError(f"bad notebook parameter chunk={chunk!r}: a multiple of input_len={input_len} "
                                 "(a chunk holds whole requests)")
if not isinstance(guard_sites, (int, float)) or isinstance(guard_sites, bool) or guard_sites < 1:
    raise NotebookParameterError(f"bad notebook parameter guard_sites={guard_sites!r}: a number >= 1")
if not isinstance(live, bool):
    raise NotebookParameterError(f"bad notebook parameter live={live!r}: True or False")
nbp.setup_plotly()
print("production's signature (host time blocked in the syncs):", {k: round(v, 3) for k, v in PRODUCTION_SIGNATURE.items()})

# %% [markdown]
# ## Production's signature beside the lab's
# `data/production/signature_<session>/` (`studies/production/record.py`, `python scripts/record.py production`, one device session each):
# TP=1, 48 layers, 64 requests × 2048 tokens, 260 syncs per forward, no adapter in use, `sync`
# against `cpu_flag`, interleaved repetitions after a warm-up prefill, checked for drift.
# Host-blocked figures are unprofiled (perf_counter around each `.item()`); the lead (GPU work
# queued when a sync starts) and the GPU idle come from profiled steady forwards (forwards 1 and 2
# of three issued back to back): for the shape only, because a profiler slows the host.

# %%
SESSIONS = PR.load_sessions()
if SESSIONS:
    for n, s_ in SESSIONS.items():
        print(f"session {n}: {label(s_.meta)}, driver {s_.meta.get('driver')}, clocks at the start "
              f"{s_.meta.get('gpu_state', {}).get('clocks_sm')} MHz, dirty tree: {s_.meta.get('dirty')}; "
              f"calibration {s_.meta.get('calibration')}")
    sig = PR.signature_table(SESSIONS)
    prod_row = dict(task="production (TP=4)", session="#25531", syncs_per_forward=PRODUCTION_SIGNATURE["syncs_per_forward"],
                    host_blocked_ms=PRODUCTION_SIGNATURE["host_blocked_ms_per_forward"],
                    first_blocked_ms=PRODUCTION_SIGNATURE["first_sync_ms"], first_share=PRODUCTION_SIGNATURE["first_share"],
                    later_blocked_mean_us=PRODUCTION_SIGNATURE["later_blocked_mean_us"])
    cols = ["task", "session", "syncs_per_forward", "host_blocked_ms", "first_blocked_ms", "first_share",
            "later_blocked_mean_us", "later_blocked_median_us", "later_lead_median_us", "gpu_idle_ms_sync",
            "gpu_idle_ms_cpu_flag", "forward_median_ms", "forward_median_ms_cpu_flag", "host_us_per_layer", "overlap_ms"]
    display(pd.concat([pd.DataFrame([prod_row]), sig[cols]], ignore_index=True).round(3))
else:
    sig = None
    print("NO SESSION in data/production/signature_* (studies/production/record.py writes one on a GPU)")

# %% [markdown]
# Read the table column by column. **Host blocked per forward** and **first sync** are the figures
# production published. In the lab's own regime the host is far ahead: each later sync finds
# about a millisecond of GPU work queued and waits for it, and the first sync of a forward finds
# almost nothing (the previous forward's last sync drained the queue). In the production-like
# regime the later syncs block the host only briefly (its host is barely ahead) and the first one
# waits for the earlier batch. The **GPU idle** columns are what the fix buys back.
#
# Along one forward, sync by sync (top: host blocked, log scale, production's published totals as
# markers; bottom: the GPU idle that follows each sync):

# %%
if SESSIONS:
    first = next(iter(SESSIONS.values()))
    if len(first.syncs):
        one = first.syncs[(first.syncs["guard"] == "sync") & (first.syncs["forward"] == first.syncs["forward"].min())]
        one = one.assign(label=one["task"].map(PR.TASK_TITLES))
        pp.signature_along_forward(one, production=PRODUCTION_SIGNATURE,
                                   title=f"One steady forward, every sync: host blocked and GPU idle after it "
                                         f"(session {first.name})").show()
        lost = sig.assign(lost_ms=sig["forward_median_ms"] - sig["forward_median_ms_cpu_flag"])
        lost["lost_us_per_sync"] = 1e3 * lost["lost_ms"] / lost["syncs_per_forward"]
        lost["host_blocked_us_per_sync"] = 1e3 * lost["host_blocked_ms"] / lost["syncs_per_forward"]
        print("GPU time lost (unprofiled: sync forward - cpu_flag forward) against host time blocked, per sync:")
        display(lost[["task", "session", "lost_ms", "lost_us_per_sync", "host_blocked_us_per_sync"]].round(1))
        print(f"production: {1e3 * PRODUCTION_SIGNATURE['host_blocked_ms_per_forward'] / 260:.0f} us host blocked per "
              f"sync on average (#25531), {PRODUCTION_SIGNATURE['gb300_item_us']:.0f} us per .item() on GB300 (#24246; "
              f"{PRODUCTION_SIGNATURE['gb300_item_no_lora_us']:.0f} us without LoRA); GPU time lost: not published")
    for n, s_ in SESSIONS.items():
        c = PR.clocks_by_guard(s_)
        if len(c):
            print(f"session {n}: the card while each guard's timed prefills ran (nvidia-smi, every 100 ms):")
            display(c.round(0).assign(power_capped_share=c["power_capped_share"].round(2)))  # a share, not rounded to 0 or 1

# %% [markdown]
# ## The fix's gain in each regime, session by session
# Each session's figure carries its own paired-bootstrap 95 % interval; with two sessions the
# reader's figure is their mean with the union of the two intervals (`stats.between_sessions`),
# flagged where the intervals do not overlap. The production-like regime's throughput is also
# given without the earlier batch's GPU time (per forward, not this prefill's work).

# %%
if SESSIONS:
    head = PR.headline(SESSIONS)
    display(head.round(2))
    for r in head[head["metric"] == "fix_throughput_gain_pct"].itertuples():
        print(f"{PR.TASK_TITLES[r.task]}: {r.estimate:+.1f} % [{r.lo:+.1f}, {r.hi:+.1f}] over {r.sessions} session(s); "
              f"production {PRODUCTION['input_throughput_gain_pct']:+.1f} %")

# %% [markdown]
# ## The first recording, with TP=2 (2026-11-30)
# Every CSV at the top of `data/production/` is one task of `studies/production/record_tp.py` (`python scripts/record.py production_tp`): one row
# per guard × adapter mode × repetition; its `.meta.json` names the GPU, the software and the
# commit. **One session, 5 repetitions**: its brackets are the spread of 5 values, not an
# interval, and it is the only TP=2 measurement (no two-GPU machine was lent for the rerun).

# %%
files = sorted(f for f in glob.glob(str(DATA / "production" / "*.csv")) if not f.endswith(".summary.csv"))
frames, labels = [], {}
for f in files:
    meta = normalize_meta(json.loads(Path(f).with_suffix(".meta.json").read_text()))
    labels[Path(f).stem] = label(meta)
    frames.append(pd.read_csv(f).assign(recording=Path(f).stem))
RECORDED = bool(frames)
if RECORDED:
    rows = pd.concat(frames, ignore_index=True)
    summary = P.summarize(rows)
    for stem, lab_ in labels.items():
        print(f"recorded: {stem:24s} {lab_}")
else:
    rows = summary = None
    print("NO RECORDED DATA in data/production/ (studies/production/record_tp.py writes it on two GPUs): "
          "only the live run below")

# %% [markdown]
# ## Throughput and TTFT: the fix against each guard, beside production
# The bars are the change that switching from a guard to `cpu_flag` brings (paired per
# repetition; whiskers: the 2.5–97.5 percentile range of the repetitions). For `sync` in adapter
# mode `none` this is production's comparison (sgl-project/sglang#25531): +14.4 % input throughput, −12.6 % TTFT. The lab's
# TP=4 figure is the prediction of the section "TP=4, predicted" below.

# %%
if RECORDED:
    ex = extrapolate_tp(summary, target_tp=target_tp)
    ex = ex[ex["guard_sites"] > 1]  # production's syncs per forward
    vs = summary[summary["guard"] != "cpu_flag"]
    pp.guard_bars(vs, "fix_throughput_gain_pct", lo="fix_throughput_gain_pct_lo", hi="fix_throughput_gain_pct_hi",
                  reference=PRODUCTION["input_throughput_gain_pct"],
                  title="Input throughput gain of cpu_flag over each guard",
                  yaxis_title="throughput gain (%)").show()
    pp.guard_bars(vs, "fix_ttft_change_pct", lo="fix_ttft_change_pct_lo", hi="fix_ttft_change_pct_hi",
                  reference=PRODUCTION["ttft_change_pct"],
                  title="Mean TTFT change of cpu_flag against each guard",
                  yaxis_title="TTFT change (%)").show()
    pp.guard_bars(summary, "input_tok_per_s", lo="input_tok_per_s_lo", hi="input_tok_per_s_hi",
                  title="Input throughput per guard (median of the repetitions)",
                  yaxis_title="input tokens / s").show()
    cols = ["tp", "chunk", "guard_sites", "adapters", "guard", "reps", "input_tok_per_s", "ttft_mean_ms",
            "ttft_p99_ms", "fix_throughput_gain_pct", "fix_throughput_gain_pct_lo", "fix_throughput_gain_pct_hi",
            "fix_ttft_change_pct", "fix_ttft_change_pct_lo", "fix_ttft_change_pct_hi"]
    display(summary[cols].round(2))

# %% [markdown]
# ## Syncs and GPU idle per forward
# Syncs are counted at the guard (every `.item()` the `sync` guard makes), per forward (chunk);
# production counted 260 `cudaStreamSynchronize` per forward. GPU idle is read from one profiled
# forward per guard (gaps inside the forward's GPU window; `after_sync`: the queue had drained at
# a host sync and the GPU waited for the host to issue again).

# %%
if RECORDED:
    pp.guard_bars(summary, "syncs_per_forward", reference=PRODUCTION["syncs_per_forward"],
                  title="Host-device syncs per forward", yaxis_title="syncs per forward").show()
    pp.guard_bars(summary, "gpu_idle_ms", title="GPU idle per forward (one profiled forward; production "
                  "published no GPU idle)", yaxis_title="GPU idle (ms per forward)").show()
    per_sync = summary[summary["guard"] == "sync"][["tp", "chunk", "guard_sites", "adapters", "syncs_per_forward",
                                                    "gpu_idle_ms", "gpu_idle_after_sync_ms"]].copy()
    per_sync["idle_us_per_sync"] = 1e3 * per_sync["gpu_idle_after_sync_ms"] / per_sync["syncs_per_forward"]
    print("production's ~385 us per sync is host time blocked, not GPU idle: compare it with the signature above")
    display(per_sync.round(2))

# %% [markdown]
# Where the idle goes. In the profiled forward, GPU span = busy + idle. If the syncs only added idle,
# the `sync` forward would be longer than the `cpu_flag` one by its extra idle. At TP=2 it is. At
# TP=1 the `sync` forward's kernels were *busy for less time* (the same kernels ran faster): part of
# the bubble is paid back. This is consistent with a fully loaded GPU running at lower clocks than
# one that idles now and then (no clock was recorded here); a TP=2 rank does half the work per
# kernel and shows no such difference.

# %%
if RECORDED:
    prof = (rows[(rows["guard_sites"] > 1) & (rows["adapters"] == "none")]
            .groupby(["tp", "guard"], sort=False)[["gpu_span_ms", "gpu_busy_ms", "gpu_idle_ms"]].first())
    display(prof.round(1))

# %% [markdown]
# ## The first recording's two ingredients
# Per configuration with 260 syncs per forward: the `cpu_flag` forward time F and the GPU time
# lost per sync s = (sync forward − F) / 260 (medians of the per-chunk forward times; unprofiled).
# The gain is about 260 · s / F. Production published neither s nor F, only the gain and the host
# time blocked, so there is no production row here: the signature section above compares it.

# %%
if RECORDED:
    rows_ = []
    for k, g in summary[summary["guard_sites"] > 1].groupby(["tp", "chunk", "adapters"]):
        g = g.set_index("guard")
        F, S = g.loc["cpu_flag", "forward_median_ms"], g.loc["sync", "forward_median_ms"]
        n = g.loc["sync", "syncs_per_forward"]
        rows_.append(dict(zip(["tp", "chunk", "adapters"], k), forward_ms_cpu_flag=F, forward_ms_sync=S,
                          us_lost_per_sync=1e3 * (S - F) / n, gain_pct=g.loc["sync", "fix_throughput_gain_pct"],
                          gain_lo=g.loc["sync", "fix_throughput_gain_pct_lo"],
                          gain_hi=g.loc["sync", "fix_throughput_gain_pct_hi"],
                          ttft_pct=g.loc["sync", "fix_ttft_change_pct"]))
    display(pd.DataFrame(rows_).round(2))

# %% [markdown]
# ## One forward, every rank
# The recorded traces of one TP=2 forward with the `sync` guard, one per rank, aligned on the end
# of the first all-reduce (a collective completes on all ranks together). Red lanes: the host
# blocked in `.item()`; below each rank's GPU lane, its idle gaps by cause. The all-reduce kernels
# (purple) stretch where one rank's bubble holds the other back.

# %%
tdir = DATA / "production" / "traces"
found = {}
for f in sorted(tdir.glob("*_tp2_*_none_*_rank*.json.gz")) if tdir.is_dir() else []:
    base, rank = f.name.split("_rank")
    found.setdefault(base, {})[int(rank.split(".")[0])] = f
for guard_ in ("sync", "cpu_flag"):
    pick = [b for b in found if b.endswith(f"_none_{guard_}") and "gs1_" not in b]
    if pick:
        b = sorted(pick)[0]
        ranks = {r: T.load_trace(p) for r, p in found[b].items()}
        span_us = float(T.forward_metrics(ranks[0])["gpu_span_ns"].iloc[0]) / 1e3
        n_layers = int(ranks[0].labels.get("layers", 48))
        pp.rank_timeline(ranks, window_us=(0, 3 * span_us / n_layers),
                         title=f"The first 3 of {n_layers} layers at TP=2, guard {guard_} ({b})").show()
        for r, t in ranks.items():
            m = T.forward_metrics(t).iloc[0]
            print(f"{guard_:8s} rank {r}: forward GPU span {m['gpu_span_ns'] / 1e6:.1f} ms, idle "
                  f"{m['idle_ns'] / 1e6:.1f} ms ({m['idle_after_sync_ns'] / 1e6:.1f} ms after a sync)")
if not found:
    print("no recorded TP=2 traces in data/production/traces")

# %% [markdown]
# ## TP=4, predicted: one rank on one GPU, checked at TP=2 first
# No machine here has four GPUs. One rank of TP=n does the same work whatever the other ranks do,
# except at the all-reduces, where its stream waits for theirs. So one H200 runs one rank's shapes
# (`model/tp.py: EmulatedTPGroup`: a 1/n share of heads and expert intermediate) and each
# all-reduce becomes a GPU spin of the time NCCL took for those bytes on two real H200s
# (`data/tp_emulation/allreduce.json`). The method is checked where the answer is known, TP=2
# emulated against TP=2 measured on two GPUs, before it is run at TP=4
# (`lora_moe_lab.sim.tp_emulation`, `data/tp_emulation/`, two device sessions). **Predicted, not
# measured**: what it leaves out is another rank's host stall arriving late at a collective.

# %%
from lora_moe_lab.sim import tp_emulation as E

emu = E.load_sessions()
if emu:
    check = E.tp2_validation(emu)
    per_session = [c for c in check.columns if c.startswith("emulated_s")]  # each session's own figure
    display(check[["point"] + per_session + ["emulated", "emulated_lo", "emulated_hi", "measured", "measured_lo",
                                             "measured_hi", "err_pct", "passed"]].round(2))
    print(f"TP=2 check: {int(check['passed'].sum())} of {len(check)} points pass (±{E.PASS_PCT:g} % or inside "
          "the measurement's interval) on the sessions' mean; each session alone is in the columns emulated_s*: "
          "under `sync` they differ by the host's speed, machine to machine")
    pred = E.tp4_prediction(emu)
    thr = pred[pred["metric"] == "fix_throughput_gain_pct"]
    display(thr[["task", "sessions"] + [c for c in thr.columns if c.startswith("s") and c[1:2].isdigit()]
                + ["estimate", "lo", "hi", "agree", "kind"]].round(2))
    for r in thr.itertuples():
        print(f"TP=4 {r.task}: the fix {r.estimate:+.1f} % [{r.lo:+.1f}, {r.hi:+.1f}] input throughput, "
              f"predicted ({r.sessions} sessions{'' if r.agree else ', which disagree'})")
    print(f"production measured {PRODUCTION['input_throughput_gain_pct']:+.1f} % at TP=4")
else:
    print("TP=4: not recorded yet (studies/tp_emulation/record.py writes data/tp_emulation/ on a GPU)")

# %% [markdown]
# ### History: the earlier TP=4 extrapolation (retired)
# Before the emulation, TP=4 was reached by scaling each measured TP size's `cpu_flag` forward F and
# time lost per sync s by the queue model's ratios (`lora_moe_lab.sim.tp`). The queue model rarely agrees
# with the replay (`data/replay/simulator_vs_replay.csv`), so these rows are kept
# only as history: **extrapolated, not a lab figure**.

# %%
if RECORDED:
    display(ex[["kind", "method", "source_tp", "target_tp", "chunk", "guard_sites", "adapters", "syncs_per_forward",
                "forward_ms", "stall_ms_per_sync", "forward_ms_tp4", "stall_ms_per_sync_tp4",
                "throughput_gain_pct", "ttft_change_pct"]].round(3))

# %% [markdown]
# ## The gain depends on the host's lead
# One GPU model gives different gains on different hosts. With `sync` each guard decision waits for the
# GPU to drain; how long the host waited (the *host lead*: the median host time blocked in a forward's
# later syncs) is how far it had run ahead. A shorter lead leaves the GPU idle longer after each sync,
# and removing the syncs buys more. Every recorded session is a point (lean host, C=16384); the
# crosses add engine host work per layer, a stand-in for a slower host; one colour per GPU model. The line is the
# least-squares relation within a model. Across models the lead alone does not carry: `make gpu-probe` predicts
# from each sync's recorded saving over the `sync` forward it has just timed, and the table predicts each session
# from the *other* sessions, and from the *other GPU models* only (`left_out`).

# %%
import plotly.graph_objects as go

from lora_moe_lab.instruments.analysers import host_lead as HL
from lora_moe_lab.provenance import catalog

pts = pd.read_csv(catalog("probe.points"))
rel = HL.fit(pts)
fig = go.Figure()
for (gpu, extra), d in pts.groupby([pts.gpu.fillna("not recorded"), pts.host_us_per_layer > 0]):
    name = f"{str(gpu).replace('NVIDIA ', '')}, " + ("host work added per layer" if extra else "lean host")
    fig.add_scatter(x=d.lead_us, y=d.measured_gain_pct, mode="markers", marker_symbol="x" if extra else "circle",
                    name=name,
                    text=d.session, error_y=dict(type="data", symmetric=False,
                                                 array=d.measured_gain_pct_hi - d.measured_gain_pct,
                                                 arrayminus=d.measured_gain_pct - d.measured_gain_pct_lo))
xs = [0.0, float(pts.lead_us.max()) * 1.05]
fig.add_scatter(x=xs, y=[rel.predict(x) for x in xs], mode="lines", name=rel.describe())
fig.update_layout(title="the fix's gain against the host's lead (TP=1; bars: paired-bootstrap 95 % intervals)",
                  xaxis_title="host lead: median host time blocked per later sync (µs)",
                  yaxis_title="input throughput gain over sync (%)").show()
display(pd.read_csv(catalog("probe.points").with_name("validation.csv")).round(2))  # studies/probe/read.py --write

# %% [markdown]
# ## A live run on this machine
# The same driver at the parameters above, unprofiled (the GPU idle column comes from one extra
# profiled forward per guard). On a GPU the lesson must hold: without adapters, `cpu_flag` beats
# `sync`, and with >= 10 repetitions the paired-bootstrap interval of the gain lies above zero;
# the notebook stops if it does not. On a CPU there is no GPU queue to drain: every op runs before
# it returns, so a sync waits for nothing. What `sync` costs there is its own work (the device
# reduction, now done by the CPU, and the `.item()` read); the table below prints that cost.

# %% tags=["lesson"]
if live:
    from lora_moe_lab.instruments.recorders.prefill import (PrefillDriver, build, load_adapters, make_plan, measure,
                                                  request_adapters)
    from lora_moe_lab.model.decoder import sites_per_layer
    from lora_moe_lab.nb.lessons import LessonError

    lab = build(preset, num_layers, max_loras=4, max_rank=16, dtype="auto", device="auto", backend="auto", seed=0,
                guard_sites=guard_sites)
    names = load_adapters(lab, 2, 16)
    plan = make_plan(requests, input_len, chunk)
    drivers = {m: PrefillDriver(lab, plan, request_adapters(requests, m, names)) for m in adapter_modes}
    key = dict(preset=preset, layers=num_layers, tp=1, requests=requests, input_len=input_len, chunk=chunk,
               guard_sites=guard_sites)
    live_rows = pd.DataFrame(measure(drivers, guards, reps, key=key, progress=False, warmup_reps=1))
    live_sum = P.summarize(live_rows)
    on_gpu = runtime.has_cuda()
    unsettled = on_gpu and "sync" in guards and "none" in adapter_modes and not bool(
        live_sum.set_index(["adapters", "guard"]).loc[("none", "sync"), "stable"])
    if unsettled:  # the point the lesson is checked on has no figure: timed once more, with twice the repetitions
        print(f"the repetitions never settled; timed again with {2 * reps} repetitions")
        live_rows = pd.DataFrame(measure(drivers, guards, 2 * reps, key=key, progress=False, warmup_reps=1))
        live_sum = P.summarize(live_rows)
    where = f"GPU {torch.cuda.get_device_name()}" if on_gpu else "CPU, wall clock"
    pp.guard_bars(live_sum, "input_tok_per_s", lo="input_tok_per_s_lo", hi="input_tok_per_s_hi",
                  title=f"Live run on this machine ({where}): input throughput",
                  yaxis_title="input tokens / s").show()
    s = live_sum.set_index(["adapters", "guard"])
    if "sync" in guards:
        n_sync = s.xs("sync", level="guard")["syncs_per_forward"]
        assert (n_sync == sum(sites_per_layer(guard_sites, num_layers))).all(), n_sync
    assert (s.drop(index="sync", level="guard", errors="ignore")["syncs_per_forward"] == 0).all()
    display(live_sum[["adapters", "guard", "reps", "warmup_note", "ci_method", "input_tok_per_s", "ttft_mean_ms",
                      "syncs_per_forward", "later_blocked_median_us", "gpu_idle_ms", "fix_throughput_gain_pct",
                      "fix_throughput_gain_pct_lo", "fix_throughput_gain_pct_hi", "fix_ttft_change_pct"]].round(3))
    if "sync" in guards and "cpu_flag" in guards and "none" in adapter_modes:
        r = s.loc[("none", "sync")]
        n = r["syncs_per_forward"]
        cost_us = 1e3 * (r["forward_median_ms"] - s.loc[("none", "cpu_flag"), "forward_median_ms"]) / n
        print(f"[{where}] without adapters, removing the sync: {r['fix_throughput_gain_pct']:+.1f} % input throughput "
              f"[{r['fix_throughput_gain_pct_lo']:+.1f}, {r['fix_throughput_gain_pct_hi']:+.1f}] ({r['ci_method']}); "
              f"{cost_us:.0f} us per sync of forward time, host blocked {r['later_blocked_median_us']:.0f} us per "
              f"later sync")
        if not bool(r["stable"]):
            # the warm-up check found no stable tail: no figure, never an average of drifting data
            print(f"[{where}] the repetitions never settled, so there is no figure to check: {r['warmup_note']}")
        elif on_gpu:
            if r["reps"] >= 10 and not r["fix_throughput_gain_pct_lo"] > 0:
                raise LessonError(f"live on the GPU the fix did not beat the sync guard: gain "
                                  f"{r['fix_throughput_gain_pct']:+.1f} % [{r['fix_throughput_gain_pct_lo']:+.1f}, "
                                  f"{r['fix_throughput_gain_pct_hi']:+.1f}]")
            print("lesson holds: the sync guard costs forward time on the GPU" if r["fix_throughput_gain_pct"] > 0 else
                  "with fewer than 10 repetitions no interval; the median gain is not positive here")
        else:
            print(f"on a CPU nothing is queued, so no sync waits for anything (host blocked "
                  f"{r['later_blocked_median_us']:.0f} us): the {cost_us:.0f} us per sync of forward time is the "
                  "guard's own work (the reduction and the .item() read run on the CPU) plus this machine's noise "
                  "(the spread above), not a GPU bubble")
