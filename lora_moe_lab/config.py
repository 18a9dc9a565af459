"""Model shape presets and validation. Weights are random and seeded: nothing is downloaded."""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace

import torch

from . import runtime


@dataclass(frozen=True)
class MoEShape:
    """Shapes of one MoE block (per tensor-parallel rank) and how many layers the model has."""

    name: str
    hidden: int  # K: model hidden size
    intermediate: int  # I: expert intermediate size (per rank under TP)
    num_experts: int  # E
    top_k: int
    num_layers: int
    # Attention of the decoder model (model/decoder.py); the MoE-only model ignores these.
    num_heads: int = 4  # query heads (per rank under TP)
    num_kv_heads: int = 2  # key/value heads, shared by groups of query heads (GQA)
    head_dim: int = 16
    rope_theta: float = 1e6

    def __post_init__(self):
        for field in ("hidden", "intermediate", "num_experts", "top_k", "num_layers",
                      "num_heads", "num_kv_heads", "head_dim"):
            v = getattr(self, field)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"shape {self.name!r}: {field} must be a positive int, got {v!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"shape {self.name!r}: num_heads={self.num_heads} is not a multiple of "
                             f"num_kv_heads={self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"shape {self.name!r}: head_dim={self.head_dim} must be even (RoPE rotates halves)")
        if not self.rope_theta > 0:
            raise ValueError(f"shape {self.name!r}: rope_theta must be positive, got {self.rope_theta!r}")
        if self.top_k > self.num_experts:
            raise ValueError(
                f"shape {self.name!r}: top_k={self.top_k} exceeds num_experts={self.num_experts}"
            )

    def with_(self, **kw) -> "MoEShape":
        return replace(self, **kw)


PRESETS: dict[str, MoEShape] = {
    # Qwen3-30B-A3B: 48 MoE layers, 128 experts, 8 routed per token; attention with 32 query
    # heads and 4 KV heads of dim 128 (q_proj maps 2048 -> 4096).
    "qwen3-30b-a3b": MoEShape("qwen3-30b-a3b", 2048, 768, 128, 8, 48, 32, 4, 128),
    # The same model under tensor parallelism 4, as one rank sees it: a quarter of every expert's
    # intermediate dimension (768 / 4 = 192) and a quarter of the heads (32 / 4, 4 / 4).
    "qwen3-30b-a3b-tp4": MoEShape("qwen3-30b-a3b-tp4", 2048, 192, 128, 8, 48, 8, 1, 128),
    # CI-sized: small enough for the Triton interpreter, still top-k routing over several experts.
    "tiny": MoEShape("tiny", 64, 32, 8, 2, 2, 4, 2, 16),
}


def get_shape(preset: str | MoEShape, **overrides) -> MoEShape:
    """A preset by name (with optional overrides such as num_layers=4), or a custom MoEShape."""
    if isinstance(preset, MoEShape):
        shape = preset
    elif isinstance(preset, str):
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
        shape = PRESETS[preset]
    else:
        raise ValueError(f"preset must be a preset name or a MoEShape, got {preset!r}; names: {sorted(PRESETS)}")
    return shape.with_(**overrides) if overrides else shape


_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
           "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float64": torch.float64, "fp64": torch.float64}


FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)  # what the model computes in


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """A dtype name or torch dtype -> one of FLOAT_DTYPES; ValueError naming `dtype` for anything else (an int
    or bool dtype would be accepted by the allocations and fail later, inside silu)."""
    if isinstance(dtype, torch.dtype):
        if dtype not in FLOAT_DTYPES:
            raise ValueError(f"dtype {dtype} is not one the model computes in; choose float16, bfloat16, float32 "
                             f"or float64 (or 'auto')")
        return dtype
    if not isinstance(dtype, str) or dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(_DTYPES)} or 'auto'")
    return _DTYPES[dtype]


def check_int(name: str, value, minimum: int | None = None) -> int:
    """`value` as an int (a bool is refused: True would pass as 1); ValueError naming `name` otherwise."""
    if not isinstance(value, int) or isinstance(value, bool) or (minimum is not None and value < minimum):
        want = "an int" if minimum is None else "a positive int" if minimum == 1 else f"an int >= {minimum}"
        raise ValueError(f"{name} must be {want}, got {value!r}")
    return value


def check_real(name: str, value, lo: float | None = None, hi: float | None = None) -> float:
    """`value` as a finite float in [lo, hi] (a bool, NaN, inf, a string or a tensor is refused); ValueError naming
    `name` otherwise."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (lo is not None and value < lo) or (hi is not None and value > hi):
        lo_s, hi_s = ("-inf" if lo is None else lo), ("inf" if hi is None else hi)
        rng = "" if lo is None and hi is None else f" in [{lo_s}, {hi_s}]"
        raise ValueError(f"{name} must be a finite number{rng}, got {value!r}")
    return float(value)


def check_dtype(dtype: str | torch.dtype, device: torch.device | str, backend: str = "torch") -> torch.dtype:
    """Reject a dtype the device/backend would compute wrongly or not at all. (Without a GPU the
    Triton kernels run under the interpreter, which is what the bf16 check keys on.)"""
    dt = parse_dtype(dtype)
    if backend == "triton":
        if dt == torch.float64:
            raise ValueError("the Triton kernels take float32, float16 or bfloat16, not float64")
        if dt == torch.bfloat16 and runtime.interpreter():
            raise ValueError(
                "bfloat16 under the Triton interpreter computes wrong numbers (it emulates bf16 "
                "arithmetic incorrectly); use float32 or float16 on CPU, bfloat16 on a GPU"
            )
    return dt


@dataclass(frozen=True)
class LoRAConfig:
    """Adapter pool geometry: `max_loras` slots, ranks up to `max_rank`."""

    max_loras: int = 4
    max_rank: int = 16

    def __post_init__(self):
        for field in ("max_loras", "max_rank"):
            v = getattr(self, field)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{field} must be a positive int, got {v!r}")
