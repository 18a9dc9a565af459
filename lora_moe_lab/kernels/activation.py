"""SiLU-and-mul as one Triton kernel (with its launcher `silu_and_mul`): out[:, :I] = silu(g) * u, g = inter[:, :I],
u = inter[:, I:], computed in fp32 and rounded once.

Why a kernel: the torch version is two kernels (silu of the gate half, then the product with the up half), so it
writes the (M*top_k, I) silu and reads it back: inter's gate half makes two trips through HBM and the result is
rounded twice. One program per (row, column block) reads g and u once and writes the product once. `out` may be the
first I columns of a wider buffer (row stride > I: the down GEMM's wide build reads its adapters' columns past I in
the same rows).
"""
import torch
import triton
import triton.language as tl

from .common import FLOAT_DTYPES, cdiv, check_compute_dtype, check_tensor, pow2, rows_out


@triton.jit
def silu_and_mul_kernel(inter_ptr, out_ptr, I, stride_in, stride_out, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < I
    g = tl.load(inter_ptr + row * stride_in + offs, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(inter_ptr + row * stride_in + I + offs, mask=ok, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + row * stride_out + offs, y.to(out_ptr.dtype.element_ty), mask=ok)


def silu_and_mul(inter: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """silu(inter[:, :I]) * inter[:, I:] for inter (rows, 2I) with unit column stride; into `out` (rows, I) of
    inter's dtype with unit column stride (any row stride) when given."""
    check_tensor("inter", inter, 2, FLOAT_DTYPES, contiguous=False)
    check_compute_dtype(inter)
    rows, I2 = inter.shape
    if I2 % 2 or inter.stride(1) != 1:
        raise ValueError(f"silu_and_mul: inter must be (rows, 2I) with unit column stride, got {tuple(inter.shape)} "
                         f"strides {inter.stride()}")
    I = I2 // 2
    out = rows_out("silu_and_mul", out, inter, (rows, I))
    if rows:
        block = min(1024, max(16, pow2(I)))
        silu_and_mul_kernel[(rows, cdiv(I, block))](inter, out, I, inter.stride(0), out.stride(0), BLOCK=block,
                                                    num_warps=4)
    return out
