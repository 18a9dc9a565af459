"""The backend interface: what the MoE layer asks of its ops, and how a backend is chosen.

Two backends implement it: `TorchBackend` (plain torch; references and fast CPU runs) and
`TritonBackend` (the fused kernels in `kernels/`). The layer never imports either directly: it
holds a `Backend` and calls these ops, so adding a backend means one new subclass here (and one
line in `ops.get_backend`). Which op runs, with which options, is not the backend's question: the
layer asks the plan (`kernels.plan.plan(op, M, shape, device, backend=backend.name)`) once per op.

Contract shared by every backend: no host syncs, shapes from static metadata only (capturable
in a CUDA graph), `moe_gemm` fully writes `out`, `lora_delta` ADDS into `out` in place.

The layer's base steps around the GEMMs are ops too: `route` (router GEMM, softmax, top-k, renormalise),
`silu_and_mul` and `moe_sum` (the top-k sum, with the residual). The torch backend runs them as plain torch (the
CPU and reference path: an fp32 GEMM over an upcast of x, two kernels for SiLU-and-mul, sum then add); the Triton
backend as one kernel each (kernels/router.py, activation.py, moe_sum.py say why).
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
    def moe_gemm(x, w, align: Alignment, top_k: int, out, *, routed_weights=None, gather=True):
        """out[pair] = x[row(pair)] @ w[expert(pair)].T (* routed weight); fully writes out."""

    @staticmethod
    @abstractmethod
    def lora_delta(x, lora_a, lora_b, align: Alignment, lora_ids, adapter_enabled, top_k, out, *,
                   routed_weights=None, gather=True, exit_codes=None, plan=None, lora_ranks=None):
        """out[pair, p*N:(p+1)*N] += (x[row] @ A[p, s, e].T) @ B[p, s, e].T for live slots. plan: the op's
        `kernels.plan.LoRAPlan` (its launch config, where the backend has one); None: the backend's default.
        lora_ranks: the batch's (L,) rank per row; a backend may read only that much of the zero-padded stacks."""

    @staticmethod
    def lora_delta_decode(x, lora_a, lora_b, topk_ids, token_lora_mapping, lora_ids, adapter_enabled, out, *,
                          routed_weights=None, gather=True, lora_ranks=None):
        """The LoRA delta straight from topk_ids and the per-token row mapping, no alignment (the plan's
        "decode" path); lora_ranks: the batch's (L,) rank per row, read so as to skip the stacks' padding."""
        raise NotImplementedError("this backend has no decode path")

    @staticmethod
    def moe_gemm_lora_packed(x, w, align: Alignment, top_k: int, out, lora_a, lora_b, token_lora_mapping, lora_ids,
                             adapter_enabled, *, routed_weights=None, gather=True, b_packed=None, per_slot=False,
                             shrink=None, expand=None):
        """The GEMM with its LoRA delta (the plan's "packed" path): the packed shrink + the base GEMM with the
        adapters' columns as extra K iterations (b_packed: the packed path's B_packed, kernels/paths/packed.py;
        per_slot, shrink, expand: the plan's options); fully writes out."""
        raise NotImplementedError("this backend has no packed LoRA GEMM")

    @staticmethod
    def moe_gemm_lora_wide(x, w, align: Alignment, top_k: int, out, lora_a, token_lora_mapping, lora_ids,
                           adapter_enabled, *, routed_weights=None, gather=False, shrink=None, per_block=False,
                           window=0):
        """The GEMM with its delta (the plan's "wide" path), u and B_packed as columns past K of x and w
        (kernels/paths/wide.py: `wide_w`); fully writes out."""
        raise NotImplementedError("this backend has no wide LoRA GEMM")

    @staticmethod
    @abstractmethod
    def route(x: torch.Tensor, router_w: torch.Tensor, top_k: int, bias: torch.Tensor | None = None):
        """(topk_w fp32 (M, top_k), topk_ids int32 (M, top_k)), the best expert first: softmax(x @ router_w.T + bias)
        over the experts, its top_k, renormalised to sum 1; the logits accumulated in fp32 (router_w in x's dtype,
        bias fp32 (E,) or None)."""

    @staticmethod
    @abstractmethod
    def moe_sum(y: torch.Tensor, top_k: int, residual: torch.Tensor | None = None) -> torch.Tensor:
        """(M, K): the sum of each token's top_k rows of y (M*top_k, K), plus `residual` (M, K) when given, in fp32,
        rounded once to y's dtype."""

    @staticmethod
    @abstractmethod
    def silu_and_mul(inter: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """silu(gate) * up over the last dim split in two halves (into `out` when given, e.g. a view of a wider
        buffer: its row stride may exceed the half's width)."""

    @staticmethod
    @abstractmethod
    def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
        """x / rms(x) * w, computed in fp32 (into `out` when given, e.g. a view of a wider buffer)."""

    def __repr__(self):
        return f"<backend {self.name}>"
