# %% [markdown]
# # 04 · Live micro-benchmarks
#
# **Goal.** Measure the cost of the per-layer guard yourself: pick a model shape, a batch size, a
# guard, how many requests use an adapter, the LoRA rank, and eager launches or CUDA-graph
# replay — then press **Run**.
#
# What is measured (on a GPU): one forward of the mini MoE model, timed with CUDA events from an
# idle device (see `lora_moe_lab.instruments.recorders.timing`): it covers the host issuing every kernel while the GPU
# runs them, and every host-device sync the guard makes. **Run** interleaves the guards: each
# repetition runs every guard once, in a rotating order, so their ratios are paired. With the `sync`
# guard, each layer's
# `.item()` makes the host wait until the GPU has drained its queue; the GPU then idles until the
# host has issued the next kernels. The difference to `cpu_flag` is the price of those bubbles.
# In graph mode the whole forward is one `cudaGraphLaunch`: no per-kernel launch cost, and no
# guard syncs (every guard records the LoRA kernels; they exit early on the GPU).
#
# **Predictions** come from the lab's validated model, the trace-driven replay (`lora_moe_lab.sim.whatif`,
# held out within ±5 % or the measurement's interval: `data/replay/validation.csv`, notebook 05): at each
# token count with a profiled forward (M=16 and 4096 of `qwen3-30b-a3b`, half the requests on an
# adapter, rank 16), per guard. Elsewhere the panel says there is no prediction: the replay predicts
# only from a recorded trace, and the earlier queue simulator, which drew curves at every M, rarely agrees
# with the replay (`data/replay/simulator_vs_replay.csv`), so it is not drawn.
# **Without a GPU** the panel shows those predictions and the canonical H200 recording
# (`data/guards/h200_guards_s1.csv` and `data/guards/h200_guards_s2.csv`, two device sessions pooled by
# `load_guards()`) — it says which numbers come from where. Moving a control redraws
# the view (▲ replay, ◆ recorded, ● your live points); **Run** adds rows to the results table. A
# long run shows its progress and
# stops at the next repetition when you press **Stop**.

# %% tags=["parameters"]
preset = "qwen3-30b-a3b"  # tiny, qwen3-30b-a3b or qwen3-30b-a3b-tp4
num_layers = 48  # MoE layers per forward, 1..48, or None: as many as the card holds (~1.4 GiB each)
tokens = 4096  # tokens per forward, a power of two up to 16384 (replay predictions at 16 and 4096)
guard = "sync"  # sync, cpu_flag or launch_always
active_fraction = 0.5  # share of requests that use an adapter
rank = 16  # LoRA rank: 4, 8, 16, 32 or 64
mode = "eager"  # eager or graph
reps = 5  # timed repetitions per guard, live GPU only
warmup = 2  # untimed calls first, live GPU only
all_guards = True  # Run measures all three guards, not only the selected one
device = "auto"  # auto, cpu or cuda

# %%

import pandas as pd

from lora_moe_lab.instruments.analysers.recordings import load_guards
from lora_moe_lab.nb import params as nbk
from lora_moe_lab.nb.params import NotebookParameterError
from lora_moe_lab.sim import whatif
from lora_moe_lab.ui import whatif_bench, widgets

nbk.reject_unknown_parameters()
nbk.check_preset(preset)
for _n in ("tokens", "rank", "reps"):
    nbk.check_positive_int(_n, globals()[_n])
if num_layers is None:  # sized to the card before anything is built (model/sizing.py); on a CPU: the preset's
    from lora_moe_lab.model.sizing import plan_build
    _plan = plan_build(preset, decoder=False, max_rank=rank, device=device)  # room for any M the panel offers
    num_layers = _plan.num_layers
    print(_plan.describe())
nbk.check_positive_int("num_layers", num_layers)
if num_layers > 48:
    raise NotebookParameterError(f"bad notebook parameter num_layers={num_layers!r}: at most 48")
if tokens not in widgets.TOKENS:
    raise NotebookParameterError(
        f"bad notebook parameter tokens={tokens!r}: a power of two in {widgets.TOKENS}"
    )
if rank not in widgets.RANKS:
    raise NotebookParameterError(f"bad notebook parameter rank={rank!r}: one of {widgets.RANKS}")
if mode not in ("eager", "graph"):
    raise NotebookParameterError(f"bad notebook parameter mode={mode!r}: 'eager' or 'graph'")
if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 0:
    raise NotebookParameterError(f"bad notebook parameter warmup={warmup!r}: an int >= 0")
if not isinstance(all_guards, bool):
    raise NotebookParameterError(f"bad notebook parameter all_guards={all_guards!r}: True or False")
(guard,) = nbk.check_guards([guard])
active_fraction = nbk.check_fraction("active_fraction", active_fraction)
dev = nbk.check_device(device)
nbk.setup_plotly()
LIVE = dev.type == "cuda"
if LIVE:
    print(f"live GPU: Run measures on {dev}")
else:
    print(
        "no GPU here: the panel shows the replay's predictions and the recorded H200 timings, not live ones"
    )

# %% [markdown]
# ## Recorded data and the validated model
# The canonical recording gives GPU points to compare against: per point the median of its
# interleaved repetitions (how many: printed below) and the 95 % interval of that median. The
# predictions are the replay's, each with its method: `sync` and `cpu_flag` in eager mode are
# predicted held out from the other guard's profiled forward (the validation's points at 48 layers);
# `launch_always` gets `cpu_flag`'s prediction (with an adapter active both launch the same kernels);
# graph mode is the eager `cpu_flag` forward with each layer's launches replaced by one graph launch.
# At every point the panel says whether the prediction agrees with the recording by the validation's
# rule: within ±5 %, or inside the measurement's 95 % interval.

# %%
try:
    rec = load_guards()
except FileNotFoundError as e:
    rec, sweep, label = None, None, None
    print(f"no canonical recording: {e}")
else:
    sweep, label = rec.as_sweep(), rec.label
    print(f"recorded points: {label}, {int(sweep.reps.min())}-{int(sweep.reps.max())} repetitions per point")
val = whatif.validation()
note = (
    f"predictions: the replay (held out, {int(val['passed'].sum())} of {len(val)} validation points pass, "
    f"data/replay/validation.csv)"
)
print(note)
pd.concat(
    [whatif.guard_predictions(m, 48, md) for m in (16, 4096) for md in ("eager", "graph")], ignore_index=True
)[["guard", "tokens", "mode", "forward_ms", "measured_ms", "syncs_per_forward", "method"]].round(3)

# %% [markdown]
# ## The panel
# Move a control: the view redraws at once (▲ the replay's predictions per guard, ◆ recorded
# points with their 95 % intervals, ● your live points; the title: the selected guard and M). Press
# **Run** to add rows to the results.

# %%
panel = whatif_bench.ReplayBenchPanel(
    live=LIVE,
    sweep=sweep,
    reps=reps,
    warmup=warmup,
    all_guards=all_guards,
    note=note,
    label=label,
    defaults=dict(
        preset=preset,
        layers=num_layers,
        tokens=tokens,
        guard=guard,
        active=active_fraction,
        rank=rank,
        mode=mode,
    ),
)
display(panel.widget)
# Without a frontend (papermill) nobody moves the controls or presses Run: do it once here, with
# the notebook's parameters, so the outputs exist.
view = panel.update(
    preset=preset, layers=num_layers, tokens=tokens, guard=guard, active=active_fraction, rank=rank, mode=mode
)
rows = panel.run(blocking=True)
if "vs_recorded" in rows:  # the replay beside the recorded point, by the validation's rule
    for r in rows[rows["source"] == "replay"].itertuples():
        print(f"{r.guard}: replay {r.median_ms:.3f} ms ({r.method}); {r.vs_recorded}  [{label}]")
if not LIVE and not (len(rows) and (rows["source"] == "replay").any()):  # the panel says why
    print(panel.status.value.replace("<b>", "").replace("</b>", ""))

# %% [markdown]
# ## Checks
# Whatever the machine: the `sync` guard makes one host-device sync per layer in eager mode and none
# under graph capture; `cpu_flag` and `launch_always` never sync. On a GPU, in eager mode, the live
# repetitions (the guards interleaved, each from an idle GPU) are read like the canonical
# recording: where the recording says the sync must cost time (every recorded interval above zero
# from that M up, printed below), `sync` must be slower than `cpu_flag` here too; below that M the
# cell explains a small or reversed gap with the numbers it measured.

# %% tags=["lesson"]
from lora_moe_lab.nb import lessons, live

measured = rows[rows["source"].str.startswith("live") | (rows["source"] == "replay")] if len(rows) else rows
for r in measured.itertuples():
    want = num_layers if (r.guard == "sync" and mode == "eager") else 0
    assert r.syncs_per_forward == want, (
        f"{r.source} {r.guard}: {r.syncs_per_forward} syncs per forward, expected {want}"
    )
if LIVE and mode == "eager" and all_guards and panel.last_samples is not None and len(panel.last_samples):
    rec_lost = rec.paired("sync", "cpu_flag") if rec is not None else None
    min_M = lessons.lesson_min_tokens(rec_lost, preset, active_fraction) if rec is not None else None
    tbl = lessons.guard_table(live.as_recording(panel.last_samples))
    if lessons.needs_retime(tbl.iloc[0]):  # a point without a figure: once more, with twice the repetitions
        print(f"M={int(tbl.tokens.iloc[0])}: the repetitions never settled; timed again with {2 * reps} repetitions")
        panel.reps = 2 * reps
        rows = panel.run(blocking=True)
        panel.reps = reps
        tbl = lessons.guard_table(live.as_recording(panel.last_samples))
    print("method:", lessons.interval_method(tbl))
    if min_M is None:
        print("no canonical recording here: nothing says where the lesson must hold; not checked")
    else:
        v = lessons.guard_verdict(tbl.iloc[0], min_M)
        print(
            f"the recording ({label}): from M={min_M} up every interval lies above zero "
            f"({lessons.lesson_scope(rec_lost, preset, active_fraction)})"
        )
        print(v.text)
        v.check()
rows
# %% [markdown]
# ## Snapshot for the HTML report
# The panel above lives in the browser; an executed copy of this notebook (the `make run` report)
# keeps these static copies of its last view and results.

# %%
panel.last_figure.show()
widgets.results_figure(panel.results).show()
