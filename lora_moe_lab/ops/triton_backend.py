"""Triton backend: the `Backend` interface over the kernels in `kernels/` (each kernel file holds its
`@triton.jit` kernel and its launcher), plus `warmup`, which compiles every config the launch tables and the
layer's plan (kernels/plan.py) can pick, each LoRA path's builds from its own module (kernels/paths/), so that a
CUDA-graph capture never compiles.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

from .. import runtime  # noqa: F401  (first: TRITON_INTERPRET before the kernels are decorated)
from ..config import MoEShape, check_dtype, get_shape
from ..kernels.activation import silu_and_mul
from ..kernels.align import moe_align
from ..kernels import paths
from ..kernels.configs import gemm_config
from ..kernels.fused_moe import moe_gemm
from ..kernels.fused_moe_lora import lora_delta as _lora_delta
from ..kernels.fused_moe_lora_packed import moe_gemm_lora_packed, moe_gemm_lora_wide
from ..kernels.lora_decode import lora_delta_decode
from ..kernels.moe_sum import moe_sum
from ..kernels.plan import OPS, LoRADims, plan
from ..kernels.rmsnorm import rmsnorm
from ..kernels.router import route, router_config
from .backend import Backend


def lora_delta(x, lora_a, lora_b, align, lora_ids, adapter_enabled, top_k, out, *, routed_weights=None, gather=True,
               exit_codes=None, plan=None, config=None, lora_ranks=None):
    """`kernels.fused_moe_lora.lora_delta` with the plan's launch config (`LoRAPlan.config`; config: one given
    explicitly wins; neither: the kernel's own table); lora_ranks: the batch's rank per row (skips the padding)."""
    if config is None and plan is not None:
        config = plan.config
    return _lora_delta(x, lora_a, lora_b, align, lora_ids, adapter_enabled, top_k, out,
                       routed_weights=routed_weights, gather=gather, exit_codes=exit_codes, config=config,
                       lora_ranks=lora_ranks)


class TritonBackend(Backend):
    """The fused Triton kernels: grouped GEMM, fused LoRA shrink+expand with early exit, the LoRA path packed into
    the base GEMM (packed and wide builds), RMSNorm, and the base layer's router (GEMM + softmax/top-k epilogue),
    SiLU-and-mul and top-k sum with the residual, one kernel each. Which LoRA path the layer runs is the plan's
    (kernels/plan.py)."""

    name = "triton"
    moe_gemm = staticmethod(moe_gemm)
    lora_delta = staticmethod(lora_delta)
    lora_delta_decode = staticmethod(lora_delta_decode)  # decode sizes: no alignment (kernels/lora_decode.py)
    moe_gemm_lora_packed = staticmethod(moe_gemm_lora_packed)  # the packed shrink + K iterations on the plain tile
    moe_gemm_lora_wide = staticmethod(moe_gemm_lora_wide)  # the adapters' columns in the GEMM's own x and w
    route = staticmethod(route)  # kernels/router.py
    silu_and_mul = staticmethod(silu_and_mul)  # kernels/activation.py
    moe_sum = staticmethod(moe_sum)  # kernels/moe_sum.py
    rmsnorm = staticmethod(rmsnorm)


# --------------------------------------------------------------------------------------------
# Warm-up: compile every config the table can pick, before any CUDA-graph capture
# --------------------------------------------------------------------------------------------
WARMUP_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def warmup(shape: MoEShape | str, dtype: torch.dtype | str = torch.bfloat16, *, max_loras: int = 4,
           max_rank: int = 16, device=None, num_tokens=WARMUP_TOKENS) -> int:
    """Compile the kernels for every (block_m, config) the tables pick for these token counts, at the
    shapes of one MoE layer (gate_up and down, base and LoRA, with and without routed weights; the router,
    SiLU-and-mul and the top-k sum with the residual).

    Each compile runs once on a tiny batch (one binary serves every M: the M-dependent integers are
    not specialised), so this is quick. Returns the number of distinct launches made.
    """
    shape = get_shape(shape)
    device = runtime.resolve_device(device)
    dtype = check_dtype(dtype, device, backend="triton")
    K, I, E, k = shape.hidden, shape.intermediate, shape.num_experts, shape.top_k
    S, R = max_loras, max_rank
    g = torch.Generator(device="cpu").manual_seed(0)

    def rnd(*size, scale=1.0):
        return (torch.randn(*size, generator=g) * scale).to(dtype).to(device)

    # Tiny inputs with the layer's K/N (so strides specialise as at run time); M = 1 token.
    x1 = rnd(1, K)
    ids = torch.randperm(E, generator=g)[:k].view(1, k).int().to(device)
    rw = torch.rand(1, k, generator=g).float().to(device)
    slot = torch.zeros(1, dtype=torch.int32, device=device)
    lora_ids = torch.arange(S, dtype=torch.int32, device=device)
    enabled = torch.ones(S, dtype=torch.int32, device=device)
    w13, w2 = rnd(E, 2 * I, K, scale=K ** -0.5), rnd(E, K, I, scale=I ** -0.5)
    a13, b13 = rnd(2, S, E, R, K), rnd(2, S, E, I, R)
    a2, b2 = rnd(1, S, E, R, I), rnd(1, S, E, K, R)
    h = rnd(k, I)
    router_w, bias = rnd(E, K, scale=K ** -0.5), torch.zeros(E, dtype=torch.float32, device=device)
    inter, y = rnd(k, 2 * I), rnd(k, K)
    seen = set()
    dims = LoRADims(slots=S, rank=R, rows=S)
    # what the paths' warm-up jobs launch on (kernels/paths/: each path's `warmup_jobs`)
    c = SimpleNamespace(shape=shape, device=device, dtype=dtype, dims=dims, K=K, I=I, E=E, k=k, S=S, R=R, x1=x1,
                        h=h, ids=ids, rw=rw, slot=slot, lora_ids=lora_ids, enabled=enabled, w13=w13, w2=w2, a13=a13,
                        b13=b13, a2=a2, b2=b2)
    for M in num_tokens:
        # the layer's plan for each op: alone (the wide builds where the plan takes them) and beside a second hook
        # (the packed build where a wide entry falls back to it); both compile
        c.alone = {op: plan(op, M, shape, device, lora=dims) for op in OPS}
        c.shared = {op: plan(op, M, shape, device, lora=dims, alone=False) for op in OPS}
        c.bm_base = bm_base = c.alone["gate_up"].block_m
        al = moe_align(ids, E, bm_base)
        # where an op runs inside the GEMM on the alignment ordered by LoRA row (the plan's order_by_row), that
        # alignment is compiled here too, and the fused paths' jobs run on it as the layer does
        by_row = any(p.order_by_row for p in c.shared.values())
        c.al_f = moe_align(ids, E, bm_base, order_by=slot) if by_row else al
        jobs = [
            ("gemm13", gemm_config(M, bm_base, 2 * I, K, E), bm_base,
             lambda cf, al=al: moe_gemm(x1, w13, al, k, torch.empty(k, 2 * I, dtype=dtype, device=device), config=cf)),
            ("gemm2", gemm_config(M, bm_base, K, I, E), bm_base,
             lambda cf, al=al: moe_gemm(h, w2, al, k, torch.empty(k, K, dtype=dtype, device=device),
                                        routed_weights=rw, gather=False, config=cf)),
            ("gemm2nw", gemm_config(M, bm_base, K, I, E), bm_base,
             lambda cf, al=al: moe_gemm(h, w2, al, k, torch.empty(k, K, dtype=dtype, device=device),
                                        gather=False, config=cf)),
        ]
        # the base layer's own kernels: the router (the tile for M; with and without the skew bias; x also as the
        # first K columns of the wide build's buffer, a row stride of its own), SiLU-and-mul (into a plain buffer and
        # into the wide down build's), the top-k sum with and without the residual
        rc = router_config(M, E, K, dtype)
        xs = [x1] + [torch.zeros(1, K + p.columns, dtype=dtype, device=device)[:, :K]
                     for p in (c.alone["gate_up"], c.shared["gate_up"]) if p.columns]
        outs = [None] + [torch.empty(k, I + p.columns, dtype=dtype, device=device)[:, :I]
                         for p in (c.alone["down"], c.shared["down"]) if p.columns]
        jobs += [(f"router{b}_s{x.stride(0)}", rc, 0, lambda cf, x=x, b=b: route(x, router_w, k, bias if b else None,
                                                                                 config=cf))
                 for x in xs for b in (0, 1)]
        jobs += [(f"silu_s{o.stride(0) if o is not None else I}", None, 0, lambda cf, o=o: silu_and_mul(inter, out=o))
                 for o in outs]
        jobs += [("moe_sum", None, 0, lambda cf: moe_sum(y, k)), ("moe_sum_res", None, 0, lambda cf: moe_sum(y, k, x1))]
        for path in paths.PATHS.values():  # every path's builds the plan can pick at M
            jobs += path.warmup_jobs(c, M)
        for name, cfg, bm, fn in jobs:
            if (name, cfg, bm) not in seen:
                seen.add((name, cfg, bm))
                fn(cfg)
    runtime.synchronize(device)
    return len(seen)
