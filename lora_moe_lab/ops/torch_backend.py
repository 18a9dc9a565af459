"""Torch backend of the MoE ops: the `Backend` interface in plain torch, sync-free, graph-capturable.

It works block by block over the same sorted-token alignment as the Triton kernels: each block of
BM (token, k) pairs gathers its rows and its expert's weights and does one batched matmul. Every
loop bound is static (derived from shapes), every index is a device tensor, so nothing is ever
read back to the host. It has no early exit: a disabled slot still costs its full share of work,
which is exactly the difference the Triton kernel's early exit removes.

Padding rows of a block (sentinel ids) and rows of a dead slot are computed like the others (static
shapes) and point at pair 0; their results are REPLACED by +0.0 with `torch.where`, never
multiplied by 0: an inf there (an overflowing adapter) times 0 is NaN, and index_add_ would pour it
into pair 0, another request's row. The Triton kernels mask their stores instead.
"""
from __future__ import annotations

import torch

from ..kernels.align import Alignment
from .backend import Backend
from .reference import exit_codes as host_exit_codes

_CHUNK_BYTES = 256 << 20  # cap on the gathered weight tiles per step


def _chunks(num_blocks: int, bytes_per_block: int):
    step = max(1, min(num_blocks, _CHUNK_BYTES // max(1, bytes_per_block)))
    for lo in range(0, num_blocks, step):
        yield slice(lo, min(num_blocks, lo + step))


def _rows(ids: torch.Tensor, n_pairs: int, top_k: int, gather: bool):
    valid = ids < n_pairs
    safe = torch.where(valid, ids, torch.zeros_like(ids)).long()
    return valid, safe, (safe // top_k if gather else safe)


def moe_gemm(x, w, align: Alignment, top_k: int, out, *, routed_weights=None, gather=True):
    n_pairs, N = out.shape
    BM = align.block_m
    ids = align.sorted_token_ids[0].view(-1, BM)
    experts = align.expert_ids[0].long().clamp(min=0)
    out.zero_()
    rw = None if routed_weights is None else routed_weights.reshape(-1)
    for c in _chunks(ids.shape[0], w.shape[1] * w.shape[2] * w.element_size()):
        valid, pair, row = _rows(ids[c], n_pairs, top_k, gather)
        y = torch.bmm(x[row], w[experts[c]].transpose(1, 2))  # (blocks, BM, N)
        if rw is not None:
            y = y * rw[pair].to(y.dtype)[..., None]
        out.index_add_(0, pair.reshape(-1), torch.where(valid[..., None], y, 0).reshape(-1, N))
    return out


def lora_delta(x, lora_a, lora_b, align: Alignment, lora_ids, adapter_enabled, top_k, out, *,
               routed_weights=None, gather=True, exit_codes=None, plan=None, lora_ranks=None):
    """The delta block by block (plan: the layer's `LoRAPlan`; it holds no option for this backend: its
    blocks' size, `kernels.plan.torch_block_m`, only sets how many rows one batched matmul takes). lora_ranks is
    not read: the products run over the zero-padded rank, the same result."""
    P, S, E, r, K = lora_a.shape
    N = lora_b.shape[3]
    n_pairs = out.shape[0]
    BM = align.block_m
    L, nb = align.expert_ids.shape  # LoRA rows; lora_ids maps a row to its weight slot
    ids = align.sorted_token_ids.view(L * nb, BM)
    row = torch.arange(L, device=ids.device).repeat_interleave(nb)
    experts = align.expert_ids.reshape(-1).long()
    live = (lora_ids.long()[row] >= 0) & (adapter_enabled.long()[row] != 0) & (experts >= 0)
    slot = lora_ids.long()[row].clamp(min=0)  # weight slot per block (a dead row's is never kept)
    if exit_codes is not None:
        exit_codes.copy_(host_exit_codes(align, lora_ids, adapter_enabled))
    e = experts.clamp(min=0)
    rw = None if routed_weights is None else routed_weights.reshape(-1)
    for c in _chunks(L * nb, P * (r * K + N * r) * lora_a.element_size()):
        valid, pair, row = _rows(ids[c], n_pairs, top_k, gather)
        xb = x[row]  # (blocks, BM, K)
        keep = (valid & live[c][:, None])[..., None]  # real pairs of live slots
        for p in range(P):
            a = lora_a[p][slot[c], e[c]]  # (blocks, r, K)
            b = lora_b[p][slot[c], e[c]]  # (blocks, N, r)
            d = torch.bmm(torch.bmm(xb, a.transpose(1, 2)), b.transpose(1, 2))  # (blocks, BM, N)
            if rw is not None:
                d = d * rw[pair].to(x.dtype)[..., None]
            out[:, p * N:(p + 1) * N].index_add_(0, pair.reshape(-1), torch.where(keep, d, 0).reshape(-1, N))


def silu_and_mul(inter: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    I = inter.shape[-1] // 2
    return torch.mul(torch.nn.functional.silu(inter[..., :I]), inter[..., I:], out=out)


def route(x: torch.Tensor, router_w: torch.Tensor, top_k: int, bias: torch.Tensor | None = None):
    """The router in fp32: an upcast of x, an fp32 GEMM, softmax, top-k, renormalise (the Triton backend's one
    kernel, kernels/router.py, does it all in its epilogue)."""
    logits = x.float() @ router_w.float().T
    if bias is not None:  # skew 0 adds nothing: the uniform router, bit for bit
        logits = logits + bias
    probs = torch.softmax(logits, dim=-1)
    w, ids = torch.topk(probs, top_k, dim=-1)
    return w / w.sum(-1, keepdim=True), ids.to(torch.int32)


def moe_sum(y: torch.Tensor, top_k: int, residual: torch.Tensor | None = None) -> torch.Tensor:
    """The top-k sum in fp32 (+ residual), rounded once: for fp32 the old sum-then-add, bit for bit."""
    s = y.view(-1, top_k, y.shape[-1]).sum(1, dtype=torch.float32)
    return (s if residual is None else residual + s).to(y.dtype)


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)
    return y if out is None else out.copy_(y)


class TorchBackend(Backend):
    """Block-by-block torch ops over the same alignment as the kernels; no early exit."""

    name = "torch"
    moe_gemm = staticmethod(moe_gemm)
    lora_delta = staticmethod(lora_delta)
    route = staticmethod(route)
    silu_and_mul = staticmethod(silu_and_mul)
    moe_sum = staticmethod(moe_sum)
    rmsnorm = staticmethod(rmsnorm)
