"""The kernel plan's tables (kernels/plan.py asks them): one JSON file per device beside the tile tables,

    lora_moe_lab/kernels/tile_tables/lora_plan_<GPU>.json     e.g. lora_plan_NVIDIA_H200.json
    lora_moe_lab/kernels/tile_tables/lora_plan_default.json   any other device, the CPU and the interpreter

the GPU named as kernels/tiles.py names it. A file holds the decode bound ((token, k) pairs up to which a separate
delta runs without alignment), named option sets, per op ("gate_up", "down") and token bucket (M rounded up to a
power of two, every bucket listed) an entry: the path ("separate", "packed" or "wide") and its options (per_slot,
shrink, wide_shrink, expand, window), and per layer shape (H<hidden>_I<intermediate>) the entries' fields that
differ. Each entry names the recordings that decided it (`decided_by`, studies/kernels/README.md) and what they
measured (`why`). Read and checked once per process; `override` swaps the table (recordings, tests). The former
module-level tables of kernels/configs.py are derived from here (`legacy`)."""
from __future__ import annotations

import contextlib
import functools
import json
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from .. import runtime
from . import tiles

TABLE_DIR = tiles.TABLE_DIR
OPS = ("gate_up", "down")
PATHS = ("separate", "packed", "wide")
BUCKETS = tuple(2 ** i for i in range(15))  # every token bucket (configs.token_bucket caps at 16384)
ENTRY_KEYS = frozenset({"path", "per_slot", "shrink", "wide_shrink", "expand", "window", "decided_by", "why"})


def file_name(gpu: str) -> str:
    return f"lora_plan_{gpu.replace(' ', '_')}.json"


DEFAULT_FILE = "lora_plan_default.json"


class Options(tuple):
    """A kernel's keyword options, frozen (hashable): (name, value) pairs, nested dicts as Options too."""

    @classmethod
    def of(cls, d: dict | None) -> "Options":
        return cls(sorted((k, cls.of(v) if isinstance(v, dict) else v) for k, v in (d or {}).items()))

    def dict(self) -> dict:
        """A fresh dict (nested ones too): the caller may change it."""
        return {k: v.dict() if isinstance(v, Options) else v for k, v in self}


@dataclass(frozen=True)
class Entry:
    """One table entry: an op's path at one token bucket (the file's fields, option names resolved)."""

    path: str = "separate"
    per_slot: bool = False
    shrink: Options = Options()
    wide_shrink: Options | None = None  # None: the same as shrink
    expand: Options = Options()
    window: bool = False
    decided_by: tuple = ()
    why: str = ""

    @property
    def folds(self) -> bool:
        return self.path in ("packed", "wide")


@dataclass(frozen=True, eq=False)
class PlanTable:
    """A device's plan, read and checked (`load`): per op {bucket: Entry}, per layer shape (hidden, intermediate)
    {op: {bucket: the file's fields that differ}}, the decode bound in (token, k) pairs."""

    gpu: str
    decode_max_pairs: int
    ops: dict
    shapes: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)  # named option sets: {name: Options}
    source: str = ""

    def entry(self, op: str, bucket: int, hidden: int | None = None, intermediate: int | None = None) -> Entry:
        """The op's entry at this bucket, with the layer shape's changes (field by field; shrink, expand key by
        key) where it has some."""
        e = self.ops[op][bucket]
        over = self.shapes.get((hidden, intermediate), {}).get(op, {}).get(bucket)
        return _merge(e, over) if over else e

    def but(self, **changes) -> "PlanTable":
        """A copy with fields replaced (tests, recordings: e.g. decode_max_pairs=0, ops={...})."""
        return replace(self, **changes)


def _merge(e: Entry, over: dict) -> Entry:
    kw = {}
    for k, v in over.items():
        if k in ("shrink", "wide_shrink", "expand"):
            base = getattr(e, k)
            kw[k] = Options.of({**(base.dict() if base is not None else {}), **v.dict()})
        elif k == "decided_by":
            kw[k] = tuple(dict.fromkeys(e.decided_by + tuple(v)))
        elif k == "why":
            kw[k] = f"{e.why}; {v}" if e.why else v
        else:
            kw[k] = v
    return replace(e, **kw)


def entries(path: str = "separate", buckets=BUCKETS, **fields) -> dict:
    """{bucket: Entry(path, **fields)} over these buckets (tests and recordings build tables with it)."""
    e = Entry(path, **{k: Options.of(v) if isinstance(v, dict) else v for k, v in fields.items()})
    return {b: e for b in buckets}


# --------------------------------------------------------------------------------------------
# Reading a table
# --------------------------------------------------------------------------------------------
def _bucket(b: str, where: str) -> int:
    if not (b.isdigit() and int(b) in BUCKETS):
        raise ValueError(f"{where}: bucket {b!r} is not a token bucket (a power of two from 1 to {BUCKETS[-1]})")
    return int(b)


def _entry_fields(raw: dict, op: str, where: str, options: dict, partial: bool) -> dict:
    if not isinstance(raw, dict) or set(raw) - ENTRY_KEYS:
        raise ValueError(f"{where}: an entry holds only {sorted(ENTRY_KEYS)}, got {raw!r}")
    if not partial and "path" not in raw:
        raise ValueError(f"{where}: missing key 'path'")
    out = {}
    for k, v in raw.items():
        if k == "path":
            if v not in PATHS:
                raise ValueError(f"{where}: path must be one of {PATHS}, got {v!r}")
        elif k in ("per_slot", "window"):
            if not isinstance(v, bool):
                raise ValueError(f"{where}: {k} must be true or false, got {v!r}")
            if k == "window" and v and op != "down":
                raise ValueError(f"{where}: window is the down GEMM's wide build's")
        elif k in ("shrink", "wide_shrink", "expand"):
            if isinstance(v, str):
                if v not in options:
                    raise ValueError(f"{where}: {k} names option set {v!r}; the file has {sorted(options)}")
                v = options[v]
            elif isinstance(v, dict):
                v = Options.of(v)
            else:
                raise ValueError(f"{where}: {k} must be an option set's name or a dict of options, got {v!r}")
        elif k == "decided_by":
            if not (isinstance(v, list) and all(isinstance(s, str) for s in v)):
                raise ValueError(f"{where}: decided_by must be a list of recording labels, got {v!r}")
            v = tuple(v)
        elif k == "why" and not isinstance(v, str):
            raise ValueError(f"{where}: why must be a string, got {v!r}")
        out[k] = v
    if not partial and out["path"] == "separate" and any(out.get(k) for k in ("per_slot", "shrink", "wide_shrink",
                                                                              "expand", "window")):
        raise ValueError(f"{where}: a separate entry takes no fold options, got {raw!r}")
    return out


def check_table(raw: dict, where: str = "lora plan") -> PlanTable:
    """A file's structure, checked when it is read: a malformed file is an error that names the file, the op and
    the bucket, never a silently wrong path. Every op lists every token bucket."""
    for key in ("gpu", "decode", "ops"):
        if key not in raw:
            raise ValueError(f"{where}: missing key {key!r}")
    mp = raw["decode"].get("max_pairs") if isinstance(raw["decode"], dict) else None
    if not isinstance(mp, int) or isinstance(mp, bool) or mp < 0:
        raise ValueError(f"{where}: decode.max_pairs must be an int >= 0 ((token, k) pairs), got {mp!r}")
    options = {}
    for name, o in raw.get("options", {}).items():
        if not isinstance(o, dict) or not isinstance(o.get("options"), dict):
            raise ValueError(f"{where}: option set {name!r} must hold a dict 'options', got {o!r}")
        options[name] = Options.of(o["options"])
    if set(raw["ops"]) != set(OPS):
        raise ValueError(f"{where}: ops must be exactly {OPS}, got {sorted(raw['ops'])}")
    ops = {}
    for op in OPS:
        got = {_bucket(b, f"{where}: {op}"): Entry(**_entry_fields(e, op, f"{where}: {op} bucket {b}", options, False))
               for b, e in raw["ops"][op].items()}
        missing = sorted(set(BUCKETS) - set(got))
        if missing:
            raise ValueError(f"{where}: {op} lacks the buckets {missing} (every token bucket has an entry)")
        ops[op] = got
    shapes = {}
    for key, per_op in raw.get("shapes", {}).items():
        h, _, i = key.partition("_I")
        if not (h.startswith("H") and h[1:].isdigit() and i.isdigit()):
            raise ValueError(f"{where}: shape {key!r} must be named H<hidden>_I<intermediate>")
        if set(per_op) - set(OPS):
            raise ValueError(f"{where}: shape {key}: ops must be among {OPS}, got {sorted(per_op)}")
        shapes[(int(h[1:]), int(i))] = {
            op: {_bucket(b, f"{where}: {key} {op}"): _entry_fields(e, op, f"{where}: {key} {op} bucket {b}", options,
                                                                   True)
                 for b, e in buckets.items()} for op, buckets in per_op.items()}
    return PlanTable(raw["gpu"], mp, ops, shapes, options, where)


@functools.lru_cache(maxsize=8)
def load(gpu: str | None) -> PlanTable:
    """The plan of this GPU (its name as the driver gives it; None: no GPU), read and checked once per process:
    its own file, else the default file (which names the GPU whose plan it follows)."""
    f = TABLE_DIR / file_name(gpu) if gpu else None
    if f is None or not f.exists():
        f = TABLE_DIR / DEFAULT_FILE
        raw = json.loads(f.read_text())
        if "follows" in raw:
            return replace(load(raw["follows"]), gpu="default", source=f"{f} -> {raw['follows']}")
    return check_table(json.loads(f.read_text()), str(f))


_OVERRIDE: list = []


@contextlib.contextmanager
def override(table: PlanTable):
    """Every plan inside the block reads `table`, on every device (a recording's arms, tests)."""
    _OVERRIDE.append(table)
    try:
        yield table
    finally:
        _OVERRIDE.pop()


@functools.lru_cache(maxsize=16)
def _cuda_name(index: int) -> str:
    import torch

    return torch.cuda.get_device_name(index)


def gpu_of(device=None) -> str | None:
    """The GPU's name for a device (host metadata: no device work); None on the CPU and under the interpreter.
    device None: this process's current GPU (kernels/tiles.py: gpu_name)."""
    if runtime.interpreter():
        return None
    if device is None:
        return tiles.gpu_name()
    import torch

    d = torch.device(device)
    if d.type != "cuda":
        return None
    return _cuda_name(d.index if d.index is not None else torch.cuda.current_device())


def table_for(device=None) -> PlanTable:
    """The plan table a device reads (`override`'s inside one)."""
    return _OVERRIDE[-1] if _OVERRIDE else load(gpu_of(device))


def gemm_shape(op: str, shape) -> tuple[int, int]:
    """(N, K) of the op's GEMM: gate_up (2 * intermediate, hidden), down (hidden, intermediate)."""
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    H, I = shape.hidden, shape.intermediate
    return (2 * I, H) if op == "gate_up" else (H, I)


# --------------------------------------------------------------------------------------------
# The former tables' names, derived from the plan (kernels/configs.py exports them for old callers)
# --------------------------------------------------------------------------------------------
def _all_entries(t: PlanTable):
    """(op, bucket, shape or None, Entry) for every op entry and every shape's merged one."""
    for op in OPS:
        for b, e in t.ops[op].items():
            yield op, b, None, e
    for (h, i), per_op in t.shapes.items():
        for op, bs in per_op.items():
            for b in bs:
                yield op, b, (h, i), t.entry(op, b, h, i)


def legacy(name: str, device=None):
    """The value the old module-level table `name` held, derived from the device's plan (a fresh copy)."""
    t = table_for(device)
    folds = {op: frozenset(b for b, e in t.ops[op].items() if e.folds) for op in OPS}
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
            if sh and e.folds and b not in folds[op]:
                out.setdefault((op, *gemm_shape(op, _Shape(*sh))), set()).add(b)
        return {key: frozenset(v) for key, v in out.items()}
    if name == "FOLDED_ORDER_BY_ROW":
        return True
    if name == "FOLD_BUILD":
        return "packed"
    if name == "PACKED_PER_SLOT_TOKENS":
        return frozenset(b for _, b, _, e in every if e.folds and e.per_slot)
    if name in t.options:  # W1S
        return t.options[name].dict()
    if name == "WIDE_GATE_UP_SHRINK":
        return next((e.wide_shrink.dict() for op, _, _, e in every if op == "gate_up" and e.path == "wide"
                     and e.wide_shrink is not None), {})
    if name == "PACKED_SHRINK_TOKENS":
        return {b: e.shrink.dict() for _, b, _, e in sorted(every, key=lambda r: r[1]) if e.folds and e.shrink}
    if name == "PACKED_EXPAND_TOKENS":
        return {b: {k: v for k, v in e.expand.dict().items() if k != "tile"} for _, b, sh, e in every
                if e.folds and sh is None and e.expand}
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
    raise AttributeError(name)


class _Shape(NamedTuple):
    hidden: int
    intermediate: int


LEGACY_TABLES = ("DECODE_MAX_PAIRS", "FUSED_LORA_TOKENS", "FOLDED_LORA_TOKENS", "FOLDED_LORA_SHAPE_TOKENS",
                 "FOLDED_ORDER_BY_ROW", "FOLD_BUILD", "PACKED_PER_SLOT_TOKENS", "W1S", "WIDE_GATE_UP_SHRINK",
                 "PACKED_SHRINK_TOKENS", "PACKED_EXPAND_TOKENS", "PACKED_TILE_SHAPE_TOKENS", "WIDE_DOWN_TOKENS",
                 "WIDE_GATE_UP_TOKENS", "WIDE_DOWN_WINDOW_TOKENS")
