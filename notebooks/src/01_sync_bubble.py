# %% [markdown]
# # 01 · The sync bubble
#
# **Goal.** See why one innocent line — `if lora_mask.any().item():` — in every MoE layer makes a
# LoRA-serving forward slower, count the host-device syncs it causes, and compare it with the
# fix (`cpu_flag`) and the CUDA-graph-friendly alternative (`launch_always`).
#
# The GPU runs work from a queue that the host (Python) fills ahead of it. As long as the host
# stays ahead, the GPU never waits. `.item()` copies a value from the GPU to the host, so the host
# must **wait until the GPU has finished everything queued before it** — the queue drains, and
# when the host starts launching again, the GPU idles until the next kernel arrives. This MoE
# model asks once per layer (one *guard site* per layer): 48 layers, 48 syncs per forward.
# Production's old code asked at every LoRA-wrapped call, more than once per layer; the cell
# below prints how many.

# %% tags=["parameters"]
preset = "tiny"          # tiny, qwen3-30b-a3b or qwen3-30b-a3b-tp4
num_layers = 4           # MoE layers in the mini model (Qwen3-30B-A3B has 48); None: as many as the card holds
num_requests = 8         # requests in the batch of the sync count and the timeline
tokens_per_request = 8   # tokens each (decode: 1; prefill: many)
active_fraction = 0.5    # share of requests that use an adapter
guards = ["sync", "cpu_flag", "launch_always"]
device = "auto"          # auto, cpu or cuda
dtype = "auto"           # auto: bfloat16 on GPU, float32 on CPU
backend = "auto"         # auto: Triton on GPU, torch ops on CPU
recorded_tokens = 4096   # without a GPU: which recorded H200 traces to show, 4096 (the bubble) or 16 (host-bound)
timing_tokens = [16, 64] # tokens per forward (M) timed live, unprofiled; on a GPU both regimes: [16, 4096]
timing_reps = 10         # interleaved repetitions per M, at least 10 on a GPU (for an interval)
timing_warmup = 2        # untimed calls of every variant first (Triton compiles, clocks settle)
timing_active = 0.0      # share of requests with an adapter in the timing (0: the recording's headline case)
timeline_layers = 6      # layers of one forward drawn on each timeline (a 48-layer forward is megabytes)

# %%
import json

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch

from lora_moe_lab.model.guards import count_guard_syncs
from lora_moe_lab.model.lab import build_lab
from lora_moe_lab.model.lora import LoRABatchInfo, LoRABatchTensors
from lora_moe_lab.nb import lessons, live
from lora_moe_lab.nb import params as nbk
from lora_moe_lab.sim.production import PRODUCTION, PRODUCTION_SIGNATURE

nbk.reject_unknown_parameters()
nbk.check_preset(preset)
for _n in ("num_requests", "tokens_per_request", "timing_reps", "timeline_layers"):
    nbk.check_positive_int(_n, globals()[_n])
if num_layers is not None:
    nbk.check_positive_int("num_layers", num_layers)
active_fraction = nbk.check_fraction("active_fraction", active_fraction)
timing_active = nbk.check_fraction("timing_active", timing_active)
guards = nbk.check_guards(guards)
dev = nbk.check_device(device)
dtype = nbk.pick_dtype(dtype, dev)
if recorded_tokens not in (16, 4096):
    raise nbk.NotebookParameterError(f"bad notebook parameter recorded_tokens={recorded_tokens!r}: "
                                     "traces were recorded at 16 and 4096 tokens")
if not isinstance(timing_tokens, list) or not timing_tokens:
    raise nbk.NotebookParameterError(f"bad notebook parameter timing_tokens={timing_tokens!r}: a non-empty list")
for _m in timing_tokens:
    nbk.check_positive_int("timing_tokens", _m)
if not isinstance(timing_warmup, int) or isinstance(timing_warmup, bool) or timing_warmup < 0:
    raise nbk.NotebookParameterError(f"bad notebook parameter timing_warmup={timing_warmup!r}: an int >= 0")
LIVE = nbk.live_gpu() and dev.type == "cuda"
if LIVE and timing_reps < 10:
    raise nbk.NotebookParameterError(f"bad notebook parameter timing_reps={timing_reps!r}: a live interval needs "
                                     ">= 10 paired repetitions")
nbk.setup_plotly()
print(f"device: {dev}  dtype: {dtype}  live GPU: {LIVE}")

# %% [markdown]
# ## The model and a batch
# A mini model of `num_layers` MoE layers with random weights, and an adapter pool with two
# adapters of different ranks. The batch builder knows from plain Python lists whether any
# request uses an adapter: that is `has_active_lora`, and computing it costs nothing.

# %%
lab = build_lab(preset, num_layers=num_layers, dtype=dtype, device=str(dev), backend=backend,
                fit_tokens=max(timing_tokens + [num_requests * tokens_per_request]))
num_layers = lab.shape.num_layers  # on a GPU the build is sized to the card (it says so when it holds fewer)
lab.pool.load("support-bot", rank=8)
lab.pool.load("sql-helper", rank=16, scaling=0.5)
batch = LoRABatchInfo.random(lab.pool, num_requests, tokens_per_request, active_fraction, seed=0)
tensors = LoRABatchTensors.from_batch(batch, lab.device)
x = lab.random_input(batch.num_tokens, seed=0)
print("adapters per request:", batch.adapters)
print("has_active_lora (host, free):", batch.has_active_lora)

# %% [markdown]
# ## One forward per guard
# The three guards must give **identical** outputs: they only differ in *how* they decide whether
# to launch the LoRA kernels. The `sync` guard counts every `.item()` it performs, so even a CPU
# run can say how many syncs a GPU run would have.

# %%
outputs, rows = {}, []
for g in guards:
    with count_guard_syncs() as c:
        outputs[g] = lab.model(x, batch, tensors, guard=g)
    rows.append({"guard": g, "syncs_per_forward": c.count, "syncs_at_48_layers": c.count * 48 // num_layers})
ref_guard = guards[0]
for g in guards[1:]:
    assert torch.equal(outputs[g], outputs[ref_guard]), f"guard {g} differs from {ref_guard}"
print("all guards give bit-identical outputs")
syncs = pd.DataFrame(rows)
prod_syncs = PRODUCTION["syncs_per_forward"]
print(f"this model: 1 guard site per layer. Production: {prod_syncs:.0f} syncs per forward over 48 layers = "
      f"{prod_syncs / 48:.2f} guard sites per layer (every LoRA-wrapped call asked); the decoder reproduces that "
      f"with guard_sites = {prod_syncs:.0f}/48 (model/decoder.py, notebook 06)")
syncs

# %%
fig = go.Figure(go.Bar(x=syncs.guard, y=syncs.syncs_per_forward, text=syncs.syncs_per_forward,
                       marker_color=["#d62728" if g == "sync" else "#2ca02c" for g in syncs.guard]))
fig.update_layout(title=f"Host-device syncs per forward ({num_layers} layers)", xaxis_title="guard",
                  yaxis_title="syncs",
                  height=350)
fig.show()
assert all(r["syncs_per_forward"] == (num_layers if r["guard"] == "sync" else 0) for r in rows), rows

# %% [markdown]
# ## What a sync costs: timed, not profiled
# A profiler records every runtime call, which adds host time to every launch: at a host-bound
# size a profiled forward measures the profiler, not the guard (an earlier version of this
# notebook printed `sync` faster than `cpu_flag` from a profiled forward). So the times below come
# from **interleaved, unprofiled repetitions**: each repetition runs every guard once — and on a
# GPU a CUDA-graph replay of the same forward — back to back in a rotating order, each from an
# idle device (`nb/live.py`, the same recipe as the canonical recording in `data/guards/`). The
# difference `sync − cpu_flag` within one repetition is paired; its median and 95 % interval are
# computed by the same function that reads the recording (`instruments/analysers/recordings.py`).
#
# The graph replay issues the whole forward with one host call, so it takes about the GPU's own
# time: eager `cpu_flag` over the replay says who sets the pace. Far above 1, the host does
# (host-bound): the GPU's queue is nearly empty whenever the host reaches a guard, and a sync has
# almost nothing to drain. Near 1, the GPU does, the host runs ahead, and every `.item()` ends
# that overlap.

# %%
from lora_moe_lab.instruments.analysers.recordings import load_guards

rec = load_guards()
rec_lost = rec.paired("sync", "cpu_flag")
min_M = lessons.lesson_min_tokens(rec_lost, preset, timing_active)
print(f"recording {rec.label}: from M={min_M} up every interval of the time lost per sync lies above zero "
      f"({lessons.lesson_scope(rec_lost, preset, timing_active)}): there a live sync must cost time")
samples = live.time_guards(lab, timing_tokens, reps=timing_reps, warmup=timing_warmup, active=timing_active,
                           adapter="support-bot", preset=preset)  # every registered guard
live_rec = live.as_recording(samples, preset=preset, layers=num_layers, tokens=timing_tokens, reps=timing_reps)
live_label = f"live: {live_rec.label}"
tbl = lessons.guard_table(live_rec)
# A point whose repetitions never settled (GPU clocks still moving) has no figure to check or explain,
# whatever its regime: it is timed once more, with twice the repetitions, before the verdict.
unsettled = [int(r.tokens) for _, r in tbl.iterrows() if lessons.needs_retime(r, gpu=LIVE)]
if unsettled:
    print(f"M={unsettled}: the repetitions never settled; timed again with {2 * timing_reps} repetitions")
    again = live.time_guards(lab, unsettled, reps=2 * timing_reps, warmup=timing_warmup, active=timing_active,
                             adapter="support-bot", preset=preset)
    tbl2 = lessons.guard_table(live.as_recording(again, preset=preset, layers=num_layers, tokens=unsettled,
                                                 reps=2 * timing_reps))
    tbl = pd.concat([tbl[~tbl.tokens.isin(unsettled)], tbl2]).sort_values("tokens").reset_index(drop=True)
print(f"{live_label}: {preset}, {num_layers} layers, {timing_reps} interleaved repetitions per M, timer "
      f"{samples.timer.iloc[0]}, active {timing_active:g}")
print("method:", lessons.interval_method(tbl))  # from the points that settled
show = ["tokens", "regime", "sync_ms", "cpu_flag_ms", "launch_always_ms", "graph_ms", "eager_over_graph",
        "sync_over_cpu_flag", "sync_lo", "sync_hi", "us_per_sync", "us_per_sync_lo", "us_per_sync_hi", "n"]
tbl[[c for c in show if c in tbl]].round(3)

# %% [markdown]
# The figure below draws `sync / cpu_flag` as the ratio of the medians with its 95 % interval (the
# method printed above). On a GPU the live points sit beside the H200 recording on one axis. On a CPU
# they get a panel of their own, below it: a CPU run has no device queue, its ratio is the host's own
# noise around 1 with intervals that can be much wider, and on a shared axis it would flatten the
# H200 points.

# %%
from plotly.subplots import make_subplots

rt = lessons.guard_table(rec)
live_err = dict(type="data", symmetric=False,
                array=(tbl.sync_hi - tbl.sync_over_cpu_flag).replace(np.inf, np.nan),
                arrayminus=(tbl.sync_over_cpu_flag - tbl.sync_lo).replace(np.inf, np.nan))
if LIVE:
    fig, rows = go.Figure(), (None, None)
else:
    fig = make_subplots(rows=2, cols=1, vertical_spacing=0.18,
                        subplot_titles=("recorded on an H200 (48 layers, no adapter active)",
                                        "live on this machine: a CPU, no device queue (its own axis)"))
    rows = (1, 2)
where = dict(row=rows[0], col=1) if rows[0] else {}
for pr, g in rt[(rt.active == 0) & (rt.layers == 48)].groupby("preset"):
    fig.add_trace(go.Scatter(x=g.tokens, y=g.sync_over_cpu_flag, mode="markers", name=f"recorded {pr}",
                             marker=dict(symbol="diamond"),
                             error_y=dict(type="data", symmetric=False, array=g.sync_hi - g.sync_over_cpu_flag,
                                          arrayminus=g.sync_over_cpu_flag - g.sync_lo)), **where)
fig.add_trace(go.Scatter(x=tbl.tokens, y=tbl.sync_over_cpu_flag, mode="markers+lines", name=live_label,
                         error_y=live_err), **(dict(row=rows[1], col=1) if rows[1] else {}))
for r in ([None] if LIVE else [1, 2]):
    kw = dict(row=r, col=1) if r else {}
    fig.add_hline(y=1, line_dash="dot", line_color="gray", **kw)
    fig.update_xaxes(title_text="tokens per forward (M)", type="log", **kw)
    fig.update_yaxes(title_text="sync / cpu_flag", **kw)
fig.add_vline(x=min_M, line_dash="dash", line_color="#d62728", **where)
fig.update_layout(title="sync / cpu_flag per forward, with its 95 % interval (right of the dashed line the lesson "
                        "must hold)", height=420 if LIVE else 700)
fig.show()

# %% [markdown]
# **The lesson, checked.** On a GPU, at every timed M from the recording's threshold up, `sync`
# must be slower than `cpu_flag`: the notebook stops if it is not. Below it, the gap may be small
# or even reversed, and the cell says why with the numbers it measured. On a CPU nothing is
# asserted: `.item()` on a CPU tensor reads host memory, there is no device queue to drain.

# %% tags=["lesson"]
for row in tbl.itertuples(index=False):
    v = lessons.guard_verdict(pd.Series(row._asdict()), min_M, gpu=LIVE)
    print(v.text, "\n")
    if LIVE:
        v.check()
for row in tbl.itertuples(index=False):  # on a GPU: the host's launch cost (CPU: the torch ops compute on the host)
    if LIVE and "launch_always_over_cpu_flag" in tbl and timing_active == 0:
        if not np.isfinite(row.launch_always_over_cpu_flag):  # the point's repetitions never settled
            print(f"M={row.tokens}: launch_always / cpu_flag: the repetitions never settled (unstable): no figure, "
                  "not averaged; run again with more repetitions.")
            continue
        per_layer = (row.launch_always_ms - row.cpu_flag_ms) * 1e3 / num_layers
        print(f"M={row.tokens}: launch_always / cpu_flag {row.launch_always_over_cpu_flag:.3f} "
              f"[{row.launch_always_lo:.3f}, {row.launch_always_hi:.3f}]: no adapter is active, so cpu_flag launches "
              f"no LoRA kernel while launch_always issues the LoRA path in every layer ({per_layer:+.0f} us of "
              "forward per layer, eager). Under a graph replay that host cost is gone (notebook 03).")

# %% [markdown]
# ## The bubble on a timeline
# A profiler trace shows where the time goes (its times are not the forward's: see above): the
# host lane (CUDA runtime calls), the GPU lane (kernels), the syncs, and every GPU idle gap
# coloured by its cause:
#
# * **after_sync** — the host was blocked in a sync, the queue ran dry, and the GPU now waits
#   for the host to start launching again.
# * **sync_reissue** — later in the same layer: the queue is still empty because of the sync, and
#   the host re-issues the layer's small ops one at a time, so the GPU waits for each. Without the
#   sync the host would have been ahead and these ops queued. Still the sync's fault.
# * **host_launch_wait** — the host could not issue kernels as fast as the GPU ran them (no sync
#   involved).
# * **kernel_to_kernel** — the next kernel was already queued; the small device-side gap.
#
# On a GPU this cell profiles the model live; without one it loads traces recorded on an H200 at
# `recorded_tokens` tokens per forward (8 layers of qwen3-30b-a3b, two profiled forwards each).

# %%
from lora_moe_lab.instruments.recorders import profiling
from lora_moe_lab.instruments.analysers import trace
from lora_moe_lab.provenance import label
from lora_moe_lab.ui import plots

TRACE_DIR = nbk.DATA / "traces"
traces, labels = {}, {}
if LIVE:
    for g in guards:
        traces[g] = profiling.profile_forwards(lambda: lab.model(x, batch, tensors, guard=g), n_warmup=1,
                                               n_active=2, labels={"guard": g})
        labels[g] = f"live on {torch.cuda.get_device_name(0)}, {preset}, {num_layers} layers, M={batch.num_tokens}"
else:
    for g in guards:
        f = TRACE_DIR / f"qwen3-30b-a3b_{g}_eager_M{recorded_tokens}.json.gz"
        if not f.exists():
            raise FileNotFoundError(f"no GPU and no recorded trace {f}")
        traces[g] = trace.load_trace(f)
        m = json.loads(f.with_name(f.name.replace(".json.gz", ".meta.json")).read_text())
        labels[g] = f"recorded: {label(m)}, {m['params']['num_layers']} layers, M={m['params']['M']}"
for g, src in labels.items():  # every trace names its own recording
    print(f"{g:14s} {src}")
gaps = {g: trace.idle_gaps(t) for g, t in traces.items()}
metrics = pd.concat([trace.forward_metrics(t).assign(guard=g) for g, t in traces.items()], ignore_index=True)
busy = metrics.groupby("guard").busy_ns.mean().div(1e3).to_dict()
idle = lessons.idle_by_cause(gaps, busy)
idle["kernels_per_forward"] = metrics.groupby("guard").n_kernels.mean()
idle["syncs_per_forward"] = metrics.groupby("guard").n_syncs.mean()
idle.round(1)

# %%
for g in [g for g in ("sync", "cpu_flag") if g in traces]:
    f = int(traces[g].forwards.forward.iloc[-1])
    shown = lessons.attribute_sync_gaps(gaps[g]).assign(category=lambda d: d["cause"])
    plots.timeline(traces[g], forward=f, layers=timeline_layers, gaps=shown,
                   title=f"guard={g}: the first {timeline_layers} layers of one forward ({labels[g].split(',')[0]})").show()

# %%
causes = ("after_sync", "sync_reissue", "host_launch_wait", "kernel_to_kernel", "other")
bars = idle.reset_index().assign(busy_ns=lambda d: d.busy_us * 1e3,
                                 **{f"idle_{c}_ns": (lambda d, c=c: d[f"idle_{c}_us"] * 1e3) for c in causes})
plots.idle_breakdown(bars, by="guard", causes=causes,
                     title="GPU time per forward: busy and idle by cause (profiled)").show()
print(lessons.explain_sync_idle(idle))
if "sync" in idle.index:
    assert idle.loc["sync", "idle_after_sync_us"] > 0, "the sync guard should leave after-sync bubbles"
for g in idle.index.drop("sync", errors="ignore"):
    assert idle.loc[g, "syncs_per_forward"] == 0 and idle.loc[g, "sync_blamed_us"] == 0, idle

# %% [markdown]
# **`launch_always` in these traces.** The batch has adapters in use, so `cpu_flag` launches the
# LoRA kernels too: both guards issue the same kernels (the cell prints their counts), and any
# difference of their profiled host time is not launch cost. The price of `launch_always` is
# the case where no adapter is active (the timing above, `timing_active = 0`): `cpu_flag` then
# skips the LoRA path, `launch_always` still issues it in every layer, and in eager mode the host
# pays for that; a graph replay removes it (notebook 03).

# %%
if {"cpu_flag", "launch_always"} <= set(idle.index):
    k = idle["kernels_per_forward"]
    print(f"kernels per forward: cpu_flag {k['cpu_flag']:.0f}, launch_always {k['launch_always']:.0f}"
          + (" - the same kernels" if k["cpu_flag"] == k["launch_always"] else ""))

# %% [markdown]
# ## Cost per sync over every recorded size
# The canonical guards recording (`data/guards/`): 48 layers, every (preset, tokens, active)
# point timed over interleaved repetitions like the live cell above. Shown: the paired median of
# `sync − cpu_flag` divided by the syncs per forward, with its 95 % interval (the method is printed).

# %%
lost = rec_lost
print(f"recorded: {rec.label}; {int(lost.n.min())} repetitions per point at least; "
      f"method: {lessons.interval_method(lost)}" if "method" in lost else f"recorded: {rec.label}")
cols = ["preset", "tokens", "active", "t_variant_us", "t_baseline_us", "ratio", "syncs", "us_per_sync",
        "us_per_sync_lo95", "us_per_sync_hi95"]
lost[cols].rename(columns={"t_variant_us": "sync_us", "t_baseline_us": "cpu_flag_us"}).round(2)

# %%
fig = go.Figure()
for (pr, act), g in lost.groupby(["preset", "active"]):
    fig.add_trace(go.Scatter(x=g.tokens, y=g.us_per_sync, mode="lines+markers", name=f"{pr}, active {act:g}",
                             error_y=dict(type="data", symmetric=False, array=g.us_per_sync_hi95 - g.us_per_sync,
                                          arrayminus=g.us_per_sync - g.us_per_sync_lo95)))
fig.add_hline(y=0, line_dash="dot", line_color="gray")
fig.update_layout(title=f"Time lost per sync, median and 95 % interval ({rec.label})",
                  xaxis_title="tokens per forward (M)", yaxis_title="µs lost per sync", xaxis_type="log", height=420)
fig.show()
all_M = lessons.lesson_min_tokens(lost)  # over every preset and adapter mix
big = lost[lost.tokens >= all_M]
print(f"M >= {all_M}: {big.us_per_sync.min():.0f}-{big.us_per_sync.max():.0f} us lost per sync; "
      f"every interval above zero: {bool((big.us_per_sync_lo95 > 0).all())}")
assert (big.us_per_sync_lo95 > 0).all(), "the recording contradicts the lesson: look before trusting it"
small = lost[lost.tokens == lost.tokens.min()]
reg = rt[rt.tokens == small.tokens.iloc[0]].regime.unique()
print(f"M = {int(small.tokens.iloc[0])} ({', '.join(reg)}: eager over graph replay "
      f"{rt[rt.tokens == small.tokens.iloc[0]].eager_over_graph.min():.1f}x or more): medians of "
      f"{small.us_per_sync.min():.0f}-{small.us_per_sync.max():.0f} us per sync (the round trip and the host's restart, "
      f"not a bubble), 95 % intervals "
      + ", ".join(f"[{lo:.0f}, {hi:.0f}]" for lo, hi in zip(small.us_per_sync_lo95, small.us_per_sync_hi95))
      + f": {int((small.us_per_sync_lo95 > 0).sum())} of {len(small)} above zero, so at this size the cost is "
      "resolved only where that interval is; the lesson is asserted at M >= " + f"{all_M} only")

# %% [markdown]
# **Where the lesson holds, and its scope.** The cell above (and, for the `tiny` preset, the live check)
# reads the threshold over **every recorded preset and adapter mix**, half the requests active included. The
# guards table of `docs/results.md` gives both thresholds: the one over the points with **no adapter active**
# only is lower, since a half-active point's interval reaches below zero at a larger M. Both are true; they
# read different points.

# %% [markdown]
# ## For scale: what production reported
# Production (Qwen3-30B-A3B, 48 MoE layers, TP=4, batch 128 × 2048 input tokens) counted its syncs
# and the **host** time blocked in them (sgl-project/sglang#25531's trace): that is how long the
# Python thread waited inside `cudaStreamSynchronize`, not how long the GPU idled. Most of it is
# the forward's first sync, which waits for all the work queued before it; a host-blocked time
# is therefore no per-sync GPU bubble and is not set beside one here. What removing the guard
# gave end to end is the figure that compares with this lab's (notebook 06).

# %%
sig = PRODUCTION_SIGNATURE
print(f"production: {sig['syncs_per_forward']:.0f} cudaStreamSynchronize per forward; host blocked in them "
      f"~{sig['host_blocked_ms_per_forward']:.0f} ms per forward, ~{sig['first_sync_ms']:.0f} ms of it in the first "
      f"sync of the forward, the other {sig['syncs_per_forward'] - 1:.0f} ~{sig['later_blocked_mean_us']:.0f} us each "
      "(host time; source: sgl-project/sglang#25531)")
print(f"removing the guard: {PRODUCTION['input_throughput_gain_pct']:+.1f} % input throughput, "
      f"{PRODUCTION['ttft_change_pct']:+.1f} % TTFT")

# %% [markdown]
# ## Takeaway
# A per-layer `.item()` guard makes the host wait for the GPU's queue in every layer and the GPU idle while
# the host issues again; deciding on the host (`cpu_flag`) gives bit-identical outputs with no sync. What that
# buys depends on how far the host runs ahead of the GPU, so the number to quote is production's, printed below.

# %%
print(f"The number to quote: {PRODUCTION['input_throughput_gain_pct']:+.1f} % input throughput, "
      f"{PRODUCTION['ttft_change_pct']:+.1f} % TTFT from removing the guard (Qwen3-30B-A3B, TP=4, 260 syncs per "
      "forward; source: sgl-project/sglang#25531). The lab's reproduction: docs/results.md.")
