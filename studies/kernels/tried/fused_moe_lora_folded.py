"""The LoRA path folded into the base GEMM: a small shrink kernel, then the base GEMM whose K loop
gets the expand as extra iterations (the base GEMM with LORA: the study's copy of it, tried/fused_moe_switches.py).

    t[pair, p]  = x[row(pair)] @ A[p, slot, expert].T                   (this file: one launch)
    out[pair]   = (x[row] @ w[expert].T + sum_p t[pair, p] @ B[p, slot, expert].T) (* routed weight)

slot = lora_ids[token_lora_mapping[token]]; p the slice of the output column (gate_up: P = 2, down: 1).

Why fold. The separate delta (kernels/fused_moe_lora.py) reads and writes `out` a second time: at
large M its down delta is a read-add-write stream of M*top_k*hidden elements, bound by HBM. Here the
delta is added in the GEMM's fp32 accumulator before its one store, so LoRA moves only its own
bytes: x once more for the shrink (from L2 for gate_up, where 8 pairs share a token row), the tiny
(EM, P, BLOCK_R) intermediate t (in the alignment's order: row i belongs to the pair at place i),
and A and B. Its compute is BLOCK_R-deep dots: one per LoRA
row present in a tile, against a base K of hidden (gate_up) or intermediate (down).

The shrink runs over the base GEMM's alignment (blocks of one expert, no per-adapter alignment).
The pairs of a block may belong to different LoRA rows, so one dot computes the block against the A
tiles of all L rows side by side (L_POW2 * BLOCK_R columns), and each pair keeps the BLOCK_R columns
of its own row. Columns of rows no pair of the block uses, and every column past the rank, load
nothing. A block with no live adapter returns after its metadata loads, and so does every block
of an all-disabled launch: under CUDA-graph capture both kernels launch unconditionally, and the
GPU decides (the zero-cost guard). The shrink writes only the rows of pairs with a live adapter;
the GEMM masks every other row of t to zero.

Measured on the H200 (data/kernels/fold_s2_* .. fold_s6_*; studies/kernels/README.md): on the base alignment it
is slower than the separate deltas at every size. The layer's build (an alignment ordered by LoRA row,
`shrink_per_row`, pointer loads in the expand) beats them on the down GEMM at M >= 4096 only. The whole
layer gained at M >= 8192 (fold_s8, fold_s9) until the base GEMM at TP=4 down took its sub-block build, which the
folded GEMM does not share; since then it loses at TP=4 (fold_s10, fold_s11). The layer folds with the packed build
(lora_moe_lab/kernels/fused_moe_lora_packed.py, the plan's `packed` and `wide` paths) instead.
"""
import torch
import triton
import triton.language as tl

from lora_moe_lab.kernels.common import pow2, stages_for
from lora_moe_lab.kernels.configs import GemmConfig, block_r
from lora_moe_lab.kernels.fused_moe import block_pairs, moe_gemm
from lora_moe_lab.kernels.fused_moe_lora_packed import check_lora_gemm_inputs
from studies.kernels.tried.fused_moe_switches import Folded, fold_tma_ok, moe_gemm_switches

LAST_FOLDED_LAUNCH: dict = {}  # the last launch's shrink grid and tiles (benchmarks, notebooks)


@triton.jit(do_not_specialize=["num_pairs", "L"])
def lora_shrink_kernel(
    x_ptr,  # (rows, K) activations, rows = M (GATHER) or M*top_k
    a_ptr,  # (P, S, E, R, K) LoRA A
    t_ptr,  # (EM, P, BLOCK_R) out, in the alignment's order: each pair's shrink by its own row's A (live rows only)
    sorted_ids_ptr, expert_ids_ptr, ntpp_ptr,  # the base GEMM's alignment (S=1)
    mapping_ptr, lora_ids_ptr, enabled_ptr,  # (M,) LoRA row per token (-1 none); (L,) slot (-1 none), enabled
    K, R, L, num_pairs, top_k,
    stride_xm, stride_xk, stride_ap, stride_as, stride_ae, stride_ar, stride_ak, stride_tm, stride_tp,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr, L_POW2: tl.constexpr,
    GATHER: tl.constexpr, PER_ROW: tl.constexpr = False,
):
    pid_m = tl.program_id(0)
    p = tl.program_id(1)  # the slice
    if pid_m * BLOCK_M >= tl.load(ntpp_ptr):
        return
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    if expert < 0:
        return
    pair, valid = block_pairs(sorted_ids_ptr, pid_m, num_pairs, BLOCK_M)
    tok = pair // top_k
    if GATHER:
        row = tok
    else:
        row = pair
    # Which of the L_POW2 * BLOCK_R side-by-side columns each pair keeps: metadata only.
    offs_c = tl.arange(0, L_POW2 * BLOCK_R)
    c_l = offs_c // BLOCK_R  # LoRA row of column c
    c_r = offs_c % BLOCK_R  # rank index of column c
    lrow = tl.load(mapping_ptr + tok, mask=valid, other=-1)
    lid = tl.load(lora_ids_ptr + c_l, mask=c_l < L, other=-1)
    en = tl.load(enabled_ptr + c_l, mask=c_l < L, other=0)
    hit = (lrow[:, None] == c_l[None, :]) & ((lid >= 0) & (en != 0))[None, :]  # pair m keeps column c
    row_on = tl.max(hit.to(tl.int32), axis=1) > 0  # pairs with a live adapter
    if tl.max(row_on.to(tl.int32), 0) == 0:  # nothing live in this block (every block, all disabled)
        return
    offs_k = tl.arange(0, BLOCK_K)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # the pair's place in the alignment: the GEMM's tile is one box
    offs_r = tl.arange(0, BLOCK_R)
    if PER_ROW:  # one K loop per LoRA row present: R columns of MMA per pair (few rows per block when the
        # alignment is ordered by LoRA row, `moe_align(order_by=)`), an accumulator of BLOCK_R columns
        _shrink_rows(x_ptr, a_ptr, t_ptr, row, valid, lrow, expert, p, lora_ids_ptr, enabled_ptr, rows, K, R, L,
                     stride_xm, stride_xk, stride_ap, stride_as, stride_ae, stride_ar, stride_ak, stride_tm,
                     stride_tp, BLOCK_M, BLOCK_K, BLOCK_R)
        return
    use_c = (tl.max(hit.to(tl.int32), axis=0) > 0) & (c_r < R)  # columns worth loading
    slot = tl.maximum(lid, 0).to(tl.int64)
    x_ptrs = x_ptr + row[:, None] * stride_xm + offs_k[None, :] * stride_xk
    a_ptrs = (a_ptr + p * stride_ap + slot[None, :] * stride_as + expert * stride_ae + c_r[None, :] * stride_ar
              + offs_k[:, None] * stride_ak)  # (BLOCK_K, C): the A.T tiles of every row side by side
    t = tl.zeros((BLOCK_M, L_POW2 * BLOCK_R), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = offs_k < K - k0
        xt = tl.load(x_ptrs, mask=row_on[:, None] & k_ok[None, :], other=0.0)  # pairs without adapter: no bytes
        at = tl.load(a_ptrs, mask=k_ok[:, None] & use_c[None, :], other=0.0)
        t = tl.dot(xt, at, t)
        x_ptrs += BLOCK_K * stride_xk
        a_ptrs += BLOCK_K * stride_ak
    # Each pair's own row: the other rows' columns zeroed, then the L_POW2 groups summed (one is non-zero).
    own = tl.sum(tl.reshape(tl.where(hit, t, 0.0), (BLOCK_M, L_POW2, BLOCK_R)), axis=1)
    # The intermediate is kept in the weights' dtype, as the matrix units take it (the separate kernel
    # casts its register tile the same way); columns past the rank hold exact zeros.
    tl.store(t_ptr + rows[:, None] * stride_tm + p * stride_tp + offs_r[None, :], own.to(t_ptr.dtype.element_ty),
             mask=row_on[:, None])


@triton.jit
def _shrink_rows(x_ptr, a_ptr, t_ptr, row, valid, lrow, expert, p, lora_ids_ptr, enabled_ptr, rows, K, R, L,
                 stride_xm, stride_xk, stride_ap, stride_as, stride_ae, stride_ar, stride_ak, stride_tm, stride_tp,
                 BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr):
    """The block's shrink one live LoRA row at a time: x tiles of that row's pairs only (the others load
    nothing), against that slot's A tile; each row's result stored for its own pairs."""
    offs_k = tl.arange(0, BLOCK_K)
    offs_r = tl.arange(0, BLOCK_R)
    r_ok = offs_r < R
    for l in range(0, L):
        here = valid & (lrow == l)
        live = (tl.load(lora_ids_ptr + l) >= 0) & (tl.load(enabled_ptr + l) != 0)
        if live & (tl.max(here.to(tl.int32), 0) > 0):
            slot = tl.maximum(tl.load(lora_ids_ptr + l), 0).to(tl.int64)
            x_ptrs = x_ptr + row[:, None] * stride_xm + offs_k[None, :] * stride_xk
            a_ptrs = (a_ptr + p * stride_ap + slot * stride_as + expert * stride_ae + offs_r[None, :] * stride_ar
                      + offs_k[:, None] * stride_ak)  # (BLOCK_K, BLOCK_R) = A.T tile
            t = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                k_ok = offs_k < K - k0
                xt = tl.load(x_ptrs, mask=here[:, None] & k_ok[None, :], other=0.0)
                at = tl.load(a_ptrs, mask=k_ok[:, None] & r_ok[None, :], other=0.0)
                t = tl.dot(xt, at, t)
                x_ptrs += BLOCK_K * stride_xk
                a_ptrs += BLOCK_K * stride_ak
            tl.store(t_ptr + rows[:, None] * stride_tm + p * stride_tp + offs_r[None, :], t.to(t_ptr.dtype.element_ty),
                     mask=here[:, None])


def lora_shrink(x, lora_a, align, top_k, token_lora_mapping, lora_ids, adapter_enabled, t, *, gather=True,
                block_k: int = 64, num_warps: int = 4, num_stages: int = 3, per_row: bool = False):
    """t[i, p, :r] = x[row(pair)] @ A[p, slot(pair), expert(pair)].T for the pair at place i of the alignment
    (sorted_token_ids[0, i]) whose token has a live adapter (other rows of t are left as they are); t (EM, P,
    BLOCK_R), BLOCK_R = block_r(r). Inputs as `moe_gemm_lora_folded` (checked there). per_row: one K loop
    per LoRA row present in a block (R columns of MMA per pair) instead of all rows side by side."""
    P, S, E, R, K = lora_a.shape
    L = lora_ids.shape[0]
    num_pairs = token_lora_mapping.shape[0] * top_k
    bm = align.block_m
    br, lp = t.shape[2], pow2(L)
    nb_launch = min(align.expert_ids.shape[1], num_pairs)  # as moe_gemm: a static bound on busy blocks
    bk = min(block_k, max(16, triton.next_power_of_2(K)))
    stages = stages_for(num_stages, (bm * bk + bk * (1 if per_row else lp) * br) * x.element_size())
    lora_shrink_kernel[(nb_launch, P)](
        x, lora_a, t, align.sorted_token_ids, align.expert_ids, align.num_tokens_post_padded,
        token_lora_mapping, lora_ids, adapter_enabled,
        K, R, L, num_pairs, top_k, x.stride(0), x.stride(1), *lora_a.stride(), t.stride(0), t.stride(1),
        BLOCK_M=bm, BLOCK_K=bk, BLOCK_R=br, L_POW2=lp, GATHER=bool(gather), PER_ROW=bool(per_row),
        num_warps=num_warps, num_stages=stages,
    )
    LAST_FOLDED_LAUNCH.update(shrink_programs=nb_launch * P, BLOCK_M=bm, BLOCK_K=bk, BLOCK_R=br, L_POW2=lp,
                              shrink_columns=br if per_row else lp * br, shrink_stages=stages, shrink_per_row=per_row)
    return t


def moe_gemm_lora_folded(x, w, align, top_k, out, lora_a, lora_b, token_lora_mapping, lora_ids, adapter_enabled, *,
                         routed_weights=None, gather=True, config: GemmConfig | None = None, shrink_out=None,
                         fold_desc: bool = False, shrink_per_row: bool = False):
    """out[pair] = (x[row] @ w[e].T + delta[pair]) (* routed weight), as `moe_gemm_lora` (same arguments,
    same result), computed as the shrink kernel + the base GEMM with the expand in its K loop. Fully
    writes `out`; pairs without a live adapter get the plain GEMM's output bit for bit.
    shrink_out: an optional (EM, P, BLOCK_R) buffer for the intermediate, in the alignment's order (else one is
    allocated). fold_desc: the GEMM reads the intermediate and B through TMA descriptors where they allow it
    (`fused_moe_switches.fold_tma_ok`). Off by default: on the H200 (data/kernels/fold_s2) the TMA build was 1.01-2.06x
    slower than pointer loads at all 28 points, with 12-21 % more instructions and about as many registers.
    shrink_per_row: the shrink loops over the LoRA rows present in each block (`lora_shrink(per_row=)`), for
    an alignment ordered by LoRA row (`moe_align(order_by=token_lora_mapping)`)."""
    N, K, num_pairs, bm, P, R, L = check_lora_gemm_inputs(x, w, align, top_k, out, lora_a, lora_b,
                                                          token_lora_mapping, lora_ids, adapter_enabled,
                                                          routed_weights, gather, "moe_gemm_lora_folded")
    if R == 0:  # nothing to add; decided from the static shape
        return moe_gemm(x, w, align, top_k, out, routed_weights=routed_weights, gather=gather, config=config)
    shape = (align.sorted_token_ids.shape[1], P, block_r(R))
    if shrink_out is None:
        t = torch.empty(shape, dtype=x.dtype, device=x.device)
    elif shrink_out.shape != shape or shrink_out.dtype != x.dtype or not shrink_out.is_contiguous():
        raise ValueError(f"shrink_out must be a contiguous {x.dtype} tensor of shape (EM, P, BLOCK_R)={shape}, "
                         f"got {shrink_out.dtype} {tuple(shrink_out.shape)}")
    else:
        t = shrink_out
    lora_shrink(x, lora_a, align, top_k, token_lora_mapping, lora_ids, adapter_enabled, t, gather=gather,
                per_row=shrink_per_row)
    moe_gemm_switches(x, w, align, top_k, out, routed_weights=routed_weights, gather=gather, config=config,
                      lora=Folded(t, lora_b, token_lora_mapping, lora_ids, adapter_enabled, fold_desc))
    LAST_FOLDED_LAUNCH.update(fold_desc=fold_desc and fold_tma_ok(t, lora_b))
    return out
