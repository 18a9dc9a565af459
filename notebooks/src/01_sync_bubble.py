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
# when the host starts launching again, the GPU idles until the next kernel arrives. One bubble
# per layer; 48 layers, 48 bubbles per forward.

# %% tags=["parameters"]
preset = "tiny"          # tiny, qwen3-30b-a3b or qwen3-30b-a3b-tp4
num_layers = 4           # MoE layers in the mini model (Qwen3-30B-A3B has 48)
num_requests = 8         # requests in the batch
tokens_per_request = 8   # tokens each (decode: 1; prefill: many)
active_fraction = 0.5    # share of requests that use an adapter
guards = ["sync", "cpu_flag", "launch_always"]
device = "auto"          # auto, cpu or cuda
dtype = "auto"           # auto: bfloat16 on GPU, float32 on CPU
backend = "auto"         # auto: Triton on GPU, torch ops on CPU
recorded_tokens = 4096   # without a GPU: which recorded H200 traces to show, 4096 (the bubble) or 16 (host-bound)

# %%
import json

import torch
import plotly.graph_objects as go
import pandas as pd

from lora_moe_lab.model.guards import count_guard_syncs
from lora_moe_lab.model.lab import build_lab
from lora_moe_lab.model.lora import LoRABatchInfo, LoRABatchTensors
from lora_moe_lab.nb import params as nbk

nbk.reject_unknown_parameters()
nbk.check_preset(preset)
for _n in ("num_layers", "num_requests", "tokens_per_request"):
    nbk.check_positive_int(_n, globals()[_n])
active_fraction = nbk.check_fraction("active_fraction", active_fraction)
guards = nbk.check_guards(guards)
dev = nbk.check_device(device)
dtype = nbk.pick_dtype(dtype, dev)
if recorded_tokens not in (16, 4096):
    raise nbk.NotebookParameterError(f"bad notebook parameter recorded_tokens={recorded_tokens!r}: "
                                     "traces were recorded at 16 and 4096 tokens")
nbk.setup_plotly()
print(f"device: {dev}  dtype: {dtype}  live GPU: {nbk.live_gpu()}")

# %% [markdown]
# ## The model and a batch
# A mini model of `num_layers` MoE layers with random weights, and an adapter pool with two
# adapters of different ranks. The batch builder knows from plain Python lists whether any
# request uses an adapter: that is `has_active_lora`, and computing it costs nothing.

# %%
lab = build_lab(preset, num_layers=num_layers, dtype=dtype, device=str(dev), backend=backend)
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
syncs

# %%
fig = go.Figure(go.Bar(x=syncs.guard, y=syncs.syncs_per_forward, text=syncs.syncs_per_forward,
                       marker_color=["#d62728" if g == "sync" else "#2ca02c" for g in syncs.guard]))
fig.update_layout(title=f"Host-device syncs per forward ({num_layers} layers)", xaxis_title="guard", yaxis_title="syncs",
                  height=350)
fig.show()
assert all(r["syncs_per_forward"] == (num_layers if r["guard"] == "sync" else 0) for r in rows), rows

# %% [markdown]
# ## The bubble on a timeline
# A profiler trace shows it directly: the host lane (CUDA runtime calls), the GPU lane (kernels),
# the syncs, and every GPU idle gap coloured by its cause:
#
# * **after_sync** — the host was blocked in a sync, the queue ran dry, and the GPU now waits
#   for the host to start launching again. This is the bubble the `sync` guard creates per layer.
# * **host_launch_wait** — the host simply could not issue kernels as fast as the GPU ran them.
# * **kernel_to_kernel** — the next kernel was already queued; the small device-side gap.
#
# On a GPU this cell profiles the model live; without one it loads traces recorded on an H200 at
# `recorded_tokens` tokens per forward (8 layers of qwen3-30b-a3b, two profiled forwards each).

# %%
from lora_moe_lab.instruments import trace
from lora_moe_lab.provenance import label
from lora_moe_lab.ui import plots

TRACE_DIR = nbk.DATA / "traces"
traces, labels = {}, {}
if LIVE_TRACE := nbk.live_gpu():
    for g in guards:
        traces[g] = trace.profile_forwards(lambda: lab.model(x, batch, tensors, guard=g), n_warmup=1, n_active=2,
                                           labels={"guard": g})
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
metrics = pd.concat([trace.forward_metrics(t).assign(guard=g) for g, t in traces.items()], ignore_index=True)
# end to end: from the host entering forward() until both host and GPU are done
metrics["e2e_ns"] = (metrics[["host_end_ns", "gpu_end_ns"]].astype("float64").max(axis=1) - metrics.host_start_ns)
per_guard = metrics.groupby("guard", sort=False)[["e2e_ns", "host_ns", "busy_ns", "idle_ns",
                                                  "idle_after_sync_ns", "n_syncs"]].mean() / [1e3, 1e3, 1e3, 1e3, 1e3, 1]
per_guard.columns = ["forward_us", "host_us", "gpu_busy_us", "gpu_idle_us", "idle_after_sync_us", "syncs"]
per_guard.round(1)

# %%
for g in [g for g in ("sync", "cpu_flag") if g in traces]:
    plots.timeline(traces[g], forward=int(traces[g].forwards.forward.iloc[-1]),
                   title=f"guard={g}: one forward ({labels[g].split(',')[0]})").show()

# %%
plots.idle_breakdown(metrics, by="guard", title="GPU time per forward: busy and idle by cause").show()
if "sync" in per_guard.index:
    assert per_guard.loc["sync", "idle_after_sync_us"] > 0, "the sync guard should leave after-sync bubbles"
for g in per_guard.index.drop("sync", errors="ignore"):
    assert per_guard.loc[g, "syncs"] == 0 and per_guard.loc[g, "idle_after_sync_us"] == 0, per_guard

# %% [markdown]
# ### Reading the two regimes
# Whether a drained queue costs anything depends on who is ahead.
#
# * **GPU-bound (thousands of tokens).** The host issues a layer faster than the GPU runs it, so
#   without a sync the two overlap: the host is already several kernels ahead. `.item()` ends the
#   overlap in every layer: the host waits for the whole queue, then the GPU waits while the host
#   issues the next layer's first kernels. The forward loses about the host's issue time per
#   layer — hundreds of microseconds per sync, clearly visible below.
# * **Host-bound (a few tokens).** The GPU runs a layer far faster than Python issues it, so its
#   queue is empty most of the time anyway. Draining an already-empty queue costs only the round
#   trip, tens of microseconds, and one or two profiled forwards cannot tell that from the noise of
#   the host's own speed (which is why a single M=16 trace can even show `sync` ahead).
#
# `launch_always` in eager mode issues the LoRA launches in every layer whatever the batch (the
# per-adapter alignment and two fused LoRA kernels, each through Triton's Python launcher): its
# programs exit early on the GPU, but the host still pays for issuing them, which shows in the
# host-bound regime. It is the strategy for CUDA graphs, where a replay issues the whole forward
# with one host call and those launch costs disappear (notebook 03).

# %%
regime = per_guard.assign(host_over_gpu=per_guard.host_us / per_guard.gpu_busy_us)
print(regime[["forward_us", "host_us", "gpu_busy_us", "host_over_gpu"]].round(2).to_string())
if "cpu_flag" in regime.index:
    r = regime.loc["cpu_flag", "host_over_gpu"]
    print(f"cpu_flag: the host needs {r:.2f}x the GPU's busy time -> "
          + ("host-bound: a sync drains a queue that is mostly empty anyway" if r > 1.5 else
             "the GPU has work queued: a sync ends the host/GPU overlap in every layer"))
if {"launch_always", "cpu_flag"} <= set(regime.index):
    extra = regime.loc["launch_always", "host_us"] - regime.loc["cpu_flag", "host_us"]
    n_layers = int(per_guard.loc["sync", "syncs"]) if "sync" in per_guard.index else num_layers
    print(f"launch_always issues the LoRA launches in every layer: +{extra:.0f} us of host time per forward "
          f"(+{extra / max(n_layers, 1):.0f} us per layer)")

# %% [markdown]
# ## Cost per sync, with its spread
# A trace is one or two forwards: good for seeing where the time goes, not for measuring a
# difference of a few percent. The cost per sync comes from the canonical guards recording
# (`data/guards/`): 48 layers, every (preset, tokens, active) point timed over interleaved
# repetitions — each repetition runs every guard back to back from an idle GPU — so the difference
# `sync − cpu_flag` within one repetition is a paired measurement. Shown: its median divided by
# the syncs per forward, with the 95 % interval of that median.

# %%
from lora_moe_lab.instruments.recordings import load_guards

rec = load_guards()
lost = rec.paired("sync", "cpu_flag")
print(f"recorded: {rec.label}; {int(lost.n.min())} interleaved repetitions per point")
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
big = lost[lost.tokens >= 1024]
print(f"M >= 1024: {big.us_per_sync.min():.0f}-{big.us_per_sync.max():.0f} us lost per sync; "
      f"every interval above zero: {bool((big.us_per_sync_lo95 > 0).all())}")
assert (big.us_per_sync_lo95 > 0).all(), "the recording contradicts the lesson at M >= 1024: look before trusting it"
small = lost[lost.tokens == lost.tokens.min()]
print(f"M = {int(small.tokens.iloc[0])} (host-bound): {small.us_per_sync.round(0).tolist()} us per sync, 95 % intervals "
      + ", ".join(f"[{lo:.0f}, {hi:.0f}]" for lo, hi in zip(small.us_per_sync_lo95, small.us_per_sync_hi95)))

# %% [markdown]
# ## For scale: the production figures
# Qwen3-30B-A3B, 48 MoE layers, TP=4, batch 128 × 2048 input tokens: the old guard made **260
# `cudaStreamSynchronize` per forward**, about **100 ms of GPU stall per forward**; removing it
# gave **+14.4 % input throughput** and **−12.6 % TTFT**.
