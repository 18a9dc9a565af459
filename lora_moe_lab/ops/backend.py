"""The backend interface: what the MoE layer asks of its ops, and how a backend is chosen.

Two backends implement it: `TorchBackend` (plain torch; references and fast CPU runs) and
`TritonBackend` (the fused kernels in `kernels/`). The layer never imports either directly: it
holds a `Backend` and calls these methods, so adding a backend means one new subclass here
(and one line in `ops.get_backend`).

Contract shared by every backend: no host syncs, shapes from static metadata only (capturable
in a CUDA graph), `moe_gemm` fully writes `out`, `lora_delta` ADDS into `out` in place.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from ..kernels.align import Alignment, moe_align


class Backend(ABC):
    name: str = "base"

    # alignment: the Triton kernels on a GPU, the torch version on CPU (same outputs)
    align = staticmethod(moe_align)

    @staticmethod
    @abstractmethod
    def block_m(num_tokens: int, top_k: int, num_experts: int, hidden: int | None = None,
                intermediate: int | None = None) -> int:
        """Rows per block of the base GEMM's alignment (from static shapes: the layer's hidden and
        intermediate sizes pick the GPU's tuned tile table where one exists)."""

    @staticmethod
    @abstractmethod
    def lora_block_m(num_tokens: int, top_k: int, num_experts: int, num_slots: int) -> int:
        """Rows per block of the per-adapter alignment."""

    @staticmethod
    @abstractmethod
    def moe_gemm(x, w, align: Alignment, top_k: int, out, *, routed_weights=None, gather=True):
        """out[pair] = x[row(pair)] @ w[expert(pair)].T (* routed weight); fully writes out."""

    @staticmethod
    @abstractmethod
    def lora_delta(x, lora_a, lora_b, align: Alignment, lora_ids, adapter_enabled, top_k, out, *,
                   routed_weights=None, gather=True, exit_codes=None):
        """out[pair, p*N:(p+1)*N] += (x[row] @ A[p, s, e].T) @ B[p, s, e].T for live slots."""

    @staticmethod
    def lora_down_config(num_tokens: int, top_k: int, num_experts: int, num_slots: int, block_m: int, N: int, K: int):
        """A launch config for the down delta's `lora_delta(..., config=)`, or None (the default)."""
        return None

    @staticmethod
    def use_decode_path(num_tokens: int, top_k: int) -> bool:
        """Whether the LoRA path runs without alignment at this static size (`lora_delta_decode`).
        No by default: a backend with a decode kernel overrides both."""
        return False

    @staticmethod
    def lora_delta_decode(x, lora_a, lora_b, topk_ids, token_lora_mapping, lora_ids, adapter_enabled, out, *,
                          routed_weights=None, gather=True):
        """The LoRA delta straight from topk_ids and the per-token row mapping, no alignment."""
        raise NotImplementedError("this backend has no decode path (use_decode_path answers False)")

    @staticmethod
    def use_fused_lora(op: str, num_tokens: int, top_k: int, num_experts: int, N: int, K: int) -> bool:
        """Whether `op` ("gate_up" / "down") runs as one GEMM with the LoRA delta in its epilogue
        (`moe_gemm_lora`), from static shapes. No by default."""
        return False

    @staticmethod
    def use_folded_lora(op: str, num_tokens: int, top_k: int, num_experts: int, N: int, K: int) -> bool:
        """Whether `op` runs as the folded LoRA GEMM (`moe_gemm_lora_folded`): a shrink kernel, then the
        base GEMM with the expand in its K loop; from static shapes. No by default."""
        return False

    @staticmethod
    def folded_order_by_row(num_tokens: int) -> bool:
        """Where an op is folded: whether the layer orders its alignment by LoRA row (the per-row shrink, the packed
        expand per slot), from static shapes."""
        return False

    @staticmethod
    def moe_gemm_lora_folded(x, w, align: Alignment, top_k: int, out, lora_a, lora_b, token_lora_mapping, lora_ids,
                             adapter_enabled, *, routed_weights=None, gather=True, shrink_per_row=False):
        """`moe_gemm_lora`'s result, computed as a shrink kernel + the base GEMM with the expand folded in."""
        raise NotImplementedError("this backend has no folded LoRA GEMM (use_folded_lora answers False)")

    @staticmethod
    def fold_build() -> str:
        """Where an op is folded: "packed" (`moe_gemm_lora_packed`) or "rows" (`moe_gemm_lora_folded`)."""
        return "rows"

    @staticmethod
    def packed_shrink(num_tokens: int) -> dict:
        """Where an op is packed: the packed shrink's options at this token count (static shapes only)."""
        return {}

    @staticmethod
    def packed_expand(num_tokens: int, op: str | None = None, N: int | None = None, K: int | None = None) -> dict:
        """Where an op is packed: the packed GEMM's expand options at this token count and GEMM shape (static shapes
        only)."""
        return {}

    @staticmethod
    def moe_gemm_lora_packed(x, w, align: Alignment, top_k: int, out, lora_a, lora_b, token_lora_mapping, lora_ids,
                             adapter_enabled, *, routed_weights=None, gather=True, b_packed=None, per_slot=False,
                             shrink=None, expand=None):
        """`moe_gemm_lora`'s result, computed as the packed shrink + the base GEMM with the adapters' columns as
        extra K iterations (b_packed: the layer's `LayerLoRAWeights.packed_b`; shrink, expand: `packed_shrink`'s and
        `packed_expand`'s options)."""
        raise NotImplementedError("this backend has no packed LoRA GEMM (fold_build answers 'rows')")

    @staticmethod
    def use_wide_down(num_tokens: int) -> bool:
        """Where down is folded: whether it takes the wide build (`moe_gemm_lora_wide`), from static shapes."""
        return False

    @staticmethod
    def use_wide_gate_up(num_tokens: int, block_m: int, N: int, K: int, num_experts: int) -> bool:
        """Where gate_up is folded: whether it takes the wide build per block, from static shapes."""
        return False

    @staticmethod
    def wide_down_window(num_tokens: int, block_m: int, N: int, K: int, num_experts: int, C: int, slots: int) -> int:
        """The wide down GEMM's window of columns at this token count (0: all C; static shapes only)."""
        return 0

    @staticmethod
    def wide_gate_up_shrink(num_tokens: int) -> dict:
        """gate_up's wide build: its shrink's options at this token count (static shapes only)."""
        return {}

    @staticmethod
    def moe_gemm_lora_wide(x, w, align: Alignment, top_k: int, out, lora_a, token_lora_mapping, lora_ids,
                           adapter_enabled, *, routed_weights=None, gather=False, shrink=None, per_block=False,
                           window=0):
        """The GEMM with its delta, u and B_packed as columns past K of x and w (`LayerLoRAWeights.wide_w`)."""
        raise NotImplementedError("this backend has no wide LoRA GEMM (use_wide_down answers False)")

    @staticmethod
    def moe_gemm_lora(x, w, align: Alignment, top_k: int, out, lora_a, lora_b, token_lora_mapping, lora_ids,
                      adapter_enabled, *, routed_weights=None, gather=True):
        """moe_gemm with the LoRA delta of each pair's LoRA row added before the store; fully writes out."""
        raise NotImplementedError("this backend has no fused LoRA epilogue (use_fused_lora answers False)")

    @staticmethod
    @abstractmethod
    def silu_and_mul(inter: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """silu(gate) * up over the last dim split in two halves (into `out` when given, e.g. a view of a wider
        buffer)."""

    @staticmethod
    @abstractmethod
    def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
        """x / rms(x) * w, computed in fp32 (into `out` when given, e.g. a view of a wider buffer)."""

    def __repr__(self):
        return f"<backend {self.name}>"
