# %% [markdown]
# # 02 · The kernel's early exit
#
# **Goal.** Look inside the fused MoE-LoRA Triton kernel: which programs it launches, why most of
# them return after reading four small integers, check that the ones that do work compute the
# right delta, see what a launch in which every adapter is disabled costs, and see why
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
# and the work-item count with the host's. The buffer starts filled with `-7`, so a cell that no
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
# N share) is in the git history (data/archive/kernels, removed from the tree at 272068a); its all-disabled launch cost several times an empty
# kernel at large M, which is why the grid changed (`data/kernels/README.md`). For scale, `enabled_us` is the same launch doing its work
# (all four adapters enabled). At decode sizes the MoE layer itself does not launch this kernel:
# it takes the decode path (its own grid, the last section), so the small-M rows time the aligned
# kernel where the layer would not use it.

# %%
from lora_moe_lab.config import get_shape
from lora_moe_lab.kernels.plan_table import table_for

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
        print(f"  {pr}: the layer takes the decode path for M x top_k <= {table_for().decode_max_pairs} pairs, M <= "
              f"{table_for().decode_max_pairs // k_} at top_k={k_}")

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
# At decode sizes (`M·top_k ≤ plan_table.table_for().decode_max_pairs`, a static choice) the MoE layer skips the
# per-adapter alignment: `kernels/lora_decode.py` launches one program per **(pair, slice, N share)**
# straight from `topk_ids` and the per-token row mapping. Each program checks, in one round of
# metadata loads: the pair past a device-side live count (3), token without adapter (5), row without
# adapter (1), adapter disabled (2), expert -1 (4); 0 = it ran. Below: its launch plan for this batch,
# and the code of every pair with slot `b` disabled, the last token's pairs past a live count, and
# one pair routed nowhere.

# %%
from lora_moe_lab.kernels.plan_table import table_for
from lora_moe_lab.kernels import exits
from lora_moe_lab.kernels.lora_decode import decode_launch_plan, lora_delta_decode

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
print(f"decode path for M*top_k <= {table_for().decode_max_pairs} pairs; this batch: {num_tokens * k0} pairs")
pd.Series({k: str(v) for k, v in plan_d.items()}, name="decode launch plan (static shapes)").to_frame()

# %%
cd = codes_d.view(num_tokens, k0).cpu().numpy()
fig = go.Figure(go.Heatmap(z=cd, zmin=0, zmax=5, colorscale="Viridis", text=cd, texttemplate="%{text}",
                           colorbar=dict(title="exit code")))
fig.update_layout(title="decode path: exit code per (token, k) pair", height=320)
fig.update_xaxes(title_text="k (expert choice of the token)")
fig.update_yaxes(title_text="token", autorange="reversed")
fig.show()
pd.Series(exits.names("lora_decode_kernel"), name="meaning").to_frame()

# %% [markdown]
# ## Beyond the exit
# What the delta costs once adapters *are* active (tiles, registers, the share of the copy bandwidth), the base MoE
# GEMM against vLLM's tuned kernel and its roofline floor, the LoRA path packed into the base GEMM, and LoRA's share
# of the layer against its floor are the kernels study's: `studies/kernels/README.md` (its figures:
# `studies/kernels/plots.py`, its tables: `data/kernels/README.md`). This notebook's live part is the exit, above.
