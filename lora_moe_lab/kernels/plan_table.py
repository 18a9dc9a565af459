"""The kernel plan's tables (kernels/plan.py asks them): one JSON file per device beside the tile tables,

    lora_moe_lab/kernels/tile_tables/lora_plan_<GPU>.json     e.g. lora_plan_NVIDIA_H200.json
    lora_moe_lab/kernels/tile_tables/lora_plan_default.json   the CPU, the interpreter, a GPU of unknown properties

the GPU named as kernels/tiles.py names it. A file holds the decode bound ((token, k) pairs up to which a separate
delta runs without alignment), named option sets, per op ("gate_up", "down") and token bucket (M rounded up to a
power of two, every bucket listed) an entry: the path (a registered path's name, kernels/paths/: "separate",
"packed", "wide") and its options (per_slot, shrink, wide_shrink, expand, window), and per layer shape
(H<hidden>_I<intermediate>) the entries' fields that differ. Each entry names the recordings that decided it
(`decided_by`, studies/kernels/README.md) and what they measured (`why`). Read and checked once per process (the
bounds: kernels/table_checks.py); `override` swaps the table (recordings, tests). A file may instead name the GPU
whose plan it `follows` (lora_plan_default.json: the H200's); a GPU without a file follows the closest recorded GPU
(kernels/gpus.py)."""
from __future__ import annotations

import contextlib
import functools
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from .. import runtime
from . import gpus, table_checks, tiles
from .table_checks import TableError

TABLE_DIR = tiles.TABLE_DIR
OPS = ("gate_up", "down")


def table_paths() -> tuple:
    """The paths an entry may name: the registered paths' (kernels/paths/, each module registers its own)."""
    from . import paths  # every path module, each registering itself
    return paths.registry.table_paths()


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
    def in_gemm(self) -> bool:
        """The entry's path runs inside the base GEMM (kernels/paths/: the path's `in_gemm`)."""
        from .paths import get
        return get(self.path).in_gemm


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
TOP_KEYS = frozenset({"gpu", "about", "decode", "options", "ops", "shapes"})
FOLLOWS_KEYS = frozenset({"gpu", "about", "follows"})
OPTION_KINDS = {"shrink": table_checks.SHRINK, "wide_shrink": table_checks.SHRINK, "expand": table_checks.EXPAND}


def _bucket(b: str, file, entry: str) -> int:
    if not (b.isdigit() and int(b) in BUCKETS):
        raise TableError(file, entry, f"bucket {b!r} is not a token bucket (a power of two from 1 to {BUCKETS[-1]})")
    return int(b)


def _entry_fields(raw: dict, op: str, file, entry: str, options: dict, partial: bool) -> dict:
    if not isinstance(raw, dict) or set(raw) - ENTRY_KEYS:
        raise TableError(file, entry, f"an entry holds only {sorted(ENTRY_KEYS)}, got {raw!r}")
    if not partial and "path" not in raw:
        raise TableError(file, entry, "missing key 'path'")
    out = {}
    for k, v in raw.items():
        if k == "path":
            if v not in table_paths():
                raise TableError(file, entry, f"path must be one of {table_paths()}, got {v!r}")
        elif k in ("per_slot", "window"):
            if not isinstance(v, bool):
                raise TableError(file, entry, f"{k} must be true or false, got {v!r}")
            if k == "window" and v and op != "down":
                raise TableError(file, entry, "window is the down GEMM's wide build's")
        elif k in OPTION_KINDS:
            if isinstance(v, str):
                if v not in options:
                    raise TableError(file, entry, f"{k} names option set {v!r}; the file has {sorted(options)}")
                v = options[v]
            elif not isinstance(v, dict):
                raise TableError(file, entry, f"{k} must be an option set's name or a dict of options, got {v!r}")
            table_checks.check_fields(v.dict() if isinstance(v, Options) else v, OPTION_KINDS[k], file, entry, k)
            v = v if isinstance(v, Options) else Options.of(v)
        elif k == "decided_by":
            if not (isinstance(v, list) and all(isinstance(s, str) for s in v)):
                raise TableError(file, entry, f"decided_by must be a list of recording labels, got {v!r}")
            v = tuple(v)
        elif k == "why" and not isinstance(v, str):
            raise TableError(file, entry, f"why must be a string, got {v!r}")
        out[k] = v
    if not partial and out["path"] == "separate" and any(out.get(k) for k in ("per_slot", "shrink", "wide_shrink",
                                                                              "expand", "window")):
        raise TableError(file, entry, f"a separate entry takes no fold options, got {raw!r}")
    return out


def _option_set(name: str, o, file) -> Options:
    """A named option set: its options are the shrink's or the expand's (checked again where an entry names it)."""
    entry = f"option set {name!r}"
    if not isinstance(o, dict) or not isinstance(o.get("options"), dict) or set(o) - {"options", "decided_by", "why"}:
        raise TableError(file, entry, f"must hold a dict 'options' (and decided_by, why), got {o!r}")
    kinds = [k for k in ("shrink", "expand") if set(o["options"]) <= set(OPTION_KINDS[k])]
    if not kinds:
        raise TableError(file, entry, f"the options {sorted(o['options'])} are neither the shrink's "
                                      f"{sorted(table_checks.SHRINK)} nor the expand's {sorted(table_checks.EXPAND)}")
    table_checks.check_fields(o["options"], OPTION_KINDS[kinds[0]], file, entry, kinds[0])
    return Options.of(o["options"])


def check_table(raw: dict, where: str = "lora plan") -> PlanTable:
    """A file's structure and values, checked when it is read: a malformed file is a TableError that names the
    file, the op and the bucket, never a silently wrong path. Every op lists every token bucket."""
    if not isinstance(raw, dict):
        raise TableError(where, "", f"must be a JSON object, got {type(raw).__name__}")
    for key in ("gpu", "decode", "ops"):
        if key not in raw:
            raise TableError(where, "", f"missing key {key!r}")
    if set(raw) - TOP_KEYS:
        raise TableError(where, "", f"a plan holds only {sorted(TOP_KEYS)}, got {sorted(set(raw) - TOP_KEYS)} too")
    mp = raw["decode"].get("max_pairs") if isinstance(raw["decode"], dict) else None
    if not isinstance(mp, int) or isinstance(mp, bool) or not 0 <= mp <= 2 ** 20:
        raise TableError(where, "decode", f"decode.max_pairs must be an int from 0 to {2 ** 20} ((token, k) pairs), "
                                          f"got {mp!r}")
    options = {name: _option_set(name, o, where) for name, o in raw.get("options", {}).items()}
    if not isinstance(raw["ops"], dict) or set(raw["ops"]) != set(OPS):
        raise TableError(where, "ops", f"ops must be exactly {OPS}, got {sorted(raw['ops'])}")
    ops = {}
    for op in OPS:
        got = {_bucket(b, where, op): Entry(**_entry_fields(e, op, where, f"{op} bucket {b}", options, False))
               for b, e in raw["ops"][op].items()}
        missing = sorted(set(BUCKETS) - set(got))
        if missing:
            raise TableError(where, op, f"{op} lacks the buckets {missing} (every token bucket has an entry)")
        ops[op] = got
    shapes = {}
    for key, per_op in raw.get("shapes", {}).items():
        h, _, i = key.partition("_I")
        if not (h.startswith("H") and h[1:].isdigit() and i.isdigit() and int(h[1:]) > 0 and int(i) > 0):
            raise TableError(where, f"shape {key!r}", "a shape must be named H<hidden>_I<intermediate>")
        if not isinstance(per_op, dict) or set(per_op) - set(OPS):
            raise TableError(where, f"shape {key}", f"ops must be among {OPS}, got {per_op!r}")
        shapes[(int(h[1:]), int(i))] = {
            op: {_bucket(b, where, f"{key} {op}"): _entry_fields(e, op, where, f"{key} {op} bucket {b}", options, True)
                 for b, e in buckets.items()} for op, buckets in per_op.items()}
    return PlanTable(raw["gpu"], mp, ops, shapes, options, where)


def _read(f: Path) -> dict:
    """A plan file's JSON, its `gpu` held against its name (a plan, or a `follows`)."""
    if not f.exists():
        raise TableError(f, "", "no such plan file")
    raw = json.loads(f.read_text())
    gpu = raw.get("gpu") if isinstance(raw, dict) else None
    if not isinstance(gpu, str) or file_name(gpu) != f.name:
        raise TableError(f, "gpu", f"the file's gpu {gpu!r} is not the one its name says ({f.name} is "
                                   f"file_name(gpu) of the GPU it holds)")
    if "follows" in raw:
        if set(raw) - FOLLOWS_KEYS or not isinstance(raw["follows"], str):
            raise TableError(f, "follows", f"a file that follows another GPU's plan holds only "
                                           f"{sorted(FOLLOWS_KEYS)}, follows a GPU's name; got {raw!r}")
    return raw


def plan_gpus() -> frozenset:
    """The GPUs with a plan file of their own, one that holds a plan (not one that follows)."""
    return frozenset(r["gpu"] for r in (_read(f) for f in TABLE_DIR.glob("lora_plan_*.json"))
                     if "follows" not in r and r["gpu"] != "default")


def _resolve(f: Path) -> tuple[PlanTable, list]:
    """(the plan a file holds, or the plan of the GPU it follows through a chain of follows; the GPUs of that
    chain, the file's first)."""
    chain = []
    while True:
        raw = _read(f)
        chain.append(raw["gpu"])
        if "follows" not in raw:
            return check_table(raw, str(f)), chain
        target = TABLE_DIR / file_name(raw["follows"])
        if raw["follows"] in chain:
            raise TableError(f, "follows", f"a cycle of follows: {' -> '.join(chain + [raw['follows']])}")
        if not target.exists():
            raise TableError(f, "follows", f"follows {raw['follows']!r}, which has no plan file ({target.name}; "
                                           f"the GPUs with one: {sorted(plan_gpus())})")
        f = target


def _as(gpu: str, t: PlanTable, chain: list, why: str = "") -> PlanTable:
    if len(chain) == 1 and not why:
        return t
    via = " -> ".join(chain)
    return replace(t, gpu=gpu, source=f"{t.source} ({gpu} -> {via}{': ' + why if why else ''})"
                   if gpu != chain[0] else f"{t.source} ({via})")


@functools.lru_cache(maxsize=8)
def load(gpu: str | None, props: gpus.DeviceProps | None = None) -> PlanTable:
    """The plan of this GPU (its name as the driver gives it; None: no GPU), read and checked once per process:
    its own file (a plan, or the plan of the GPU it follows), else the closest recorded GPU's (kernels/gpus.py,
    from the GPU's properties: the driver's, gpus.json's, or `props`), said once; else (no GPU, or one whose
    properties are unknown) the default file's, which names the GPU whose plan it follows."""
    if gpu is not None and (TABLE_DIR / file_name(gpu)).exists():
        t, chain = _resolve(TABLE_DIR / file_name(gpu))
        if len(chain) > 1:
            gpus.say_once("LoRA plan", gpu, chain[-1], f"its plan file follows {' -> '.join(chain[1:])}")
        return _as(chain[0], t, chain)
    if gpu is None:
        t, chain = _resolve(TABLE_DIR / DEFAULT_FILE)
        return _as(chain[0], t, chain)
    props = props or gpus.props_of(gpu)
    src, why = (gpus.closest(props, plan_gpus(), same_arch=False) if props else (None, ""))
    if src is None:
        t, chain = _resolve(TABLE_DIR / DEFAULT_FILE)
        why = why or "its properties are unknown (not this machine's GPU, not in gpus.json)"
        why = f"{why}: the default plan"
    else:
        t, chain = _resolve(TABLE_DIR / file_name(src))
    gpus.say_once("LoRA plan", gpu, chain[-1], why)
    return _as(gpu, t, chain, why)


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
