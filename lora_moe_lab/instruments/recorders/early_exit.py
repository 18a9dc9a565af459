"""Helpers for notebook 02: the fused MoE-LoRA kernel's persistent launch, its early exits, and what
an all-disabled launch costs.

    case  = make_case(lab, adapters, token_counts)        # one layer's real inputs, from the lab
    plan  = launch_plan(case)                             # programs launched, work items, tiles
    items = work_items(case)                              # the items this batch really has, per slot
    codes, out = run_exit_map(case)                       # the kernel's exit code per (slot, block)
    want  = host_exit_codes(case.align, case.lora_ids, case.adapter_enabled)   # the same, on the host
    ui.kernel_plots.exit_map_figure(codes, case)          # plotly heatmap (slot x token block)

Pure functions over tensors and DataFrames; the GPU-only timing (`launch_costs`) needs CUDA and
says so. Exit codes (written by the kernel when asked, see kernels/fused_moe_lora.py):
0 ran, 1 slot's lora_id is -1, 2 adapter disabled, 3 block past num_tokens_post_padded, 4 expert -1.
"""
from __future__ import annotations

import glob
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ... import runtime  # noqa: F401  (first: TRITON_INTERPRET before any kernel is decorated)
from ...kernels import exits
from ...kernels.align import Alignment, moe_align
from ...kernels.configs import lora_block_m
from ...kernels.empty import empty_kernel
from ...kernels.fused_moe_lora import lora_delta, lora_launch_plan
from ...ops.reference import exit_codes, ref_lora_delta
from ...provenance import catalog, normalize_meta
from ..analysers import schemas
from .timing import time_graph

EXIT_SHORT = exits.short("fused_moe_lora_kernel")  # the one table (kernels/exits.py)


@dataclass
class Case:
    """The gate_up LoRA delta of one MoE layer for one batch: everything `lora_delta` reads."""

    x: torch.Tensor  # (M, K) activations
    topk_ids: torch.Tensor  # (M, top_k) int32, from the layer's router
    token_slot: torch.Tensor  # (M,) int32 slot per token, -1 = no adapter
    lora_a: torch.Tensor  # (2, S, E, r, K)
    lora_b: torch.Tensor  # (2, S, E, I, r)
    lora_ids: torch.Tensor  # (S,) int32
    adapter_enabled: torch.Tensor  # (S,) int32
    align: Alignment  # per-adapter alignment (S rows)
    top_k: int
    out0: torch.Tensor  # (M*top_k, 2I) random "base" intermediate the delta is added into

    @property
    def num_slots(self) -> int:
        return self.lora_ids.shape[0]


def make_case(lab, adapters: list, token_counts: list[int], *, seed: int = 0, layer: int = 0) -> Case:
    """Real inputs of layer `layer`'s gate_up LoRA delta: the batch metadata built by the lab from
    Python lists, the experts its router picks, the pool's weight stacks, the per-adapter alignment
    the MoE layer would build. `out0` is random (never zeros): rows the kernel must not touch are
    compared bit for bit."""
    batch, tensors = lab.make_batch(adapters, token_counts)
    x = lab.random_input(batch.num_tokens, seed=seed)
    _, topk_ids = lab.model.layers[layer].route(x)
    M, k = topk_ids.shape
    E, I = lab.shape.num_experts, lab.shape.intermediate
    S = lab.pool.max_loras
    bm = lora_block_m(M, k, E, S)
    align = moe_align(topk_ids, E, bm, tensors.token_lora_mapping, S)
    w = lab.pool.layers[layer]
    g = torch.Generator(device="cpu").manual_seed(seed + 1)
    out0 = torch.randn(M * k, 2 * I, generator=g).to(lab.dtype).to(lab.device)
    return Case(x, topk_ids, tensors.token_lora_mapping, w.gate_up_a, w.gate_up_b, tensors.lora_ids,
                tensors.adapter_enabled, align, k, out0)


def launch_plan(case: Case, exit_codes: bool = False) -> dict:
    """What `kernels.fused_moe_lora.lora_delta` launches for this case, from static shapes only: a persistent grid
    of `programs` programs (SMs x programs per SM, never more than `work_items_max`)."""
    return lora_launch_plan(case.x, case.lora_a, case.lora_b, case.align, case.top_k,
                                       exit_codes=exit_codes)


def work_items(case: Case) -> pd.DataFrame:
    """The work items this batch gives the kernel, per slot, computed on the host the way every
    program computes them from the slot metadata: 0 for an empty (lora_id -1) or disabled slot,
    else its busy blocks (below num_tokens_post_padded) times split_n."""
    plan = launch_plan(case)
    bm, nb, split = case.align.block_m, case.align.expert_ids.shape[1], plan["split_n"]
    ids = case.lora_ids.cpu().tolist()
    en = case.adapter_enabled.cpu().tolist()
    ntpp = case.align.num_tokens_post_padded.cpu().tolist()
    rows = []
    for s in range(len(ids)):
        busy = min((ntpp[s] + bm - 1) // bm, nb)
        live = ids[s] != -1 and en[s] != 0
        rows.append(dict(slot=s, lora_id=ids[s], enabled=en[s], num_tokens_post_padded=ntpp[s], busy_blocks=busy,
                         items=busy * split if live else 0))
    return pd.DataFrame(rows)


def item_programs(case: Case) -> np.ndarray:
    """(S, blocks) array: the program that takes the first N share of each live block (items are
    numbered slot by slot, block by block; program pid takes items pid, pid + programs, ...), -1 for
    blocks that are no work item at all."""
    plan = launch_plan(case)
    w = work_items(case)
    S, nb = case.align.expert_ids.shape
    split, nprog = plan["split_n"], plan["programs"]
    out = np.full((S, nb), -1, dtype=np.int64)
    first = 0
    for r in w.itertuples():
        if r.items:
            for b in range(r.busy_blocks):
                out[r.slot, b] = (first + b * split) % nprog
        first += r.items
    return out


def run_delta(case: Case, *, adapter_enabled: torch.Tensor | None = None, exit_codes: torch.Tensor | None = None):
    """out0 + delta through the Triton kernel (out0 is left alone; returns the new tensor)."""
    out = case.out0.clone()
    en = case.adapter_enabled if adapter_enabled is None else adapter_enabled
    lora_delta(case.x, case.lora_a, case.lora_b, case.align, case.lora_ids, en, case.top_k, out,
                          exit_codes=exit_codes)
    return out


def run_exit_map(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch once in exit-code mode (every block gets a program). Returns (codes, out); the code
    buffer is poisoned with -7 first, so a program that never wrote its code shows up."""
    S, nb = case.align.expert_ids.shape
    codes = torch.full((S, nb), exits.NEVER_WRITTEN, dtype=torch.int32, device=case.x.device)
    out = run_delta(case, exit_codes=codes)
    return codes, out


def host_exit_codes(align: Alignment, lora_ids, adapter_enabled) -> np.ndarray:
    """The exit code each program should write (the rule of ops/reference.py:exit_codes), as numpy."""
    dev = align.expert_ids.device
    as_t = lambda v: v.to(dev) if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=torch.int32, device=dev)
    return exit_codes(align, as_t(lora_ids), as_t(adapter_enabled)).cpu().numpy()


def exit_summary(codes) -> pd.DataFrame:
    """Programs per slot and exit code (one column per code, in code order)."""
    c = np.asarray(codes.cpu() if isinstance(codes, torch.Tensor) else codes)
    rows = []
    for s in range(c.shape[0]):
        row = {"slot": s}
        for code, name in EXIT_SHORT.items():
            row[name] = int((c[s] == code).sum())
        rows.append(row)
    return pd.DataFrame(rows)


def check_against_reference(case: Case, out: torch.Tensor, tol: float) -> dict:
    """delta = out - out0 against the float64 reference on the rows that use an enabled adapter;
    every other row must be bit-identical to out0 (the kernel must not have touched it). Rows of a
    busy block whose expert id is -1 count as not live (the kernel skips them by design)."""
    ref = ref_lora_delta(case.x.cpu(), case.lora_a.cpu(), case.lora_b.cpu(), case.topk_ids.cpu(),
                         case.token_slot.cpu(), case.lora_ids.cpu(), case.adapter_enabled.cpu(), case.top_k)
    k = case.top_k
    slot = case.token_slot.cpu().long().repeat_interleave(k)
    sc = slot.clamp(min=0)
    live = (slot >= 0) & (case.lora_ids.cpu().long()[sc] >= 0) & (case.adapter_enabled.cpu().long()[sc] != 0)
    # pairs in a busy block whose expert id is -1 (exit 4: e.g. the expert lives on another rank)
    st, ei = case.align.sorted_token_ids.cpu(), case.align.expert_ids.cpu()
    ntpp, bm = case.align.num_tokens_post_padded.cpu(), case.align.block_m
    for s, b in zip(*torch.nonzero(ei == -1, as_tuple=True)):
        if b * bm < ntpp[s]:
            p = st[s, b * bm:(b + 1) * bm].long()
            live[p[p < live.numel()]] = False
    o, o0 = out.cpu(), case.out0.cpu()
    untouched = bool(torch.equal(o[~live], o0[~live]))
    err = float("nan")
    if live.any():
        got = o[live].double() - o0[live].double()
        err = float((got - ref[live]).norm() / ref[live].norm().clamp_min(1e-300))
    return dict(live_pairs=int(live.sum()), other_pairs=int((~live).sum()), rel_err=err, tol=tol,
                other_rows_untouched=untouched, ok=untouched and (not live.any() or err < tol))


# ------------------------------------------------------------------------------------------------
# What an all-disabled launch costs
# ------------------------------------------------------------------------------------------------
def recorded_disabled_launches(data_dir: Path | str | None = None) -> tuple[pd.DataFrame | None, dict]:
    """The figures written by studies/kernels/record.py (data/kernels): an all-disabled gate_up LoRA
    launch vs an empty Triton kernel, CUDA-graph replay, per preset and M, with the enabled launch's
    time beside it. `kernels.csv` is the current kernel (grid "current"); files named
    `earlier_<commit>_kernels.csv` are older kernels (grid "earlier <commit>"). Returns (rows, the
    current run's metadata) or (None, {})."""
    d = Path(data_dir) if data_dir is not None else catalog("kernels.folder")
    frames = []
    for p in sorted(glob.glob(str(d / "*kernels.csv"))):
        name = Path(p).name
        df = schemas.read_csv(p, "kernel_recording")  # its seal and schema: RecordingError naming it
        if "section" not in df.columns:
            continue
        dis = df[df["section"] == "disabled"]
        if not len(dis):
            continue
        grid = "current" if name == "kernels.csv" else "earlier " + name.replace("earlier_", "").replace(
            "_kernels.csv", "")
        cols = [c for c in ("preset", "M", "config", "programs", "time_us", "empty_kernel_us", "ratio") if c in dis]
        out = dis[cols].rename(columns={"time_us": "all_disabled_us"}).drop_duplicates(["preset", "M"], keep="last")
        work = df[df["section"] == "lora_gate_up"]
        if len(work):
            work = work[["preset", "M", "time_us"]].drop_duplicates(["preset", "M"], keep="last")
            out = out.merge(work.rename(columns={"time_us": "enabled_us"}), on=["preset", "M"], how="left")
        frames.append(out.assign(kernel=grid, file=name))
    meta = {}
    mp = d / "kernels.meta.json"
    if mp.exists():
        meta = schemas.read_json(mp)  # a damaged metadata file is an error naming it, not an empty label
    meta = normalize_meta(meta)
    if not frames:
        return None, meta
    return pd.concat(frames, ignore_index=True), meta


def launch_costs(case: Case, *, inner: int = 32, reps: int = 20, warmup: int = 3) -> pd.DataFrame:
    """Live on a GPU: device time per call from CUDA-graph replays of `inner` back-to-back calls
    (median over `reps` replays, device events), and the host's cost to issue one call in eager
    mode (perf_counter around `inner` launches, no sync inside). Rows: no launch, an empty Triton
    kernel, the LoRA kernel with every adapter disabled, the same kernel doing its work."""
    if not runtime.has_cuda():
        raise RuntimeError("launch_costs needs a CUDA GPU (device events and graph replay)")
    off = torch.zeros_like(case.adapter_enabled)
    on = torch.ones_like(case.adapter_enabled)
    out = case.out0.clone()
    dummy = torch.zeros(1, device=case.x.device)
    empty = empty_kernel

    def lora(en):
        return lambda: lora_delta(case.x, case.lora_a, case.lora_b, case.align, case.lora_ids, en,
                                             case.top_k, out)

    calls = {"empty Triton kernel": lambda: empty[(1,)](dummy), "LoRA kernel, all adapters disabled": lora(off),
             "LoRA kernel, adapters enabled (the work)": lora(on)}
    rows = [dict(what="no launch (host flag says: skip)", device_us_per_call=0.0, host_issue_us_per_call=0.0)]
    for name, fn in calls.items():
        def many(fn=fn):
            for _ in range(inner):
                fn()
        t = time_graph(many, warmup=warmup, reps=reps)
        runtime.synchronize()
        fn()
        runtime.synchronize()
        host = []
        for _ in range(max(3, reps // 4)):
            runtime.synchronize()
            t0 = time.perf_counter()
            many()
            host.append((time.perf_counter() - t0) * 1e6 / inner)
            runtime.synchronize()
        rows.append(dict(what=name, device_us_per_call=t.median_us / inner,
                         host_issue_us_per_call=float(np.median(host))))
    return pd.DataFrame(rows)
