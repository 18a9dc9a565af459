"""The LoRA plan (lora_moe_lab/kernels/plan_table.py) seen as the module-level tables the kernel recordings were
decided with (DECODE_MAX_PAIRS, FOLDED_LORA_TOKENS, W1S, ...: `TABLES`), for the studies that still speak of them.
The layer reads the plan itself; nothing here changes what it runs (a recording's arms: plan_table.override).

    legacy(name)             the table `name`, derived from the plan this device reads now (an override's inside one)
    PACKED_PER_SLOT_TOKENS   ... every name of TABLES as a constant: the H200's plan, the GPU they were recorded on
"""
from __future__ import annotations

from typing import NamedTuple

from lora_moe_lab.kernels import plan_table
from lora_moe_lab.kernels.configs import token_bucket
from lora_moe_lab.kernels.plan_table import OPS, PlanTable, gemm_shape, table_for

RECORDED_ON = "NVIDIA H200"


class _Shape(NamedTuple):
    hidden: int
    intermediate: int


def _all_entries(t: PlanTable):
    """(op, bucket, shape or None, Entry) for every op entry and every shape's merged one."""
    for op in OPS:
        for b, e in t.ops[op].items():
            yield op, b, None, e
    for (h, i), per_op in t.shapes.items():
        for op, bs in per_op.items():
            for b in bs:
                yield op, b, (h, i), t.entry(op, b, h, i)


def legacy(name: str, table: PlanTable | None = None):
    """The value the old module-level table `name` held, derived from `table` (None: the plan this device reads
    now), a fresh copy."""
    t = table or table_for()
    folds = {op: frozenset(b for b, e in t.ops[op].items() if e.in_gemm) for op in OPS}
    every = list(_all_entries(t))
    if name == "DECODE_MAX_PAIRS":
        return t.decode_max_pairs
    if name == "FUSED_LORA_TOKENS":  # the epilogue build: no entry takes it (studies/kernels/tried)
        return {op: frozenset() for op in OPS}
    if name == "FOLDED_LORA_TOKENS":
        return dict(folds)
    if name == "FOLDED_LORA_SHAPE_TOKENS":
        out = {}
        for op, b, sh, e in every:
            if sh and e.in_gemm and b not in folds[op]:
                out.setdefault((op, *gemm_shape(op, _Shape(*sh))), set()).add(b)
        return {key: frozenset(v) for key, v in out.items()}
    if name == "FOLDED_ORDER_BY_ROW":
        return True
    if name == "FOLD_BUILD":
        return "packed"
    if name == "PACKED_PER_SLOT_TOKENS":
        return frozenset(b for _, b, _, e in every if e.in_gemm and e.per_slot)
    if name in t.options:  # W1S
        return t.options[name].dict()
    if name == "WIDE_GATE_UP_SHRINK":
        return next((e.wide_shrink.dict() for op, _, _, e in every if op == "gate_up" and e.path == "wide"
                     and e.wide_shrink is not None), {})
    if name == "PACKED_SHRINK_TOKENS":
        return {b: e.shrink.dict() for _, b, _, e in sorted(every, key=lambda r: r[1]) if e.in_gemm and e.shrink}
    if name == "PACKED_EXPAND_TOKENS":
        return {b: {k: v for k, v in e.expand.dict().items() if k != "tile"} for _, b, sh, e in every
                if e.in_gemm and sh is None and e.expand}
    if name == "PACKED_TILE_SHAPE_TOKENS":
        out = {}
        for op, b, sh, e in every:
            tile = e.expand.dict().get("tile") if sh else None
            if tile:
                out.setdefault((op, *gemm_shape(op, _Shape(*sh))), {})[b] = tile
        return out
    if name == "WIDE_DOWN_TOKENS":
        return frozenset(b for b, e in t.ops["down"].items() if e.path == "wide")
    if name == "WIDE_GATE_UP_TOKENS":
        return frozenset(b for op, b, _, e in every if op == "gate_up" and e.path == "wide")
    if name == "WIDE_DOWN_WINDOW_TOKENS":
        return frozenset(b for op, b, _, e in every if op == "down" and e.path == "wide" and e.window)
    raise AttributeError(f"no plan table named {name!r}: {TABLES}")


TABLES = ("DECODE_MAX_PAIRS", "FUSED_LORA_TOKENS", "FOLDED_LORA_TOKENS", "FOLDED_LORA_SHAPE_TOKENS",
          "FOLDED_ORDER_BY_ROW", "FOLD_BUILD", "PACKED_PER_SLOT_TOKENS", "W1S", "WIDE_GATE_UP_SHRINK",
          "PACKED_SHRINK_TOKENS", "PACKED_EXPAND_TOKENS", "PACKED_TILE_SHAPE_TOKENS", "WIDE_DOWN_TOKENS",
          "WIDE_GATE_UP_TOKENS", "WIDE_DOWN_WINDOW_TOKENS")

_H200 = plan_table.load(RECORDED_ON)
DECODE_MAX_PAIRS = legacy("DECODE_MAX_PAIRS", _H200)
FUSED_LORA_TOKENS = legacy("FUSED_LORA_TOKENS", _H200)
FOLDED_LORA_TOKENS = legacy("FOLDED_LORA_TOKENS", _H200)
FOLDED_LORA_SHAPE_TOKENS = legacy("FOLDED_LORA_SHAPE_TOKENS", _H200)
FOLDED_ORDER_BY_ROW = legacy("FOLDED_ORDER_BY_ROW", _H200)
FOLD_BUILD = legacy("FOLD_BUILD", _H200)
PACKED_PER_SLOT_TOKENS = legacy("PACKED_PER_SLOT_TOKENS", _H200)
W1S = legacy("W1S", _H200)
WIDE_GATE_UP_SHRINK = legacy("WIDE_GATE_UP_SHRINK", _H200)
PACKED_SHRINK_TOKENS = legacy("PACKED_SHRINK_TOKENS", _H200)
PACKED_EXPAND_TOKENS = legacy("PACKED_EXPAND_TOKENS", _H200)
PACKED_TILE_SHAPE_TOKENS = legacy("PACKED_TILE_SHAPE_TOKENS", _H200)
WIDE_DOWN_TOKENS = legacy("WIDE_DOWN_TOKENS", _H200)
WIDE_GATE_UP_TOKENS = legacy("WIDE_GATE_UP_TOKENS", _H200)
WIDE_DOWN_WINDOW_TOKENS = legacy("WIDE_DOWN_WINDOW_TOKENS", _H200)


def use_decode_path(num_tokens: int, top_k: int) -> bool:
    """Whether a separate delta runs without alignment at this size (the plan's decode bound, this device's)."""
    return num_tokens * top_k <= table_for().decode_max_pairs


def packed_shrink(num_tokens: int) -> dict:
    """The packed shrink's options at this token count where an op folds (this device's plan)."""
    return dict(legacy("PACKED_SHRINK_TOKENS").get(token_bucket(num_tokens), {}))


def packed_expand(num_tokens: int, op: str | None = None, N: int | None = None, K: int | None = None) -> dict:
    """The packed GEMM's expand options at this token count, with its tile for the GEMM shape (op, N, K)."""
    b = token_bucket(num_tokens)
    opts = dict(legacy("PACKED_EXPAND_TOKENS").get(b, {}))
    tile = legacy("PACKED_TILE_SHAPE_TOKENS").get((op, N, K), {}).get(b)
    if tile:
        opts["tile"] = dict(tile)
    return opts


def folded_order_by_row(num_tokens: int) -> bool:
    """Where an op folds: whether the layer orders its alignment by LoRA row at this token count."""
    return token_bucket(num_tokens) in legacy("PACKED_PER_SLOT_TOKENS")
