"""Base grouped GEMM with the MoE-LoRA delta fused into its epilogue (an experiment; tried, not in the
layer's plan: studies/kernels/tried/__init__.py).

Same alignment, grid and tiles as the base GEMM (`kernels/fused_moe.py`): one program computes a
BLOCK_M x BLOCK_N tile of out = x @ w[expert].T for one block of pairs (all of one expert), and
before its single store adds, for the pairs whose token has a live adapter,

    delta[pair, n] = (x[row(pair)] @ A[p(n), slot, expert].T) @ B[p(n), slot, expert, n - p(n)*NS].T

slot = lora_ids[token_lora_mapping[token]]; p(n) = n // NS is the slice of column n (gate_up: P=2,
columns [0, I) slice 0, [I, 2I) slice 1; down: P=1). With routed weights the tile is scaled after
the add: rw * (base + delta), the layout the separate kernels produce. So `out` is written once:
no read-add-write of `out` by a second kernel, no per-adapter alignment, and every x tile the base
loop loads also feeds the shrink.

The pairs of one block share an expert but may belong to different LoRA rows. The shrink is one
dot against the A tiles of ALL L rows side by side (C = L_POW2 * BLOCK_R columns, column c of row
c // BLOCK_R); each pair then keeps only its own row's R columns and the expand is one dot of
depth C against the matching B tiles. A row no pair of the block uses, a row without adapter
(lora_ids -1) or a disabled one is masked out of those loads (no memory traffic), though its MMA
work still runs: the matrix units need the tile whole. Rows of tokens without a live adapter keep
the base accumulator untouched (`where`, not `+ 0`, so even a -0.0 survives): bit for bit the
plain GEMM's output. The cost is the shrink, recomputed by each of a block's N tiles (its A tiles
come from L2 after the first): C/BLOCK_N more MMA work, which hurts where the base GEMM is
compute-bound (large M).
"""
import triton
import triton.language as tl

from lora_moe_lab.kernels.common import cdiv, pow2, stages_for
from lora_moe_lab.kernels.configs import GemmConfig, block_r, gemm_config
from lora_moe_lab.kernels.fused_moe import block_pairs, grouped_tile, moe_gemm
from lora_moe_lab.kernels.fused_moe_lora_packed import check_lora_gemm_inputs


@triton.jit(do_not_specialize=["num_pairs", "num_blocks", "L"])
def fused_moe_lora_epilogue_kernel(
    x_ptr, w_ptr, out_ptr, sorted_ids_ptr, expert_ids_ptr, ntpp_ptr, rw_ptr,  # as fused_moe_kernel
    a_ptr,  # (P, S, E, R, K) LoRA A
    b_ptr,  # (P, S, E, NS, R) LoRA B, scaling folded in; N = P * NS
    mapping_ptr,  # (M,) int32 LoRA row per token, -1 = none
    lora_ids_ptr,  # (L,) int32 weight slot per row, -1 = none
    enabled_ptr,  # (L,) int32 per row, 0 = disabled
    N, K, R, L, NS, num_pairs, num_blocks, top_k,
    stride_xm, stride_xk, stride_we, stride_wn, stride_wk, stride_om, stride_on,
    stride_ap, stride_as, stride_ae, stride_ar, stride_ak,
    stride_bp, stride_bs, stride_be, stride_bn, stride_br,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    BLOCK_R: tl.constexpr, L_POW2: tl.constexpr, P: tl.constexpr,
    GATHER: tl.constexpr, HAS_RW: tl.constexpr, STRADDLE: tl.constexpr,
):
    pid_m, pid_n = grouped_tile(tl.program_id(0), N, num_blocks, BLOCK_N, GROUP_M)
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
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)

    # ---- which LoRA columns this block needs: metadata only ----
    offs_c = tl.arange(0, L_POW2 * BLOCK_R)
    c_l = offs_c // BLOCK_R  # LoRA row of column c
    c_r = offs_c % BLOCK_R  # rank index of column c
    lrow = tl.load(mapping_ptr + tok, mask=valid, other=-1)
    lid = tl.load(lora_ids_ptr + c_l, mask=c_l < L, other=-1)
    en = tl.load(enabled_ptr + c_l, mask=c_l < L, other=0)
    hit = (lrow[:, None] == c_l[None, :]) & ((lid >= 0) & (en != 0))[None, :]  # pair m uses column c's row
    row_on = tl.max(hit.to(tl.int32), axis=1) > 0  # pairs that get a delta
    use_c = (tl.max(hit.to(tl.int32), axis=0) > 0) & (c_r < R)  # columns worth loading
    slot = tl.maximum(lid, 0).to(tl.int64)
    p0 = (pid_n * BLOCK_N) // NS  # slice of the tile's first column (both, if STRADDLE)

    x_ptrs = x_ptr + row[:, None] * stride_xm + offs_k[None, :] * stride_xk
    w_ptrs = w_ptr + expert * stride_we + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None] * stride_wk
    a_ptrs = (a_ptr + p0 * stride_ap + slot[None, :] * stride_as + expert * stride_ae + c_r[None, :] * stride_ar
              + offs_k[:, None] * stride_ak)  # (BLOCK_K, C): A.T tiles of every row side by side
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    t0 = tl.zeros((BLOCK_M, L_POW2 * BLOCK_R), dtype=tl.float32)
    t1 = tl.zeros((BLOCK_M, L_POW2 * BLOCK_R), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = offs_k < K - k0
        xt = tl.load(x_ptrs, mask=valid[:, None] & k_ok[None, :], other=0.0)
        wt = tl.load(w_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        at = tl.load(a_ptrs, mask=k_ok[:, None] & use_c[None, :], other=0.0)
        acc = tl.dot(xt, wt, acc)
        t0 = tl.dot(xt, at, t0)  # the shrink reuses the x tile already in shared memory
        if STRADDLE:  # the tile crosses into slice p0 + 1
            at1 = tl.load(a_ptrs + stride_ap, mask=k_ok[:, None] & use_c[None, :] & (p0 + 1 < P), other=0.0)
            t1 = tl.dot(xt, at1, t1)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk
        a_ptrs += BLOCK_K * stride_ak

    # ---- epilogue: each pair keeps its own row's R columns; one expand dot of depth C ----
    t0 = tl.where(hit, t0, 0.0).to(b_ptr.dtype.element_ty)
    p_n = offs_n // NS
    b_ptrs = (b_ptr + p_n[None, :] * stride_bp + slot[:, None] * stride_bs + expert * stride_be
              + (offs_n - p_n * NS)[None, :] * stride_bn + c_r[:, None] * stride_br)  # (C, BLOCK_N) = B.T tiles
    bt = tl.load(b_ptrs, mask=use_c[:, None] & n_ok[None, :], other=0.0)
    if STRADDLE:
        t1 = tl.where(hit, t1, 0.0).to(b_ptr.dtype.element_ty)
        d = tl.dot(t0, tl.where((p_n == p0)[None, :], bt, 0.0)) + tl.dot(t1, tl.where((p_n != p0)[None, :], bt, 0.0))
    else:
        d = tl.dot(t0, bt)
    acc = tl.where(row_on[:, None], acc + d, acc)  # rows without a live adapter: the base result untouched
    if HAS_RW:
        acc = acc * tl.load(rw_ptr + pair, mask=valid, other=0.0)[:, None]
    out_ptrs = out_ptr + pair[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=valid[:, None] & n_ok[None, :])


LAST_EPILOGUE_LAUNCH: dict = {}  # grid and tiles of the last launch (benchmarks, notebooks)


def moe_gemm_lora(x, w, align, top_k, out, lora_a, lora_b, token_lora_mapping, lora_ids, adapter_enabled, *,
                  routed_weights=None, gather=True, config: GemmConfig | None = None):
    """out[pair] = (x[row] @ w[e].T + delta[pair]) (* routed weight): the base GEMM (`moe_gemm`, same
    alignment) with the LoRA delta of the pair's token added before the store.

    lora_a (P, S, E, r, K), lora_b (P, S, E, N/P, r) with P = 2 (gate_up: columns [0, N/P) use slice
    0) or 1 (down); token_lora_mapping (M,) int32 LoRA row per token (-1: none); lora_ids /
    adapter_enabled (L,) int32 per row (weight slot or -1; 0 = disabled). Fully writes `out`.
    """
    N, K, num_pairs, bm, P, R, L = check_lora_gemm_inputs(x, w, align, top_k, out, lora_a, lora_b,
                                                          token_lora_mapping, lora_ids, adapter_enabled,
                                                          routed_weights, gather, "moe_gemm_lora")
    M = num_pairs // top_k
    if R == 0:  # nothing to add; decided from the static shape
        return moe_gemm(x, w, align, top_k, out, routed_weights=routed_weights, gather=gather, config=config)
    cfg = config or gemm_config(M, bm, N, K, w.shape[0])
    NS = N // P
    straddle = P == 2 and NS % cfg.block_n != 0  # some N tile holds columns of both slices
    br, lp = block_r(R), pow2(L)
    nb_launch = min(align.expert_ids.shape[1], num_pairs)  # as moe_gemm: a static bound on busy blocks
    grid = (nb_launch * cdiv(N, cfg.block_n),)
    tile_bytes = bm * cfg.block_k + cfg.block_k * cfg.block_n + cfg.block_k * lp * br * (2 if straddle else 1)
    stages = stages_for(cfg.num_stages, tile_bytes * x.element_size())
    fused_moe_lora_epilogue_kernel[grid](
        x, w, out, align.sorted_token_ids, align.expert_ids, align.num_tokens_post_padded,
        routed_weights if routed_weights is not None else out, lora_a, lora_b,
        token_lora_mapping, lora_ids, adapter_enabled,
        N, K, R, L, NS, num_pairs, nb_launch, top_k,
        x.stride(0), x.stride(1), *w.stride(), out.stride(0), out.stride(1), *lora_a.stride(), *lora_b.stride(),
        BLOCK_M=bm, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, BLOCK_R=br, L_POW2=lp, P=P,
        GATHER=bool(gather), HAS_RW=routed_weights is not None, STRADDLE=straddle,
        num_warps=cfg.num_warps, num_stages=stages,
    )
    LAST_EPILOGUE_LAUNCH.update(config=cfg, programs=grid[0], BLOCK_M=bm, BLOCK_R=br, L_POW2=lp, straddle=straddle,
                                num_stages=stages, lora_columns=lp * br, alignment_kernels="the base GEMM's only")
    return out
