"""The least time LoRA's own bytes and FLOPs take in a forward, each adapter at its own rank (not padded to the pool's
maximum): the floor a LoRA-on / LoRA-off throughput ratio is set against.

    c = read_floors.ceilings()                                 # the H200's copy bandwidth and matmul rate, recorded
    layer_floor("qwen3-30b-a3b", [(16, 4096)] * 4, c)          # one MoE layer: (rank, tokens) per adapter -> µs parts
    forward_floor_us(preset, tokens_by_adapter, c, layers=48)  # the whole model: the layer's floor x its layers
    floor_ratio(t_off_us, t_lora_floor_us)                     # t_off / (t_off + floor): the best ratio LoRA allows

The model is studies/kernels/read_floors.py's `lora_floor` (its docstring says why) with the adapters told apart:
per op, the shrink is its own kernel (each adapter's A over the experts its tokens hit, the op's input once, u written
once) and the expand adds K steps to the base GEMM (each adapter's B over its experts, u read once, its FLOPs on top of
the GEMM's), each kernel at the larger of its bytes over the copy bandwidth and its FLOPs over the matmul ceiling.
The experts an adapter's tokens hit are the expected count under uniform routing (`read_floors.experts_hit`). With
every adapter at one rank and the tokens spread evenly, `layer_floor` is `lora_floor` exactly (the tests check it).
Attention carries no LoRA here: a decoder's LoRA floor is its MoE layers'.
"""
from __future__ import annotations

from lora_moe_lab.config import get_shape

from studies.kernels.read_floors import BF16_BYTES, experts_hit, gemm_floor


def _roof_us(nbytes: float, flops: float, c: dict) -> float:
    return max(nbytes / (c["copy_gbps"] * 1e3), flops / (c["matmul_tflops"] * 1e6))


def layer_floor(preset: str, tokens_by_adapter, c: dict) -> dict:
    """One MoE layer's LoRA floor in µs: `tokens_by_adapter` lists (rank, tokens) per adapter in use (every token of
    the batch on one of them: M = the sum). Returns each kernel's added µs, `weights_us` (every adapter's A and B of
    the experts its tokens hit, at the copy bandwidth) and `added_us`, their sum."""
    pairs_by = [(int(r), int(m)) for r, m in tokens_by_adapter if int(m) > 0]
    if not pairs_by or any(r < 1 for r, _ in pairs_by):
        raise ValueError(f"tokens_by_adapter needs (rank >= 1, tokens) with some tokens, got {tokens_by_adapter!r}")
    sh = get_shape(preset)
    E, k, H, I = sh.num_experts, sh.top_k, sh.hidden, sh.intermediate
    M = sum(m for _, m in pairs_by)
    pairs = M * k
    parts, weights = {}, 0.0
    # op: (slices, the shrink's input elements, its K, the GEMM's N)
    for op, (sl, inp, K, N) in {"gate_up": (2, M * H, H, 2 * I), "down": (1, pairs * I, I, H)}.items():
        a = sum(experts_hit(m, E, k) * sl * r * K for r, m in pairs_by) * BF16_BYTES
        b = sum(experts_hit(m, E, k) * N * r for r, m in pairs_by) * BF16_BYTES
        u = sum(m * k * sl * r for r, m in pairs_by) * BF16_BYTES
        weights += a + b
        shrink_flops = sum(2.0 * m * k * K * sl * r for r, m in pairs_by)
        expand_flops = sum(2.0 * m * k * r * N for r, m in pairs_by)
        parts[f"{op}_shrink_us"] = _roof_us(a + inp * BF16_BYTES + u, shrink_flops, c)
        g = gemm_floor(preset, op, M, c)
        parts[f"{op}_expand_us"] = _roof_us(g["bytes"] + b + u, g["flops"] + expand_flops, c) - g["floor_us"]
    return dict(parts, weights_us=weights / (c["copy_gbps"] * 1e3), added_us=sum(parts.values()))


def forward_floor_us(preset: str, tokens_by_adapter, c: dict, layers: int) -> float:
    """The whole forward's LoRA floor: `layers` MoE layers of `layer_floor` (µs)."""
    return layers * layer_floor(preset, tokens_by_adapter, c)["added_us"]


def floor_ratio(t_off_us: float, t_lora_floor_us: float) -> float:
    """The LoRA-on / LoRA-off throughput ratio LoRA's own bytes and FLOPs allow at best: t_off / (t_off + floor)."""
    return t_off_us / (t_off_us + t_lora_floor_us)
