# %% [markdown]
# # 05 · A scale model of the sync bubble
#
# **Goal.** Explain the production numbers — 260 syncs per forward, +14.4 % input throughput and
# −12.6 % TTFT once the guard was gone — with a model small
# enough to reason about, fitted to what one GPU measured, checked on points the fit did not see,
# and then pushed to the production setting that no single GPU here runs (TP=4, 48 layers,
# 128 × 2048 input tokens).
#
# The model (`lora_moe_lab.sim`) is a queue. The host issues ops one after another, each
# costing host time (PyTorch dispatch + the launch call); the GPU runs the queue in order, each op
# starting once it has been issued *and* the previous op has finished. While the host stays ahead,
# launch costs are hidden. A sync (`.item()` → `cudaStreamSynchronize`) blocks the host until the
# queue is empty; afterwards the GPU idles until the host has issued the next op. Its parameters:
# a host cost per launch (and the extra of a Triton launch), a sync overhead, a graph-launch cost,
# a fixed device time per kernel, and effective math and memory rates.
#
# What production's trace measured is not what this model predicts: its ~100 ms per forward is
# host time blocked in `cudaStreamSynchronize` (~70 ms of it in the first sync), while the model's
# "lost per sync" is GPU time lost (the `sync` forward minus the `cpu_flag` one). The two are never
# set side by side here; notebook 06 compares host-blocked time with host-blocked time.
#
# **One story.** Every number below comes from one calibration: the fit on the archived H200
# guards recording of 2026-11-30 (`data/guards/h200_guards.csv`, 15 repetitions, before the
# warm-up check; the model was not refitted on the newer sessions), its held-out validation and
# its production extrapolation, written by `scripts/validate_simulator.py` to `data/simulator/`.
# The README quotes the same files. `refit = True` redoes the calibration here from that
# recording; the fit is deterministic, so it gives the same numbers.

# %% tags=["parameters"]
refit = False                  # True: refit here on the archived data/guards/h200_guards.csv (~10 s)
target_pct = 15.0              # validation target: within +-target_pct of the measured median (or its 95 % interval)
require_target = False         # True: stop here when a held-out point misses the target
timeline_preset = "qwen3-30b-a3b"  # shape of the simulated forward drawn as a timeline
timeline_tokens = 16           # its tokens
timeline_layers = 4            # its layers

# %%
import json
from pathlib import Path

import numpy as np
import pandas as pd

from lora_moe_lab import provenance, sim
from lora_moe_lab.instruments import trace
from lora_moe_lab.instruments.recordings import ARCHIVED_GUARDS_CSV, load_guards
from lora_moe_lab.nb import params as nbk
from lora_moe_lab.nb.params import NotebookParameterError
from lora_moe_lab.ui import plots, sim_plots, widgets

nbk.reject_unknown_parameters()
nbk.check_preset(timeline_preset)
for _n in ("timeline_tokens", "timeline_layers"):
    nbk.check_positive_int(_n, globals()[_n])
if not isinstance(target_pct, (int, float)) or isinstance(target_pct, bool) or not 0 < target_pct <= 100:
    raise NotebookParameterError(f"bad notebook parameter target_pct={target_pct!r}: a percentage in (0, 100]")
for _n in ("refit", "require_target"):
    if not isinstance(globals()[_n], bool):
        raise NotebookParameterError(f"bad notebook parameter {_n}={globals()[_n]!r}: True or False")
nbk.setup_plotly()
print("production:", {k: round(v, 1) for k, v in sim.PRODUCTION.items()})

# %% [markdown]
# ## The calibration
# Recorded on the H200: each guard (`sync`, `cpu_flag`, `launch_always`, and the CUDA-graph replay)
# at 48 layers, two shapes (the full model and one TP=4 rank), 16 … 16384 tokens, no adapter or
# half the requests with one; the variants interleaved in every repetition, so each point carries
# the median of its repetitions and a distribution-free 95 % interval of that median. The fit:
# `scipy.optimize.least_squares` over the log of each parameter inside physical bounds, residual
# log(predicted / measured) per point, weighted by the point's spread; fixed starting values, so
# the same recording always gives the same parameters.

# %%
if refit:
    rec = load_guards(ARCHIVED_GUARDS_CSV)  # the recording data/simulator was fitted on
    cal = sim.calibrate(rec, target_pct=target_pct)
    source = f"refitted here on {rec.path.relative_to(nbk.DATA.parent)}"
    try:
        stored = sim.load_calibration()
        same = np.allclose([getattr(stored.params, p) for p in stored.fit.fitted],
                           [getattr(cal.params, p) for p in stored.fit.fitted], rtol=1e-6)
        source += " — " + ("the same parameters as data/simulator" if same else
                           "DIFFERENT from data/simulator: rerun scripts/validate_simulator.py")
    except (OSError, ValueError):
        source += " (data/simulator has no calibration of this recording yet)"
else:
    cal = sim.load_calibration()
    source = "read from data/simulator/simulator_fit.json (scripts/validate_simulator.py; refit=True redoes it)"
LABEL = cal.label
print(f"recording: {LABEL}\ncalibration {source}")
f = cal.fit
tbl = pd.DataFrame({"start (defaults)": sim.CostModel().as_dict(), "fitted": cal.params.as_dict()}).loc[list(f.fitted)]
tbl["bounds"] = [sim.FIT_BOUNDS[p] for p in f.fitted]
tbl["at a bound"] = [p in f.at_bound for p in f.fitted]
print(f"fitted on {f.rows} points; rms log error {f.rms_log_error:.3f}  [{LABEL}]")
if f.at_bound:
    print(f"at a bound (the recording barely constrains them): {', '.join(f.at_bound)}")
tbl

# %% [markdown]
# A parameter at a bound is one the recording hardly sees: a graph launch of a few microseconds
# is invisible inside forwards of several milliseconds. Judge the model by the held-out
# validation below, not parameter by parameter.
#
# ## Validation on points the fit did not see
# Leave one token count out: for each of the recording's token counts, fit on every other one and
# predict the points at this one (five fits; at 16 and 16384 tokens this is an extrapolation). A
# point passes when the prediction is within ±`target_pct` % of the measured median, or inside
# the measurement's 95 % interval where that interval is wider — a point measured with ±20 % of
# run-to-run spread cannot be asked to match to 15 %, while one measured to ±0.1 % can. Below: the
# summary per guard, then every miss with why: the model is simulated at the point and says which
# side of the queue sets its time (`sim.diagnose`). A host-bound miss indicts the per-launch host
# costs (one number for every op and size), a device-bound miss the kernel-time model (one math
# and one memory rate for every kernel shape).

# %%
val = cal.validation
if target_pct != val.target_pct:  # the stored points judged again with this notebook's target
    val = sim.Validation(sim.judge(val.points, target_pct=target_pct), target_pct, val.how)
print(f"[{LABEL}]")
print(val.report().split("\n")[0])  # the misses follow below, each with the model's diagnosis
sim_plots.predicted_vs_measured(val.points, target_pct=target_pct, title="Held-out prediction vs measured median "
                                f"(whiskers: its 95 % interval) · {LABEL}").show()
if require_target:
    assert val.ok, val.report()
diag = sim.diagnose(val.points, cal.params)
miss = diag[~diag["passes"].astype(bool)]
print(f"{len(miss)} misses: " + ", ".join(f"{n} {b}-bound in {m} mode" for (b, m), n in
                                         miss.groupby(["bound", "mode"]).size().items()))
pd.set_option("display.max_colwidth", 400)
display(val.summary.round(1))
miss[["preset", "tokens", "active", "guard", "mode", "median_us", "predicted_us", "error_pct", "bound", "why"]].round(1)

# %% [markdown]
# ## A simulated forward, drawn like a recorded one
# The simulated timeline converts to the same tables the trace parser produces
# (`sim.to_trace_tables`), so `plots.timeline` draws it with the same lanes and idle-gap colours
# as a real profiler trace, and `trace.forward_metrics` measures it the same way. Red gaps are the
# GPU idling after a sync: the queue was drained and the host is issuing again.

# %%
params = cal.params
sel = dict(shape=timeline_preset, tokens=timeline_tokens, layers=timeline_layers, active=0.5, params=params)
sims = {g: sim.simulate_forward(guard=g, timeline=True, **sel) for g in ("sync", "cpu_flag")}
metrics = pd.concat({g: trace.forward_metrics(sim.to_trace_tables(r.timeline)) for g, r in sims.items()},
                    names=["guard"]).reset_index(level=0)
for g, r in sims.items():
    sim_plots.sim_timeline(r, title=f"Simulated forward: {timeline_preset}, {timeline_layers} layers, "
                                    f"M={timeline_tokens}, guard {g} ({r.forward_us:.0f} us) · fit of {LABEL}").show()
m = metrics.set_index("guard")
assert m.loc["sync", "n_syncs"] == timeline_layers and m.loc["cpu_flag", "n_syncs"] == 0, m
assert m.loc["sync", "idle_after_sync_ns"] > 0 and m.loc["cpu_flag", "idle_after_sync_ns"] == 0, m
assert sims["sync"].forward_us > sims["cpu_flag"].forward_us
plots.idle_breakdown(metrics, by="guard", title="Simulated GPU time per forward: busy and idle by cause").show()
metrics[["guard", "gpu_span_ns", "busy_ns", "idle_after_sync_ns", "idle_host_launch_wait_ns", "n_syncs", "gpu_util"]]

# %% [markdown]
# When a recorded profiler trace of the same kind is there (`data/traces`, `scripts/gpu_traces.py`),
# here it is beside the model (same builder; the trace carries its own label).

# %%
traces = [trace.load_trace(p) for p in sorted((nbk.DATA / "traces").glob("*_sync_eager_M*.json.gz"))]
traces = [t for t in traces if {"preset", "num_layers", "guard", "mode", "M"} <= set(t.labels)]
if traces:
    t = min(traces, key=lambda t: int(t.labels["M"]))
    lab_ = t.labels
    mp = Path(str(t.path).replace(".json.gz", ".meta.json")) if t.path else None
    tlabel = provenance.label(json.loads(mp.read_text())) if mp and mp.exists() else "unlabelled trace"
    plots.timeline(t, forward=int(t.forwards["forward"].iloc[0]), title=f"Recorded: {lab_['preset']}, "
                   f"{lab_['num_layers']} layers, M={lab_['M']}, guard sync · {tlabel}").show()
    ads = lab_.get("adapters") or []
    r = sim.simulate_forward(lab_["preset"], int(lab_["M"]), "sync", layers=int(lab_["num_layers"]), params=params,
                             active=(sum(a is not None for a in ads) / len(ads)) if ads else 0.5, timeline=True)
    sim_plots.sim_timeline(r, title=f"Simulated, same configuration ({r.forward_us:.0f} us) · fit of {LABEL}").show()
else:
    print("no recorded trace in data/traces (scripts/gpu_traces.py writes them on a GPU): only the simulated forward")

# %% [markdown]
# ## Extrapolation to production
# Qwen3-30B-A3B under tensor parallelism 4 (each rank holds a quarter of every expert's
# intermediate dimension), 48 layers, one all-reduce per layer, a batch of 128 × 2048 input tokens
# prefilled in chunks, half the tokens with an adapter, and **one guard sync per layer** as in this
# lab's model: 48 syncs per forward where production counted 260. The model covers the MoE blocks
# only (no attention, no sampling), so its absolute forward times are below the serving engine's;
# the time lost per sync is what transfers. These are the figures of
# `data/simulator/simulator_vs_production.csv` — the ones the README quotes (16384-token chunks).

# %% tags=["lesson"]
s_ = sim.PRODUCTION_SETTINGS
ex = sim.extrapolate(params, **s_)
cmp_ = cal.production
# the stored figures are the extrapolation of the stored parameters: one story, checked
assert np.allclose(sim.production_figures(params)["predicted"], cmp_["predicted"], rtol=1e-9), cmp_
sim_plots.extrapolation_figure(ex, cmp_, title=f"Production shapes (TP=4 rank, 48 layers): model vs production · "
                                               f"fit of {LABEL}").show()
h = cal.headline()
print(f"[{LABEL}] at {sim.HEADLINE_CHUNK}-token chunks: {h['syncs_per_forward']:.0f} syncs per forward, "
      f"{h['stall_us_per_sync']:.0f} us of GPU time lost per sync, {h['input_throughput_gain_pct']:+.1f} % input throughput, "
      f"{h['ttft_change_pct']:+.1f} % TTFT without the guard")
print(f"production: {sim.PRODUCTION['syncs_per_forward']:.0f} syncs per forward, "
      f"{sim.PRODUCTION['input_throughput_gain_pct']:+.1f} %, {sim.PRODUCTION['ttft_change_pct']:+.1f} % "
      f"(its {sim.PRODUCTION['stall_us_per_sync']:.0f} us per sync is host time blocked: no GPU-time counterpart)")
assert (ex.loc[ex["guard"] == "sync", "syncs_per_forward"] == 48 * s_["syncs_per_layer"]).all()
display(ex[["tokens", "chunks_per_batch", "guard", "forward_ms", "syncs_per_forward", "sync_stall_ms",
            "stall_ms_per_forward", "prefill_ms", "throughput_gain_vs_sync_pct"]].round(2))
cmp_.round(3)

# %% [markdown]
# **How far off, and why.** Production did not publish the GPU time a sync cost it, only the host
# time blocked in the syncs (~385 µs per sync on average, 70 % of it in the first), so the model's
# "lost per sync" has no production counterpart. What both have is the gain. Below: the time lost
# per sync at which the model's own `cpu_flag` forward would gain production's +14.4 % with 48
# syncs, and the sync overhead (host work between a sync and the next launch) that would make the
# model lose that much: far above the fitted value means production's engine did more host work
# after each sync than this model; zero means the model's drain alone already costs that much.

# %%
f_cf = float(ex[(ex["tokens"] == sim.HEADLINE_CHUNK) & (ex["guard"] == "cpu_flag")]["forward_ms"].iloc[0])
target_us = 1e3 * f_cf * sim.PRODUCTION["input_throughput_gain_pct"] / 100 / h["syncs_per_forward"]
need = sim.sync_us_to_match(params, target_us_per_sync=target_us, tokens=sim.HEADLINE_CHUNK, active=s_["active"],
                            syncs_per_layer=s_["syncs_per_layer"])
print(f"[{LABEL}] model: {h['stall_us_per_sync']:.0f} us of GPU time lost per sync (fitted sync overhead "
      f"{params.sync_us:.1f} us); production's +{sim.PRODUCTION['input_throughput_gain_pct']:.1f} % at the model's "
      f"{f_cf:.1f} ms cpu_flag forward and {h['syncs_per_forward']:.0f} syncs would need {target_us:.0f} us per sync")
if need > 0:
    print(f"to lose that much per sync, the host would need ~{need:.0f} us of work after each sync")
else:
    print("the model's drain alone already loses that much per sync")
assert need >= 0 and np.isfinite(need)

# %% [markdown]
# ## What if…
# Move the sliders: the host's launch cost per kernel (a faster or slower CPU, a leaner Python
# launcher) and the tokens per forward (the work each layer gives the GPU to hide the host
# behind). It starts at the fitted launch cost and the production setting above. The sync guard's
# penalty grows with the launch cost and shrinks as the per-layer work grows; `cpu_flag` and
# `launch_always` never stall (with some adapter active both launch the same LoRA kernels, so
# their lines coincide).

# %%
whatif = widgets.WhatIfPanel(params, tokens=sim.HEADLINE_CHUNK, syncs_per_layer=s_["syncs_per_layer"],
                             active=s_["active"])
display(whatif.widget)
_ = whatif.update(launch_us=round(params.launch_us, 2))  # draw once without a frontend (papermill)
t = whatif.last_table.set_index("guard")
assert t.loc["sync", "forward_ms"] > t.loc["cpu_flag", "forward_ms"], t

# %% [markdown]
# Snapshot of the what-if view for the HTML report (the sliders above live in the browser).

# %%
whatif.last_figure.show()
whatif.last_table.round(3)
