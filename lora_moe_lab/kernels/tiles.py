"""Tuned tile tables of the base MoE GEMM: data, one JSON file per GPU and layer shape.

    lora_moe_lab/kernels/tile_tables/<GPU>_E<experts>_H<hidden>_I<intermediate>.json
    e.g. NVIDIA_H200_E128_H2048_I768.json (qwen3-30b-a3b), NVIDIA_H200_E128_H2048_I192.json (its TP=4 shard)

Each file is written by `studies/kernels/record_base.py` from its sweep (the sweep's CSV sits in
data/kernels/ beside the file's copy) and holds, per token bucket (M rounded up to a power of two):
the BLOCK_M of the alignment, which gate_up and down share, and each GEMM's tile. A bucket that
was not swept takes the largest swept bucket below it. A file's name says its GPU and shape, and its content must
say the same (a table for another shape under a GPU's name is an error, not a silent loss of the real shape's tiles).
A GPU without files of its own reads those of the GPU it follows (`source`, kernels/gpus.py), or the rules in
kernels/configs.py (`rule_block_m`, `rule_gemm_config`); so does a shape without a file.

The GPU's name is read once per process from the driver (host metadata, no device work), so a
lookup never syncs and is safe under CUDA-graph capture.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

from . import gpus
from .table_checks import TILE, TableError, check_fields

TABLE_DIR = Path(__file__).with_name("tile_tables")
GEMM_KEYS = ("block_n", "block_k", "group_m", "num_warps", "num_stages")
# absent = off (kernels/configs.py: GemmConfig)
OPTIONAL_KEYS = ("w_desc", "persistent", "flatten", "max_regs", "early_loads", "sub_m")
OTHER_TABLES = (gpus.GPUS_FILE.name, "rules.json")  # the GPUs (kernels/gpus.py), the rules (kernels/configs.py)


def file_name(gpu: str, num_experts: int, hidden: int, intermediate: int) -> str:
    return f"{gpu.replace(' ', '_')}_E{num_experts}_H{hidden}_I{intermediate}.json"


@functools.lru_cache(maxsize=1)
def gpu_name() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(torch.cuda.current_device())


def check_table(table: dict, where: str = "tile table") -> dict:
    """A table's structure and values, checked when it is read: a malformed file is a TableError that names the
    file and the bucket, never a silently wrong tile (the bounds: kernels/table_checks.py)."""
    for key in ("gpu", "num_experts", "hidden", "intermediate", "buckets"):
        if key not in table:
            raise TableError(where, "", f"missing key {key!r}")
    for key in ("num_experts", "hidden", "intermediate"):
        if not isinstance(table[key], int) or isinstance(table[key], bool) or not 0 < table[key] < 2 ** 20:
            raise TableError(where, key, f"must be a positive int, got {table[key]!r}")
    if not table["buckets"]:
        raise TableError(where, "buckets", "no buckets")
    for b, e in table["buckets"].items():
        if not (b.isdigit() and 0 < int(b) <= 2 ** 14 and int(b) & (int(b) - 1) == 0):
            raise TableError(where, f"bucket {b!r}", "not a power of two from 1 to 16384")
        if e.get("block_m") not in (16, 32, 64, 128):
            raise TableError(where, f"bucket {b}", f"block_m must be 16, 32, 64 or 128, got {e.get('block_m')!r}")
        for op in ("gate_up", "down"):
            tile = e.get(op)
            if not isinstance(tile, dict) or not set(GEMM_KEYS) <= set(tile):
                raise TableError(where, f"bucket {b} {op}", f"must hold {GEMM_KEYS} (and optionally "
                                                             f"{OPTIONAL_KEYS}), got {tile!r}")
            check_fields(tile, TILE, where, f"bucket {b} {op}", "tile")
            sub = tile.get("sub_m", 0)
            if sub and e["block_m"] % sub:
                raise TableError(where, f"bucket {b} {op}", f"sub_m (the kernel's rows of a block) must divide "
                                                             f"block_m={e['block_m']}, got {sub!r}")
    return table


def read(f: Path) -> dict:
    """One tile table file, checked, its name held against its content."""
    t = check_table(json.loads(f.read_text()), str(f))
    named = file_name(t["gpu"], t["num_experts"], t["hidden"], t["intermediate"])
    if f.name != named:
        raise TableError(f, "gpu, num_experts, hidden, intermediate",
                         f"the file holds the table of {t['gpu']!r} E{t['num_experts']} H{t['hidden']} "
                         f"I{t['intermediate']} ({named}), not the one its name says")
    return t


def table_files(table_dir: Path | None = None) -> list[Path]:
    """Every tile table file: the folder's JSON files but the LoRA plans, gpus.json, rules.json and the GPUs' own
    LoRA tile rules (rules_<GPU>.json)."""
    d = table_dir or TABLE_DIR
    return sorted(f for f in d.glob("*.json") if not f.name.startswith(("lora_plan_", "rules_"))
                  and f.name not in OTHER_TABLES)


@functools.lru_cache(maxsize=4)
def _recorded(table_dir: Path) -> frozenset:
    return frozenset(read(f)["gpu"] for f in table_files(table_dir))


def recorded_gpus() -> frozenset:
    """The GPUs with tile tables of their own."""
    return _recorded(TABLE_DIR)


@functools.lru_cache(maxsize=8)
def _source(gpu: str, table_dir: Path, props) -> tuple[str, str]:
    return gpus.base_gemm_follows(gpu, _recorded(table_dir), props)


def source(gpu: str, props: gpus.DeviceProps | None = None) -> tuple[str, str]:
    """(the GPU whose tile tables `gpu` reads, else gpus.RULE; why), said once per process where it is not `gpu`
    itself. props: the GPU's properties (None: the driver's, else gpus.json's)."""
    src, why = _source(gpu, TABLE_DIR, props)
    if src != gpu:
        gpus.say_once("tile table", gpu, src, why)
    return src, why


def _followed(gpu: str | None) -> str | None:
    """The GPU whose tables `gpu` reads (None: the rules)."""
    return None if gpu is None else _followed_in(gpu, TABLE_DIR)


@functools.lru_cache(maxsize=8)
def _followed_in(gpu: str, table_dir: Path) -> str | None:  # once per GPU and folder: the plan's hot path
    src = source(gpu)[0]
    return None if src == gpus.RULE else src


@functools.lru_cache(maxsize=1)
def _tables_of(gpu: str) -> tuple[dict, ...]:
    """Every table of this GPU, read and checked once per process."""
    prefix = gpu.replace(" ", "_") + "_E"
    return tuple(read(f) for f in sorted(TABLE_DIR.glob(prefix + "*.json")))


def _entry(table: dict, bucket: int) -> dict:
    swept = sorted(int(b) for b in table["buckets"])
    below = [b for b in swept if b <= bucket]
    return table["buckets"][str(below[-1] if below else swept[0])]


def lookup(num_experts: int, hidden: int | None, intermediate: int | None, bucket: int,
           gpu: str | None = None) -> dict | None:
    """The table's entry (block_m, gate_up, down) for this layer shape and token bucket, or None; gpu: a GPU's
    name, its own tables only (the analysers read the H200's on any machine), else this machine's GPU (the tables
    of the GPU it follows)."""
    gpu = gpu or _followed(gpu_name())
    if gpu is None or hidden is None or intermediate is None:
        return None
    shape = (num_experts, hidden, intermediate)
    table = next((t for t in _tables_of(gpu) if (t["num_experts"], t["hidden"], t["intermediate"]) == shape), None)
    return _entry(table, bucket) if table else None


def gemm_tile(num_experts: int | None, N: int, K: int, bucket: int, block_m: int) -> dict | None:
    """The tuned tile of the GEMM (N, K) for this bucket when its table's BLOCK_M is `block_m` (the
    alignment's), else None: gate_up is (N, K) = (2 * intermediate, hidden), down (hidden, intermediate). This
    machine's GPU reads the tables of the GPU it follows."""
    gpu = _followed(gpu_name())
    if gpu is None:
        return None
    for t in _tables_of(gpu):
        if num_experts is not None and t["num_experts"] != num_experts:
            continue
        op = ("gate_up" if (N, K) == (2 * t["intermediate"], t["hidden"]) else
              "down" if (N, K) == (t["hidden"], t["intermediate"]) else None)
        if op is None:
            continue
        e = _entry(t, bucket)
        if e["block_m"] == block_m:
            return dict(e[op])
    return None
