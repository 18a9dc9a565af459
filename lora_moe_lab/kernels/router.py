"""The MoE router as one Triton kernel (with its launcher `route`): logits = x @ W.T (+ the skew bias), accumulated
in fp32, with softmax, top-k and renormalisation in the epilogue. Returns (topk_w fp32 (M, top_k), topk_ids int32
(M, top_k)), the best expert first, as `MoELayer.route` on the torch backend.

Why a kernel: the fp32 router it replaces upcast x first (a copy that writes M*K*4 bytes and reads them back), ran
its GEMM in fp32, off the tensor cores (cuBLAS: the GEMM and a split-K reduce), then softmax, top-k, renormalise and
the id cast as ~6 small kernels. Here x and W are read once, in the model dtype, and the dots run on the tensor
cores with an fp32 accumulator. In bf16 every product x_i * w_i is exact in fp32 (8 + 8 significant bits), so the
logits differ from the fp32 GEMM's in the accumulation order only. fp32 inputs take IEEE fp32 dots (no tf32): the
router stays as precise as it was. Only the (M, top_k) weights and ids are written.

One program holds a BLOCK_M x BLOCK_N tile of logits with every expert in it (BLOCK_N = the next power of two >= E,
at most 256), so the epilogue needs nothing from another program:
  - top-k is TOP_K rounds of a max over the row's experts still free; the lowest expert id wins an exact tie, and
    the winner is taken out for the next round. Selecting on logits is selecting on probabilities (exp is
    monotone), without exp's rounding. A NaN logit counts as +inf (the weights of its row come out NaN, its ids
    stay distinct experts in range: a NaN row never sends a pair to an expert that does not exist);
  - the softmax denominator cancels in the renormalisation: w_j = exp(l_j - l_max) / sum over the chosen experts
    of exp(l_i - l_max), the softmax of the chosen logits (l_max: the first one chosen).
"""
import torch
import triton
import triton.language as tl

from .. import runtime
from .common import FLOAT_DTYPES, cdiv, check_compute_dtype, check_tensor, pow2, stages_for

MAX_EXPERTS = 256  # one tile holds every expert's logit


@triton.jit(do_not_specialize=["M"])  # one binary for every M (a warm-up covers all M; capture never compiles)
def router_kernel(x_ptr, w_ptr, bias_ptr, tw_ptr, ids_ptr, M, E, K, stride_x, stride_w,
                  TOP_K: tl.constexpr, BLOCK_TK: tl.constexpr, HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    ex = tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_K)
    row_ok, ex_ok = rows < M, ex < E
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + cols
        xt = tl.load(x_ptr + rows[:, None] * stride_x + kk[None, :], mask=row_ok[:, None] & (kk < K)[None, :],
                     other=0.0)
        wt = tl.load(w_ptr + ex[None, :] * stride_w + kk[:, None], mask=ex_ok[None, :] & (kk < K)[:, None],
                     other=0.0)
        acc = tl.dot(xt, wt, acc, input_precision=PRECISION)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + ex, mask=ex_ok, other=0.0).to(tl.float32)[None, :]
    logit = tl.where(acc != acc, float("inf"), acc)  # NaN -> +inf: ids stay in range
    free = tl.broadcast_to(ex_ok[None, :], (BLOCK_M, BLOCK_N))  # experts not chosen yet
    slot = tl.arange(0, BLOCK_TK)
    top_w = tl.zeros((BLOCK_M, BLOCK_TK), dtype=tl.float32)
    top_i = tl.zeros((BLOCK_M, BLOCK_TK), dtype=tl.int32)
    lmax = tl.max(tl.where(free, logit, float("-inf")), axis=1)  # the first expert chosen
    for j in tl.static_range(TOP_K):
        cand = tl.where(free, logit, float("-inf"))
        best = tl.max(cand, axis=1)
        arg = tl.min(tl.where(free & (cand == best[:, None]), ex[None, :], BLOCK_N), axis=1)
        free = free & (ex[None, :] != arg[:, None])
        top_w = tl.where(slot[None, :] == j, tl.exp(best - lmax)[:, None], top_w)
        top_i = tl.where(slot[None, :] == j, arg[:, None], top_i)
    top_w = top_w / tl.sum(top_w, axis=1)[:, None]
    at = rows[:, None] * TOP_K + slot[None, :]
    ok = row_ok[:, None] & (slot[None, :] < TOP_K)
    tl.store(tw_ptr + at, top_w, mask=ok)
    tl.store(ids_ptr + at, top_i, mask=ok)


def router_config(M: int, E: int, K: int, dtype: torch.dtype) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_K, num_warps, num_stages) from static shapes only. Decode sizes take 16-row tiles (more
    programs share the weight's read), larger M 64-row ones (W is re-read from L2 once per tile: fewer tiles). Not
    tuned on a GPU yet. Under the interpreter one small tile."""
    bn = max(16, pow2(E))
    if runtime.interpreter():
        return 16, min(64, max(16, pow2(K))), 4, 1
    bm, bk = (16, 128) if M <= 128 else (64, 64)
    size = torch.empty(0, dtype=dtype).element_size()
    return bm, bk, 4 if bm * bn <= 4096 else 8, stages_for(4, (bm + bn) * bk * size)


def route(x: torch.Tensor, w: torch.Tensor, top_k: int, bias: torch.Tensor | None = None, *, out=None, config=None):
    """(topk_w fp32 (M, top_k), topk_ids int32 (M, top_k)): softmax(x @ w.T + bias) over E experts, its top_k,
    renormalised; fp32 accumulation. x (M, K) with unit column stride (a view of a wider buffer is fine), w (E, K)
    in x's dtype, bias (E,) or None; out: the two contiguous buffers to write, or None (new ones); config:
    `router_config`'s tuple (a warm-up compiles another M's), or None (M's own)."""
    check_tensor("x", x, 2, FLOAT_DTYPES, contiguous=False)
    check_compute_dtype(x)
    check_tensor("router_w", w, 2, (x.dtype,), x.device)
    M, K = x.shape
    E = w.shape[0]
    if w.shape[1] != K or x.stride(1) != 1:
        raise ValueError(f"route: x must be (M, K) with unit column stride and router_w (E, K), got "
                         f"{tuple(x.shape)} strides {x.stride()} and {tuple(w.shape)}")
    if not 1 <= E <= MAX_EXPERTS:
        raise ValueError(f"route: the router kernel holds every expert in one tile: E must be in 1..{MAX_EXPERTS}, "
                         f"got {E}")
    if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= E:
        raise ValueError(f"route: top_k must be an int in 1..E={E}, got {top_k!r}")
    if bias is not None:
        check_tensor("router bias", bias, 1, FLOAT_DTYPES, x.device)
        if bias.shape != (E,):
            raise ValueError(f"route: bias must be (E,)=({E},), got {tuple(bias.shape)}")
    if out is None:
        out = (torch.empty(M, top_k, dtype=torch.float32, device=x.device),
               torch.empty(M, top_k, dtype=torch.int32, device=x.device))
    tw, ids = out
    check_tensor("topk_w", tw, 2, (torch.float32,), x.device)
    check_tensor("topk_ids", ids, 2, (torch.int32,), x.device)
    if tw.shape != (M, top_k) or ids.shape != (M, top_k):
        raise ValueError(f"route: out must be two ({M}, {top_k}) buffers, got {tuple(tw.shape)}, {tuple(ids.shape)}")
    if M == 0:
        return tw, ids
    bm, bk, warps, stages = config or router_config(M, E, K, x.dtype)
    router_kernel[(cdiv(M, bm),)](x, w, w if bias is None else bias, tw, ids, M, E, K, x.stride(0), w.stride(0),
                                  TOP_K=top_k, BLOCK_TK=pow2(top_k), HAS_BIAS=bias is not None,
                                  PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
                                  BLOCK_M=bm, BLOCK_N=max(16, pow2(E)), BLOCK_K=bk, num_warps=warps,
                                  num_stages=stages)
    return tw, ids
