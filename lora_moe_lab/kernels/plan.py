"""The MoE layer's kernel plan: for one op ("gate_up" or "down") of one batch size, which LoRA path runs and with
which options, and the alignment's block sizes. One question, `plan(op, M, shape, device)`, answered from static
shapes only (never a device read: capture-safe) and from data: the device's table (kernels/plan_table.py:
kernels/tile_tables/lora_plan_<GPU>.json, else the closest recorded GPU's, or lora_plan_default.json without a GPU),
each entry naming the recordings that decided it. Each path the plan can return is one module of kernels/paths/
(its rule, weights, launches, warm-up and exits): an entry names a path, and that path's `rule` makes the op's plan
(it may hand over: separate to decode at decode sizes, wide to packed where the wide build cannot run).

Only a layer's first hook runs a path inside the base GEMM (`first`, the path's `in_gemm`); such an entry of another
hook runs separate. The torch backend has no in-GEMM kernels: its plan is always separate, its blocks sized by its
own rule. `override(table)` swaps the table (recordings, tests)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from . import configs
from .plan_table import (BUCKETS, DEFAULT_FILE, OPS, TABLE_DIR, Entry, Options, PlanTable, check_table,  # noqa: F401
                         entries, file_name, gemm_shape, load, override, table_for)


class LoRADims(NamedTuple):
    """The static LoRA shapes a plan reads: weight slots S, the padded rank R, LoRA rows L of the batch
    (lora_ids' length: S for the pool's batches, fewer for a compacted one)."""

    slots: int
    rank: int
    rows: int


@dataclass(frozen=True)
class LoRAPlan:
    """One op's plan. path: "none" (no LoRA work: the base GEMM alone), "decode", "separate", "packed" or "wide".
    block_m: the base GEMM's alignment (both ops of a layer share it); order_by_row: that alignment ordered by LoRA
    row (`moe_align(order_by=)`), the packed expand one dot per slot; lora_block_m, config: the separate path's
    alignment and launch config (None: the kernel's own); shrink, expand: `moe_gemm_lora_packed`'s and
    `moe_gemm_lora_wide`'s options; window: the wide down GEMM's columns per tile (0: all); columns: the columns past
    K the op's input rows carry for the wide build (gate_up: top_k tails per token row, down: one per pair row)."""

    op: str
    path: str
    block_m: int
    order_by_row: bool = False
    lora_block_m: int = 0
    config: configs.LoRAKernelConfig | None = None
    shrink: Options = Options()
    expand: Options = Options()
    window: int = 0
    columns: int = 0
    decided_by: tuple = ()

    @property
    def in_gemm(self) -> bool:
        """The delta runs inside the base GEMM (no separate kernels, no LoRA alignment): the path's `in_gemm`."""
        from .paths import get
        return get(self.path).in_gemm

    @property
    def shrink_options(self) -> dict:
        return self.shrink.dict()

    @property
    def expand_options(self) -> dict:
        return self.expand.dict()


# --------------------------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------------------------
def torch_block_m(num_tokens: int, top_k: int, num_experts: int) -> int:
    """The torch backend's rows per block: small blocks when few pairs land on each expert (decode), larger in
    prefill. There BLOCK_M only sets how many rows one batched matmul takes (the results do not depend on it); the
    Triton tiles answer 16 under the interpreter, which would make CPU runs of the torch backend slower for
    nothing."""
    per_expert = num_tokens * top_k / num_experts
    return 16 if per_expert <= 16 else 32 if per_expert <= 64 else 64


def plan(op: str, M: int, shape, device=None, *, lora: LoRADims | None = None, backend: str = "triton",
         first: bool = True, alone: bool = True) -> LoRAPlan:
    """Op `op` of a layer of `shape` (config.MoEShape) at M tokens on `device`: its LoRA path and options.
    lora: the hook's static LoRA shapes (None: no LoRA work, the plan gives the alignment only); backend: the
    backend's name; first: the layer's first hook (only it may run its delta inside the base GEMM); alone: it is
    the layer's only hook (the wide builds need that). Static shapes only: capture-safe."""
    gemm_shape(op, shape)  # the op's check
    k, E, H, I = shape.top_k, shape.num_experts, shape.hidden, shape.intermediate
    if backend == "torch":
        bm = torch_block_m(M, k, E)
        return LoRAPlan(op, "none", bm) if lora is None else LoRAPlan(op, "separate", bm, lora_block_m=bm)
    bm = configs.moe_block_m(M, k, E, H, I)
    if lora is None:
        return LoRAPlan(op, "none", bm)
    from . import paths  # every path module, registered (kernels/paths/)
    table = table_for(device)
    e = table.entry(op, configs.token_bucket(M), H, I)
    path = paths.get(e.path)
    if path.in_gemm and not first:
        path = paths.get("separate")
    return path.rule(paths.Question(op, M, shape, e, lora, table, bm, alone))
