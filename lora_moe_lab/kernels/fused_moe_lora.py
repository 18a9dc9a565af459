"""Fused MoE-LoRA shrink + expand (one `@triton.jit` kernel; launcher: `lora_moe_lab.triton_ops.lora_delta`).

For every adapter slot s and every (token, k) pair of that slot routed to expert e:

    out[pair, p*N:(p+1)*N] += (x[row(pair)] @ A[p, s, e].T) @ B[p, s, e].T   (* routed_weight[pair])

for the P slices p (P=2: gate and up of gate_up, which share the same x rows; P=1: down).

One program owns one block of BLOCK_M pairs of one slot's alignment (all of one expert) and a
1/SPLIT_N share of the N columns:
  * shrink: t_p = x_rows @ A[p, s, e].T for every slice, a (BLOCK_M, BLOCK_R) fp32 tile that stays in
    registers; each x tile is loaded once and used for both slices;
  * expand: for its N columns, out += t_p @ B[p, s, e].T, read-add-write of `out` in place.
No intermediate ever goes to memory and nothing is zero-filled. At small M there are few blocks, so
SPLIT_N > 1 spreads the columns of one block over several programs (each recomputes the cheap
shrink, whose A tiles then come from L2) to occupy more SMs.

Early exit (DESIGN.md): the program returns before loading any activation or weight when its slot's
lora_ids entry is -1, the adapter is disabled, its block starts at or past the slot's
num_tokens_post_padded, or the block's expert id is -1. The four metadata words are loaded together
(one memory latency), so an all-disabled launch costs about an empty launch. With WRITE_EXIT the
program records why it stopped: 0 ran, 1 lora_id -1, 2 disabled, 3 past the end, 4 expert -1.

The rank is zero-padded to the pool's max rank R; BLOCK_R = next power of two >= max(R, 16) (the
matrix units need 16) and rows >= R are masked, so smaller ranks cost nothing extra in memory.
"""
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["num_pairs", "num_blocks"])
def fused_moe_lora_kernel(
    x_ptr,  # (rows, K) activations; rows = M (GATHER) or M*top_k
    a_ptr,  # (P, S, E, R, K) LoRA A (shrink), R = padded max rank
    b_ptr,  # (P, S, E, N, R) LoRA B (expand), scaling folded in
    out_ptr,  # (M*top_k, P*N): the delta is ADDED here in place
    sorted_ids_ptr,  # (S, EM) int32 per-slot alignment, sentinel = num_pairs
    expert_ids_ptr,  # (S, EM // BLOCK_M) int32, -1 = unused block
    ntpp_ptr,  # (S,) int32 num_tokens_post_padded per slot
    lora_ids_ptr,  # (S,) int32, -1 = no adapter in this slot
    enabled_ptr,  # (S,) int32, 0 = adapter disabled for this batch
    rw_ptr,  # (M*top_k,) float32 routed weights (HAS_RW only)
    exit_ptr,  # (S, EM // BLOCK_M) int32 exit codes (WRITE_EXIT only)
    N, K, R,
    num_pairs,  # M * top_k, also the sentinel
    num_blocks,  # blocks launched per slot: EM // BLOCK_M, or min(that, num_pairs) (busy ones lie first)
    top_k,
    n_per_split,  # columns per program along N, a multiple of BLOCK_N
    stride_xm, stride_xk,
    stride_ap, stride_as, stride_ae, stride_ar, stride_ak,
    stride_bp, stride_bs, stride_be, stride_bn, stride_br,
    stride_om, stride_on,
    stride_ss,  # sorted_ids row stride (EM)
    stride_es,  # expert_ids row stride (EM // BLOCK_M)
    P: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_R: tl.constexpr, SPLIT_N: tl.constexpr,
    GATHER: tl.constexpr, HAS_RW: tl.constexpr, WRITE_EXIT: tl.constexpr,
):
    # Program order: the SPLIT_N programs of one block are neighbours (they share A tiles in L2),
    # then the blocks of one slot, then the slots.
    pid = tl.program_id(0)
    pid_n = pid % SPLIT_N
    blk = pid // SPLIT_N
    slot = blk // num_blocks
    b = blk % num_blocks

    # ---- early exits: metadata only, loaded together, before any activation/weight load ----
    lora_id = tl.load(lora_ids_ptr + slot)
    enabled = tl.load(enabled_ptr + slot)
    ntpp = tl.load(ntpp_ptr + slot)
    expert = tl.load(expert_ids_ptr + slot * stride_es + b)
    if lora_id == -1:
        if WRITE_EXIT:
            tl.store(exit_ptr + slot * num_blocks + b, 1)
        return
    if enabled == 0:
        if WRITE_EXIT:
            tl.store(exit_ptr + slot * num_blocks + b, 2)
        return
    if b * BLOCK_M >= ntpp:
        if WRITE_EXIT:
            tl.store(exit_ptr + slot * num_blocks + b, 3)
        return
    if expert == -1:
        if WRITE_EXIT:
            tl.store(exit_ptr + slot * num_blocks + b, 4)
        return
    if WRITE_EXIT:
        tl.store(exit_ptr + slot * num_blocks + b, 0)

    # ---- rows of this block ----
    offs_m = tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ids_ptr + slot * stride_ss + b * BLOCK_M + offs_m)
    valid = pair < num_pairs
    pair = tl.where(valid, pair, 0).to(tl.int64)  # padded rows: in-bounds address, masked anyway
    if GATHER:
        row = pair // top_k
    else:
        row = pair
    offs_r = tl.arange(0, BLOCK_R)
    r_ok = offs_r < R
    offs_k = tl.arange(0, BLOCK_K)
    a_base = a_ptr + slot.to(tl.int64) * stride_as + expert.to(tl.int64) * stride_ae
    b_base = b_ptr + slot.to(tl.int64) * stride_bs + expert.to(tl.int64) * stride_be

    # ---- shrink: t_p = x_rows @ A[p].T, x tile loaded once for both slices ----
    x_ptrs = x_ptr + row[:, None] * stride_xm + offs_k[None, :] * stride_xk
    a_ptrs = a_base + offs_k[:, None] * stride_ak + offs_r[None, :] * stride_ar  # (BLOCK_K, BLOCK_R) = A.T tile
    t0 = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    t1 = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = offs_k < K - k0
        xt = tl.load(x_ptrs, mask=valid[:, None] & k_ok[None, :], other=0.0)
        at0 = tl.load(a_ptrs, mask=k_ok[:, None] & r_ok[None, :], other=0.0)
        t0 = tl.dot(xt, at0, t0)
        if P == 2:
            at1 = tl.load(a_ptrs + stride_ap, mask=k_ok[:, None] & r_ok[None, :], other=0.0)
            t1 = tl.dot(xt, at1, t1)
        x_ptrs += BLOCK_K * stride_xk
        a_ptrs += BLOCK_K * stride_ak

    # The rank-R intermediate goes into the expand dot in the weights' dtype (as the matrix units
    # take it); the expand accumulates in fp32.
    t0 = t0.to(b_ptr.dtype.element_ty)
    t1 = t1.to(b_ptr.dtype.element_ty)
    if HAS_RW:
        rw = tl.load(rw_ptr + pair, mask=valid, other=0.0)

    # ---- expand: out[:, p*N + n] += t_p @ B[p].T over this program's share of N ----
    offs_n = tl.arange(0, BLOCK_N)
    n_start = pid_n * n_per_split
    for n0 in range(0, n_per_split, BLOCK_N):
        n = n_start + n0 + offs_n
        n_ok = n < N
        b_ptrs = b_base + n[None, :] * stride_bn + offs_r[:, None] * stride_br  # (BLOCK_R, BLOCK_N) = B.T tile
        b_mask = r_ok[:, None] & n_ok[None, :]
        o_mask = valid[:, None] & n_ok[None, :]
        o_ptrs = out_ptr + pair[:, None] * stride_om + n[None, :] * stride_on
        # All loads of the iteration first (both slices), then the dots, then the stores: the
        # compiler may not move a load of `out` above a store to `out`, so this order keeps the
        # two slices' memory round trips overlapped instead of back to back.
        bt0 = tl.load(b_ptrs, mask=b_mask, other=0.0)
        o0 = tl.load(o_ptrs, mask=o_mask, other=0.0)
        if P == 2:
            bt1 = tl.load(b_ptrs + stride_bp, mask=b_mask, other=0.0)
            o1 = tl.load(o_ptrs + N * stride_on, mask=o_mask, other=0.0)
        d0 = tl.dot(t0, bt0)
        if HAS_RW:
            d0 = d0 * rw[:, None]
        tl.store(o_ptrs, (o0.to(tl.float32) + d0).to(out_ptr.dtype.element_ty), mask=o_mask)
        if P == 2:
            d1 = tl.dot(t1, bt1)
            if HAS_RW:
                d1 = d1 * rw[:, None]
            tl.store(o_ptrs + N * stride_on, (o1.to(tl.float32) + d1).to(out_ptr.dtype.element_ty), mask=o_mask)
