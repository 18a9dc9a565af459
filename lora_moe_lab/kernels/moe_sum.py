"""The top-k sum with the residual as one Triton reduction kernel (with its launcher `moe_sum`):
h_new[t] = residual[t] + sum_j y[t * top_k + j], accumulated in fp32 and rounded once (the routed weights were
applied inside the down GEMM).

Why a kernel: `y.view(M, top_k, K).sum(1)` and then `h + that` are two kernels: the (M, K) sum is written and read
back, one more pass over M*K, and the stream is rounded twice. One program per (token, column block) reads the
token's top_k rows and its residual row once and writes h_new once. Without a residual it is the plain top-k sum.
"""
import torch
import triton
import triton.language as tl

from .common import FLOAT_DTYPES, cdiv, check_compute_dtype, check_tensor, pow2, rows_out


@triton.jit
def moe_sum_kernel(y_ptr, res_ptr, out_ptr, K, stride_y, stride_res, stride_out, TOP_K: tl.constexpr,
                   HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < K
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        acc += tl.load(y_ptr + (row * TOP_K + j) * stride_y + offs, mask=ok, other=0.0).to(tl.float32)
    if HAS_RES:
        acc += tl.load(res_ptr + row * stride_res + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + offs, acc.to(out_ptr.dtype.element_ty), mask=ok)


def moe_sum(y: torch.Tensor, top_k: int, residual: torch.Tensor | None = None,
            out: torch.Tensor | None = None) -> torch.Tensor:
    """(M, K) in y's dtype: the sum of each token's top_k rows of y (M*top_k, K), plus `residual` (M, K) when given;
    into `out` when given. Rows of unit column stride."""
    check_tensor("y", y, 2, FLOAT_DTYPES, contiguous=False)
    check_compute_dtype(y)
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k <= 0:
        raise ValueError(f"moe_sum: top_k must be a positive int, got {top_k!r}")
    P, K = y.shape
    if P % top_k or y.stride(1) != 1:
        raise ValueError(f"moe_sum: y must be (M*top_k, K) with unit column stride, got {tuple(y.shape)} strides "
                         f"{y.stride()} with top_k={top_k}")
    M = P // top_k
    if residual is not None:
        check_tensor("residual", residual, 2, (y.dtype,), y.device, contiguous=False)
        if residual.shape != (M, K) or residual.stride(1) != 1:
            raise ValueError(f"moe_sum: residual must be ({M}, {K}) with unit column stride, got "
                             f"{tuple(residual.shape)} strides {residual.stride()}")
    out = rows_out("moe_sum", out, y, (M, K))
    if M:
        block = min(1024, max(16, pow2(K)))
        res = y if residual is None else residual
        moe_sum_kernel[(M, cdiv(K, block))](y, res, out, K, y.stride(0), res.stride(0), out.stride(0), TOP_K=top_k,
                                            HAS_RES=residual is not None, BLOCK=block, num_warps=4)
    return out
