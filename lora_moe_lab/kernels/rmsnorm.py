"""RMSNorm as one Triton kernel (with its launcher `rmsnorm`).

Why a kernel for something this small: in eager mode every torch op is a separate launch that
costs the host ~5-15 us. The unfused norm is 8 ops (upcast, square, mean, add eps, rsqrt, two
multiplies, downcast); at 48 layers that is ~400 launches per forward spent on one norm. One
program per row reads it once, reduces in fp32 and writes it once.
"""
import torch
import triton
import triton.language as tl

from .common import rows_out


@triton.jit
def rmsnorm_kernel(x_ptr, w_ptr, out_ptr, K, eps, stride_x, stride_o, BLOCK_K: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_K)
    ok = offs < K
    x = tl.load(x_ptr + row * stride_x + offs, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / K + eps)
    tl.store(out_ptr + row * stride_o + offs, (x * inv * w).to(out_ptr.dtype.element_ty), mask=ok)


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """One program per row: y = x / rms(x) * w, reduced in fp32; into `out` when given (rows of unit column stride,
    e.g. the first K columns of the wide build's x buffer: the MoE layer's gate_up reads the adapters' columns
    past K in the same rows)."""
    if x.dim() != 2 or w.shape != (x.shape[1],):
        raise ValueError(f"rmsnorm: x must be (M, K) and w (K,), got {tuple(x.shape)} and {tuple(w.shape)}")
    if x.stride(1) != 1 or not w.is_contiguous():
        raise ValueError("rmsnorm: x rows and w must be contiguous")
    out = rows_out("rmsnorm", out, x, tuple(x.shape))
    K = x.shape[1]
    rmsnorm_kernel[(x.shape[0],)](x, w, out, K, eps, x.stride(0), out.stride(0),
                                  BLOCK_K=triton.next_power_of_2(K), num_warps=4 if K <= 4096 else 8)
    return out
