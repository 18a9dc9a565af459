"""RMSNorm launcher (Triton kernel on GPU / interpreter) with a torch fallback."""
from __future__ import annotations

import torch


def rmsnorm_torch(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def rmsnorm_triton(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    import triton

    from .kernels.rmsnorm import rmsnorm_kernel

    if x.dim() != 2 or w.shape != (x.shape[1],):
        raise ValueError(f"rmsnorm: x must be (M, K) and w (K,), got {tuple(x.shape)} and {tuple(w.shape)}")
    if x.stride(1) != 1 or not w.is_contiguous():
        raise ValueError("rmsnorm: x rows and w must be contiguous")
    out = torch.empty_like(x)
    K = x.shape[1]
    rmsnorm_kernel[(x.shape[0],)](x, w, out, K, eps, x.stride(0), out.stride(0),
                                  BLOCK_K=triton.next_power_of_2(K), num_warps=4 if K <= 4096 else 8)
    return out
