"""Qwen3-style attention for prefill of whole requests (no KV cache).

    fused qkv GEMM -> per-head RMSNorm of q and k (over head_dim) -> RoPE (rotate-half) ->
    causal scaled_dot_product_attention, one independent sequence per request (GQA: groups of
    query heads share a KV head) -> o_proj GEMM

Nothing here reads a device value on the host: request lengths come from the batch's host lists
and RoPE positions from its device offsets, so the host keeps issuing work while the GPU runs. Under tensor parallelism
a rank holds a contiguous block of query heads and the KV heads they read (column-parallel qkv)
and the matching columns of o_proj (row-parallel): its output is a partial sum that the decoder
all-reduces.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..config import MoEShape
from ..ops import Backend
from . import init

# `enable_gqa` (torch >= 2.5) lets SDPA read each KV head for its group of query heads without
# materialising copies; older versions get the copies.
_SDPA_GQA = torch.__version__ >= (2, 5)


def positions(seg_indptr: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """0..len-1 for every request, concatenated, computed ON THE DEVICE from the batch's request
    offsets (seg_indptr, R + 1, already there). Nothing is copied from the host here: a captured
    graph that replays this reads the static seg_indptr a new batch was written into, where a
    copy from a temporary pinned host buffer would replay stale (or freed) host memory.
    `output_size` sizes repeat_interleave from the host: without it torch reads the counts back."""
    ptr = seg_indptr.long()
    R = ptr.shape[0] - 1
    req = torch.repeat_interleave(torch.arange(R, device=ptr.device), ptr[1:] - ptr[:-1], output_size=num_tokens)
    return torch.arange(num_tokens, device=ptr.device) - ptr[req]


def rope_cos_sin(pos: torch.Tensor, head_dim: int, theta: float):
    """(cos, sin), each (M, head_dim) fp32 for positions `pos` (M,): built once per forward, shared by every layer."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=pos.device) / head_dim)
    freqs = pos.float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)  # rotate-half pairs dim i with dim i + head_dim/2
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (M, heads, D) rotated in fp32: x*cos + rotate_half(x)*sin, rotate_half = (-x2, x1)."""
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    rot = torch.cat([-x2, x1], dim=-1)
    return (xf * cos[:, None] + rot * sin[:, None]).to(x.dtype)


def causal_attention(q, k, v, token_counts: list[int]) -> torch.Tensor:
    """q (M, H, D), k and v (M, KV, D) -> (M, H, D); each request is its own causal sequence.
    Equal lengths: ONE SDPA call over (R, H, L, D). Otherwise one call per request, sliced with
    host-known offsets (no sync; a launch per request)."""
    M, H, D = q.shape
    kw = dict(is_causal=True)
    if _SDPA_GQA:
        kw["enable_gqa"] = True
    elif k.shape[1] != H:
        k, v = (t.repeat_interleave(H // t.shape[1], dim=1) for t in (k, v))

    def sdpa(q, k, v, R, L):  # (R*L, heads, D) -> (R, heads, L, D) -> SDPA -> (R*L, H, D)
        q, k, v = (t.reshape(R, L, t.shape[1], D).transpose(1, 2) for t in (q, k, v))
        return F.scaled_dot_product_attention(q, k, v, **kw).transpose(1, 2).reshape(R * L, H, D)

    live = [c for c in token_counts if c > 0]
    if all(c == live[0] for c in live):
        return sdpa(q, k, v, len(live), live[0])
    out = torch.empty_like(q)
    start = 0
    for c in token_counts:
        if c:
            s = slice(start, start + c)
            out[s] = sdpa(q[s], k[s], v[s], 1, c)
            start += c
    return out


class Attention(torch.nn.Module):
    """One rank's attention: `shape` holds this rank's head counts (model/tp.py: tp_shape)."""

    def __init__(self, shape: MoEShape, dtype, device, gen: torch.Generator, eps: float = 1e-6, *,
                 tp_rank: int = 0, tp_size: int = 1):
        super().__init__()
        K, D = shape.hidden, shape.head_dim
        H, KV = shape.num_heads, shape.num_kv_heads  # this rank's
        self.H, self.KV, self.D, self.eps, self.theta = H, KV, D, eps, shape.rope_theta

        def randn(*size, std):  # full tensors in fp32, drawn in the same order on every rank
            return init.randn(gen, device, *size, std=std)

        def heads(w, n):  # rows of this rank's n heads
            return w[tp_rank * n * D:(tp_rank + 1) * n * D]

        q = heads(randn(H * tp_size * D, K, std=K ** -0.5), H)
        k = heads(randn(KV * tp_size * D, K, std=K ** -0.5), KV)
        v = heads(randn(KV * tp_size * D, K, std=K ** -0.5), KV)
        # one fused GEMM for q, k and v (rows: q heads, then k heads, then v heads)
        self.qkv_w = init.frozen(torch.cat([q, k, v]).to(dtype))
        del q, k, v
        o = randn(K, H * tp_size * D, std=(H * tp_size * D) ** -0.5)
        self.o_w = init.frozen(o[:, tp_rank * H * D:(tp_rank + 1) * H * D].to(dtype).contiguous())
        del o
        self.q_norm_w = init.frozen((1 + randn(D, std=0.1)).to(dtype))
        self.k_norm_w = init.frozen((1 + randn(D, std=0.1)).to(dtype))

    def forward(self, x, token_counts: list[int], rope, backend: Backend, before_o_proj=None):
        """x (M, hidden), already normed -> this rank's partial o_proj output (M, hidden).
        `before_o_proj()`, when given, runs right before the o_proj GEMM (guard sites)."""
        M = x.shape[0]
        H, KV, D = self.H, self.KV, self.D
        qkv = x @ self.qkv_w.T
        q, k, v = qkv.split([H * D, KV * D, KV * D], dim=-1)
        # per-head RMSNorm over head_dim (Qwen3's q_norm / k_norm): rows of D
        q = backend.rmsnorm(q.reshape(M * H, D), self.q_norm_w, self.eps).view(M, H, D)
        k = backend.rmsnorm(k.reshape(M * KV, D), self.k_norm_w, self.eps).view(M, KV, D)
        cos, sin = rope
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        att = causal_attention(q, k, v.reshape(M, KV, D), token_counts)
        if before_o_proj is not None:
            before_o_proj()
        return att.reshape(M, H * D) @ self.o_w.T
