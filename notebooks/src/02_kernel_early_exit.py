# %% [markdown]
# # 02 · The kernel's early exit
#
# **Goal.** Look inside the fused MoE-LoRA Triton kernel: which programs it launches, why most of
# them return after reading four small integers, check that the ones that do work compute the
# right delta, see what a launch in which *every* adapter is disabled costs, and see why
# `has_active_lora` defaults to `True`.
#
# Under CUDA-graph capture (and with the `launch_always` guard) the host does not decide whether
# the LoRA work is needed: the kernel is always launched and each GPU program decides for itself,
# from metadata already on the device, whether it has anything to do. That is what makes the
# decision free of host-device syncs. The price is one kernel launch per LoRA op even when no
# adapter is active — this notebook measures that price.
#
# On a machine without a GPU the kernel runs under the Triton interpreter (each program in turn,
# on numpy): the exit map and the correctness checks are the real kernel's; timings come from the
# recorded H200 data when it is there.

# %% tags=["parameters"]
preset = "tiny"          # tiny, qwen3-30b-a3b or qwen3-30b-a3b-tp4
num_tokens = 8           # tokens in the batch, M; keep it at 16 or fewer on CPU, where the interpreter is slow
num_requests = 4         # requests sharing those tokens
rank = 8                 # max LoRA rank of the pool (adapter "b" gets rank // 2)
max_loras = 4            # adapter slots S, at least 3: three adapters are loaded, the rest stay empty
num_layers = 2           # layers of the mini model used in the has_active_lora demo
device = "auto"          # auto, cpu or cuda
dtype = "auto"           # auto: bfloat16 on GPU, float32 on CPU (bf16 is wrong under the interpreter)

# %%
import dataclasses

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch

from lora_moe_lab import runtime
from lora_moe_lab.provenance import label
from lora_moe_lab.instruments.recorders import early_exit as ee
from lora_moe_lab.model.lab import build_lab
from lora_moe_lab.model.lora import LoRAInfo, check_flag_against_device
from lora_moe_lab.nb import params as nbk
from lora_moe_lab.ops.reference import tolerance
from lora_moe_lab.ui.kernel_plots import exit_map_figure

nbk.reject_unknown_parameters()
nbk.check_preset(preset)
for _n in ("num_tokens", "num_requests", "rank", "max_loras", "num_layers"):
    nbk.check_positive_int(_n, globals()[_n])
if max_loras < 3:
    raise nbk.NotebookParameterError(f"bad notebook parameter max_loras={max_loras!r}: need >= 3 slots "
                                     "(three adapters are loaded)")
if num_requests > num_tokens:
    raise nbk.NotebookParameterError(f"bad notebook parameter num_requests={num_requests!r}: more requests "
                                     f"than tokens ({num_tokens})")
dev = nbk.check_device(device)
dtype = nbk.pick_dtype(dtype, dev)
if runtime.interpreter() and dtype == "bfloat16":
    raise nbk.NotebookParameterError("bad notebook parameter dtype='bfloat16': the Triton interpreter computes "
                                     "bf16 wrongly; use float32 or float16 on CPU")
if runtime.interpreter() and num_tokens > 64:
    raise nbk.NotebookParameterError(f"bad notebook parameter num_tokens={num_tokens!r}: the Triton interpreter "
                                     "runs every program in turn on the CPU; keep num_tokens <= 64 here")
nbk.setup_plotly()
LIVE = dev.type == "cuda"
print(f"device: {dev}  dtype: {dtype}  Triton interpreter: {runtime.interpreter()}")

# %% [markdown]
# ## The lab: three adapters in a pool of `max_loras` slots
# Slots 0-2 hold adapters `a`, `b`, `c`; any further slot stays empty (`lora_ids[slot] = -1`).
# The batch's requests are split into `num_requests` segments; `adapter_enabled[slot]` is 1 when
# some request of *this batch* uses the slot. Both lists are built on the host from Python lists
# and copied to the device once per batch.

# %%
lab = build_lab(preset, num_layers=num_layers, max_loras=max_loras, max_rank=rank, dtype=dtype,
                device=str(dev), backend="triton")
lab.pool.load("a", rank=rank)
lab.pool.load("b", rank=max(1, rank // 2))
lab.pool.load("c", rank=rank, scaling=0.5)
base, extra = divmod(num_tokens, num_requests)
counts = [base + (1 if i < extra else 0) for i in range(num_requests)]
print("slots:", lab.pool.slot_names, " ranks:", lab.pool.slot_ranks, " token counts:", counts)

# %% [markdown]
# ## The grid: a persistent launch over work items
# The work of `kernels.fused_moe_lora.lora_delta` is a list of **work items**, each `(slot, token block, N share)`:
#
# * the per-adapter alignment groups each slot's `(token, k)` pairs by expert and pads each group
#   to a multiple of `BLOCK_M`; a **token block** is `BLOCK_M` rows of *one* expert. The table has a
#   static size `EM = round_up(M·top_k + E·(BLOCK_M−1), BLOCK_M)` per slot, so shapes never depend
#   on the data (the whole path can be captured in a CUDA graph); a slot's busy blocks lie first,
#   below its `num_tokens_post_padded`;
# * `split_n` items share the `N` output columns of one block (more parallel work at small M;
#   each recomputes the cheap rank-r shrink, whose A tiles then come from L2).
#
# The launcher cannot know how many items a batch has without reading device data (a sync), so it
# launches a **fixed, persistent grid**, from static shapes only: `programs = min(work_items_max,
# SMs × programs_per_sm)` (`work_items_max = S · min(EM/BLOCK_M, M·top_k) · split_n`, an upper
# bound). Every program loads the metadata of *all* slots in one round, computes how many items
# each slot contributes, and takes items `pid, pid + programs, …` — a few programs per SM, all in
# one wave, however many items there are. (Under the interpreter the "GPU" has 2 SMs.)

# %%
case_all = ee.make_case(lab, [["a", "b", "c"][i % 3] for i in range(num_requests)], counts, seed=1)
plan = ee.launch_plan(case_all)
items_all = ee.work_items(case_all)
pd.Series(plan, name="launch plan (static shapes)").to_frame()

# %%
print(f"this batch: {items_all['items'].sum()} work items for {plan['programs']} programs "
      f"(upper bound {plan['work_items_max']})")
assert plan["persistent"] and plan["programs"] <= plan["work_items_max"]
assert plan["EM"] % plan["BLOCK_M"] == 0 and plan["EM"] >= plan["pairs"] + plan["experts_E"] * (plan["BLOCK_M"] - 1)
assert items_all["items"].sum() <= plan["work_items_max"]
items_all

# %% [markdown]
# ## Four reasons to stop early
# No activation or weight is loaded for a (slot, block) when
#
# 1. `lora_ids[slot] == -1`: no adapter is loaded in the slot;
# 2. `adapter_enabled[slot] == 0`: loaded, but no request of this batch uses it;
# 3. `b · BLOCK_M >= num_tokens_post_padded[slot]`: the block lies past the slot's padded tokens;
# 4. `expert_ids[slot, b] == -1`: the block has no expert (the sync-free alignment marks blocks past
#    the end this way; an engine with expert parallelism also uses -1 for experts on another rank).
#
# Checks 1-3 are **slot-level**: each program decides them for all slots at once from one round of
# metadata loads, and a slot that fails them contributes no work item at all (with every slot
# disabled there are zero items: each program returns right after those loads). Check 4 is made
# per item, before the item's first activation load.
#
# With the debug buffer `exit_codes` the programs first write one code per (slot, block) from the
# metadata alone (0 = the block is real work). We run the same layer for several adapter patterns
# and compare every code with the host's computation (`host_exit_codes`, same order of checks),
# and the work-item count with the host's. The buffer starts filled with −7, so a cell that no
# program wrote would show.

# %%
patterns = {
    "none": [None] * num_requests,
    "some": ["a"] + [None] * (num_requests - 1),
    "all": [["a", "b", "c"][i % 3] for i in range(num_requests)],
}
cases = {name: ee.make_case(lab, adapters, counts, seed=1) for name, adapters in patterns.items()}
cases["all"] = case_all
# expert -1: mark the first busy block of slot 0 as "expert not here" (as expert parallelism would)
case_ep = dataclasses.replace(case_all, align=case_all.align._replace(expert_ids=case_all.align.expert_ids.clone()))
case_ep.align.expert_ids[0, 0] = -1
cases["all, block (0,0) expert -1"] = case_ep

results, outs = {}, {}
for name, case in cases.items():
    codes, out = ee.run_exit_map(case)
    want = ee.host_exit_codes(case.align, case.lora_ids, case.adapter_enabled)
    assert (codes.cpu().numpy() != -7).all(), f"{name}: some program never wrote its exit code"
    assert np.array_equal(codes.cpu().numpy(), want), f"{name}: kernel exit codes differ from the host's\n{codes}\n{want}"
    n_items = int(ee.work_items(case)["items"].sum())
    n_zero = int((want[:, :] == 0).sum()) * ee.launch_plan(case)["split_n"]
    # every block with code 0 is a work item; blocks with code 4 are items too (they exit per item)
    assert n_zero + int((want == 4).sum()) * ee.launch_plan(case)["split_n"] == n_items, (name, n_items, want)
    results[name], outs[name] = codes, out
print("kernel exit codes == host computation for", list(results))

# %%
for name in ("none", "some", "all"):
    exit_map_figure(results[name], cases[name],
                       title=f"adapters: {name} — {patterns[name]}").show()

# %% [markdown]
# **Reading the maps** (hover a cell: its expert, the slot's `num_tokens_post_padded`, and the
# program that takes it). `none`: every slot exits at check 1 or 2 — the batch has no work item, the
# whole launch does no work. `some`: only slot 0's first blocks are work. `all`: slots 0-2 have
# their busy blocks as work; the light-grey tail of each row (check 3) is never even enumerated as
# an item — the static table is much longer than the busy part (the price of static shapes), but
# the persistent loop only walks the busy part. Empty slots exit at check 1 in every pattern.

# %%
exit_map_figure(results["all, block (0,0) expert -1"], case_ep,
                   title="all adapters, block (slot 0, b 0) marked expert -1").show()
summary = pd.concat({name: ee.exit_summary(c).set_index("slot") for name, c in results.items()}, names=["pattern"])
summary.fillna(0).astype(int)

# %% [markdown]
# ## An unloaded slot
# Unload adapter `b`: its slot's `lora_ids` entry becomes −1 and every program of that slot exits
# at check 1, whatever the batch says.

# %%
lab.pool.unload("b")
case_unl = ee.make_case(lab, [["a", "c"][i % 2] for i in range(num_requests)], counts, seed=1)
codes_unl, out_unl = ee.run_exit_map(case_unl)
assert np.array_equal(codes_unl.cpu().numpy(), ee.host_exit_codes(case_unl.align, case_unl.lora_ids,
                                                                  case_unl.adapter_enabled))
slot_b = 1
assert (codes_unl[slot_b].cpu() == 1).all(), codes_unl
exit_map_figure(codes_unl, case_unl, title="slot 1 unloaded (lora_ids[1] = -1)").show()
results["b unloaded"], outs["b unloaded"], cases["b unloaded"] = codes_unl, out_unl, case_unl
_ = lab.pool.load("b", rank=max(1, rank // 2))  # back in slot 1 for what follows

# %% [markdown]
# ## Correct where it works, untouched where it exits
# The kernel *adds* the delta into the intermediate in place. For every pattern: the rows of
# tokens that use an enabled adapter must match the float64 reference (`ops.reference.ref_lora_delta`)
# within the tolerances of docs/design.md (fp32 under the interpreter < 1e-5, fp32 on a GPU with tf32
# dots < 5e-3, bf16/fp16 < 2e-2); every other row must be **bit for bit** what it was before.
# A second launch without the exit-code buffer (the normal, shorter grid) must agree too.

# %%
tol = tolerance(lab.dtype, lab.device)
rows = []
for name, case in cases.items():
    for launch, out in (("exit-code mode", outs[name]), ("normal launch", ee.run_delta(case))):
        rows.append({"pattern": name, "launch": launch, **ee.check_against_reference(case, out, tol)})
correct = pd.DataFrame(rows)
assert correct["ok"].all(), correct
correct

# %% [markdown]
# ## What an all-disabled launch costs
# With every adapter disabled, each program loads the slots' metadata once, finds zero work items,
# and returns: no activation, no weight is loaded. The launch should cost about what an **empty**
# kernel costs — the GPU still schedules the grid, but every program is gone after one round of
# loads. The alternative, *not launching* (what `cpu_flag` does when the host flag is False),
# costs no GPU time and no host launch time — but it needs the host to know, which it cannot
# under capture.
#
# On a GPU we measure device time per call from CUDA-graph replays of 32 back-to-back calls
# (device events, median), and the host's cost to issue one call eagerly (the Triton launcher is
# Python: this is the part `cpu_flag` saves outside graphs).

# %% tags=["lesson"]
CLAIM = "an all-disabled launch costs at most 2x an empty kernel + 2 us"
if LIVE:
    costs = ee.launch_costs(cases["all"])
    source = f"measured live on {torch.cuda.get_device_name(0)}"
    fig = go.Figure()
    fig.add_bar(x=costs.what, y=costs.device_us_per_call, name="device time per call (graph replay)")
    fig.add_bar(x=costs.what, y=costs.host_issue_us_per_call, name="host issue time per call (eager)")
    fig.update_layout(barmode="group", xaxis_title="what is launched", yaxis_title="time per call (us)",
                      title=f"Launch cost, {preset}, M={num_tokens} ({source})", height=400)
    fig.show()
    c = costs.set_index("what")
    off, empty = c.loc["LoRA kernel, all adapters disabled", "device_us_per_call"], c.loc["empty Triton kernel", "device_us_per_call"]
    print(f"device: all-disabled launch {off:.2f} us vs empty kernel {empty:.2f} us per call ({off / empty:.2f}x)")
    print("host, eager, per call: " + ", ".join(f"{w} {h:.1f} us" for w, h in c["host_issue_us_per_call"].items() if h)
          + " - the Triton launcher's Python on the host; the GPU is done with an exiting launch in "
          f"{off:.2f} us, so in eager mode the host's issue time is the cost `cpu_flag` saves")
    assert off <= 2.0 * empty + 2.0, f"claim failed ({CLAIM}): {off:.2f} us vs empty {empty:.2f} us"
    display(costs)

# %% [markdown]
# The same launches recorded on the H200 (`data/kernels/`), over M and both presets.

# %%
rec, meta = ee.recorded_disabled_launches()
if rec is None:
    print("No recorded kernel figures yet (data/kernels/kernels.csv, written on a GPU by studies/kernels/record.py).")
else:
    src = f"recorded: {label(meta)}"
    print(src, "(no launch: 0 us by definition)")
    fig = go.Figure()
    for (kernel, preset_name), g in rec.groupby(["kernel", "preset"], sort=False):
        fig.add_trace(go.Scatter(x=g.M, y=g.all_disabled_us, mode="lines+markers",
                                 name=f"all disabled, {kernel} kernel: {preset_name}",
                                 line=dict(dash="solid" if kernel == "current" else "dot")))
    e = rec[rec.kernel == "current"].groupby("M", as_index=False)["empty_kernel_us"].mean()
    fig.add_trace(go.Scatter(x=e.M, y=e.empty_kernel_us, mode="lines+markers", name="empty Triton kernel",
                             line=dict(color="black")))
    fig.update_layout(xaxis=dict(type="log", title="tokens M"), yaxis_title="device time per call (us, graph replay)",
                      height=420, title=f"All-disabled LoRA launch vs an empty kernel ({src})")
    fig.show()
    cur = rec[rec.kernel == "current"]
    assert len(cur) and (cur["all_disabled_us"] <= 2.0 * cur["empty_kernel_us"] + 2.0).all(), f"claim failed ({CLAIM})"
    display(rec[["kernel", "preset", "M", "programs", "all_disabled_us", "empty_kernel_us", "ratio", "enabled_us"]])

# %% [markdown]
# The cell below reads the recorded rows: how many programs the persistent grid launched at each M
# (`split_n`: how many programs share one block's N columns) and what its all-disabled launch cost
# against an empty kernel. The kernel before the persistent grid (one program per token block and
# N share) is in the git history (`data/archive/kernels/`); its all-disabled launch cost several times an empty
# kernel at large M, which is why the grid changed (`data/kernels/README.md`). For scale, `enabled_us` is the same launch doing its work
# (all four adapters enabled). At decode sizes the MoE layer itself does not launch this kernel:
# it takes the decode path (its own grid, the last section), so the small-M rows time the aligned
# kernel where the layer would not use it.

# %%
from lora_moe_lab.config import get_shape
from lora_moe_lab.kernels.configs import DECODE_MAX_PAIRS

for (kernel, pr), g in ([] if rec is None else rec.groupby(["kernel", "preset"], sort=False)):
    g = g.sort_values("M")
    split = g.config.str.extract(r"split(\d+)")[0].astype(int)
    progs = ", ".join(f"M={m}: {int(p)} (split_n {s_})" for m, p, s_ in zip(g.M, g.programs, split))
    most, worst = g.loc[g.programs.idxmax()], g.loc[g.ratio.idxmax()]
    print(f"{kernel}, {pr}: programs {progs}; the most at M={int(most.M)}. All disabled "
          f"{g.all_disabled_us.min():.2f}-{g.all_disabled_us.max():.2f} us, {g.ratio.min():.2f}-{g.ratio.max():.2f}x "
          f"an empty kernel, the most at M={int(worst.M)} ({worst.all_disabled_us:.2f} us with {int(worst.programs)} "
          f"programs: {'where' if most.M == worst.M else 'not where'} it launched the most programs)")
    k_ = get_shape(pr).top_k
    if kernel == "current":
        print(f"  {pr}: the layer takes the decode path for M x top_k <= {DECODE_MAX_PAIRS} pairs, M <= "
              f"{DECODE_MAX_PAIRS // k_} at top_k={k_}")

# %% [markdown]
# **Reading it.** The persistent grid's program count does not grow with M: at small M its launch
# table splits each block's N columns into more shares (`split_n` above 1: more parallel work for a
# small batch), so a small M can launch more programs than a large one; from `split_n` 1 on, the
# count is a few programs per SM whatever M. Whether the all-disabled cost followed the program
# count, the lines above say per preset: each program is gone after one round of metadata loads,
# and the cost stays within the narrow range printed above.

# %% [markdown]
# ## Why `has_active_lora` defaults to True
# `cpu_flag` trusts the host flag. If a code path builds a `LoRAInfo` and forgets to set the flag,
# the default `True` means the kernels are launched and exit early when nothing is active: a
# little launch cost, never a wrong answer. The opposite default would be dangerous: a **wrong
# False** silently skips the LoRA work, and the rows of adapter requests simply lose their delta —
# no error, no NaN, just a different model.

# %%
_, no_adapter_tensors = lab.make_batch([None] * num_requests, counts)
info = LoRAInfo(lab.pool.layers[0], no_adapter_tensors, rank)  # the flag not given
assert info.has_active_lora is True
print("LoRAInfo(...).has_active_lora defaults to", info.has_active_lora)

adapters = ["a"] + [None] * (num_requests - 2) + ["c"] if num_requests >= 2 else ["a"]
batch, tensors = lab.make_batch(adapters, counts)
x = lab.random_input(batch.num_tokens, seed=3)
right = lab.model(x, batch, tensors, guard="cpu_flag")
stale = dataclasses.replace(batch, has_active_lora=False)  # a stale / forgotten flag: WRONG
wrong = lab.model(x, stale, tensors, guard="cpu_flag")
kernel_decides = lab.model(x, stale, tensors, guard="launch_always")
rows = []
for r, (a, lo, hi) in enumerate(zip(adapters, batch.seg_indptr[:-1], batch.seg_indptr[1:])):
    rows.append({"request": r, "adapter": a, "tokens": hi - lo,
                 "max |wrong - right|": (wrong[lo:hi] - right[lo:hi]).abs().max().item(),
                 "max |launch_always - right|": (kernel_decides[lo:hi] - right[lo:hi]).abs().max().item()})
damage = pd.DataFrame(rows)
has = damage["adapter"].notna()
assert (damage.loc[has, "max |wrong - right|"] > 1e-3).all(), damage   # adapter rows lost their delta
assert (damage.loc[~has, "max |wrong - right|"] == 0).all(), damage    # the others are untouched
assert torch.equal(kernel_decides, right), "launch_always must not depend on the host flag"
damage

# %% [markdown]
# The adapter requests' rows changed, the others did not: nothing in the output says anything went
# wrong. `launch_always` ignores the flag and lets the kernel decide, so it is right.
#
# **Catching it.** `LoRAInfo(debug_check=True)` makes the `cpu_flag` guard cross-check the host flag
# against the device (`lora.check_flag_against_device`). That check *reads a device value on the
# host* — a host-device sync per layer — so it is a debugging aid, off by default. On the model:
# `lab.model.debug_check = True`.

# %%
try:
    check_flag_against_device(LoRAInfo(lab.pool.layers[0], tensors, rank, has_active_lora=False))
    raise RuntimeError("the debug check did not catch a wrong has_active_lora=False")
except AssertionError as e:
    print("LoRAInfo check :", e)

lab.model.debug_check = True
try:
    lab.model(x, stale, tensors, guard="cpu_flag")
    raise RuntimeError("model.debug_check did not catch a wrong has_active_lora=False")
except AssertionError as e:
    print("model check    :", e)
finally:
    lab.model.debug_check = False
ok = lab.model.lora_info(0, batch, tensors)
assert ok.has_active_lora and not ok.debug_check
print("with a correct flag and debug_check off, nothing is checked and nothing syncs")

# %% [markdown]
# ## The decode path: no alignment at all
# At decode sizes (`M·top_k ≤ configs.DECODE_MAX_PAIRS`, a static choice) the MoE layer skips the
# per-adapter alignment: `kernels/lora_decode.py` launches one program per **(pair, slice, N share)**
# straight from `topk_ids` and the per-token row mapping. Each program checks, in one round of
# metadata loads: the pair past a device-side live count (3), token without adapter (5), row without
# adapter (1), adapter disabled (2), expert -1 (4); 0 = it ran. Below: its launch plan for this batch,
# and the code of every pair with slot `b` disabled, the last token's pairs past a live count, and
# one pair routed nowhere.

# %%
from lora_moe_lab.kernels.configs import DECODE_MAX_PAIRS
from lora_moe_lab.kernels.lora_decode import DECODE_EXIT_CODES, decode_launch_plan, lora_delta_decode

bd, td = lab.make_batch([["a", None, "b", "c"][i % 4] for i in range(num_requests)], counts)
w0, k0 = lab.pool.layers[0], lab.shape.top_k
g0 = torch.Generator().manual_seed(3)
ids_d = torch.stack([torch.randperm(lab.shape.num_experts, generator=g0)[:k0] for _ in range(num_tokens)]).int()
ids_d[0, 0] = -1  # one pair routed nowhere
ids_d = ids_d.to(dev)
enabled_d = td.adapter_enabled.clone()
enabled_d[lab.pool.slot_of("b")] = 0  # adapter b disabled for this launch
live_d = torch.tensor([(num_tokens - 1) * k0], dtype=torch.int32, device=dev)  # last token: padding
codes_d = torch.full((num_tokens * k0,), -1, dtype=torch.int32, device=dev)
xd = lab.random_input(num_tokens, seed=5)
out_d = torch.zeros(num_tokens * k0, 2 * lab.shape.intermediate, dtype=xd.dtype, device=dev)
lora_delta_decode(xd, w0.gate_up_a, w0.gate_up_b, ids_d, td.token_lora_mapping, td.lora_ids, enabled_d, out_d,
                  num_live_pairs=live_d, exit_codes=codes_d)
plan_d = decode_launch_plan(num_tokens * k0, 2, lab.shape.intermediate, lab.shape.hidden, rank)
print(f"decode path for M*top_k <= {DECODE_MAX_PAIRS} pairs; this batch: {num_tokens * k0} pairs")
pd.Series({k: str(v) for k, v in plan_d.items()}, name="decode launch plan (static shapes)").to_frame()

# %%
cd = codes_d.view(num_tokens, k0).cpu().numpy()
fig = go.Figure(go.Heatmap(z=cd, zmin=0, zmax=5, colorscale="Viridis", text=cd, texttemplate="%{text}",
                           colorbar=dict(title="exit code")))
fig.update_layout(title="decode path: exit code per (token, k) pair", height=320)
fig.update_xaxes(title_text="k (expert choice of the token)")
fig.update_yaxes(title_text="token", autorange="reversed")
fig.show()
pd.Series(DECODE_EXIT_CODES, name="meaning").to_frame()

# %% [markdown]
# ## Beyond the exit: what the delta itself costs (recorded on the H200)
# When adapters *are* active, the aligned kernel's work item is a stream: read BLOCK_M rows of the
# output, add `t @ B.T`, write them back. What a stream reaches is set by the bytes it keeps in flight,
# and those by how many programs fit on an SM: 65536 registers per SM make room for 4 programs of
# 4 warps at 128 registers a thread, 3 at 168, 2 above. Below, every tile variant of the H200 sweep
# (`studies/kernels/record_expand.py --candidates regs`): its registers, the programs per SM they allowed
# (colour) and whether the expand loop was pipelined by hand (`prefetch`, marker). A register cap
# (`maxnreg`) that buys a fourth program pays (M=512, down); one that makes the compiler spill
# costs far more than it buys (M=8192, down). These are recordings, not live timings: this
# notebook's live part is the exit, above.

# %%
from lora_moe_lab.instruments.analysers.recordings import CANONICAL_KERNEL_RUN, TILE_SWEEP_RUN, load_kernel_run
from lora_moe_lab.ui.kernel_plots import occupancy_figure, share_floor_figure

sweep_run, final_run = load_kernel_run(TILE_SWEEP_RUN), load_kernel_run(CANONICAL_KERNEL_RUN)
shown = preset if preset in set(sweep_run.rows["preset"]) else "qwen3-30b-a3b"  # the presets the H200 ran
sw = sweep_run.section("sweep")
print(f"recorded: {sweep_run.label} (tile sweep), preset {shown}")
occupancy_figure(sw[sw["preset"] == shown]).show()

# %% [markdown]
# With every adapter active and every token using one, how much does LoRA add to the MoE layer?
# Each bar is the median of the paired rounds (base and LoRA replayed back to back; how many: printed), whiskers the
# 10-90 % spread. The grey bar is what the LoRA bytes alone (each used adapter-expert's A and B,
# x, and the output read and written) would take at the measured copy bandwidth: no tile goes
# below it. At TP=4 the LoRA weights do not shrink with the intermediate size the way the base
# weights do, so the floor itself sits above 25 % up to M=2048. This recording is older than the
# tuned base GEMM of the next section: its base layer is slower (`base`, µs), so the same LoRA
# time is a smaller share of it. The fold section's layer table, further down, measures the share
# against today's base, and the two tables differ by that much.

# %%
sf = final_run.share_floor()
print(f"recorded: {final_run.label}; each bar: {int(final_run.section('layer_paired').reps.max())} paired rounds")
share_floor_figure(sf).show()
(sf.assign(share_pct=100 * sf["lora_share"], floor_pct=100 * sf["floor_share"])
   [["preset", "M", "base", "share_pct", "floor_pct"]].round(1))

# %% [markdown]
# ## Under the LoRA delta: the base GEMM and what the counters say (recorded on the H200)
# Every "what LoRA costs" figure is measured against the base MoE GEMM. Its tiles now come from a
# tuned table per GPU and layer shape (`kernels/tile_tables/`, swept by `studies/kernels/record_base.py`),
# its loads drop their predicates where K and N are tile multiples, and its weight tiles come
# through the Tensor Memory Accelerator where that was faster. Below: the table's kernel against
# vLLM's tuned kernel (figures carried from another run: `direct`, and `bridged` through the kernel
# both runs timed), then Nsight Compute's DRAM bytes against each kernel's byte floor (the bytes it
# must move at least: weights of the experts used, activations and outputs once each).

# %%
from lora_moe_lab.instruments.analysers import base_gemm
from lora_moe_lab.ui.kernel_plots import counters_figure, fold_figure

base_run = base_gemm.load_base_run()
vs = base_gemm.versus_peers()
ncu = base_gemm.load_counters()  # the base GEMMs and the LoRA deltas as the layer runs them now, one ncu session
print(f"recorded: {base_run.label}; bridge through {vs.run.iloc[0]} ({vs.bridge_arm.iloc[0]}); counters: "
      f"{base_gemm.NCU_NOW_RUN}")
print(f"at least vLLM's speed by both ratios at {int(vs.ge_1.sum())} of {len(vs)} points")
counters_figure(ncu).show()
vs.pivot_table(index=["preset", "op"], columns="M", values="direct").round(2)

# %% [markdown]
# **Reading the counters.** Near 1.0 on the left means no byte is wasted: at M=16 the base GEMM
# streams its experts' weights at most of DRAM's peak, and there is nothing left to tune but the
# bytes. At M=8192 DRAM is mostly idle and the tensor pipe is the budget: the printed table below
# shows how much of the time it was busy, and how the TMA weight loads raised it. The LoRA down
# delta moves its floor's bytes, not more: its scattered output rows cost no extra DRAM traffic;
# what it lacks is loads in flight (its top stall is waiting on memory, `long_scoreboard`). The
# line printed above the table says how far that leaves it from a copy's bandwidth, the ceiling of
# a stream, and with how many registers a thread: the more registers, the fewer programs per SM.

# %%
kc = base_gemm.kernel_counters(ncu)
dn = kc[(kc.path == "LoRA delta") & (kc.gemm == "down") & (kc.M >= 1024)]
print("LoRA down delta at M >= 1024: " + "; ".join(
    f"{r.preset} M={r.M} {100 * r.of_copy:.0f} % of copy bandwidth, {r.dram_bytes_over_floor:.2f}x its byte floor, "
    f"occupancy {r.achieved_occupancy_pct:.0f} %, {r.registers:.0f} registers, top stall {r.top_stall}"
    for r in dn.itertuples()))
kc.round(2)

# %% [markdown]
# ## How far from the hardware: each GEMM's floor (recorded on the H200)
# A kernel cannot beat the larger of two times: the bytes it must move (the used experts' weights,
# its input and its output, once each) at the measured device-to-device copy bandwidth, and the
# FLOPs it must do at the measured bf16 matrix rate (an 8192³ cuBLAS product). Each bar is that
# floor over a kernel's time: 1.0 is the roofline. The red bars are the issue's goal, a kernel
# 1.15× faster than vLLM's: where a red bar reaches 1.0, the goal asks for the copy engine's own
# bandwidth, and no tile table gets there. The down delta's printed line says what the counters
# showed of the narrower tiles tried to raise its bandwidth; the TP=4 down line, what splitting the
# base GEMM's 128-row blocks into two sub-blocks of 64 rows (two programs per SM) changed; the last
# line, how evenly the SMs share the work at M=1024: below about 0.9 the last wave runs on part of
# the chip (TP=4 gate_up: 4.3 tiles per SM, so some SMs run one tile more than the rest).

# %%
from lora_moe_lab.instruments.analysers import floors
from lora_moe_lab.ui.kernel_plots import floors_figure

ceil = floors.ceilings()
gf = floors.goal_floors(vs, ceil)
print(f"ceilings: copy {ceil['copy_gbps'] / 1e3:.2f} TB/s, bf16 matmul {ceil['matmul_tflops']:.0f} TFLOP/s (the highest "
      f"of {', '.join(ceil['runs'])}); kernel times: {vs.run.iloc[0]}")
worst = gf.loc[gf.goal_of_floor.idxmax()]
print(f"the goal's hardest point: {worst.preset} {worst.op} M={worst.M} needs {100 * worst.goal_of_floor:.1f} % of its "
      f"{'byte' if worst.bound == 'bytes' else 'FLOP'} floor (this lab's table: {100 * worst.ours_of_floor:.1f} %, vLLM: {100 * worst.vllm_of_floor:.1f} %)")
floors_figure(gf).show()
o = floors.occupancy_test()  # the table beside BLOCK_N 64 at 3 programs per SM (`_narrow`)
r = o[(o.preset == "qwen3-30b-a3b") & (o.M == 2048)].iloc[0]
print(f"down delta, {r.preset} M=2048 (ncu, one launch each): BLOCK_N 128 → 64 raised occupancy "
      f"{r.achieved_occupancy_pct_table:.0f} → {r.achieved_occupancy_pct_narrow:.0f} % and lowered DRAM throughput "
      f"{r.dram_pct_peak_table:.0f} → {r.dram_pct_peak_narrow:.0f} % of peak at the same bytes "
      f"({r.dram_bytes_over_floor_table:.2f} → {r.dram_bytes_over_floor_narrow:.2f}× the floor); `{r.top_stall_table}` "
      f"cycles per issue {r.top_stall_ratio_table:.2f} → {r.top_stall_ratio_narrow:.2f}")
before, after = base_gemm.SUBBLOCK_NCU_RUNS  # the two sessions that counted the sub-block build's adoption
cs = base_gemm.counter_sessions(before, after)  # the same builds, two sessions
c_old, c_now = base_gemm.load_counters(before), base_gemm.load_counters(after)
pick = lambda c, arm: c[(c.preset == "qwen3-30b-a3b-tp4") & (c.op == "base_down") & (c.M == 8192) & (c.arm == arm)].iloc[0]
b0, b1 = pick(c_old, "table"), pick(c_now, "table")
print(f"TP=4 down M=8192, the table's build before → after the sub-blocks ({before} → {after}): "
      f"{b0.tile} → {b1.tile}: occupancy {b0.achieved_occupancy_pct:.0f} → {b1.achieved_occupancy_pct:.0f} %, "
      f"{b0.registers:.0f} → {b1.registers:.0f} registers, DRAM {b0.dram_pct_peak:.0f} → {b1.dram_pct_peak:.0f} % of "
      f"peak, tensor pipe {b0.tensor_pipe_pct:.0f} → {b1.tensor_pipe_pct:.0f} %, top stall {b0.top_stall} → "
      f"{b1.top_stall}; {b0.duration_us:.0f} → {b1.duration_us:.0f} us counted (the same build in both sessions: "
      f"{len(cs)} launches, durations {cs.duration_ratio.min():.3f}–{cs.duration_ratio.max():.3f}x)")
bal = ncu[(ncu.M == 1024) & (ncu.arm == "table") & ncu.op.str.startswith("base_")]
print("the SMs' balance at M=1024 (the average SM's active cycles over the busiest SM's, ncu "
      f"{base_gemm.NCU_NOW_RUN}): " + "; ".join(f"{r.preset} {r.op.removeprefix('base_')} {r.sm_busy_avg_over_max:.2f}"
                                                for r in bal.itertuples()))
gf[["preset", "op", "M", "bound", "floor_us", "table_us", "vllm_us", "ours_of_floor", "vllm_of_floor",
    "goal_of_floor"]].round(3)

# %% [markdown]
# ## The LoRA path folded into the base GEMM (recorded on the H200)
# A shrink kernel writes each pair's rank-R intermediate, and the base GEMM adds the expand to its
# fp32 accumulator as extra K iterations: one BLOCK_R-deep dot per live LoRA row present in the
# tile. The delta then never reads or writes the output on its own. Below is the recording
# (`studies/kernels/record_fold.py`): each point is the whole GEMM with its delta, folded over
# separate, paired; above 1 the separate kernels win. Two builds: `folded` (the alignment as the
# base GEMM has it, every LoRA row side by side in the shrink, the expand's operands through TMA)
# and the layer's build `rows_ptr` (the alignment ordered by LoRA row inside each expert, a shrink
# of one row's rank at a time, pointer loads in the expand).

# %%
fold = base_gemm.load_fold_run()
ft = base_gemm.fold_table(fold)
print(f"recorded: {fold.label}; faster than the separate deltas (interval below 1): folded at "
      f"{int((ft.folded_over_separate_hi < 1).sum())} of {len(ft)} points, the layer's build at "
      f"{int((ft.rows_ptr_over_separate_hi < 1).sum())} ({', '.join(sorted(set(ft[ft.rows_ptr_over_separate_hi < 1].op)))})")
fold_figure(ft).show()
ft[["preset", "op", "M", "folded_over_separate", "rows_ptr_over_separate", "rows_ptr_over_separate_lo",
    "rows_ptr_over_separate_hi", "gemm_rows_off_over_base", "align_us", "align_ordered_us"]].round(3)

# %% [markdown]
# The same GEMMs in a whole MoE layer, captured as a CUDA graph and replayed: LoRA's share of the
# layer's time with the separate deltas, with both GEMMs folded, with every adapter disabled on
# the folded path (what a graph pays when no request has an adapter), and as the layer's table picks.
# It reads the latest session at today's separate deltas (`FOLD_LAYER_SESSIONS`): the fold has to beat
# the separate delta as it is now, pipelined expand included; the table folds where it won in each of them.

# %%
from lora_moe_lab.kernels import configs

lay_run = base_gemm.load_fold_run(base_gemm.FOLD_LAYER_SESSIONS[-1])
lay = base_gemm.fold_layer(lay_run)
wins = lay[lay.down_folded_over_separate_hi < 1]
print(f"recorded: {lay_run.label}; the down GEMM alone folded beats the separate deltas in the layer at: "
      + (", ".join(f"{r.preset} M={r.M}" for r in wins.itertuples()) or "no size this run recorded")
      + "; the rows build folds nowhere (the table folds with the packed build now, below)")
lay[["preset", "M", "base_us", "separate_all_share_pct", "folded_all_share_pct", "folded_none_share_pct",
     "down_folded_share_pct", "picked_all_share_pct", "picked_over_separate"]].round(2)

# %% [markdown]
# And the counters (Nsight Compute, one launch each at M = 8192, never a timing) of the three
# folded builds beside the plain GEMM at the same tile:

# %%
fc = base_gemm.fold_counters()
fc.round(2)

# %% [markdown]
# **Reading it.** The cells above print every figure named here.
# - **Where the layer's build wins:** only the down GEMM, and only at large M, where one tile of
#   the ordered alignment spans one or two LoRA rows and the expand's extra depth is one R instead
#   of four. The gate_up GEMM loses at every M: its folded GEMM carries the expand's registers and
#   instructions (`registers`, `instructions` of `plain_gate_up` against `folded_gate_up`), and at
#   TP=4 that halves the programs per SM (`achieved_occupancy_pct`).
# - **TMA for the expand's operands lost:** compare `folded` and `folded_ptr` in the counters:
#   about as many registers, more instructions, a less busy tensor pipe.
# - **The per-row shrink** drops from 255 to 167 registers and gains occupancy, but reads x once
#   per row present (`dram_bytes_over_floor` of `shrink_gate_up`).
# - **In the layer,** the ordered alignment used to be a torch sort of a few dozen small kernels, which
#   cost more than folding saved (docs/kernels.md); it is a Triton launch now, close to the base
#   alignment (`align_us`, `align_ordered_us` in the kernel table above). `folded_none_share_pct`
#   is what a graph pays for launching and skipping with both GEMMs folded.
# - **What the layer folds:** only where the down GEMM alone folded beats the separate deltas on both
#   presets (the line printed above the layer table) in two device sessions. Since the base GEMM at TP=4
#   down runs two sub-blocks of 64 rows per alignment block (two programs per SM), the folded GEMM, which
#   keeps the 128-row tile, loses there: this "rows" build folds nowhere, and this session's `picked_all` (its
#   day's table: nothing folded) is the separate deltas. The packed build below is the one the table folds with now.

# %% [markdown]
# ## The packed build: the per-row work moved into the shrink (recorded on the H200)
#
# `kernels/fused_moe_lora_packed.py`: the shrink writes each pair's rank-R result into the columns of
# its adapter's slot (zeros in the other slots, and in every row without a live adapter), so the GEMM's
# expand is its own loop body again: a dense box of that buffer against every slot's B side by side,
# read through TMA, with no row masks and no gathers. The GEMM keeps the plain GEMM's tile table
# (persistent grids, sub-blocks) and about its registers. Each point: the GEMM with its shrink over the
# base GEMM plus the separate delta with its LoRA alignment, paired, in two device sessions; below 1 the
# packed build wins.

# %%
pses = base_gemm.packed_sessions()
pk = pses[pses.op != "layer"].pivot_table(index=["preset", "op", "M"], columns="figure", values="estimate")
choice = base_gemm.packed_choice(pses)
print(f"recorded: {', '.join(base_gemm.PACKED_SESSIONS)}; wins on both presets in every session (the build the "
      f"layer takes there): gate_up at {sorted(choice['gate_up']['wins'])}, down at {sorted(choice['down']['wins'])}; "
      f"the table folds gate_up at {sorted(configs.FOLDED_LORA_TOKENS['gate_up'])}, down at "
      f"{sorted(configs.FOLDED_LORA_TOKENS['down'])}")
pk.round(3)

# %% [markdown]
# The layer with the table as it stood in fold_s14 (the last section below changes it), LoRA's share of it against
# the separate deltas, and what a graph pays with every adapter disabled (both kernels launched, the GPU decides):

# %%
play = base_gemm.packed_layer(base_gemm.load_fold_run(base_gemm.PACKED_FIGURE_SESSIONS["picked_all_share_pct"][-1]))
big = play[play.M >= 1024]
print("LoRA's share of the layer at M >= 1024, as committed: "
      + ", ".join(f"{p} {g.picked_all_share_pct.min():.1f}-{g.picked_all_share_pct.max():.1f} % (separate "
                  f"{g.separate_all_share_pct.min():.1f}-{g.separate_all_share_pct.max():.1f} %)"
                  for p, g in big.groupby("preset", sort=False))
      + "; the issue's goal: 12 % (qwen3), 20 % (TP=4)")
play[["preset", "M", "base_us", "separate_all_share_pct", "picked_all_share_pct", "picked_none_share_pct",
      "picked_over_separate", "picked_over_separate_lo", "picked_over_separate_hi"]].round(3)

# %%
base_gemm.packed_counters()[["preset", "op", "arm", "duration_us", "registers", "achieved_occupancy_pct",
                             "dram_bytes_over_floor", "top_stall"]].round(2)

# %% [markdown]
# **Reading it.**
# - **The registers came back:** the packed GEMM holds 205 registers at qwen3 gate_up where the rows build
#   held 246 (the plain GEMM: 173), and at TP=4 it keeps the plain GEMM's 120-128 and its two programs per SM
#   (`achieved_occupancy_pct` about 24 % for both). Pointer loads of the expand's B tile had staged it through
#   registers (234-255 in a static compile); TMA puts it straight into shared memory.
# - **The down GEMM wins at every M >= 128,** most at TP=4 (0.77-0.87x), where the separate delta's extra
#   pass over `out` (2048 columns) dwarfs the GEMM's short K (192).
# - **gate_up loses at M >= 4096:** its separate delta is a small share of a long GEMM, and the gate_up
#   shrink alone costs about 170 µs at M = 8192 (`shrink_gate_up`): it reads x once per slice (DRAM bytes
#   1.86x its floor) at about 12 % occupancy, stalled on loads. A shrink computing both slices per x tile at
#   8 warps was slower (fold_s13: 184 µs) and was reverted.
# - **Disabled:** the packed GEMM alone with nothing live costs 0.98-1.05x the plain one at most points (up to
#   1.11x at qwen3 down M = 16384), but 1.21-1.28x at TP=4 down M >= 1024, whose tiles run a flattened
#   persistent loop: that the expand's loop inside it costs the flattening is a hypothesis no counter checked yet (`GEMM off` in docs/results.md, block kernels-packed), above
#   the issue's 1.02x; with everything launched the layer pays 1.4-2.6 % (qwen3) and 5.7-9.3 % (TP=4).
# - **Still far from the goal:** LoRA's share at M >= 1024 fell by 1.5-3 points (qwen3) and 3-9 points
#   (TP=4), not to 12 % and 20 %.

# %% [markdown]
# ## The gate_up shrink in slot windows (recorded on the H200)
#
# The shrink above computes every slot's rank columns for every row: 4x what a pair needs, with its tensor pipe
# half busy. `lora_shrink_packed(slot_window=1, both_slices=True)` walks one slot at a time, from the first to the
# last slot a block's live rows use (on the alignment ordered by LoRA row: one or two), gate and up from one x
# tile. `W1S` adds programs of 64 rows under a register cap of 128 (four per SM). Each ratio below: the shrink over
# the one-dot shrink on the same alignment, or the whole packed GEMM over the separate delta; paired, 95 %
# intervals, in every session listed (`lo`, `hi`: the union of their intervals).

# %%
wsp = base_gemm.window_spread()
wfig = ["shrink_w1_both_ord_keep_over_committed", "packed_slot_over_separate", "packed_slot_w1k_over_separate"]
print(f"sessions: {', '.join(base_gemm.WINDOW_COMPARED)} (compared); {base_gemm.WINDOW_SESSIONS[0]} ran first, "
      f"with a slowed one-dot shrink")
wsp[(wsp.op == "gate_up") & wsp.figure.isin(wfig)].round(3)

# %%
w3 = base_gemm.shrink_windows(("win_s3",))
w3[(w3.op == "gate_up") & w3.figure.isin(["shrink_w1_both_ord_sub64_cap_over_committed",
                                          "packed_slot_w1s_over_separate"])].round(3)

# %%
wc = base_gemm.window_counters()
wc[wc.op == "shrink_gate_up"][["session", "preset", "arm", "duration_us", "registers", "achieved_occupancy_pct",
                               "tensor_pipe_pct", "dram_pct_peak", "l2_hit_pct", "dram_bytes_over_floor",
                               "top_stall"]].round(2)

# %% [markdown]
# **Reading it.**
# - **The shrink:** at M >= 8192 the window cuts the gate_up shrink to 0.65-0.90x on both presets. With W1S it
#   takes 130-132 µs at M = 8192, against about 188 µs. At M = 1024, where every block holds all four slots, the
#   windows lose (1.7-2.1x), so the one-dot shrink stays there.
# - **End to end:** gate_up at M >= 8192 now beats the separate delta at qwen3 (0.925-0.990x) and ties at TP=4
#   (W1S: 0.99-1.01x). A fold table per op could not take it; the next section's table per GEMM shape does.
# - **The counters:** the window halved the tensor pipe's work (49 → 22 %), and the shrink became a memory kernel.
#   The cap doubled occupancy (11.7 → 21.6 %) and DRAM throughput went to 61 % of peak. The bytes stay about 2x
#   the floor: x rows come back from DRAM once per expert of their token (L2 hit 30-36 %).


# %% [markdown]
# ## The expand's waits, and a fold table per GEMM shape (recorded on the H200)
#
# The packed GEMM's expand costs more than its extra K columns: at qwen3 down M = 8192 the GEMM with its expand
# runs about 1.3x the plain GEMM on the same alignment for 64 extra columns against a K of 768. Three builds
# tested what holds it (`moe_gemm_lora_packed(expand=...)`, the GEMM alone on the same u, paired, 95 %):
# - `pf`: the expand's operands prefetched into L2 (`prefetch.global.L2`) before the K loop, so its loads after the
#   loop would wait for L2 instead of DRAM;
# - `un`: the expand as guarded steps with no loop, so a persistent tile loop stays flattened (a second loop inside
#   stops Triton from flattening the two);
# - `d64`: two slots (64 columns) per expand dot: one wait per block instead of two.

# %%
esp = base_gemm.ratio_spread(base_gemm.expand_trials(base_gemm.EXPAND_SESSIONS[:2]), base_gemm.EXPAND_SESSIONS[:2])
print(f"sessions: {', '.join(base_gemm.EXPAND_SESSIONS[:2])} (pf, un, unpf; d64 in exp_s2 and exp_s3)")

def span(t, figs, index):
    """One column per figure: the union of its sessions' 95 % intervals, as text."""
    t = t[t.figure.isin(figs)].assign(range=lambda d: d.lo.map("{:.3f}".format) + "-" + d.hi.map("{:.3f}".format))
    return t.pivot(index=index, columns="figure", values="range")[list(figs)]


span(esp, ["gemm_pf_over_loop", "gemm_un_over_loop", "off_un_over_base"], ["preset", "op", "M"])

# %%
d64 = base_gemm.ratio_spread(base_gemm.expand_trials(base_gemm.EXPAND_SESSIONS[1:]), base_gemm.EXPAND_SESSIONS[1:])
d64[d64.figure == "gemm_d64_over_loop"][["preset", "op", "M", "lo", "hi", "spread"]].round(3)

# %%
ecnt = base_gemm.fold_counters_of(base_gemm.EXPAND_SESSIONS[:1])
ecnt[ecnt.op.str.startswith("folded")][["preset", "op", "arm", "duration_us", "registers", "achieved_occupancy_pct",
                                        "l2_hit_pct", "top_stall"]].round(2)

# %% [markdown]
# Where the packed GEMM's warps wait (ncu's source view: warp stall samples per SASS instruction, qwen3 at M = 8192,
# per slot, one profiled launch each, exp_src): the expand's share of the samples and, of those, the share spent in
# its TMA waits. Then the build that puts u on pointer loads, so the expand's two copies are in flight together
# (`uptr`, exp_s5, one session):

# %%
print(base_gemm.packed_source_view().round(3).to_string(index=False))
u5 = base_gemm.expand_trials(("exp_s5",))
span(u5, ["gemm_uptr_over_loop", "gemm_d64_over_loop", "gemm_loop_over_base"], ["preset", "op", "M"])

# %% [markdown]
# The layer: the committed table (`picked_all`: qwen3's gate_up folded at M >= 8192 by a table per GEMM shape, the
# shrink in W1S windows at M >= 8192, per slot with two slots per expand dot at M = 4096) against the table before
# (`prev_all`), LoRA's share of the layer, and the ratio of the two (paired, 95 %, in every session listed):

# %%
lt = base_gemm.layer_tables()
lsp = base_gemm.ratio_spread(lt, base_gemm.LAYER_TABLE_SESSIONS)
big_t = lsp[(lsp.M >= 1024) & (lsp.figure == "picked_all_share_pct")]
print(f"sessions: {', '.join(base_gemm.LAYER_TABLE_SESSIONS)}; LoRA's share at M >= 1024 with the per-shape fold and "
      "the W1S shrink (before the 4096 change): "
      + ", ".join(f"{p} {g.lo.min():.1f}-{g.hi.max():.1f} %" for p, g in big_t.groupby("preset", sort=False))
      + "; the issue's goal: 12 % (qwen3), 20 % (TP=4)")
span(lsp, ["separate_all_share_pct", "prev_all_share_pct", "picked_all_share_pct", "picked_all_over_prev"],
     ["preset", "M"])

# %% [markdown]
# The layer at the table committed then, in the two sessions that ran it (exp_s8 and exp_s9: the table above with the
# packed GEMM on a program per tile at TP=4 down M = 1024, next section; today's table, with the down GEMM's wide
# build, is in the last section), and the A/A check of the paired method (exp_s4 timed the table before against
# itself, `cand_all_over_picked`):

# %%
cl = base_gemm.committed_layer(base_gemm.PREVIOUS_LAYER)
aa = base_gemm.layer_tables(("exp_s4",))
aa = aa[aa.figure == "cand_all_over_picked"]
print(f"A/A (the same table twice, exp_s4): {aa.value.min():.3f}-{aa.value.max():.3f}, intervals "
      f"{aa.lo.min():.3f}-{aa.hi.max():.3f}; {int(((aa.lo > 1) | (aa.hi < 1)).sum())} of {len(aa)} exclude 1")
print("LoRA's share at M >= 1024, both sessions: " + ", ".join(
    f"{p} {g.all_lo.min():.1f}-{g.all_hi.max():.1f} % (separate {g.separate_lo.min():.1f}-{g.separate_hi.max():.1f} %; "
    f"disabled {g.none_lo.min():.1f}-{g.none_hi.max():.1f} %)" for p, g in cl[cl.M >= 1024].groupby("preset", sort=False)))
cl.round(2)

# %% [markdown]
# **Reading it.**
# - **Not the expand's own loads:** the L2 prefetch moved no time (`gemm_pf_over_loop` 0.98-1.08x) and the counters
#   saw no gain in L2 hits for the GEMM (qwen3 down: 69.7 % without it, 67.8 % with it). The top stall stays
#   `barrier`.
# - **The flattened loop came back, the registers went up:** with no loop in the expand Triton flattens the tile loop
#   again (two `scf.for` in the compiled IR, as the plain GEMM), but it pipelines the expand's loads with the rest:
#   qwen3 down spills (255 registers and 352 bytes of stack, 3.1x the loop's time, top stall `long_scoreboard`) and
#   TP=4 down drops to one program per SM (186 registers, occupancy 25 → 12.5 %, 1.45-1.67x).
# - **Two slots per dot:** the GEMM alone in 0.89-1.00x the loop's time at M = 1024-4096, about 1.0x above; at
#   M = 4096 it makes the per-slot path beat the dense one (0.966-0.986x, exp_s3), so the layer runs it there.
# - **The source view:** the expand holds 20 % of the down GEMM's warp samples (12 % of gate_up's), and 56-63 % of
#   those sit on its two TMA waits, one after the other. Putting u on pointer loads overlaps them (one wait left in
#   the SASS), yet the GEMM moved by 0.98-1.02x: the waits' length is not the round trips alone, and what they stand
#   for is still open.
# - **The layer:** qwen3's share at M >= 8192 went from about 23 % to about 20 % (`picked_all_over_prev`
#   0.969-0.991 in exp_s2 and exp_s3); the other points are unchanged within their intervals. The 4096 change gained
#   TP=4 about 1 % of the layer in exp_s3 (0.985-0.993), the size of the A/A check's own miss (the same table
#   against itself: estimates down to 0.993, two intervals in ten exclude 1): differences under 1 % are not called
#   here. Still above the goals.

# %% [markdown]
# ## Loads before the K loop, and a program per tile
#
# Two more builds of the packed GEMM's expand (`studies/kernels/record_fold.py --sections expand`, the GEMM alone on the same
# u, paired, 95 %):
# - `early`: the expand's first step (u's and B_packed's tiles of the block's first slot) loaded by pointers before the
#   K loop and held in registers across it, so no wait is left after the loop for that step. Three sessions
#   (exp_s6-exp_s8).
# - `ppt`: the packed GEMM on a program per tile where the plain GEMM's table runs a flattened persistent grid (the
#   expand's loop stops Triton from flattening it; expand option `tile`). Two sessions (exp_s7, exp_s8).

# %%
ea = base_gemm.ratio_spread(base_gemm.expand_trials(base_gemm.EARLY_SESSIONS), base_gemm.EARLY_SESSIONS)
print(f"sessions: {', '.join(base_gemm.EARLY_SESSIONS)} (early); {', '.join(base_gemm.TILE_SESSIONS)} (ppt, ppt_d64)")
span(ea, ["gemm_early_over_loop", "off_early_over_base"], ["preset", "op", "M"])

# %% [markdown]
# Where the warps wait with `early` (ncu's source view, qwen3 at M = 8192, the loop and `early` in one file, exp_src2):

# %%
sv2 = base_gemm.packed_source_view(base_gemm.SOURCE_VIEW2, ops=base_gemm.SOURCE_VIEW2_OPS)
print(sv2.round(3).to_string(index=False))
tot2 = sv2.groupby("op").samples.sum()
print(f"all samples, down: early / loop = {tot2['down/early'] / tot2['down/loop']:.3f}")

# %%
tp = base_gemm.ratio_spread(base_gemm.expand_trials(base_gemm.TILE_SESSIONS), base_gemm.TILE_SESSIONS)
span(tp[tp.op == "down"], ["gemm_ppt_over_loop", "gemm_ppt_d64_over_loop", "off_ppt_over_base", "off_loop_over_base"],
     ["preset", "M"])

# %%
tl_ = base_gemm.packed_tile_layer()
tl_ = tl_[tl_.M >= 1024][["session", "preset", "M", "figure", "value", "lo", "hi"]].round(3)
print("the layer with the committed tile over the layer without it (exp_s7: the candidate with a program per tile at "
      "every flattened shape; exp_s8, exp_s9: the committed table over PREV)")
tl_.pivot(index=["preset", "M"], columns="session", values="value")

# %% [markdown]
# **Reading it.**
# - **Not the loads' latency, a third time:** with the first step's operands in registers before the K loop the
#   qwen3 GEMMs moved by 0.98-1.04x (estimates) in three sessions, and the source view shows why nothing was gained: the down
#   GEMM's samples total the same, the expand's TMA waits are gone and the same number of samples sit in the rest of
#   the tile instead. At TP=4 down M >= 4096 the 24-32 registers it holds take the second program per SM
#   (1.67-1.75x). Rejected. Three builds now (L2 prefetch, overlapped copies, loads before the loop) rule out the
#   expand's operand latency; what the tile waits for is per tile, not per load.
# - **A program per tile where the expand unflattens the grid:** at TP=4 down M = 1024 the packed GEMM alone runs in
#   0.85x its persistent build's time (0.78x with two slots per dot) and, with every adapter disabled, costs 1.10x
#   the plain GEMM instead of 1.22x; at M >= 4096 it loses (1.02-1.06x). The layer takes it at TP=4 down M = 1024
#   (`configs.PACKED_TILE_SHAPE_TOKENS`): 0.976-0.986x the layer without it in three sessions, LoRA's share there
#   42.2-42.7 % → 39.8-40.6 %, disabled 5.7-6.4 % → 3.6-4.0 %. Elsewhere the layer did not move (qwen3's candidate
#   tiles: 0.990-1.000x). Still above the goals.

# %% [markdown]
# ## The down GEMM's wide build: the adapters' columns in its own operands
#
# The packed GEMM's expand is a second loop after the K loop, and its cost is per tile. For the down GEMM it need not
# be a second loop: its x rows are the pairs' own rows, and so are u's. `moe_gemm_lora_wide` allocates the
# activations C columns wider, the shrink writes u into those columns, w2 carries B_packed in its columns past K, and
# the plain GEMM's K loop walks them when the shrink says an adapter is live (one int32 on the device; 0 when none
# is, so with every adapter disabled the GEMM is the plain GEMM). Timed in two sessions (wide_s1, wide_s2: the path
# end to end over the layer's committed packed path; the GEMM with nothing live over the plain GEMM):

# %%
wd = base_gemm.ratio_spread(base_gemm.wide_trials(), base_gemm.WIDE_SESSIONS)
print(f"sessions: {', '.join(base_gemm.WIDE_SESSIONS)}; the differential: " + ", ".join(
    f"{r.run} {r.cases} cases, {r.failures} failures, worst {r.worst:.1e}" for r in base_gemm.wide_check().itertuples()))
span(wd, ["path_wide_over_committed", "path_wide_w1_over_committed", "off_wide_over_base",
          "path_committed_off_over_base", "gemm_wide_over_base"], ["preset", "M"])

# %% [markdown]
# What ncu counted (one launch each at M = 8192, wide_s1): the down path's shrink and GEMM, the wide build beside the
# committed packed one (`packed_slot_w1s`):

# %%
base_gemm.wide_counters().round(2)

# %% [markdown]
# The layer at today's tables (the wide build at the buckets of `configs.WIDE_DOWN_TOKENS`) over the same tables
# without it, and LoRA's share of the layer, in two sessions (lay_s1, lay_s2):

# %%
from lora_moe_lab.kernels import configs  # noqa: E402

wl = base_gemm.wide_layer()
print(f"the wide build at the token buckets {sorted(configs.WIDE_DOWN_TOKENS)}; the layer with it over the layer "
      "without it:")
print(wl[wl.M >= 1024].pivot(index=["preset", "M"], columns="session", values="value").round(3).to_string())
now = base_gemm.committed_layer(base_gemm.PREVIOUS_LAYER)  # lay_s1, lay_s2: the tables of that session
print("LoRA's share at M >= 1024, both sessions: " + ", ".join(
    f"{p} {g.all_lo.min():.1f}-{g.all_hi.max():.1f} % (separate {g.separate_lo.min():.1f}-{g.separate_hi.max():.1f} "
    f"%; disabled {g.none_lo.min():.1f}-{g.none_hi.max():.1f} %)" for p, g in now[now.M >= 1024].groupby("preset",
                                                                                                        sort=False)))
now.round(2)

# %% [markdown]
# **Reading it.**
# - **The expand as the K loop's own iterations:** the down path end to end runs in 0.86-0.90x the packed path's
#   time at M >= 4096 on both presets (0.85-0.87x with the W1S shrink at M >= 8192). The counters show why: the wide
#   GEMM's tensor pipe is busier (qwen3: 67 against 51 %) and its top stall is the plain GEMM's `wait`, not the
#   packed GEMM's `barrier`; there is no second loop after the K loop to drain into.
# - **The disabled cost, met where it runs:** with every adapter disabled the wide GEMM is 0.96-1.02x the plain GEMM
#   (the packed path: up to 1.31x at TP=4 down). In the layer, every kernel launched and every adapter disabled now
#   costs under 3 % at M >= 1024.
# - **The share:** the layer is 0.96-0.98x the layer without the wide build at M >= 1024 (qwen3) and 0.95-0.97x at
#   TP=4 M >= 4096; LoRA's share at qwen3 M >= 8192 is now about 16-17 %. Still above the goals (12 %, 20 %): what is
#   left is mostly gate_up's shrink and expand, which cannot take this build as it is (its x rows are tokens, u's
#   rows are pairs): the next section.

# %% [markdown]
# ## gate_up's wide build, per block
#
# Two changes let gate_up take the wide build. Each pair's u lives in its *token's* row, at the columns K + j·C for
# the pair's slot j among the token's top_k; the GEMM's row pointers jump there once, between the last base K step and
# the first tail step (one add of j·C, no pointer select: the loads keep their asynchronous copies). And, since a pair
# needs only its own slot's columns of one slice (32 of 256 here), each tile walks only the slots its block's live
# pairs use, of its own slice (`per_block`). Timed in three sessions (wg_s2-wg_s4), end to end against the committed
# packed path, with the W1S shrink on the ordered alignment (the layer's), beside the build over all C columns:

# %%
wg = base_gemm.ratio_spread(base_gemm.wide_gate_up_trials(), base_gemm.WIDE_GU_SESSIONS)
print(f"sessions: {', '.join(base_gemm.WIDE_GU_SESSIONS)}; the differentials: " + ", ".join(
    f"{r.run} {r.cases} cases, {r.failures} failures, worst {r.worst:.1e}"
    for r in base_gemm.wide_check(base_gemm.WIDE_GU_CHECK_RUNS).itertuples()))
span(wg, ["path_wide_over_committed", "path_wide_blk_w1_over_committed", "gemm_wide_blk_over_base",
          "path_wide_blk_off_over_base"], ["preset", "M"])

# %% [markdown]
# What ncu counted for gate_up's GEMM and shrink at M = 8192 (one launch each): the committed packed path
# (`packed_slot_w1s`), the wide build over all columns (`wide_both`) and per block (`wide_blk`):

# %%
base_gemm.wide_gate_up_counters().round(2)

# %% [markdown]
# The layer at today's tables (gate_up's wide build at `configs.WIDE_GATE_UP_TOKENS` where qwen3's gate_up folds)
# over the tables before it, and LoRA's share of the layer with it (lay_s3, lay_s4; today's share is in the last
# section):

# %%
gl = base_gemm.layer_tables(tuple(n for n, _ in base_gemm.WIDE_GU_LAYER))
gl = gl[(gl.figure == "picked_all_over_prev") & (gl.M >= 1024)]
print(f"gate_up's wide build at the token buckets {sorted(configs.WIDE_GATE_UP_TOKENS)}; the layer with it over "
      "the layer without it:")
print(gl.pivot(index=["preset", "M"], columns="session", values="value").round(3).to_string())
now = base_gemm.committed_layer(base_gemm.WIDE_GU_COMMITTED)
goal = {"qwen3-30b-a3b": 12.0, "qwen3-30b-a3b-tp4": 20.0}
for p, g in now[now.M >= 1024].groupby("preset", sort=False):
    print(f"{p}: LoRA's share at M >= 1024 {g.all_lo.min():.1f}-{g.all_hi.max():.1f} % (separate "
          f"{g.separate_lo.min():.1f}-{g.separate_hi.max():.1f} %; the issue's goal <= {goal.get(p, float('nan')):.0f} "
          f"%: {'met' if g.all_hi.max() <= goal.get(p, 0) else 'not met'})")

# %% [markdown]
# **Reading it.**
# - **Over all C columns the build loses** at M >= 8192 (1.06-1.33x the packed path): every tile walks every slot's
#   columns of both slices, 12.5 % more K, while the packed path's per-slot expand walks only the block's slots.
# - **Per block it wins at qwen3 M >= 4096** (about 0.90-0.95x the packed path) and the layer follows at M >= 8192
#   (about 0.98-0.99x). Its GEMM costs 1.03-1.07x the plain GEMM: the expand is now the K loop's last step or two.
# - **What is left** is mostly the shrink, the same kernel in both paths: 125 µs at qwen3 M = 8192, about twice its
#   byte floor (x rows come back from DRAM once per expert). The share goals are still not met; at TP=4 the layer does
#   not fold gate_up at M >= 2048 at all, so nothing changed there.


# %% [markdown]
# ## gate_up's shrink slot by slot
#
# The shrink above reads each token's x row once per expert of the token, and its programs took the alignment's
# blocks expert by expert: the blocks in flight then need rows of nearly every token, while every expert's A streams
# through L2 beside them. Taken slot by slot instead (`lora_shrink_packed(slot_order=True)`; on the alignment ordered
# by LoRA row a block holds one or two slots), the programs in flight read only one slot's tokens' rows. The result
# is the same bit for bit: only the launch order changes. The order is one small Triton program
# (`align.slot_major_order`, a counting sort). The shrink alone at qwen3's gate_up (each arm a CUDA graph; two
# machines), under two adapter mappings: each token's adapter at random, and requests of contiguous tokens:

# %%
so = base_gemm.ratio_spread(base_gemm.shrink_order_trials(), base_gemm.ORDER_SESSIONS)
print(f"sessions: {', '.join(base_gemm.ORDER_SESSIONS)} (the order given); with the order's own kernel: "
      f"{base_gemm.ORDER_SESSIONS[-1]}")
paid = base_gemm.shrink_order_trials(base_gemm.ORDER_SESSIONS[-1:])
print(paid[paid.figure.str.endswith("paid_over_expert")].pivot(index="M", columns="figure", values="value").round(3)
      .to_string())
span(so, ["random_slot_over_expert", "requests_slot_over_expert", "requests_over_random"], ["M"])

# %% [markdown]
# What ncu counted (M = 8192, one launch each, two sessions): time, DRAM bytes against the shrink's byte floor and
# the L2 hit rate, in block order (`*_expert`) and slot by slot (`*_slot`):

# %%
base_gemm.shrink_order_counters().round(2)

# %% [markdown]
# The layer at today's tables (the shrink slot by slot) over the same tables with the shrink in block order
# (`picked_all_over_prev`; disabled: `picked_none_over_prev`), and LoRA's share of the layer now:

# %%
ol = base_gemm.layer_tables(tuple(n for n, _ in base_gemm.ORDER_LAYER))
ol = ol[ol.figure.isin(["picked_all_over_prev", "picked_none_over_prev"]) & (ol.M >= 4096)]
print(ol.pivot(index=["preset", "M"], columns=["figure", "session"], values="value").round(3).to_string())
now = base_gemm.committed_layer()
print(f"sessions: {', '.join(now.session.unique())}")
for p, g in now[now.M >= 1024].groupby("preset", sort=False):
    print(f"{p}: LoRA's share at M >= 1024 {g.all_lo.min():.1f}-{g.all_hi.max():.1f} % (separate "
          f"{g.separate_lo.min():.1f}-{g.separate_hi.max():.1f} %; the issue's goal <= {goal.get(p, float('nan')):.0f} "
          f"%: {'met' if g.all_hi.max() <= goal.get(p, 0) else 'not met'})")

# %% [markdown]
# **Reading it.**
# - **The launch order moves bytes:** with the order given the shrink takes 0.85-0.92x its time in block order, DRAM
#   bytes fall from about 2.06x to 1.73x the floor and the L2 hit rate rises from 36 % to 45 %. The mapping does not
#   matter: a slot's tokens are a quarter of x whether they are contiguous or not.
# - **The order costs a launch:** its kernel takes about 5 µs at M = 8192, so the shrink with it is 0.89-0.97x. The
#   layer keeps 0.992-0.998x of it at qwen3 M >= 4096 (two sessions), and with nothing live the kernel returns at
#   once (a tie).
# - **The share goals are still not met.** qwen3 is nearest at M = 16384 (about 13.5 %). The shrink still runs at
#   56 % of DRAM peak, stalled on its gathered loads.

# %% [markdown]
# ## LoRA's share against its floor, and the layer kernel by kernel
#
# The share goals (≤ 12 % for qwen3, ≤ 20 % at TP=4, from M = 1024) set beside the least time LoRA can add with the
# deltas folded: each shrink its own kernel, each expand extra K steps of the base GEMM, every kernel at the larger of
# its bytes over the copy ceiling and its FLOPs over the matmul ceiling (`floors.lora_floor`). `goal_of_floor` above
# 1.0 means the goal leaves less time than the adapters' own bytes take:

# %%
from lora_moe_lab.instruments.analysers import floors
from lora_moe_lab.ui.kernel_plots import lora_parts_figure

sf = floors.share_floors()
print(sf.pivot_table(index=["preset", "M"], columns="session",
                     values=["share_pct", "floor_share_pct", "goal_of_floor", "added_over_floor"]).round(2).to_string())
for p, g in sf[sf.M == 1024].groupby("preset", sort=False):
    print(f"{p} M = 1024: the goal asks for {g.goal_of_floor.min():.2f}-{g.goal_of_floor.max():.2f}x the floor "
          f"({'out of any kernel' if g.goal_of_floor.min() > 1 else 'reachable'}'s reach)")

# %% [markdown]
# Which kernels make up LoRA's added time: each arm's CUDA graph replayed under the profiler, every kernel's GPU
# time from CUPTI (`studies/kernels/record_parts.py`; attributions, set beside the live paired figure, the black
# diamond, and the floor, the red bar):

# %%
parts = floors.layer_parts()
lora_parts_figure(parts, floors.share_floors(base_gemm.PARTS_LAYER)).show()
busy = parts[parts.part == "<busy>"].pivot_table(index=["preset", "M"], columns="session", values="added_us")
busy["live"] = floors.share_floors(base_gemm.PARTS_LAYER).groupby(["preset", "M"]).added_us.mean()
print("LoRA's added µs, profiled per session against live:\n" + busy.round(1).to_string())

# %% [markdown]
# The base layer itself: how much of its kernel time is the GEMMs, and how much the parts the lab runs as torch ops
# (the router in fp32, SiLU and mul as two kernels, the top-k sum) that an engine fuses. With those parts at their
# floors, the same LoRA time is a larger share (`lean_share_pct`, a bound computed from measured parts):

# %%
lb = floors.lean_base_shares()
lb[["preset", "M", "gemm_pct", "torch_parts_pct", "share_pct", "lean_share_pct"]].round(1)

# %% [markdown]
# **Reading it.**
# - **At M = 1024 the goals are out of reach:** they leave LoRA 1.24-1.33x less time than its floor. From M = 4096
#   they need a third to two thirds of the floor, and the committed kernels run 2.4-4.1x it.
# - **Where the time goes** (the parts ran before down's window): at qwen3 the shrinks (about 260 µs at M = 16384
#   against about 110 µs of floor); at TP=4 gate_up's separate delta (about 185 µs against 56) and down's wide GEMM,
#   whose tail walked all four adapters' columns for every row (+121 µs). Its window of two slots, taken at M = 16384,
#   brought that to +68 µs (parts_s3) and the TP=4 share there to about 22.5 % (lay_s10).
# - **The base is not an engine's base:** a third to a half of its kernel time is torch parts an engine fuses, so
#   the measured share understates what LoRA would cost beside a production layer.
