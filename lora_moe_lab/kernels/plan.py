"""The MoE layer's kernel plan: for one op ("gate_up" or "down") of one batch size, which LoRA path runs and with
which options, and the alignment's block sizes. One question, `plan(op, M, shape, device)`, answered from static
shapes only (never a device read: capture-safe) and from data: the device's table (kernels/plan_table.py:
kernels/tile_tables/lora_plan_<GPU>.json, else the closest recorded GPU's, or lora_plan_default.json without a GPU),
each entry naming the recordings that decided it. The paths:

    separate  the base GEMM, then the delta as its own kernels: without alignment (`decode`) up to the table's
              decode bound of (token, k) pairs, else over a per-adapter alignment (`lora_block_m`, `config`)
    packed    the packed shrink, then the base GEMM with the adapters' columns as extra K iterations
              (kernels/fused_moe_lora_packed.py: `moe_gemm_lora_packed`)
    wide      those columns in the GEMM's own x and w (`moe_gemm_lora_wide`); `columns` past K in the op's input rows

Only a layer's first hook runs a path inside the base GEMM (`fuse`), and the wide builds need it to be the only hook
(`alone`: they write the adapters' columns into the layer's buffers) and gate_up's to step its tile evenly over K;
elsewhere a wide entry runs packed. The torch backend has no fused kernels: its plan is always separate, its blocks
sized by its own rule. `override(table)` swaps the table (recordings, tests)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from . import configs
from .common import pow2
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
    def fused(self) -> bool:
        """The delta runs inside the base GEMM (no separate kernels, no LoRA alignment)."""
        return self.path in ("packed", "wide")

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


def wide_columns(op: str, lora: LoRADims) -> int:
    """C: the op's adapter columns per pair in the wide build (every slice's and slot's BLOCK_R side by side, the
    slots rounded up to a power of two; as kernels/fused_moe_lora_packed.py: wide_columns lays them)."""
    return (2 if op == "gate_up" else 1) * pow2(lora.slots) * configs.block_r(lora.rank)


def plan(op: str, M: int, shape, device=None, *, lora: LoRADims | None = None, backend: str = "triton",
         fuse: bool = True, alone: bool = True) -> LoRAPlan:
    """Op `op` of a layer of `shape` (config.MoEShape) at M tokens on `device`: its LoRA path and options.
    lora: the hook's static LoRA shapes (None: no LoRA work, the plan gives the alignment only); backend: the
    backend's name; fuse: the hook may run its delta inside the base GEMM (a layer's first hook only); alone: it is
    the layer's only hook (the wide builds need that). Static shapes only: capture-safe."""
    N, K = gemm_shape(op, shape)
    k, E, H, I = shape.top_k, shape.num_experts, shape.hidden, shape.intermediate
    if backend == "torch":
        bm = torch_block_m(M, k, E)
        return LoRAPlan(op, "none", bm) if lora is None else LoRAPlan(op, "separate", bm, lora_block_m=bm)
    bm = configs.moe_block_m(M, k, E, H, I)
    if lora is None:
        return LoRAPlan(op, "none", bm)
    table = table_for(device)
    b = configs.token_bucket(M)
    e = table.entry(op, b, H, I)
    if fuse and e.folds:
        path = e.path
        if path == "wide" and not alone:
            path = "packed"
        if path == "wide" and op == "gate_up" and K % configs.gemm_config(M, bm, N, K, E).block_k:
            path = "packed"  # its row pointers jump to each pair's tail between two K steps
        if path == "packed":
            return LoRAPlan(op, "packed", bm, e.per_slot, shrink=e.shrink, expand=e.expand, decided_by=e.decided_by)
        C = wide_columns(op, lora)
        if op == "gate_up":
            shrink = e.wide_shrink if e.wide_shrink is not None else e.shrink
            return LoRAPlan(op, "wide", bm, e.per_slot, shrink=shrink, columns=k * C, decided_by=e.decided_by)
        return LoRAPlan(op, "wide", bm, e.per_slot, shrink=e.shrink, window=_window(e, M, bm, N, K, E, C, lora.slots),
                        columns=C, decided_by=e.decided_by)
    if M * k <= table.decode_max_pairs:
        return LoRAPlan(op, "decode", bm)
    lbm = configs.lora_block_m(M, k, E, lora.rows)
    cfg = configs.lora_down_config(M, k, E, lora.rows, lbm, N, K) if op == "down" else None
    return LoRAPlan(op, "separate", bm, lora_block_m=lbm, config=cfg, decided_by=e.decided_by if not e.folds else ())


def _window(e: Entry, M, bm, N, K, E, C, slots) -> int:
    """The wide down GEMM's columns per tile: two slots' (2 * BLOCK_R) where the entry takes the window, the tile
    reads w through TMA and steps evenly over K and the window, and the window is narrower than all C; else 0."""
    br = C // pow2(slots)
    if not e.window or 2 * br >= C:
        return 0
    cfg = configs.gemm_config(M, bm, N, K, E)
    return 2 * br if cfg.w_desc and K % cfg.block_k == 0 and (2 * br) % cfg.block_k == 0 else 0
