"""A build sized to the card: the bytes a lab holds, counted from its shapes before anything is allocated.

A 48-layer Qwen3-30B-A3B lab with its adapter pool holds about 73 GiB in bf16; an 80 GB H100 holds it with
little room, a 48 GB L40S or a 24 GB card not at all. The lesson does not need 48 layers: every layer has the
same shapes and the same guard syncs (production's 260 over 48 is a per-layer rate), so a build that cannot
hold its preset's layers takes the most that fit, says so in one line, and the figures it prints are per layer
or named with their layer count. A layer count asked for explicitly that cannot fit is a `BuildTooLargeError`
naming the GiB needed, the GiB free and the count that fits.

    plan = fit_layers(shape, LoRAConfig(4, 16), "bfloat16", "triton", decoder=True, requested=None)
    plan.num_layers, plan.describe()

The bytes come from one function per part, each beside the code that allocates it: the base layer here
(`moe_layer_bytes`, `attention_bytes`), the adapter pool (`model/lora.py: pool_layer_bytes`) and each LoRA path's
own weight layout (each path's `layer_bytes`, kernels/paths/). `tests/model/test_sizing.py` holds them to
the bytes a real build allocates, to the byte.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import runtime
from ..config import LoRAConfig, MoEShape, parse_dtype

GIB = 2 ** 30
FIT_TOKENS = 16384  # the largest chunk the lab runs (prefill C = 16384): the workspace a build leaves room for
RESERVE_BYTES = 1 * GIB  # the CUDA context's own work space beyond ours: cuBLAS, Triton's modules, NCCL, graphs


class BuildTooLargeError(ValueError):
    """A lab that cannot fit in the memory this process may use: the message gives the GiB it needs, the GiB
    free, and the layer count (or option) that fits. Raised before anything is allocated."""


def moe_layer_bytes(shape: MoEShape, dtype: torch.dtype) -> int:
    """One MoE layer's own weights (model/moe.py: MoELayer): router (E, K), w13 (E, 2I, K), w2 (E, K, I), norm K."""
    K, I, E = shape.hidden, shape.intermediate, shape.num_experts
    return (E * K + E * 2 * I * K + E * K * I + K) * dtype.itemsize


def attention_bytes(shape: MoEShape, dtype: torch.dtype) -> int:
    """One decoder layer's attention and its norm (model/attention.py, model/decoder.py): qkv, o, q/k norms."""
    K, D, H, KV = shape.hidden, shape.head_dim, shape.num_heads, shape.num_kv_heads
    return ((H + 2 * KV) * D * K + K * H * D + 2 * D + K) * dtype.itemsize


def layer_bytes(shape: MoEShape, lora: LoRAConfig, dtype, backend: str, *, decoder: bool) -> int:
    """Everything one layer of the lab holds: base weights, the pool's stacks, the LoRA path's own layout."""
    from .lora import pool_layer_bytes

    dt = parse_dtype(dtype)
    n = moe_layer_bytes(shape, dt) + pool_layer_bytes(shape, lora, dt)
    if decoder:
        n += attention_bytes(shape, dt)
    from ..kernels import paths  # each path's own layout beside the stacks (the wide build holds the weights)
    n += sum(p.layer_bytes(shape, lora, dt, backend) for p in paths.PATHS.values())
    return n


def workspace_bytes(shape: MoEShape, tokens: int, dtype, *, decoder: bool) -> int:
    """The activations one forward keeps alive at once at `tokens` tokens, doubled for the caching allocator's
    rounding and the next layer's buffers allocated before the last are freed. An upper bound, not a count:
    M x top_k rows of the gate_up intermediate (2I), the activation (I) and the expert outputs (K) dominate."""
    dt = parse_dtype(dtype)
    M, K, I, k = tokens, shape.hidden, shape.intermediate, shape.top_k
    moe = M * k * (2 * I + I + K) + 4 * M * K  # inter, act, out; x, the norm, the residual, the sum
    attn = M * (shape.num_heads + 2 * shape.num_kv_heads) * shape.head_dim * 2 if decoder else 0  # qkv + out
    lora = M * k * 2 * 64 * 4  # shrink outputs (fp32, up to 64 columns per slice): small beside the rest
    return 2 * ((moe + attn) * dt.itemsize + lora + M * k * 4 * 8)  # + routing and alignment ids


def build_transient_bytes(shape: MoEShape, dtype) -> int:
    """The build's own peak above what it keeps: a layer's weights are drawn in fp32 on the device then cast
    (the full w13 and its cast copy), and the wide build copies one weight into its wider tensor."""
    K, I, E = shape.hidden, shape.intermediate, shape.num_experts
    return E * 2 * I * K * (4 + parse_dtype(dtype).itemsize) + E * 2 * I * K * parse_dtype(dtype).itemsize


@dataclass(frozen=True)
class BuildPlan:
    """The layer count a build takes and why. `capacity_bytes` is what this process may still allocate."""

    preset: str
    requested: int | None  # None: the preset's count, fewer allowed
    preset_layers: int
    num_layers: int
    per_layer_bytes: int
    fixed_bytes: int  # headroom: workspace, the build's transient peak, the reserve
    capacity_bytes: int | None  # None: no limit known (a CPU)
    total_bytes: int | None

    @property
    def reduced(self) -> bool:
        """True when the card held fewer layers than the preset has (never for a count asked for explicitly)."""
        return self.requested is None and self.num_layers < self.preset_layers

    def need_bytes(self, layers: int | None = None) -> int:
        return (self.num_layers if layers is None else layers) * self.per_layer_bytes + self.fixed_bytes

    def describe(self) -> str:
        if self.capacity_bytes is None:
            return f"{self.preset}: {self.num_layers} layers, {self.need_bytes() / GIB:.1f} GiB (no device limit)"
        cap = f"{self.capacity_bytes / GIB:.1f} GiB usable of {self.total_bytes / GIB:.1f} GiB"
        if self.reduced:
            return (f"{self.preset}: {self.num_layers} of its {self.preset_layers} layers fit this card ({cap}; "
                    f"{self.per_layer_bytes / GIB:.2f} GiB per layer + {self.fixed_bytes / GIB:.1f} GiB headroom): "
                    f"every layer keeps its shapes and guard syncs, the figures are per layer or name the count")
        return f"{self.preset}: {self.num_layers} layers, {self.need_bytes() / GIB:.1f} GiB of {cap}"

    def meta(self) -> dict:
        """What a recording's metadata keeps of it."""
        g = (lambda b: None if b is None else round(b / GIB, 2))
        return dict(layers=self.num_layers, preset_layers=self.preset_layers, layers_reduced=self.reduced,
                    build_gib=g(self.need_bytes()), gpu_usable_gib=g(self.capacity_bytes),
                    gpu_total_gib=g(self.total_bytes))


def fit_layers(shape: MoEShape, lora: LoRAConfig, dtype, backend: str, *, decoder: bool,
               requested: int | None = None, device: torch.device | str = "auto", tokens: int = FIT_TOKENS,
               capacity: tuple[int, int] | None = None) -> BuildPlan:
    """The layer count to build: `requested` when given (a `BuildTooLargeError` if it cannot fit), else the
    most of `shape.num_layers` that fit with room for a forward of `tokens` tokens. `capacity` = (usable, total)
    bytes stands in for the device's (tests, or a card one plans for); on a CPU without it nothing is limited."""
    if requested is not None and (not isinstance(requested, int) or isinstance(requested, bool) or requested < 1):
        raise ValueError(f"num_layers={requested!r}: a positive int (or None: the preset's count, as many as fit)")
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
        raise ValueError(f"tokens={tokens!r}: a positive int (the largest forward the build leaves room for)")
    per = layer_bytes(shape, lora, dtype, backend, decoder=decoder)
    fixed = workspace_bytes(shape, tokens, dtype, decoder=decoder) + build_transient_bytes(shape, dtype)
    if capacity is None and runtime.resolve_device(device).type == "cuda":
        capacity = runtime.gpu_capacity(device)
    want = shape.num_layers if requested is None else requested
    if capacity is None:
        return BuildPlan(shape.name, requested, shape.num_layers, want, per, fixed, None, None)
    usable, total = capacity
    fixed += RESERVE_BYTES
    fits = max(0, (usable - fixed) // per)
    plan = BuildPlan(shape.name, requested, shape.num_layers, int(min(want, fits)), per, fixed, usable, total)
    if fits < 1:
        raise BuildTooLargeError(
            f"{shape.name}: not even one layer fits: one needs {(per + fixed) / GIB:.1f} GiB ({per / GIB:.2f} per "
            f"layer + {fixed / GIB:.1f} headroom for {tokens} tokens) and {usable / GIB:.1f} GiB is usable here "
            f"({total / GIB:.1f} GiB card); a smaller preset ('tiny') or fewer tokens fit")
    if requested is not None and requested > fits:
        raise BuildTooLargeError(
            f"{shape.name} with num_layers={requested} needs {plan.need_bytes(requested) / GIB:.1f} GiB and "
            f"{usable / GIB:.1f} GiB is usable here ({total / GIB:.1f} GiB card): num_layers={fits} fits, or "
            f"num_layers=None takes as many as fit")
    return plan


def plan_build(preset: str | MoEShape, *, decoder: bool, num_layers: int | None = None, max_loras: int = 4,
               max_rank: int = 16, dtype="auto", device: str = "auto", backend: str = "auto",
               tokens: int = FIT_TOKENS, tp_size: int = 1) -> BuildPlan:
    """The plan `build_lab` (decoder=False) or `build_decoder_lab` (decoder=True) would follow with these
    arguments, without building: for a notebook or a sweep that picks its layer count first."""
    from ..config import get_shape
    from .tp import tp_shape

    dev = runtime.resolve_device(device)
    shape = tp_shape(get_shape(preset), tp_size)
    return fit_layers(shape, LoRAConfig(max_loras, max_rank), runtime.resolve_dtype(dtype, dev),
                      runtime.resolve_backend(backend, dev), decoder=decoder, requested=num_layers, device=dev,
                      tokens=tokens)
