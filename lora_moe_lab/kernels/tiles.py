"""Tuned tile tables of the base MoE GEMM: data, one JSON file per GPU and layer shape.

    lora_moe_lab/kernels/tile_tables/<GPU>_E<experts>_H<hidden>_I<intermediate>.json
    e.g. NVIDIA_H200_E128_H2048_I768.json (qwen3-30b-a3b), NVIDIA_H200_E128_H2048_I192.json (its TP=4 shard)

Each file is written by `studies/kernels/record_base.py` from its sweep (the sweep's CSV sits in
data/kernels/ beside the file's copy) and holds, per token bucket (M rounded up to a power of two):
the BLOCK_M of the alignment, which gate_up and down share, and each GEMM's tile. A bucket that
was not swept takes the largest swept bucket below it. No file for this GPU or shape: the rules
in kernels/configs.py (`rule_block_m`, `rule_gemm_config`) decide, as on any other GPU.

The GPU's name is read once per process from the driver (host metadata, no device work), so a
lookup never syncs and is safe under CUDA-graph capture.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

TABLE_DIR = Path(__file__).with_name("tile_tables")
GEMM_KEYS = ("block_n", "block_k", "group_m", "num_warps", "num_stages")
# absent = off (kernels/configs.py: GemmConfig)
OPTIONAL_KEYS = ("w_desc", "persistent", "flatten", "max_regs", "early_loads", "sub_m")


def file_name(gpu: str, num_experts: int, hidden: int, intermediate: int) -> str:
    return f"{gpu.replace(' ', '_')}_E{num_experts}_H{hidden}_I{intermediate}.json"


@functools.lru_cache(maxsize=1)
def gpu_name() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(torch.cuda.current_device())


def check_table(table: dict, where: str = "tile table") -> dict:
    """A table's structure, checked when it is read: a malformed file is an error that names the
    file and the bucket, never a silently wrong tile."""
    for key in ("gpu", "num_experts", "hidden", "intermediate", "buckets"):
        if key not in table:
            raise ValueError(f"{where}: missing key {key!r}")
    if not table["buckets"]:
        raise ValueError(f"{where}: no buckets")
    for b, e in table["buckets"].items():
        if not (b.isdigit() and int(b) & (int(b) - 1) == 0):
            raise ValueError(f"{where}: bucket {b!r} is not a power of two")
        if e.get("block_m") not in (16, 32, 64, 128):
            raise ValueError(f"{where}: bucket {b}: block_m must be 16, 32, 64 or 128, got {e.get('block_m')!r}")
        for op in ("gate_up", "down"):
            tile = e.get(op)
            if not isinstance(tile, dict) or set(tile) - set(OPTIONAL_KEYS) != set(GEMM_KEYS):
                raise ValueError(f"{where}: bucket {b}: {op} must hold exactly {GEMM_KEYS} (and optionally "
                                 f"{OPTIONAL_KEYS}), got {tile!r}")
            if any(not isinstance(tile[k], int) or tile[k] <= 0 for k in GEMM_KEYS):
                raise ValueError(f"{where}: bucket {b}: {op} values must be positive ints, got {tile}")
            for flag in ("w_desc", "flatten", "early_loads"):
                if not isinstance(tile.get(flag, False), bool):
                    raise ValueError(f"{where}: bucket {b}: {op} {flag} must be true or false, got {tile[flag]!r}")
            for key, what in (("persistent", "programs per SM"), ("max_regs", "registers per thread, 0 = no cap")):
                v = tile.get(key, 0)
                if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                    raise ValueError(f"{where}: bucket {b}: {op} {key} must be an int >= 0 ({what}), got {v!r}")
            sub = tile.get("sub_m", 0)
            if sub and (not isinstance(sub, int) or isinstance(sub, bool) or sub < 16 or e["block_m"] % sub):
                raise ValueError(f"{where}: bucket {b}: {op} sub_m (the kernel's rows of a block) must divide "
                                 f"block_m={e['block_m']} and be >= 16, got {sub!r}")
    return table


@functools.lru_cache(maxsize=1)
def _tables_of(gpu: str) -> tuple[dict, ...]:
    """Every table of this GPU, read and checked once per process."""
    prefix = gpu.replace(" ", "_") + "_E"
    return tuple(check_table(json.loads(f.read_text()), str(f))
                 for f in sorted(TABLE_DIR.glob(prefix + "*.json")))


def _entry(table: dict, bucket: int) -> dict:
    swept = sorted(int(b) for b in table["buckets"])
    below = [b for b in swept if b <= bucket]
    return table["buckets"][str(below[-1] if below else swept[0])]


def lookup(num_experts: int, hidden: int | None, intermediate: int | None, bucket: int,
           gpu: str | None = None) -> dict | None:
    """The table's entry (block_m, gate_up, down) for this layer shape and token bucket, or None; gpu: a GPU's
    name (the analysers read the H200's tables on any machine), else this machine's."""
    gpu = gpu or gpu_name()
    if gpu is None or hidden is None or intermediate is None:
        return None
    shape = (num_experts, hidden, intermediate)
    table = next((t for t in _tables_of(gpu) if (t["num_experts"], t["hidden"], t["intermediate"]) == shape), None)
    return _entry(table, bucket) if table else None


def gemm_tile(num_experts: int | None, N: int, K: int, bucket: int, block_m: int) -> dict | None:
    """The tuned tile of the GEMM (N, K) for this bucket when its table's BLOCK_M is `block_m` (the
    alignment's), else None: gate_up is (N, K) = (2 * intermediate, hidden), down (hidden, intermediate)."""
    gpu = gpu_name()
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
