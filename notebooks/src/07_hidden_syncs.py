# %% [markdown]
# # 07 · Hidden syncs: find them in any model
#
# **Goal.** Point the sync audit at any PyTorch callable, see every host-device sync it makes with its
# line, count and cost, then thirteen shapes the bug takes in serving code, each with a sync-free rewrite.
#
# The lab teaches one sync, the LoRA guard's `.any().item()`. Serving engines keep shipping the
# same bug in other shapes, and keep fixing it:
#
# * **sgl-project/sglang#32589**: a mamba track mask read with `.any()` and `nonzero()` in every
#   mamba layer made 56 host syncs per prefill forward (27 mamba layers); the fix hoisted both into
#   per-forward metadata.
# * **sgl-project/sglang#33662**: `swa_offsets[-1].item()` in chunked prefill serialised the
#   stream; removing it gave +12.6 % prefill throughput and −31.6 % TTFT p50.
# * **sgl-project/sglang#6994**: LoRA batch preparation made free of stream syncs: TTFT p50 −31.4 %.
# * **sgl-project/sglang#24262**: a per-layer alignment fallback stalled the host in every layer;
#   removing the stalls cut NCCL all-reduce kernel time by about 68 % (the other ranks spin).
# * **vLLM** runs a GPU sync check with an allowlist of sites for the same reason.
#
# Profilers show where a GPU idles. The **audit** (`lora_moe_lab.audit`) answers "which
# line of my Python made it idle, and what would removing it buy?": for any PyTorch callable,
# every host-device sync with its call site, its kind, its count per call, the host time blocked,
# and on a GPU the GPU idle after it (one profiled forward) and the saving the replay engine
# predicts if it were removed. Then the thirteen shapes the bug takes, each with its rewrite.
#
# On a CPU the audit counts and locates the calls that *would* sync on a GPU (times are CPU
# times, nothing is estimated) and the notebook shows the **recorded** H200 costs from
# `data/hidden_syncs/`. On a GPU (`notebooks/params/gpu.yaml`) it also measures them live.

# %% tags=["parameters"]
size = "smoke"       # smoke (tiny, for CI) or h200 (M 4096, H 2048, 8 layers, the recorded size)
patterns = "all"     # all, or a list of pattern names (lora_moe_lab/instruments/recorders/hidden_syncs.py)
lab_layers = 48      # layers of the lab's own MoE forward that the audit is pointed at first
live_reps = 0        # paired live repetitions per pattern (0 for none, 10 or more for an interval)
live_warmup = 4      # warm-up pairs discarded before the live repetitions
hf_tokens = 16       # input length of the tiny transformers Qwen3-MoE audited after the lab's forward
graph_breaks = True  # which syncs break a full-graph torch.compile (dynamo traces: ~1 min on a CPU)

# %%
import inspect

import pandas as pd
import torch

from lora_moe_lab import runtime
from lora_moe_lab.instruments.analysers import hidden_sync_runs
from lora_moe_lab.instruments.recorders import hidden_syncs as HS
from lora_moe_lab.audit import audit  # the audit, priced by the replay engine
from lora_moe_lab.nb import params as nbp
from lora_moe_lab.nb.params import NotebookParameterError
from lora_moe_lab.ui import audit_plots as AP

nbp.reject_unknown_parameters()
if size not in ("smoke", "h200"):
    raise NotebookParameterError(f"bad notebook parameter size={size!r}: 'smoke' or 'h200'")
if patterns != "all" and (not isinstance(patterns, (list, tuple)) or set(patterns) - set(HS.names())):
    raise NotebookParameterError(f"bad notebook parameter patterns={patterns!r}: "
                                 f"'all' or a list from {HS.names()}")
nbp.check_positive_int("lab_layers", lab_layers)
nbp.check_positive_int("hf_tokens", hf_tokens)
if not isinstance(graph_breaks, bool):
    raise NotebookParameterError(f"bad notebook parameter graph_breaks={graph_breaks!r}: True or False")
if not isinstance(live_reps, int) or isinstance(live_reps, bool) or not (live_reps == 0 or live_reps >= 10):
    raise NotebookParameterError(f"bad notebook parameter live_reps={live_reps!r}: 0 or an int >= 10")
if not isinstance(live_warmup, int) or isinstance(live_warmup, bool) or live_warmup < 0:
    raise NotebookParameterError(f"bad notebook parameter live_warmup={live_warmup!r}: an int >= 0")
nbp.setup_plotly()
DEV = "cuda" if runtime.has_cuda() else "cpu"
if DEV == "cpu":
    torch.set_num_threads(1)  # tiny ops: several OpenMP threads only spin against each other
SIZE = HS.Size.smoke() if size == "smoke" else HS.Size()
NAMES = HS.names() if patterns == "all" else list(patterns)
print(f"device {DEV}; pattern size {SIZE}; {len(NAMES)} patterns")

# %% [markdown]
# ## The audit on the lab's own forward
# First the forward this lab is about: the MoE model (tiny shapes, `lab_layers` layers) with the
# old guard `sync`, then the fix `cpu_flag`. The audit must find exactly one `.item()` per layer,
# in `guards.py`, and nothing for the fix.

# %%
from lora_moe_lab.model.lab import build_lab

lab = build_lab("tiny", num_layers=lab_layers, device=DEV, backend="torch" if DEV == "cpu" else "auto",
                seed=0)
lab.pool.load("a0", rank=4)
batch, tensors = lab.make_batch(adapters=[None, "a0"], token_counts=[3, 5])
x = lab.random_input(8, seed=0)
lab_audit = {g: audit(lab.model, x, batch, tensors, guard=g, warmup=1) for g in ("sync", "cpu_flag")}
print(lab_audit["sync"].summary())
print()
print(lab_audit["cpu_flag"].summary())
AP.timeline_figure(lab_audit["sync"], title=f"The `sync` guard's syncs along one forward ({DEV})").show()
AP.cost_table_figure(lab_audit["sync"]).show()

# %% [markdown]
# ### How to read an audit
# * **site**: the innermost line outside torch and outside the tooling: where *your* code asked.
# * **kind**: what made the host wait (`item`: a value read, `bool()` of `if tensor:` too;
#   `tolist`; `d2h`: `.cpu()`, `.numpy()`, print; `shape`: an output whose size is device data;
#   `pageable`: a `non_blocking` upload from unpinned memory: the host copies it into a staging
#   buffer before the call returns, and CUDA's API notes say the driver *may* synchronize with the
#   stream to stage it (the recorded cost below says whether it did here);
#   `synchronize`; `allocator`: `empty_cache` or a call after which the reserved memory grew).
# * **count per call**: a per-layer sync shows up as a multiple of the layer count.
# * **host blocked** (perf_counter around the call): how long the host waited. It is the GPU work
#   queued ahead of the sync plus a round trip: a long block can be free (the GPU was busy) and a
#   short one expensive. **GPU idle after** (one profiled forward) and the **replay saving** are
#   what removing it buys; they exist on a GPU only. The table is sorted by saving, then idle.

# %% [markdown]
# ## The audit on code no one here wrote: transformers' Qwen3-MoE
# The same audit on a model this lab did not write: a tiny random-init `Qwen3MoeForCausalLM` from
# transformers (2 layers of 8 experts, top-2; float32 on a CPU, bf16 on a GPU; `hf_tokens` tokens),
# with the per-expert loop transformers ships as its `eager` experts implementation. Through the
# notebook magic this time: `%load_ext lora_moe_lab.audit`, then `rep = %sync_audit EXPR`
# audits EXPR as a callable's body (one warm-up call first) and shows the table and the timeline;
# a `%%sync_audit` cell audits the cell once. `--focus transformers` sites each sync at its innermost
# line inside transformers. The loop walks the experts hit with device tensors as loop state, so
# the audit should find, per layer, **1 `nonzero` + 5 syncs per expert hit**: `bool()` of
# `expert_idx == num_experts`, a 0-d index and a `where(cond)` on one line, two more 0-d indices
# (`gate_up_proj[expert_idx]`, `down_proj[expert_idx]`). The experts hit are counted apart, from the
# router's choices (a hook on a plain forward, outside the audit).

# %%
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

hf_cfg = Qwen3MoeConfig(vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, intermediate_size=64, moe_intermediate_size=32,
                        num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1, max_position_embeddings=128)
hf_cfg._experts_implementation = "eager"  # transformers' per-expert loop (its default is grouped_mm)
torch.manual_seed(0)
model = Qwen3MoeForCausalLM(hf_cfg).to(device=DEV, dtype=torch.float32 if DEV == "cpu" else torch.bfloat16).eval()
ids = torch.randint(0, hf_cfg.vocab_size, (1, hf_tokens), generator=torch.Generator().manual_seed(0)).to(DEV)
fwd = torch.no_grad()(lambda: model(ids, use_cache=False).logits)
experts = [m for m in model.modules() if type(m).__name__ == "Qwen3MoeExperts"]
routed = []  # each layer's top-k expert ids, from one plain forward
hooks = [m.register_forward_pre_hook(lambda m, a: routed.append(a[1].detach().cpu())) for m in experts]
eager_out = fwd()
for h in hooks:
    h.remove()
hits = [int(r.unique().numel()) for r in routed]
closed = [1 + 5 * h for h in hits]
print(f"{len(experts)} MoE layers of {hf_cfg.num_experts} experts, {hf_tokens} tokens on {DEV}; experts hit per "
      f"layer (the router's choices): {hits}")

# %%
%load_ext lora_moe_lab.audit
hf_eager = %sync_audit --focus transformers fwd()
t = hf_eager.table()
loop = t[t["function"].str.startswith("Qwen3MoeExperts.") & t["kind"].isin(["item", "index0d", "shape"])]
for layer, (h, n) in enumerate(zip(hits, closed)):
    print(f"layer {layer}: 1 nonzero + 5 x {h} experts hit = {n}")
print(f"the audit, in Qwen3MoeExperts.forward: {loop['count_per_call'].sum():g} syncs per forward on "
      f"{loop['site'].nunique()} lines (closed form {sum(closed)}); outside it: "
      f"{hf_eager.count - loop['count_per_call'].sum():g} ({', '.join(sorted(set(t['site']) - set(loop['site'])))})")
assert loop["count_per_call"].sum() == sum(closed), "the eager loop's syncs differ from the closed form"

# %% [markdown]
# ### The rewrite: one `.tolist()` per layer
# `lora_moe_lab/instruments/recorders/expert_loop.py` computes the same thing from one host read
# per layer: each expert's token count (`.tolist()`), after a stable sort of the routing table in
# the order `torch.where` walks it, so every expert sees its rows in the same order and the output
# is bit-equal. `expert_loop.register()` adds it to transformers' experts interface as "hoisted";
# the experts read `self.config._experts_implementation` at each call. Every module that has a
# `.config` is set (normally they all share the model's one config object: checked below).

# %%
from lora_moe_lab.instruments.recorders import expert_loop

expert_loop.register()
cfgs = {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}
print(f"{sum(hasattr(m, 'config') for m in model.modules())} modules have a .config: {len(cfgs)} distinct object(s)"
      + (", the model's own: setting model.config is enough" if list(cfgs) == [id(model.config)] else ""))
for c in cfgs.values():
    c._experts_implementation = expert_loop.NAME
hf_hoisted = %sync_audit --focus transformers fwd()
same = torch.equal(fwd(), eager_out)
print(f"hoisted: {hf_hoisted.kinds.get('tolist', 0):g} .tolist() per forward ({len(experts)} layers), "
      f"{hf_hoisted.count:g} syncs in all (eager {hf_eager.count:g}); logits bit-equal to the eager loop's: {same}")
assert hf_hoisted.kinds.get("tolist", 0) == len(experts), "not one .tolist() per layer"
assert not hf_hoisted.kinds.get("index0d") and not hf_hoisted.kinds.get("shape"), dict(hf_hoisted.kinds)
assert same, "the hoisted loop's logits differ from the eager loop's"

# %% [markdown]
# ### Which syncs break a compiled graph
# The same `.item()` that stops the host is, to `torch.compile`, a value Python needs before the graph
# can go on, and a `nonzero` is an output whose size the tracer cannot know: each ends the graph, and
# `fullgraph=True` refuses to compile at the first. `audit(..., graph_breaks=True)` traces the eager
# forward once with `torch._dynamo.explain` and marks each sync site that some break's stack passes
# through. Dynamo's own break count and the breaks it lists can differ (a frame it gives up on runs
# eagerly, its later syncs unseen): both are printed.

# %%
if graph_breaks:
    for c in cfgs.values():
        c._experts_implementation = "eager"
    hf_graph = audit(fwd, warmup=0, profile=False, focus="transformers", graph_breaks=True)
    print(hf_graph.graph_breaks.summary(hf_graph))
    display(hf_graph.graph_break_table())
else:
    print("graph_breaks=False: the graph-break view is not traced here")

# %% [markdown]
# ### The priced rewrite, recorded on the H200
# On a GPU the audit prices each sync (the GPU idle after it and the replay's saving); whether the
# rewrite buys that back is a timing question: `data/audit_corpus/` (`studies/audit_corpus/record.py`,
# `priced.csv`, a row per session and model) holds the replay's predicted saving beside the
# measured one (eager against hoisted, paired, with its 95 % interval) per model, recorded on an H200.
# The price reads the original forward only: one profiled call, its host scaled to the original's own
# unprofiled time in the measurement's window (a shared host's speed drifts within a minute); the
# canonical sessions (the last two) come nearest the measured saving (`priced.csv`). Read as recorded; nothing
# here is computed on this machine.

# %%
PRICED = nbp.DATA / "audit_corpus" / "priced.csv"  # one row per session and model
if PRICED.exists():
    priced = pd.read_csv(PRICED)
    cols = ["session", "model", "syncs_before", "syncs_after", "predicted_saving_us", "measured_saving_us",
            "measured_lo_us", "measured_hi_us", "pred_error_pct", "halfwidth_pct", "reps", "predict_method"]
    print(f"recorded: {PRICED.name} (saving per forward, us; measured: paired, percentile bootstrap 95 % interval)")
    display(priced[[c for c in cols if c in priced]].round(1))
else:
    print("no H200 recording of the priced rewrite in data/audit_corpus/ yet")

# %% [markdown]
# ## The patterns
# Each pattern is a small multi-layer forward (per layer: `work` matmuls, then the pattern's step,
# then a residual); the matmuls are the GPU work queued ahead of the sync. For each: the audit of
# the original and of the rewrite, and the rewrite checked equal to the original (bit for bit where
# the math allows; `tolist_routing`'s rewrite runs every expert on every token, a different GEMM
# shape, so it is compared within 1e-5).

# %%
rows, audits = [], {}
for name in NAMES:
    case = HS.build(name, SIZE, DEV)
    ro, rf = audit(case.original, warmup=1), audit(case.rewrite, warmup=1, profile=False)
    same, err = HS.equal(case)
    audits[name] = ro
    rows.append(dict(pattern=name, what=case.pattern.title, kind_found=" + ".join(sorted(ro.kinds)),
                     syncs_per_forward=ro.count, sites=", ".join(sorted(ro.sites)), rewrite_syncs=rf.count,
                     rewrite_equal=same, rel_err=err, fix=case.pattern.fix, case=case.pattern.case))
found = pd.DataFrame(rows)
display(found[["pattern", "what", "kind_found", "syncs_per_forward", "sites", "rewrite_syncs",
               "rewrite_equal"]])

# %% [markdown]
# The code of each pattern, original step and rewrite side by side in one function (the shared
# forward is `hidden_syncs._Model.forward`):

# %%
for name in NAMES:
    p = next(p for p in HS.PATTERNS if p.name == name)
    print(f"# --- {name}: {p.title}\n# case: {p.case}\n# fix: {p.fix}")
    print(inspect.getsource(p.make))

# %% [markdown]
# ## What each costs on the H200 (recorded)
# `data/hidden_syncs/hidden_syncs_<session>.csv` (`studies/hidden_syncs/record.py`, one device
# session each): M = 4096 tokens × H = 2048, 8 layers of 2 fp32 matmuls (several ms of GPU work per
# forward, so the host runs ahead and each sync drains a real queue); original and rewrite timed
# interleaved and paired, each forward's wall time ending with a device sync, after a warm-up
# checked for drift. The cost per occurrence is the paired median difference over the syncs per
# forward, with its paired-bootstrap 95 % interval; over two sessions, the mean with the union of
# the intervals (`stats.between_sessions`), flagged where they disagree.

# %%
REC = hidden_sync_runs.recorded()
if REC is None:
    print("H200 costs: not recorded yet (run studies/hidden_syncs/record.py --session s1 on a GPU; "
          "data/hidden_syncs/README.md)")
else:
    display(REC[["pattern", "kind", "occurrences", "per_occ_us", "per_occ_lo_us", "per_occ_hi_us", "diff_us",
                 "diff_lo_us", "diff_hi_us", "original_ms", "sessions", "agree", "n", "gpu"]].round(2))
    AP.pattern_costs_figure(REC).show()

# %% tags=["lesson"]
bad = found[(found["rewrite_syncs"] > 0) | ~found["rewrite_equal"]]
assert bad.empty, \
    f"a rewrite syncs or differs: {bad[['pattern', 'rewrite_syncs', 'rel_err']].to_dict('records')}"
for r in found.itertuples():
    want, got = HS.KINDS_SEEN[r.pattern], set(r.kind_found.split(" + "))
    # on a GPU torch's debug mode may see one more sync inside a call at the same site ("other")
    extra = {"other"} if DEV == "cuda" else set()
    assert want <= got <= want | extra, f"{r.pattern}: found {got}, expected {want}"
print(f"the audit finds every pattern with its kind ({len(found)} patterns) and every rewrite is sync-free "
      f"and equal to its original ({int(found['rewrite_equal'].sum())} of {len(found)})")
WHY_FREE = {"pageable_copy": "A non_blocking upload from pageable memory is staged by the host (a host "
                              "copy, synchronous), and at this size the driver did not wait for the stream: no "
                              "bubble. It stays a hazard: the source may change before the DMA, and it cannot "
                              "be captured in a CUDA graph; the pinned rewrite is the safe form."}
if REC is not None:
    for r in REC.itertuples():
        if r.sessions:
            flag = "" if r.agree else "; the sessions disagree: the union of their intervals is shown"
            print(f"[H200, recorded] {r.pattern}: {r.per_occ_us:.1f} us per occurrence "
                  f"[{r.per_occ_lo_us:.1f}, {r.per_occ_hi_us:.1f}] (95 %, {r.method}; "
                  f"sessions {r.sessions}{flag}); the rewrite saves {r.diff_us:.0f} us "
                  f"[{r.diff_lo_us:.0f}, {r.diff_hi_us:.0f}] per forward of "
                  f"{r.original_ms:.2f} ms ({r.occurrences:g} syncs)")
            if r.per_occ_lo_us <= 0 <= r.per_occ_hi_us:
                # a flagged pattern with no measurable bubble: said, not hidden (see the kinds above)
                print(f"    {r.pattern}: no measurable cost at this size (the interval holds 0). "
                      + (WHY_FREE.get(r.pattern) or "The audit flags the call; here it did not drain the queue."))
        else:
            print(f"[H200, recorded] {r.pattern}: no figure, the repetitions never settled "
                  f"(sessions {r.unstable})")
else:
    print("[H200] costs per occurrence: not recorded yet")
if live_reps and DEV == "cuda":
    for name in NAMES:
        m = HS.measure(name, SIZE, DEV, reps=live_reps, warmup=live_warmup)
        if m["status"] == "ok":
            print(f"[live, {torch.cuda.get_device_name()}] {name}: {m['per_occ_us']:.1f} us per occurrence "
                  f"[{m['per_occ_lo_us']:.1f}, {m['per_occ_hi_us']:.1f}] (95 %, {m['method']}; n={m['n']}); "
                  f"the rewrite saves {m['diff_us']:.0f} us [{m['diff_lo_us']:.0f}, {m['diff_hi_us']:.0f}] "
                  "per forward")
        else:
            print(f"[live] {name}: the repetitions never settled, no figure ({m['warmup_note']})")
elif live_reps:
    print("live timing asked, but this machine has no GPU: a CPU has no queue to drain, "
          "so no figure is timed")

# %% [markdown]
# ## Which rewrite fits which kind
# * `item` from a decision (`if x.any():`, a guard): **host-side metadata**. The batch builder knows
#   it from Python lists (`has_active_lora`, the total instead of `offsets[-1]`, the max length).
#   Under CUDA-graph capture, launch unconditionally and let the kernel **exit early on the device**.
# * `tolist` / `shape` (routing counts, `nonzero`, masks, `unique`): **static shapes**. Three-argument
#   `torch.where`, `masked_fill`, fixed-size masks by `scatter_`, a static upper bound with padding the
#   kernel skips (this lab's alignment). `bincount` syncs on CUDA too (it sizes its output).
# * `repeat_interleave`: pass **`output_size`** from the host's token count.
# * `d2h` (logging, print): keep values on the device; read once after the step, off the hot path.
# * `pageable`: **pinned buffers**, one `non_blocking` upload per forward from a page-locked buffer
#   that is not rewritten while the copy is in flight.
# * `allocator`: workspaces allocated once, outside the forward; no `empty_cache` on the hot path.
#   That is also what makes a forward **capture-safe**: a CUDA graph replays fixed addresses.
# * `synchronize`: events (`Event.record`, `stream.wait_event`) to order streams; time outside.
#
# ## Keeping a path sync-free in CI
# * `with checked_region(): forward()` (`instruments/recorders/syncs.py`) fails at the first sync on a GPU
#   (torch's sync debug mode set to "error", the error names your line); on a CPU it checks the
#   library guard's syncs. `allow_sync()` marks an intended one.
# * `with sync_check(allow=["guards.py:active"]):` (`instruments/recorders/sync_check.py`, like vLLM's) fails on
#   every sync outside the named sites, on an allowlist entry that matched nothing (a stale entry),
#   and on a `non_blocking` upload from pageable memory, on any machine.
# * `audit(forward, *inputs).count == 0` in a test: the CPU run of CI already catches every kind
#   above except allocator growth (a GPU-only fact); `docs/sync_audit.md` has the details.
# * In any project that installs this one, `@pytest.mark.sync_budget(max_syncs=0, allow=["file.py:func"])`
#   on a test (or the `sync_budget` fixture around a block) fails it on more syncs than the budget
#   outside the allowlist, or on an entry that matched nothing: the audit counts on a CPU, torch's
#   debug mode on a GPU (`instruments/recorders/audit_pytest.py`). `audit(..., timeout_s=60)` stops a
#   forward that never returns, with the syncs it saw so far.
