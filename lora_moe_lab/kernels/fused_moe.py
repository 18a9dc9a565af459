"""Base fused-MoE grouped GEMM (the `@triton.jit` kernel and its launcher `moe_gemm`).

The (token, k) pairs were grouped by expert and padded to blocks of BLOCK_M rows by the alignment
(`kernels/align.py`). One program computes a BLOCK_M x BLOCK_N tile of

    out[pair, n] = sum_k x[row(pair), k] * w[expert(block), n, k]      (* routed_weight[pair])

where row(pair) = pair // top_k when GATHER (x holds one row per token, e.g. gate_up) and
row(pair) = pair otherwise (x holds one row per pair, e.g. the down projection). Every row of a
block belongs to the same expert, so the whole tile is one dense matmul against one expert's
weights: the gather happens on the activation side only. Padding rows carry the sentinel id
num_pairs and are masked out of loads and stores.
"""
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from .. import runtime
from .common import (BASE_SMEM_BUDGET, FLOAT_DTYPES, cdiv, check_alignment, check_compute_dtype, check_routed_weights,
                     check_tensor, num_pairs_of, num_sms, reg_cap, stages_for)
from .configs import GemmConfig, gemm_config


@triton.jit
def grouped_tile(pid, N, num_blocks, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Program id -> (token block, N tile), grouped: GROUP_M consecutive token blocks sweep the
    same N tiles together (shared with the tried epilogue build, studies/kernels/tried/)."""
    num_pid_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * num_pid_n
    first_m = (pid // in_group) * GROUP_M
    group_size = tl.minimum(num_blocks - first_m, GROUP_M)
    return first_m + (pid % in_group) % group_size, (pid % in_group) // group_size


@triton.jit
def block_pairs(sorted_ids_ptr, pid_m, num_pairs, BLOCK_M: tl.constexpr):
    """The pair ids of token block pid_m (int64) and which are real: padding rows carry the sentinel
    num_pairs and get pair 0, an in-bounds address that every load and store masks out."""
    pair = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pair < num_pairs
    return tl.where(valid, pair, 0).to(tl.int64), valid


@triton.jit
def _packed_expand(acc, valid, expert, offs_n, pid_m, pid_n, blk_lo, blk_hi, u_ptr, bp_ptr, u_desc, bp_desc, N, NS,
                   stride_um, stride_pe, stride_pn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, P: tl.constexpr,
                   STRADDLE: tl.constexpr, PACK_C: tl.constexpr, EXPAND_K: tl.constexpr, PACK_DESC: tl.constexpr):
    """The packed LoRA expand (kernels/fused_moe_lora_packed.py): more K iterations of the base GEMM, no per-row
    logic. u (EM, P * PACK_C) holds each pair's shrink in the columns of its slice and its adapter's slot (zeros
    elsewhere, and in every real row without a live adapter), in the alignment's order, so the tile's rows are one
    dense box; B_packed (E * N, P * PACK_C) holds, for output column n, every slot's B row of n's slice side by side
    (zeros in the other slice's columns). [blk_lo, blk_hi): the columns of the slots this block's live pairs use
    (0, 0: nothing live, no iteration at all), walked EXPAND_K at a time (BLOCK_R: one dot per slot; PACK_C: one
    over every slot). A tile inside one slice reads that slice's columns; one across the gate/up boundary
    (STRADDLE) reads both, and the zeros of B_packed keep each column to its own slice. PACK_DESC: both operands
    through TMA descriptors, straight into shared memory (pointer loads would stage the (EXPAND_K, BLOCK_N) tile
    through registers beside the accumulator). The expand builds the studies tried and no plan takes (guarded steps
    without a loop, an L2 prefetch, u by pointers beside B's TMA copy, the first step before the K loop) live in
    studies/kernels/tried/fused_moe_switches.py."""
    lo = (blk_lo // EXPAND_K) * EXPAND_K
    hi = blk_hi
    if STRADDLE:
        p0 = 0
    else:
        p0 = (pid_n * BLOCK_N) // NS  # the tile's slice (gate / up)
    offs_u = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # places in the alignment
    offs_c = tl.arange(0, EXPAND_K)
    for q in tl.static_range(P if STRADDLE else 1):
        base = (p0 + q) * PACK_C
        # not pipelined: its buffers then fit beside (and reuse) the K loop's in shared memory
        for c0 in tl.range(base + lo, base + hi, EXPAND_K, num_stages=1):
            acc = _packed_step(acc, c0, valid, expert, offs_n, offs_u, offs_c, pid_m, pid_n, u_ptr, bp_ptr, u_desc,
                               bp_desc, N, stride_um, stride_pe, stride_pn, BLOCK_M, BLOCK_N, PACK_DESC)
    return acc


@triton.jit
def _packed_step(acc, c0, valid, expert, offs_n, offs_u, offs_c, pid_m, pid_n, u_ptr, bp_ptr, u_desc, bp_desc, N,
                 stride_um, stride_pe, stride_pn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 PACK_DESC: tl.constexpr):
    """One expand step: acc += u[tile rows, c0 : c0 + EXPAND_K] @ B_packed[tile columns, c0 : c0 + EXPAND_K].T."""
    if PACK_DESC:  # each TMA copy is waited for before the next is issued (ncu source view, studies/kernels/README.md)
        ut = u_desc.load([(pid_m * BLOCK_M).to(tl.int32), c0])
        bt = bp_desc.load([(expert * N + pid_n * BLOCK_N).to(tl.int32), c0]).T
    else:
        ut = tl.load(u_ptr + offs_u[:, None] * stride_um + (c0 + offs_c)[None, :], mask=valid[:, None], other=0.0)
        bt = tl.load(bp_ptr + expert * stride_pe + offs_n[None, :].to(tl.int64) * stride_pn + (c0 + offs_c)[:, None],
                     mask=(offs_n < N)[None, :], other=0.0)
    return tl.dot(ut, bt, acc)


@triton.jit(do_not_specialize=["num_pairs", "num_blocks"])
def fused_moe_kernel(
    x_ptr,  # (rows, K): activations, rows = M (GATHER) or M*top_k
    w_ptr,  # (E, N, K): expert weights, one (N, K) matrix per expert
    out_ptr,  # (M*top_k, N): one output row per (token, k) pair; every row is written
    sorted_ids_ptr,  # (EM,) int32: pair ids grouped by expert, sentinel = num_pairs
    expert_ids_ptr,  # (EM // (BLOCK_M * SUB),) int32: expert of each alignment block, -1 past the end
    ntpp_ptr,  # (1,) int32: num_tokens_post_padded, blocks starting at or past it are empty
    rw_ptr,  # (M*top_k,) float32 routed weights (read only when HAS_RW)
    N, K,
    num_pairs,  # M * top_k, also the sentinel value
    num_blocks,  # token blocks launched: min(EM // BLOCK_M, num_pairs) (the busy ones lie first)
    top_k,
    stride_xm, stride_xk,
    stride_we, stride_wn, stride_wk,
    stride_om, stride_on,
    w_desc,  # TMA descriptor of w viewed as (E * N, K), block (BLOCK_N, BLOCK_K); read only when W_DESC
    NS,  # the columns of one slice (gate / up: N = P * NS)
    # ---- the packed LoRA expand (read only when PACKED; kernels/fused_moe_lora_packed.py) ----
    u_ptr,  # (EM, P * PACK_C): each pair's shrink in its slice's and slot's columns, in the alignment's order
    blk_ptr,  # (alignment blocks, 2) int32: the columns [lo, hi) of the slots each block's live pairs use
    bp_ptr,  # (E, N, P * PACK_C): B of every slot side by side, scaling folded in (`pack_lora_b`)
    stride_um, stride_pe, stride_pn,
    u_desc, bp_desc,  # TMA descriptors of u and B_packed (as (E * N, P * PACK_C)); read only when PACK_DESC
    tail_ptr,  # (1,) int32: the columns past K every tile walks (read only when TAIL)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    GATHER: tl.constexpr, HAS_RW: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, W_DESC: tl.constexpr,
    P: tl.constexpr = 1, STRADDLE: tl.constexpr = False, PERSIST: tl.constexpr = False, FLATTEN: tl.constexpr = False,
    EARLY_LOADS: tl.constexpr = False, SUB: tl.constexpr = 1,
    PACKED: tl.constexpr = False, PACK_C: tl.constexpr = 16, EXPAND_K: tl.constexpr = 16,
    PACK_DESC: tl.constexpr = False,
    TAIL: tl.constexpr = False, TAIL_J: tl.constexpr = 0, TAIL_BLK: tl.constexpr = False, TAIL_WIN: tl.constexpr = 0,
):
    # TAIL (`Tail`, the wide LoRA build, kernels/fused_moe_lora_packed.py): x's and w's rows go on past K, the
    # adapters' u and B_packed columns, and tail_ptr holds how many of them every tile's K loop walks: all when any
    # adapter is live, none when none is (the shrink decides and writes it, on the GPU). One trip count for the
    # launch, so Triton still flattens a persistent grid's tile loop and K loop. One scalar load: deciding here from
    # the L slot ids and flags instead held 13-16 more registers (Triton 3.6, sm_90: TP=4 down at 8 warps then fits
    # one program per SM, not two).
    # TAIL_J (gathered rows, gate_up): x's rows are tokens and a token's top_k pairs each have their own tail, pair
    # (token, j) at the columns K + j * TAIL_J of the token's row. The row pointers jump there once, at the step
    # into the tail (K is a multiple of BLOCK_K: the launcher checks), by one add: no select between two pointers.
    # TAIL_BLK: each tile walks only the columns of the slots its block's live pairs use (blk_ptr, written by the
    # shrink), of its own slice (gate or up), widened to whole BLOCK_K steps: a trip count per tile, so a persistent
    # grid's loops are not flattened (the layer takes it where it measured faster: kernels/plan.py).
    # TAIL_WIN (rows the pairs' own, the down GEMM, TMA weights): the shrink wrote each pair's u in x's tail shifted
    # to its block's window: the columns from the block's first live slot's (kept inside the C columns) where the
    # block's live slots fit in TAIL_WIN columns, else unshifted. x's tail is read from column K as always; only w's
    # tail is read from the same shift (a TMA coordinate: past K + C the copy fills zeros). tail_ptr, written by the
    # shrink: TAIL_WIN when every block fits, C when one does not, 0 with nothing live; one trip count for the
    # launch, so the persistent grid keeps its flattening. On the alignment ordered by LoRA row a block holds one or
    # two slots: a tile walks 64 columns instead of 128. (A jump of x's row pointers instead, by the shift, cost x
    # its asynchronous copies in the static compile: 16 KB less shared memory, 122 -> 194 registers at TP=4 down.)
    kb = K
    if TAIL and not TAIL_BLK:  # (EVEN_K holds for K + every tail: the launcher checks both against BLOCK_K)
        K = K + tl.load(tail_ptr)
    # SUB (config `sub_m`): the alignment's blocks are SUB * BLOCK_M rows, so token block pid_m lies in alignment
    # block pid_m // SUB and takes its expert. Every alignment block's rows are one expert's, so each sub-block is
    # one dense matmul too. A sub-block of padding only returns at once (a program per tile) or runs masked
    # (persistent: no branch inside the loop that Triton pipelines).
    if PERSIST:
        # Persistent grid (config `persistent`: programs per SM): a static number of programs, each takes
        # every nprog-th tile of the busy ones (counted from num_tokens_post_padded on the device, so the
        # loop bound needs no host read). FLATTEN lets Triton pipeline the tile loop and the K loop as one:
        # the next tile's loads are issued while this tile's MMAs finish and its store drains, which a
        # short K (the down GEMM: K = 768, or 192 at TP=4) otherwise leaves exposed once per tile.
        ntpp = tl.load(ntpp_ptr)
        busy = tl.minimum(tl.cdiv(ntpp, BLOCK_M), num_blocks)
        total = busy * tl.cdiv(N, BLOCK_N)
        for tile in tl.range(tl.program_id(0), total, tl.num_programs(0), flatten=FLATTEN):
            pid_m, pid_n = grouped_tile(tile, N, busy, BLOCK_N, GROUP_M)
            expert = tl.load(expert_ids_ptr + pid_m // SUB).to(tl.int64)
            # expert -1 (a block no expert of this rank owns): every row masked, nothing stored
            _gemm_tile(x_ptr, w_ptr, out_ptr, sorted_ids_ptr, rw_ptr, pid_m, pid_n, tl.maximum(expert, 0),
                       expert >= 0, N, K, num_pairs, top_k, stride_xm, stride_xk, stride_we, stride_wn, stride_wk,
                       stride_om, stride_on, w_desc, NS,
                       u_ptr, blk_ptr + (pid_m // SUB) * 2, bp_ptr, stride_um, stride_pe, stride_pn, u_desc, bp_desc,
                       BLOCK_M, BLOCK_N, BLOCK_K, GATHER, HAS_RW, EVEN_K, EVEN_N, W_DESC, P, STRADDLE, EARLY_LOADS,
                       PACKED, PACK_C, EXPAND_K, PACK_DESC, kb, TAIL_J, TAIL_BLK, TAIL_WIN)
    else:
        # One program per tile. Program id -> (token block, N tile), grouped so that GROUP_M consecutive
        # token blocks sweep the same N tiles together; neighbouring blocks usually share an expert, so
        # its weight tiles are served from L2 instead of HBM.
        pid_m, pid_n = grouped_tile(tl.program_id(0), N, num_blocks, BLOCK_N, GROUP_M)
        # Blocks past the padded end hold only sentinels: nothing to compute, nothing to write.
        ntpp = tl.load(ntpp_ptr)
        if pid_m * BLOCK_M >= ntpp:
            return
        expert = tl.load(expert_ids_ptr + pid_m // SUB).to(tl.int64)
        if expert < 0:
            return
        if SUB > 1:  # a sub-block of padding only (the end of its expert's rows): nothing to load or store
            if tl.min(tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)), 0) >= num_pairs:
                return
        _gemm_tile(x_ptr, w_ptr, out_ptr, sorted_ids_ptr, rw_ptr, pid_m, pid_n, expert, True, N, K, num_pairs,
                   top_k, stride_xm, stride_xk, stride_we, stride_wn, stride_wk, stride_om, stride_on, w_desc, NS,
                   u_ptr, blk_ptr + (pid_m // SUB) * 2, bp_ptr, stride_um, stride_pe, stride_pn, u_desc, bp_desc,
                   BLOCK_M, BLOCK_N, BLOCK_K, GATHER, HAS_RW, EVEN_K, EVEN_N, W_DESC, P, STRADDLE, EARLY_LOADS,
                   PACKED, PACK_C, EXPAND_K, PACK_DESC, kb, TAIL_J, TAIL_BLK, TAIL_WIN)


@triton.jit
def _gemm_tile(x_ptr, w_ptr, out_ptr, sorted_ids_ptr, rw_ptr, pid_m, pid_n, expert, owned, N, K, num_pairs, top_k,
               stride_xm, stride_xk, stride_we, stride_wn, stride_wk, stride_om, stride_on, w_desc, NS,
               u_ptr, blk, bp_ptr, stride_um, stride_pe, stride_pn, u_desc, bp_desc,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GATHER: tl.constexpr,
               HAS_RW: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, W_DESC: tl.constexpr,
               P: tl.constexpr, STRADDLE: tl.constexpr, EARLY_LOADS: tl.constexpr, PACKED: tl.constexpr,
               PACK_C: tl.constexpr, EXPAND_K: tl.constexpr, PACK_DESC: tl.constexpr, kb,
               TAIL_J: tl.constexpr, TAIL_BLK: tl.constexpr, TAIL_WIN: tl.constexpr):
    """One BLOCK_M x BLOCK_N output tile of token block pid_m (all of one expert); `owned` False masks
    every row (a block of expert -1 in the persistent loop); blk: this tile's block's entry of blk_ptr (PACKED);
    kb: the base K (TAIL_J: where each row's pointer jumps to its pair's tail)."""
    pair, valid = block_pairs(sorted_ids_ptr, pid_m, num_pairs, BLOCK_M)
    valid = valid & owned
    if GATHER:
        row = pair // top_k
    else:
        row = pair
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + row[:, None] * stride_xm + offs_k[None, :] * stride_xk
    # w tile loaded as (BLOCK_K, BLOCK_N) so the dot needs no transpose.
    w_ptrs = w_ptr + expert * stride_we + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None] * stride_wk

    # EVEN_K / EVEN_N (K, N multiples of the tile): no K or N predicates on the loads at all.
    # W_DESC: the weight tile comes through the Tensor Memory Accelerator (one TMA copy per tile,
    # issued by one thread, no address registers); rows past this expert's N belong to the next
    # expert or lie past the end (zero-filled) and only feed output columns that are never stored.
    w_row = (expert * N + pid_n * BLOCK_N).to(tl.int32)  # TMA coordinates are 32-bit (tma_ok checks E * N)
    # EARLY_LOADS (config `early_loads`): the gathers the epilogue needs are issued before the K loop, so their
    # latency passes under the MMAs; after the loop each is exposed once per tile, and at one program per SM
    # nothing else hides it (studies/kernels/README.md, "Builds no table takes").
    if EARLY_LOADS:
        if HAS_RW:
            rw = tl.load(rw_ptr + pair, mask=valid, other=0.0)
    if PACKED:  # the block's slot columns: two scalars, loaded before the K loop so their latency hides under it
        blk_lo = tl.load(blk)
        blk_hi = tl.load(blk + 1)
    if TAIL_J > 0:
        jump = (pair % top_k) * TAIL_J  # from column kb of the token's row to column kb of its pair's tail
    else:
        jump = pair * 0
    t_lo = 0  # the tile's first tail column (TAIL_BLK)
    if TAIL_BLK:
        # blk: the block's slot columns [lo, hi) within a slice (PACK_C columns each); the tile's slices are those
        # of its first and last column. Rounded out to BLOCK_K steps, clipped to the pair's P * PACK_C columns: the
        # extra columns are other slots' u, zeros for this pair (the shrink writes them), against finite B.
        lo = tl.load(blk)
        hi = tl.load(blk + 1)
        p_lo = (pid_n * BLOCK_N) // NS
        p_hi = (tl.minimum(pid_n * BLOCK_N + BLOCK_N, N) - 1) // NS
        t_lo = ((p_lo * PACK_C + lo) // BLOCK_K) * BLOCK_K
        t_hi = tl.minimum(tl.cdiv(p_hi * PACK_C + hi, BLOCK_K) * BLOCK_K, P * PACK_C)
        K = kb + tl.where(hi > lo, t_hi - t_lo, 0)
    if TAIL_WIN > 0:  # w's tail from the block's window (the shrink wrote x's tail from it): its first live slot's
        # column, kept inside the C columns, where its live slots fit in TAIL_WIN columns; else from column 0
        lo = tl.load(blk)
        t_lo = tl.where(tl.load(blk + 1) - lo <= TAIL_WIN, tl.minimum(lo, PACK_C - TAIL_WIN), 0)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # accumulate in fp32 whatever the inputs
    for k0 in range(0, K, BLOCK_K):
        k_ok = offs_k < K - k0
        if EVEN_K:
            xt = tl.load(x_ptrs, mask=valid[:, None], other=0.0)
        else:
            xt = tl.load(x_ptrs, mask=valid[:, None] & k_ok[None, :], other=0.0)
        if W_DESC:
            if TAIL_BLK or TAIL_WIN > 0:
                wt = w_desc.load([w_row, k0 + tl.where(k0 >= kb, t_lo, 0)]).T
            else:
                wt = w_desc.load([w_row, k0]).T
        elif EVEN_K and EVEN_N:
            wt = tl.load(w_ptrs)
        else:
            wt = tl.load(w_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc = tl.dot(xt, wt, acc)
        x_ptrs += BLOCK_K * stride_xk
        if TAIL_J > 0 or TAIL_BLK:
            x_ptrs += tl.where(k0 + BLOCK_K == kb, jump + t_lo, 0)[:, None]
        w_ptrs += BLOCK_K * stride_wk
        if TAIL_BLK or TAIL_WIN > 0:
            w_ptrs += tl.where(k0 + BLOCK_K == kb, t_lo, 0)

    if PACKED:
        acc = _packed_expand(acc, valid, expert, offs_n, pid_m, pid_n, blk_lo, blk_hi, u_ptr, bp_ptr, u_desc,
                             bp_desc, N, NS, stride_um, stride_pe, stride_pn, BLOCK_M, BLOCK_N, P, STRADDLE, PACK_C,
                             EXPAND_K, PACK_DESC)
    if HAS_RW:
        if not EARLY_LOADS:
            rw = tl.load(rw_ptr + pair, mask=valid, other=0.0)
        acc = acc * rw[:, None]
    out_ptrs = out_ptr + pair[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=valid[:, None] & n_ok[None, :])


# --------------------------------------------------------------------------------------------
# Launcher
# --------------------------------------------------------------------------------------------
def check_gemm_inputs(x, w, align, top_k, out, routed_weights, gather, what="moe_gemm"):
    """The base GEMM's input checks (shared with the fused LoRA-epilogue GEMM); returns
    (N, K, num_pairs, block_m)."""
    check_tensor("x", x, 2, FLOAT_DTYPES, contiguous=False)
    if x.stride(1) != 1:
        raise ValueError(f"x must have contiguous rows (unit column stride), got strides {x.stride()}")
    dev = x.device
    check_compute_dtype(x)
    check_tensor("w", w, 3, (x.dtype,), dev, contiguous=False)
    if not rows_even(w):
        raise ValueError(f"w must be contiguous, or the first K columns of a contiguous wider (E, N, K') tensor; "
                         f"got shape {tuple(w.shape)}, strides {w.stride()}")
    check_tensor("out", out, 2, (x.dtype,), dev)
    E, N, K = w.shape
    if x.shape[1] != K:
        raise ValueError(f"x has K={x.shape[1]} columns but w is (E, N, K)={tuple(w.shape)}")
    if out.shape[1] != N:
        raise ValueError(f"out must have N={N} columns (w is {tuple(w.shape)}), got shape {tuple(out.shape)}")
    num_pairs = num_pairs_of(x, top_k, gather, out)
    bm = check_alignment(align, num_pairs, E, None, dev, what)
    if align.sorted_token_ids.shape[0] != 1:
        raise ValueError(f"{what} takes an alignment with one slot (S=1), got S={align.sorted_token_ids.shape[0]}")
    check_routed_weights(routed_weights, num_pairs, top_k, dev)
    return N, K, num_pairs, bm


def rows_even(w) -> bool:
    """Whether (E, N, K) w is E * N evenly spaced rows of unit K stride: contiguous, or the first K columns of a
    contiguous wider (E, N, K') tensor (the wide LoRA build's weights, `fused_moe_lora_packed.wide_weights`)."""
    return w.stride(2) == 1 and w.stride(0) == w.shape[1] * w.stride(1) and w.stride(1) >= w.shape[2]


def tma_ok(w) -> bool:
    """Whether w can be read through a TMA descriptor: evenly spaced (E, N, K) rows (`rows_even`) a 16-byte
    multiple apart from a 16-byte aligned base, on a GPU of compute capability 9 or newer (Hopper); the
    interpreter runs descriptors too."""
    return _tma_device(w) and ((rows_even(w) and (w.stride(1) * w.element_size()) % 16 == 0
                                and w.data_ptr() % 16 == 0 and w.shape[0] * w.shape[1] < 2 ** 31))


def rows_desc(w, block, cols: int | None = None):
    """A TMA descriptor of (E, N, K) w (`tma_ok`) as E * N rows of `cols` (default K) columns, block (BLOCK_N,
    BLOCK_K); cols > K reads on into the wider tensor's columns past K (`Tail`)."""
    return TensorDescriptor(w, [w.shape[0] * w.shape[1], cols or w.shape[2]], [w.stride(1), 1], block)


def tail_columns(t, c: int) -> bool:
    """Whether t's rows (its last dim of unit stride) go on for c more columns in its storage: t is the first K
    columns of a wider tensor with at least K + c columns."""
    if t.stride(-1) != 1 or t.stride(-2) < t.shape[-1] + c:
        return False
    last = t.storage_offset() + sum((n - 1) * st for n, st in zip(t.shape, t.stride())) + c
    return last < t.untyped_storage().nbytes() // t.element_size()


_TMA: dict = {}  # CUDA device index -> whether it runs TMA descriptors (asked at every launch: kept)


def _tma_device(t) -> bool:
    """Whether t's device runs TMA descriptors: the interpreter, or a GPU of compute capability >= 9."""
    if runtime.interpreter():
        return True
    if not t.is_cuda:
        return False
    i = t.get_device()
    ok = _TMA.get(i)
    if ok is None:
        ok = _TMA[i] = torch.cuda.get_device_capability(i)[0] >= 9
    return ok


def packed_tma_ok(bp) -> bool:
    """Whether B_packed (E, N, P * C) can be read through TMA: 16-byte aligned base, 32-bit row coordinates."""
    return bp.data_ptr() % 16 == 0 and bp.shape[0] * bp.shape[1] < 2 ** 31


class Tail(NamedTuple):
    """The wide LoRA build's operands (kernels/fused_moe_lora_packed.py, `moe_gemm_lora_wide`): x and w are the first
    K columns of tensors c columns wider, u and B_packed in those columns; cols, a (1,) int32 tensor on the device,
    holds the columns past K every tile walks (c when any adapter is live, 0 when none: the plain GEMM's K), written
    by the shrink before the GEMM runs. jump (gathered rows only, gate_up): x's rows are tokens and pair (token, j)'s
    tail lies at the columns K + j * jump of its token's row (0: the rows are the pairs', the down GEMM)."""
    c: int
    cols: torch.Tensor
    jump: int = 0
    blk: torch.Tensor | None = None  # per-block slot columns (the shrink's blk): each tile walks only those
    slices: int = 1  # P: gate_up's c columns are two slices of c // 2 (blk's columns are within one)
    win: int = 0  # with blk, down only: every tile walks one window of win columns from its block's first live slot
    # (cols: win, or c when a block's slots do not fit; the shrink decides: lora_shrink_packed(tail_win=))


class Packed(NamedTuple):
    """The packed LoRA expand's operands (kernels/fused_moe_lora_packed.py builds them): u (EM, P, C) each pair's
    shrink in its slice's and slot's columns, blk (alignment blocks, 2) int32 the columns [lo, hi) each block's
    live pairs use, b_packed (E, N, P * C) every slot's B side by side; expand_k: the depth of one expand dot (C, or
    BLOCK_R: one per slot in the block's range). TMA descriptors where the GPU and the tensors allow them."""
    u: torch.Tensor
    blk: torch.Tensor
    b_packed: torch.Tensor
    expand_k: int


def moe_gemm(x, w, align, top_k, out, *, routed_weights=None, gather=True, config: GemmConfig | None = None,
             packed: Packed | None = None, tail: Tail | None = None):
    """out[pair] = x[row] @ w[expert(pair)].T (* routed weight), row = pair // top_k if gather else pair.

    x: (M, K) or (M*top_k, K); w: (E, N, K); align: Alignment with S=1; out: (M*top_k, N), fully written.
    packed (`Packed`, from `moe_gemm_lora_packed` only): the packed expand added before the scaling; it runs on the
    plain GEMM's tile table as it is (persistent grids and sub-blocks included).
    tail (`Tail`, from `moe_gemm_lora_wide` only): x's and w's rows go on for tail.c columns (the adapters'), which
    the K loop walks when any adapter is live (with tail.blk: only the columns of the slots in the tile's block, of
    the tile's slice); the plain GEMM's kernel, tile table and loop otherwise.
    """
    sizes = check_gemm_inputs(x, w, align, top_k, out, routed_weights, gather)
    check_tail_rows(tail, x, w, sizes[1], gather, top_k)
    return checked_gemm(x, w, align, top_k, out, sizes, routed_weights, gather, config, packed, tail)


def checked_gemm(x, w, align, top_k, out, sizes, routed_weights, gather, config, packed, tail):
    """`moe_gemm` past its input checks: sizes = (N, K, num_pairs, block_m) as `check_gemm_inputs` returned them for
    these inputs, and a tail's rows checked (`check_tail_rows`): a launcher that has checked them (the packed and
    wide LoRA GEMMs) launches without checking twice."""
    N, K, num_pairs, bm = sizes
    M = num_pairs // top_k
    cfg = config or gemm_config(M, bm, N, K, w.shape[0])
    # sub_m: the kernel's tile takes sub_m of the alignment's bm rows, SUB sub-blocks per block
    sub_m = cfg.sub_m if cfg.sub_m else bm
    if bm % sub_m:
        raise ValueError(f"moe_gemm: config.sub_m={cfg.sub_m} must divide the alignment's block_m={bm}")
    SUB = bm // sub_m
    # Blocks past num_tokens_post_padded only hold sentinels, and every busy block holds at least one
    # pair, so at most min(nb, num_pairs) blocks are busy: a static bound, no need to read ntpp. A busy block's
    # sub-blocks past its first may be padding only (they return at once), so all SUB of each are launched.
    nb_launch = min(align.expert_ids.shape[1], num_pairs) * SUB
    tiles = nb_launch * cdiv(N, cfg.block_n)
    # persistent: a static grid of programs per SM that loop over the busy tiles
    persist = bool(cfg.persistent)
    grid = (min(tiles, num_sms(x.device) * cfg.persistent) if persist else tiles,)
    rw = routed_weights if routed_weights is not None else out  # dummy pointer, never read
    stages = stages_for(cfg.num_stages, (sub_m * cfg.block_k + cfg.block_k * cfg.block_n) * x.element_size(),
                        BASE_SMEM_BUDGET)
    tail_c, tail_kw = _check_tail(tail, x, w, K, packed is not None, gather, top_k)
    if (tail_kw.get("TAIL_J") or tail_kw.get("TAIL_BLK") or tail_kw.get("TAIL_WIN")) and K % cfg.block_k:
        raise ValueError(f"moe_gemm: a tail with a jump (gathered rows), per-block columns or a window needs K={K} "
                         f"to be a multiple of the tile's BLOCK_K={cfg.block_k}: the row pointers jump to the pair's "
                         f"tail between two K steps")
    if tail_kw.get("TAIL_WIN") and tail_kw["TAIL_WIN"] % cfg.block_k:
        raise ValueError(f"moe_gemm: tail.win={tail_kw['TAIL_WIN']} must be a multiple of the tile's "
                         f"BLOCK_K={cfg.block_k}: the window is walked in whole K steps")
    if tail_kw.get("TAIL_WIN") and not (cfg.w_desc and tma_ok(w)):
        raise ValueError("moe_gemm: tail.win needs the tile's TMA weight loads (w_desc): a shifted window reads w's "
                         "columns past K + C, which the TMA copy fills with zeros")
    use_desc = cfg.w_desc and tma_ok(w)
    w_desc = rows_desc(w, [cfg.block_n, cfg.block_k], K + tail_c) if use_desc else w
    ns, pack_kw = 0, {}  # NS: the slice width (gate / up), read by the packed expand and a tail's block columns
    if packed is None:
        pack, pack_ints = (out,) * 3, (0,) * 3 + (out, out)  # dummy pointers and strides, never read
        if tail is not None and tail.blk is not None:  # the per-block slot columns, as the packed expand reads them
            pack = (out, tail.blk, out)
            ns, pack_kw = N // tail.slices, dict(P=tail.slices, PACK_C=tail_c // tail.slices)
    else:
        u, bp, ek = packed.u, packed.b_packed, packed.expand_k
        P, C = u.shape[1], u.shape[2]
        pdesc = _tma_device(u) and u.is_contiguous() and bp.is_contiguous() and packed_tma_ok(bp)
        u2, bp2 = u.view(u.shape[0], P * C), bp.view(-1, P * C)
        descs = ((TensorDescriptor.from_tensor(u2, [sub_m, ek]), TensorDescriptor.from_tensor(bp2, [cfg.block_n, ek]))
                 if pdesc else (out, out))
        pack, pack_ints = (u2, packed.blk, bp), (u2.stride(0), bp.stride(0), bp.stride(1)) + descs
        ns = N // P
        pack_kw = dict(PACKED=True, P=P, STRADDLE=P == 2 and (N // P) % cfg.block_n != 0, PACK_C=C, EXPAND_K=ek,
                       PACK_DESC=pdesc)
    fused_moe_kernel[grid](
        x, w, out, align.sorted_token_ids, align.expert_ids, align.num_tokens_post_padded, rw,
        N, K, num_pairs, nb_launch, top_k,
        x.stride(0), x.stride(1), w.stride(0), w.stride(1), w.stride(2), out.stride(0), out.stride(1), w_desc, ns,
        *pack, *pack_ints, tail.cols if tail is not None else out,
        BLOCK_M=sub_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, SUB=SUB,
        GATHER=bool(gather), HAS_RW=routed_weights is not None,
        EVEN_K=cfg.even and K % cfg.block_k == 0 and tail_c % cfg.block_k == 0,
        EVEN_N=cfg.even and N % cfg.block_n == 0, W_DESC=use_desc,
        PERSIST=persist, FLATTEN=persist and cfg.flatten, EARLY_LOADS=cfg.early_loads,
        num_warps=cfg.num_warps, num_stages=stages, **pack_kw, **tail_kw, **reg_cap(cfg.max_regs),
    )
    return out


def check_tail_rows(tail, x, w, K, gather, top_k) -> None:
    """An error naming the problem where x's or w's rows do not go on for a `Tail`'s c columns (x's for its last
    pair's tail, with a jump): the kernel would read past their storage. Nothing for None."""
    if tail is None:
        return
    c, jump = int(tail.c), int(tail.jump)
    if c <= 0:
        raise ValueError(f"moe_gemm: tail.c must be a positive number of columns, got {tail.c!r}")
    if jump and (not gather or jump < c):
        raise ValueError(f"moe_gemm: tail.jump={jump} needs gathered rows (gather=True) and jump >= tail.c={c}: each "
                         f"of a token's top_k pairs has its own c columns")
    for nm, t, n in (("x", x, (top_k - 1) * jump + c if jump else c), ("w", w, c)):
        if not tail_columns(t, n):
            raise ValueError(f"moe_gemm: tail needs {nm} to be the first K={K} columns of a tensor with at least "
                             f"K + {n} columns (shape {tuple(t.shape)}, strides {t.stride()})")


def _check_tail(tail, x, w, K, other, gather, top_k):
    """(c, the kernel's keywords) of a `Tail` (0, {} for None), its rows checked already (`check_tail_rows`); an
    error naming the problem beside another LoRA build or where its fields disagree."""
    if tail is None:
        return 0, {}
    if other:
        raise ValueError("moe_gemm: tail (the wide build) excludes packed")
    c, jump = int(tail.c), int(tail.jump)
    if tail.cols.shape != (1,) or tail.cols.dtype != torch.int32 or tail.cols.device != x.device:
        raise ValueError(f"moe_gemm: tail.cols must be a (1,) int32 tensor on {x.device}, got {tuple(tail.cols.shape)} "
                         f"{tail.cols.dtype} on {tail.cols.device}")
    if tail.blk is not None:
        if tail.slices not in (1, 2) or c % tail.slices or tail.blk.dtype != torch.int32 or tail.blk.dim() != 2:
            raise ValueError(f"moe_gemm: tail.blk must be the shrink's (blocks, 2) int32 slot columns and tail.slices "
                             f"1 or 2 dividing c={c}, got {tuple(tail.blk.shape)} {tail.blk.dtype}, {tail.slices}")
    win = int(tail.win)
    if win:
        if tail.blk is None or jump or tail.slices != 1 or not 0 < win < c:
            raise ValueError(f"moe_gemm: tail.win={win} needs the shrink's blk, rows of the pairs' own (no jump), one "
                             f"slice and 0 < win < c={c}")
        return c, dict(TAIL=True, TAIL_J=0, TAIL_BLK=False, TAIL_WIN=win)
    return c, dict(TAIL=True, TAIL_J=jump, TAIL_BLK=tail.blk is not None)
