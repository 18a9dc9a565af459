"""Model shape presets and validation. Weights are random and seeded: nothing is downloaded."""
from __future__ import annotations

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

    def __post_init__(self):
        for field in ("hidden", "intermediate", "num_experts", "top_k", "num_layers"):
            v = getattr(self, field)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"shape {self.name!r}: {field} must be a positive int, got {v!r}")
        if self.top_k > self.num_experts:
            raise ValueError(
                f"shape {self.name!r}: top_k={self.top_k} exceeds num_experts={self.num_experts}"
            )

    def with_(self, **kw) -> "MoEShape":
        return replace(self, **kw)


PRESETS: dict[str, MoEShape] = {
    # Qwen3-30B-A3B: 48 MoE layers, 128 experts, 8 routed per token.
    "qwen3-30b-a3b": MoEShape("qwen3-30b-a3b", 2048, 768, 128, 8, 48),
    # The same model under tensor parallelism 4: each rank holds a quarter of every expert's
    # intermediate dimension (768 / 4 = 192).
    "qwen3-30b-a3b-tp4": MoEShape("qwen3-30b-a3b-tp4", 2048, 192, 128, 8, 48),
    # CI-sized: small enough for the Triton interpreter, still top-k routing over several experts.
    "tiny": MoEShape("tiny", 64, 32, 8, 2, 2),
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
        raise TypeError(f"preset must be a name or a MoEShape, got {type(preset).__name__}")
    return shape.with_(**overrides) if overrides else shape


_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
           "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float64": torch.float64, "fp64": torch.float64}


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(_DTYPES)}")
    return _DTYPES[dtype]


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
        if not isinstance(self.max_loras, int) or self.max_loras <= 0:
            raise ValueError(f"max_loras must be a positive int, got {self.max_loras!r}")
        if not isinstance(self.max_rank, int) or self.max_rank <= 0:
            raise ValueError(f"max_rank must be a positive int, got {self.max_rank!r}")
