"""The LoRA path packed into the base GEMM: a small shrink kernel, then the base GEMM whose K loop runs a few more
iterations over the adapters' columns (`fused_moe_kernel` with PACKED; kernels/fused_moe.py).

    u[i, p, s*BR + r] = x[row(pair)] @ A[p, s, expert].T [r]   if s = slot(pair) and its adapter is live, else 0
    out[pair]         = (x[row] @ w[expert].T + u[i] @ B_packed[expert].T) (* routed weight)

i is the pair's place in the base GEMM's alignment, p the slice (gate_up: P = 2, down: 1), BR = block_r(R), and
B_packed[e, n, (p, s, r)] = B[p, s, e, n - p*N/P, r] where p is n's slice, 0 in the other slice's columns
(`pack_lora_b`: every slot's B side by side along K, built once when the adapters load).

Why packed. The folded build (studies/kernels/tried/fused_moe_lora_folded.py) adds, after the K loop, one
BLOCK_R-deep dot per LoRA row present in the tile, each with its own row masks and gathers: the GEMM holds that
code's registers even where it skips it (173 -> 248 registers, qwen3 gate_up, ncu on the H200) and it keeps the
alignment's 128-row tile. Here the per-row decisions move into the shrink, which writes zeros for every pair without
a live adapter, so the expand is the base loop's own dot on a dense box of u against a slice of B_packed: no row
masks, no gathers, and the GEMM keeps the plain GEMM's tile table (persistent grids, sub-blocks). The shrink also
writes each alignment block's column range [lo, hi) of the slots its live pairs use; a block with nothing live gets
(0, 0) and the GEMM runs no extra iteration there. With every adapter disabled both kernels launch (the CUDA-graph
case) and the GPU decides: every shrink program reads the L slot ids and flags, writes its block's empty range and
exits, and the GEMM reads two integers per tile. (A launch-wide branch in the GEMM to the plain loop was slower at
the persistent tiles, in both branches.)

The shrink's options (`lora_shrink_packed`; all off by default, the layer's plan picks them per token bucket:
kernels/plan.py): one window of slots per dot instead of every slot's columns (on the alignment ordered by LoRA row
a block holds one or two slots), both slices from one x tile, programs of fewer rows, a register cap. At M >= 8192
one slot per dot with both slices, 64-row programs and a cap of 128 ran the gate_up shrink in 0.60-0.75x the one-dot
shrink's time (studies/kernels/README.md, "Shrink windows and slot order"). And the blocks taken slot by slot
(`slot_order`): 0.85-0.92x again, DRAM bytes 2.06 -> 1.73x the floor (studies/kernels/README.md, "Shrink windows and
slot order"). The H200 recordings behind these numbers: studies/kernels/README.md.
"""
from dataclasses import replace

import torch
import triton
import triton.language as tl

from .align import slot_major_order
from .common import check_tensor, pow2, reg_cap, stages_for
from .configs import GemmConfig, block_r, gemm_config
from .fused_moe import Packed, Tail, block_pairs, check_gemm_inputs, checked_gemm, moe_gemm, tail_columns

# moe_gemm_lora_packed(expand=...): the expand dot's depth and the GEMM's tile (the expand builds no plan takes:
# studies/kernels/tried/packed_switches.py)
EXPAND_OPTIONS = frozenset({"depth", "tile"})


@triton.jit
def lora_rows(pair, valid, top_k, mapping_ptr, lora_ids_ptr, enabled_ptr, L):
    """Each pair's LoRA row, its weight slot and whether its adapter is live: three dependent gathers (the row, then
    its slot and enabled flag). lrow -1 and live False for padding rows and tokens without a row; a row past the L
    rows is never live (and never read past the end of lora_ids). Returns (lrow, slot, live); slot -1 where the pair
    has no row."""
    lrow = tl.load(mapping_ptr + pair // top_k, mask=valid, other=-1)
    has = valid & (lrow >= 0) & (lrow < L)
    lid = tl.load(lora_ids_ptr + lrow, mask=has, other=-1)
    en = tl.load(enabled_ptr + lrow, mask=has, other=0)
    return lrow, lid, has & (lid >= 0) & (en != 0)


@triton.jit
def _u_tile(u_ptr, rows, c_p, offs_c, w0, stride_up, WB: tl.constexpr, BLOCK_R: tl.constexpr, shift=0):
    """Pointers of u's (rows, window columns) tile, rows the offsets of u's rows: column c of the window at slot w0
    is slice c_p[c], column w0 * BLOCK_R + c % WB - shift of that slice's slots; and whether that column is >= 0
    (TAIL_WIN: each pair's columns shifted to its block's window)."""
    col = w0 * BLOCK_R + offs_c % WB - shift
    return u_ptr + rows[:, None] + c_p[None, :] * stride_up + col[None, :], (col >= 0)[None, :]


@triton.jit(do_not_specialize=["num_pairs", "L"])
def packed_shrink_kernel(
    x_ptr,  # (rows, K) activations, rows = M (GATHER) or M*top_k
    a_ptr,  # (P, S, E, R, K) LoRA A
    u_ptr,  # (EM, P, S_POW2 * BLOCK_R) out: each pair's shrink in its slot's columns, zeros in the other slots
    # (U_PAIR: (M, top_k, P, S_POW2 * BLOCK_R), pair (token, j) at token * stride_um + j * stride_uj)
    blk_ptr,  # (alignment blocks, 2) int32 out: columns [lo, hi) of the slots the block's live pairs use
    tail_ptr,  # (1,) int32 out (U_PAIR): the columns of u the wide GEMM walks, P * S_POW2 * BLOCK_R or 0 (none live)
    sorted_ids_ptr, expert_ids_ptr, ntpp_ptr,  # the base GEMM's alignment (S=1)
    mapping_ptr, lora_ids_ptr, enabled_ptr,  # (M,) LoRA row per token (-1 none); (L,) slot (-1 none), enabled
    order_ptr,  # (ORDERED) (alignment blocks,) int32: the block each program's place in the launch computes
    K, R, S, L, num_pairs, top_k,
    stride_xm, stride_xk, stride_ap, stride_as, stride_ae, stride_ar, stride_ak, stride_um, stride_up,
    stride_uj, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr, S_POW2: tl.constexpr,
    GATHER: tl.constexpr, L_POW2: tl.constexpr, SUB: tl.constexpr = 1, SLOT_W: tl.constexpr = 0,
    P_ALL: tl.constexpr = 1, ROW_PTRS: tl.constexpr = False, U_PAIR: tl.constexpr = False,
    ORDERED: tl.constexpr = False, TAIL_WIN: tl.constexpr = 0,
):
    # SUB: each alignment block (SUB * BLOCK_M rows, one expert) is SUB programs of BLOCK_M rows (a smaller
    # accumulator and tile: more programs in flight per SM); the block's first program writes the block's range.
    # SLOT_W: slots per dot. The windows of SLOT_W slots from the first to the last slot the program's live rows
    # use are computed one after another; the others only get their zeros (SLOT_W = S_POW2: one dot over every
    # slot). P_ALL: the slices one program computes from one x tile (P: both, x read once; 1: a program per slice,
    # grid axis 1). U_PAIR (the wide build): u's rows are the pairs' own (the columns past K of the down GEMM's x
    # rows, or of gate_up's token rows, top_k tails side by side), not the alignment's order, and every real row is
    # written, zeros where nothing is live: that GEMM walks u's columns for every row, with no block ranges.
    pid = tl.program_id(0)
    # No adapter live in the launch (the CUDA-graph replay of a batch without LoRA): the block's range is empty,
    # written from the L slot ids and flags alone, before any of the block's metadata gathers.
    offs_l = tl.arange(0, L_POW2)
    lid = tl.load(lora_ids_ptr + offs_l, mask=offs_l < L, other=-1)
    en = tl.load(enabled_ptr + offs_l, mask=offs_l < L, other=0)
    any_live = tl.max(((lid >= 0) & (en != 0)).to(tl.int32), 0) > 0
    if ORDERED:  # the SMs take programs roughly in launch order: a permutation of the blocks sets which run together
        if any_live:  # (with nothing live the order kernel wrote nothing: each program keeps its own block)
            pid = tl.load(order_ptr + pid // SUB) * SUB + pid % SUB
    pid_m = pid // SUB  # the alignment block
    p0 = tl.program_id(1) * P_ALL  # the program's first slice
    writer = (p0 == 0) & (pid % SUB == 0)  # one writer of the block's range
    c_all = tl.num_programs(1) * P_ALL * S_POW2 * BLOCK_R  # u's columns per pair, every slice
    if U_PAIR and TAIL_WIN == 0:
        if (pid == 0) & (p0 == 0):
            tl.store(tail_ptr, tl.where(any_live, c_all, 0))
    if not any_live:
        if writer:
            tl.store(blk_ptr + 2 * pid_m, 0)
            tl.store(blk_ptr + 2 * pid_m + 1, 0)
        return
    if pid_m * SUB * BLOCK_M >= tl.load(ntpp_ptr):  # past the padded end: the GEMM reads nothing of this block
        return
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    pair, valid = block_pairs(sorted_ids_ptr, pid, num_pairs, BLOCK_M)  # this program's rows
    tok = pair // top_k
    if GATHER:
        row = tok
    else:
        row = pair
    _, slot, live = lora_rows(pair, valid, top_k, mapping_ptr, lora_ids_ptr, enabled_ptr, L)
    live = live & (slot < S) & (expert >= 0)  # expert -1: a block no rank's expert owns
    n_live = tl.sum(live.to(tl.int32), 0)
    if SUB == 1:
        blk_slot, blk_live = slot, live
    else:  # the range covers the whole alignment block: its first program reads every row's slot (TAIL_WIN: each
        # program, for the block's window)
        pair_b, valid_b = block_pairs(sorted_ids_ptr, pid_m, num_pairs, SUB * BLOCK_M)
        _, blk_slot, blk_live = lora_rows(pair_b, valid_b & (writer | (TAIL_WIN > 0)), top_k, mapping_ptr,
                                             lora_ids_ptr, enabled_ptr, L)
        blk_live = blk_live & (blk_slot < S) & (expert >= 0)
    any_b = tl.sum(blk_live.to(tl.int32), 0) > 0
    b_lo = tl.where(any_b, tl.min(tl.where(blk_live, blk_slot, S_POW2), 0) * BLOCK_R, 0)
    b_hi = tl.where(any_b, (tl.max(tl.where(blk_live, blk_slot, -1), 0) + 1) * BLOCK_R, 0)
    # TAIL_WIN: the block's window, from its first live slot's column kept inside C, where its live slots fit in
    # TAIL_WIN columns; each pair's u is written shifted by it (the GEMM reads w's tail from the same shift)
    shift = 0
    if TAIL_WIN > 0:
        shift = tl.where(b_hi - b_lo <= TAIL_WIN, tl.minimum(b_lo, c_all - TAIL_WIN), 0)
    if writer:  # (0, 0) when nothing is live: the GEMM adds nothing there
        tl.store(blk_ptr + 2 * pid_m, b_lo)
        tl.store(blk_ptr + 2 * pid_m + 1, b_hi)
        if U_PAIR and TAIL_WIN > 0:  # (tail_ptr zeroed by the launcher) the window if every block's slots fit in it
            tl.atomic_max(tail_ptr, tl.where(any_b, tl.where(b_hi - b_lo <= TAIL_WIN, TAIL_WIN, c_all), 0))
    if U_PAIR:
        rows = tok * stride_um + (pair % top_k) * stride_uj
    else:
        rows = (pid * BLOCK_M + tl.arange(0, BLOCK_M)) * stride_um
    W: tl.constexpr = SLOT_W if SLOT_W > 0 else S_POW2
    CW: tl.constexpr = P_ALL * W * BLOCK_R  # the columns of one dot: P_ALL slices x W slots x BLOCK_R
    offs_c = tl.arange(0, CW)
    c_p = p0 + offs_c // (W * BLOCK_R)  # slice of column c
    c_r = offs_c % BLOCK_R  # rank index of column c
    if TAIL_WIN > 0:  # the columns no shifted store reaches, [C - shift, C): zeros (read where the GEMM walks all C)
        offs_a = tl.arange(0, S_POW2 * BLOCK_R)  # (one slice: u's C columns of the row)
        tl.store(u_ptr + rows[:, None] + offs_a[None, :], tl.zeros((BLOCK_M, S_POW2 * BLOCK_R),
                                                                   dtype=u_ptr.dtype.element_ty),
                 mask=valid[:, None] & (offs_a >= c_all - shift)[None, :])
    if n_live == 0:
        if SUB > 1 or U_PAIR:  # the block may hold live rows in another program: the GEMM reads these rows, as zeros
            for w0 in tl.static_range(0, S_POW2, W):
                zp, z_ok = _u_tile(u_ptr, rows, c_p, offs_c, w0, stride_up, W * BLOCK_R, BLOCK_R, shift)
                tl.store(zp, tl.zeros((BLOCK_M, CW), dtype=u_ptr.dtype.element_ty), mask=valid[:, None] & z_ok)
        return
    offs_k = tl.arange(0, BLOCK_K)
    # One window of W slots side by side per dot; each pair keeps its own slot's columns, the rest become zeros. The
    # windows walked are those from the first to the last slot this program's live rows use (the loop's bounds, not an
    # `if` around the K loop: such a branch, or a K loop of a data-dependent trip count, held 214 registers against
    # 128 at TP=4 gate_up M = 1024, Triton 3.6); the windows outside get their zeros.
    if W == S_POW2:
        w_lo, w_hi = 0, W
    else:
        w_lo = (tl.min(tl.where(live, slot, S_POW2), 0) // W) * W
        w_hi = tl.max(tl.where(live, slot, -1), 0) + 1
        for w0 in tl.static_range(0, S_POW2, W):
            zp, z_ok = _u_tile(u_ptr, rows, c_p, offs_c, w0, stride_up, W * BLOCK_R, BLOCK_R, shift)
            tl.store(zp, tl.zeros((BLOCK_M, CW), dtype=u_ptr.dtype.element_ty),
                     mask=valid[:, None] & z_ok & ((w0 + W <= w_lo) | (w0 >= w_hi)))
    for w0 in range(w_lo, w_hi, W):
        c_s = w0 + (offs_c // BLOCK_R) % W  # slot of column c
        hit = live[:, None] & (slot[:, None] == c_s[None, :])
        row_w = tl.max(hit.to(tl.int32), axis=1) > 0  # rows whose slot is in the window
        use_c = (tl.max(hit.to(tl.int32), axis=0) > 0) & (c_r < R)  # columns worth loading: slots in use, r < R
        t = tl.zeros((BLOCK_M, CW), dtype=tl.float32)
        if ROW_PTRS:  # 1-D row and column bases; the 2-D pointer tiles are rebuilt each step, not carried
            x_rows = x_ptr + row * stride_xm
            a_cols = a_ptr + c_p * stride_ap + c_s.to(tl.int64) * stride_as + expert * stride_ae + c_r * stride_ar
        else:
            x_ptrs = x_ptr + row[:, None] * stride_xm + offs_k[None, :] * stride_xk
            a_ptrs = (a_ptr + c_p[None, :] * stride_ap + c_s[None, :].to(tl.int64) * stride_as
                      + expert * stride_ae + c_r[None, :] * stride_ar + offs_k[:, None] * stride_ak)
        for k0 in range(0, K, BLOCK_K):
            k_ok = offs_k < K - k0
            if ROW_PTRS:
                x_ptrs = x_rows[:, None] + (k0 + offs_k)[None, :] * stride_xk
                a_ptrs = a_cols[None, :] + (k0 + offs_k)[:, None] * stride_ak
            xt = tl.load(x_ptrs, mask=row_w[:, None] & k_ok[None, :], other=0.0)  # rows of other windows: no bytes
            at = tl.load(a_ptrs, mask=k_ok[:, None] & use_c[None, :], other=0.0)  # (BLOCK_K, CW): A.T tiles
            t = tl.dot(xt, at, t)
            if not ROW_PTRS:
                x_ptrs += BLOCK_K * stride_xk
                a_ptrs += BLOCK_K * stride_ak
        # Kept in the weights' dtype, as the matrix units take it (the separate kernel casts its intermediate the
        # same way). Every real row is written, zeros where the pair has no live adapter in the window's slots: the
        # GEMM masks nothing per row.
        up, u_ok = _u_tile(u_ptr, rows, c_p, offs_c, w0, stride_up, W * BLOCK_R, BLOCK_R, shift)
        tl.store(up, tl.where(hit, t, 0.0).to(u_ptr.dtype.element_ty), mask=valid[:, None] & u_ok)


def check_lora_gemm_inputs(x, w, align, top_k, out, lora_a, lora_b, token_lora_mapping, lora_ids, adapter_enabled,
                           routed_weights, gather, what):
    """The checks of a base GEMM with the LoRA delta inside (this file's builds, and the tried ones in
    studies/kernels/tried/); returns (N, K, num_pairs, block_m, P, R, L)."""
    N, K, num_pairs, bm = check_gemm_inputs(x, w, align, top_k, out, routed_weights, gather, what)
    dev = x.device
    for nm, t in (("lora_a", lora_a), ("lora_b", lora_b)):
        check_tensor(nm, t, 5, (x.dtype,), dev)
    P, S, E, R, Ka = lora_a.shape
    if P not in (1, 2) or N % P or Ka != K or E != w.shape[0] or lora_b.shape != (P, S, E, N // P, R):
        raise ValueError(f"{what}: lora_a (P, S, E, r, K)={tuple(lora_a.shape)} and lora_b (P, S, E, N/P, r)="
                         f"{tuple(lora_b.shape)} must match w (E, N, K)={tuple(w.shape)} with P 1 or 2")
    M = num_pairs // top_k
    for nm, t in (("token_lora_mapping", token_lora_mapping), ("lora_ids", lora_ids),
                  ("adapter_enabled", adapter_enabled)):
        check_tensor(nm, t, 1, (torch.int32,), dev)
    L = lora_ids.shape[0]
    if token_lora_mapping.shape != (M,) or adapter_enabled.shape != (L,) or not 1 <= L <= S:
        raise ValueError(f"{what}: token_lora_mapping must be (M,)=({M},) and lora_ids / adapter_enabled (L,) "
                         f"with 1 <= L <= S={S}; got {tuple(token_lora_mapping.shape)}, {tuple(lora_ids.shape)}, "
                         f"{tuple(adapter_enabled.shape)}")
    return N, K, num_pairs, bm, P, R, L


def pack_lora_b(lora_b: torch.Tensor, block_rank: int | None = None) -> torch.Tensor:
    """B (P, S, E, N/P, R) -> (E, N, P * C), C = S_POW2 * BR: for output column n of slice p, every slot's B row
    side by side in the columns [p * C, (p + 1) * C), each padded from R to BR = block_r(R) with zeros (slots past S
    too), and zeros in the other slice's columns (so a GEMM tile across the gate/up boundary needs no mask). Build
    it once per adapter load, outside any captured graph: it is the packed expand's weight, as w is the base GEMM's."""
    if lora_b.dim() != 5:
        raise ValueError(f"pack_lora_b: lora_b must be (P, S, E, N/P, R), got shape {tuple(lora_b.shape)}")
    P, S, E, NS, R = lora_b.shape
    br = block_rank or block_r(R)
    if br < R:
        raise ValueError(f"pack_lora_b: block_rank={br} is below the rank R={R}")
    bp = torch.zeros(E, P, NS, P, pow2(S), br, dtype=lora_b.dtype, device=lora_b.device)
    for p in range(P):
        bp[:, p, :, p, :S, :R] = lora_b[p].permute(1, 2, 0, 3)
    return bp.reshape(E, P * NS, P * pow2(S) * br)


def lora_shrink_packed(x, lora_a, align, top_k, token_lora_mapping, lora_ids, adapter_enabled, u, blk, *,
                       gather=True, block_k: int = 64, num_warps: int = 4, num_stages: int = 3, sub_m: int = 0,
                       slot_window: int = 0, both_slices: bool = False, row_ptrs: bool = False,
                       max_regs: int = 0, u_pair: bool = False, tail_cols=None,
                       slot_order: bool = False, block_order=None, tail_win: int = 0):
    """u[i, p] and blk for the pairs of the alignment (see the module doc); inputs as `moe_gemm_lora_packed`.
    sub_m: rows per program when fewer than the alignment's BLOCK_M (a power of two dividing it; 0: all of them).
    slot_window: slots per dot (a power of two; 0: every slot in one dot). Only the windows between the program's
    first and last live slot are computed (the others get zeros), so on the alignment ordered by LoRA row (one or two
    slots per block) a window of 1 computes about the rank columns each pair needs instead of every slot's.
    both_slices: gate_up's two slices from one x tile (x read once) instead of one program per slice.
    row_ptrs: the pointer tiles rebuilt from 1-D bases each K step (fewer registers). max_regs: a register cap per
    thread (ptxas maxnreg: 128 fits four programs of 4 warps per SM; a dot over every slot needs more). u_pair: u's
    rows are the pairs' (u (M, top_k, P, C), any strides with unit columns: the wide build's columns past K of the
    down GEMM's x rows, or of gate_up's token rows), every real row written, and tail_cols ((1,) int32) the columns
    the wide GEMM walks: P * C, or 0 when no adapter is live. slot_order: the programs take the alignment's blocks
    slot by slot (`align.slot_major_order`, one more launch: gate_up's x rows, read once per expert of a token, come
    back from DRAM less often). block_order: that order, or any int32 permutation of the blocks, given (the same
    result either way, bit for bit: each block is computed as without it). tail_win (u_pair, one slice): each pair's
    u is written shifted to its block's window (from its first live slot's column, kept inside C, where its live
    slots lie within tail_win columns; else unshifted) and tail_cols is tail_win when every block fits, C when one
    does not (the GEMM's window: `Tail.win`), 0 when nothing is live."""
    if u_pair and tail_cols is None:
        raise ValueError("lora_shrink_packed: u_pair needs tail_cols, the (1,) int32 the wide GEMM reads")
    P, S, E, R, K = lora_a.shape
    L = lora_ids.shape[0]
    num_pairs = token_lora_mapping.shape[0] * top_k
    if u.dim() != (4 if u_pair else 3) or u.stride(-1) != 1:
        raise ValueError(f"lora_shrink_packed: u must be {'(M, top_k, P, C)' if u_pair else '(EM, P, C)'} with unit "
                         f"column stride, got shape {tuple(u.shape)}, strides {u.stride()}")
    bm, br = align.block_m, u.shape[-1] // pow2(S)
    rows = sub_m if sub_m and sub_m < bm else bm
    if bm % rows or rows < 16:
        raise ValueError(f"lora_shrink_packed: sub_m={sub_m} must be a power of two >= 16 dividing BLOCK_M={bm}")
    win = slot_window or pow2(S)
    if win != pow2(win) or win > pow2(S):
        raise ValueError(f"lora_shrink_packed: slot_window={slot_window} must be a power of two <= {pow2(S)} "
                         f"(the slots rounded up to a power of two), or 0 for all of them")
    p_all = P if both_slices else 1
    nb_launch = min(align.expert_ids.shape[1], num_pairs)  # as moe_gemm: a static bound on busy blocks
    if slot_order and block_order is None:
        block_order = slot_major_order(align, top_k, token_lora_mapping, lora_ids, S, adapter_enabled)
    if block_order is not None and (block_order.dtype != torch.int32 or block_order.dim() != 1
                                    or block_order.shape[0] != align.expert_ids.shape[1]):
        raise ValueError(f"lora_shrink_packed: block_order must be an int32 permutation of the alignment's "
                         f"{align.expert_ids.shape[1]} blocks, got {block_order.dtype} {tuple(block_order.shape)}")
    if tail_win and (not u_pair or P != 1 or tail_win % br or not 0 < tail_win < pow2(S) * br):
        raise ValueError(f"lora_shrink_packed: tail_win={tail_win} needs u_pair, one slice and a multiple of "
                         f"BLOCK_R={br} below C={pow2(S) * br}")
    if tail_win:
        tail_cols.zero_()  # the programs raise it with atomic_max: the window, or C where a block's slots spill over
    bk = min(block_k, max(16, pow2(K)))
    stages = stages_for(num_stages, (rows * bk + bk * p_all * win * br) * x.element_size())
    packed_shrink_kernel[(nb_launch * (bm // rows), P // p_all)](
        x, lora_a, u, blk, tail_cols if u_pair else blk, align.sorted_token_ids, align.expert_ids,
        align.num_tokens_post_padded,
        token_lora_mapping, lora_ids, adapter_enabled, blk if block_order is None else block_order,
        K, R, S, L, num_pairs, top_k, x.stride(0), x.stride(1), *lora_a.stride(), u.stride(0), u.stride(-2),
        u.stride(1) if u_pair else 0,
        BLOCK_M=rows, BLOCK_K=bk, BLOCK_R=br, S_POW2=pow2(S), GATHER=bool(gather), L_POW2=pow2(L), SUB=bm // rows,
        SLOT_W=win, P_ALL=p_all, ROW_PTRS=bool(row_ptrs), U_PAIR=bool(u_pair),
        ORDERED=block_order is not None, TAIL_WIN=int(tail_win),
        num_warps=num_warps,
        num_stages=stages, **reg_cap(max_regs),
    )
    return u


def moe_gemm_lora_packed(x, w, align, top_k, out, lora_a, lora_b, token_lora_mapping, lora_ids, adapter_enabled, *,
                         routed_weights=None, gather=True, config: GemmConfig | None = None, b_packed=None,
                         shrink_out=None, per_slot: bool = False, shrink: dict | None = None,
                         expand: dict | None = None):
    """out[pair] = (x[row] @ w[e].T + delta[pair]) (* routed weight), as `moe_gemm_lora` (same arguments, same
    result), computed as the packed shrink + the base GEMM with the adapters' columns as extra K iterations. Fully
    writes `out`; pairs without a live adapter get the plain GEMM's output bit for bit (0 * finite B: every slot's
    B must be finite, loaded or not).

    b_packed: `pack_lora_b(lora_b)`, built once (else built here, per call). shrink_out: an optional (EM, P, C)
    buffer for u. per_slot: one expand dot of depth BLOCK_R per slot in the block's range instead of one over all C
    columns (pays where the alignment is ordered by LoRA row, `moe_align(order_by=)`: few slots per block).
    shrink: the shrink's options (`lora_shrink_packed`'s keywords: sub_m, slot_window, both_slices, ...).
    expand: the GEMM's expand options, `depth` (the columns of one expand dot, a power of two from BLOCK_R to C:
    e.g. two slots per dot with per_slot; default BLOCK_R per slot, else C) and `tile` (GemmConfig fields replaced in
    the GEMM's tile, `config` else the table's: e.g. dict(persistent=0, flatten=False), a program per tile)."""
    expand = dict(expand or {})
    if set(expand) - EXPAND_OPTIONS:
        raise ValueError(f"moe_gemm_lora_packed: unknown expand options {sorted(set(expand) - EXPAND_OPTIONS)}; "
                         f"known: {sorted(EXPAND_OPTIONS)}")
    sizes = check_lora_gemm_inputs(x, w, align, top_k, out, lora_a, lora_b, token_lora_mapping, lora_ids,
                                   adapter_enabled, routed_weights, gather, "moe_gemm_lora_packed")
    N, K, num_pairs, bm, P, R, L = sizes
    if R == 0:  # nothing to add; decided from the static shape
        return moe_gemm(x, w, align, top_k, out, routed_weights=routed_weights, gather=gather, config=config)
    S, E = lora_a.shape[1], lora_a.shape[2]
    br = block_r(R)
    C = pow2(S) * br
    if b_packed is None:
        b_packed = pack_lora_b(lora_b, br)
    elif b_packed.shape != (E, N, P * C) or b_packed.dtype != x.dtype or not b_packed.is_contiguous():
        raise ValueError(f"b_packed must be pack_lora_b(lora_b): a contiguous {x.dtype} tensor of shape "
                         f"(E, N, P * C)={(E, N, P * C)}, got {b_packed.dtype} {tuple(b_packed.shape)}")
    shape = (align.sorted_token_ids.shape[1], P, C)
    if shrink_out is None:
        u = torch.empty(shape, dtype=x.dtype, device=x.device)
    elif shrink_out.shape != shape or shrink_out.dtype != x.dtype or not shrink_out.is_contiguous():
        raise ValueError(f"shrink_out must be a contiguous {x.dtype} tensor of shape (EM, P, C)={shape}, "
                         f"got {shrink_out.dtype} {tuple(shrink_out.shape)}")
    else:
        u = shrink_out
    ek = int(expand.get("depth") or (br if per_slot else C))
    if ek < br or ek > C or ek & (ek - 1):
        raise ValueError(f"moe_gemm_lora_packed: expand depth must be a power of two from BLOCK_R={br} to C={C}, "
                         f"got {ek}")
    if expand.get("tile"):
        cfg = config or gemm_config(num_pairs // top_k, bm, N, K, E)
        try:
            config = replace(cfg, **expand["tile"])
        except TypeError as e:
            raise ValueError(f"moe_gemm_lora_packed: expand tile {expand['tile']} names a field GemmConfig does not "
                             f"have") from e
    blk = torch.empty((align.expert_ids.shape[1], 2), dtype=torch.int32, device=x.device)
    lora_shrink_packed(x, lora_a, align, top_k, token_lora_mapping, lora_ids, adapter_enabled, u, blk, gather=gather,
                       **(shrink or {}))
    checked_gemm(x, w, align, top_k, out, sizes[:4], routed_weights, gather, config, Packed(u, blk, b_packed, ek), None)
    return out


# ------------------------------------------------------------------------------------------------
# The wide build: the adapters' columns in the GEMM's own operands (down: past K of each pair's row; gate_up: past K
# of each token's row, one tail per pair, walked per block)
# ------------------------------------------------------------------------------------------------
def wide_weights(w: torch.Tensor, b_packed: torch.Tensor) -> torch.Tensor:
    """(E, N, K + C): w's columns, then B_packed's (`pack_lora_b` of the op's B: down's P = 1, gate_up's P = 2). The
    base GEMM runs on its view [..., :K]; `moe_gemm_lora_wide` on all of it. Built once, with the weights; an adapter
    load rewrites the last C columns in place."""
    if w.dim() != 3 or b_packed.dim() != 3 or b_packed.shape[:2] != w.shape[:2] or b_packed.dtype != w.dtype:
        raise ValueError(f"wide_weights: b_packed (E, N, C) must match w (E, N, K) in E, N and dtype, got "
                         f"{tuple(b_packed.shape)} {b_packed.dtype} and {tuple(w.shape)} {w.dtype}")
    return torch.cat([w, b_packed], dim=2).contiguous()


def wide_path_bytes(shape, lora, dtype: torch.dtype) -> int:
    """The bytes the wide path adds to one layer beyond the base weights and the pool's stacks: the C columns past
    K of w13's and w2's wide builds, and the packed B they are refreshed from (`LayerLoRAWeights.packed`), for
    gate_up (P = 2) and down (P = 1). Read by the build's sizing (model/sizing.py) before anything is allocated."""
    E, K, I = shape.num_experts, shape.hidden, shape.intermediate
    per_slice = pow2(lora.max_loras) * block_r(lora.max_rank)
    return 2 * (E * 2 * I * 2 * per_slice + E * K * per_slice) * dtype.itemsize


def wide_columns(lora_a: torch.Tensor) -> int:
    """C, each pair's adapter columns in the wide build for A (P, S, E, R, K): every slice's and slot's BLOCK_R
    columns side by side, S rounded up to a power of two (as `pack_lora_b` lays them: the columns past K of w_wide's
    rows). The down GEMM's x rows (pairs) carry C more columns; gate_up's (tokens) carry top_k * C, one tail per
    pair (`x_wide_columns`)."""
    return lora_a.shape[0] * pow2(lora_a.shape[1]) * block_r(lora_a.shape[3])


def x_wide_columns(lora_a: torch.Tensor, top_k: int, gather: bool) -> int:
    """The columns past K of the wide build's x rows: C (`wide_columns`) for the down GEMM's pair rows, top_k * C for
    gate_up's token rows."""
    return wide_columns(lora_a) * (top_k if gather else 1)


def moe_gemm_lora_wide(x, w, align, top_k, out, lora_a, token_lora_mapping, lora_ids, adapter_enabled, *,
                       routed_weights=None, gather: bool = False, config: GemmConfig | None = None,
                       shrink: dict | None = None, per_block: bool = False, window: int = 0):
    """The MoE GEMM with its LoRA delta, the adapters' columns as the last K iterations of the plain GEMM's own loop.
    x and w are the first K columns of wider tensors: w of w_wide = `wide_weights(w, pack_lora_b(B))` (C =
    `wide_columns(lora_a)` more columns), x of x_wide, whose columns past K this call overwrites with u:
    - down (gather=False, lora_a (1, S, E, R, K)): x_wide (M*top_k, K + C), each pair's u past K in its own row;
    - gate_up (gather=True, lora_a (2, S, E, R, K)): x_wide (M, K + top_k * C), the u of pair (token, j) in the
      columns K + j * C of its token's row; the GEMM's row pointers jump there after the K loop's last base step
      (`Tail.jump`: K must be a multiple of the tile's BLOCK_K).
    The shrink writes each pair's u (zeros where no adapter is live); the GEMM is `moe_gemm` with `Tail`: with any
    adapter live every tile walks K + C columns, else K, decided on the GPU. per_block: each tile walks only the
    columns of the slots its block's live pairs use (the shrink's per-block ranges), of its own slice, in whole
    BLOCK_K steps: on the alignment ordered by LoRA row (`moe_align(order_by=)`) one or two slots' instead of all C
    (K must be a multiple of BLOCK_K; a trip count per tile, so a persistent grid's loops are not flattened).
    window (down only): every tile walks `window` columns from its block's first live slot's (a multiple of
    BLOCK_R and of the tile's BLOCK_K, below C), one trip count for the launch; where a block's live slots spill
    past a window the shrink makes every tile walk all C (`Tail.win`). Same result as `moe_gemm_lora` (pairs without
    a live adapter bit for bit the plain GEMM's). shrink: `lora_shrink_packed`'s options."""
    P = 2 if gather else 1
    if lora_a.dim() != 5 or lora_a.shape[0] != P:
        raise ValueError(f"moe_gemm_lora_wide: lora_a must be ({P}, S, E, R, K), the "
                         f"{'gate_up' if gather else 'down'} GEMM's ({P} slice{'s' if P > 1 else ''}), got shape "
                         f"{tuple(lora_a.shape)}")
    _, S, E, R, K = lora_a.shape
    C, CX = wide_columns(lora_a), x_wide_columns(lora_a, top_k, gather)
    for nm, t, n in (("x", x, CX), ("w", w, C)):
        if not tail_columns(t, n):
            raise ValueError(f"moe_gemm_lora_wide: {nm} must be the first K={K} columns of a tensor with K + {n} = "
                             f"{K + n} columns ({P} slice(s) x {pow2(S)} slots x BLOCK_R {block_r(R)}"
                             f"{f' x top_k {top_k}' if nm == 'x' and gather else ''}), got shape {tuple(t.shape)}, "
                             f"strides {t.stride()}")
    if x.shape[1] != K or w.shape[2] != K or w.shape[0] != E:
        raise ValueError(f"moe_gemm_lora_wide: lora_a (P, S, E, R, K)={tuple(lora_a.shape)} must match x "
                         f"{tuple(x.shape)} and w {tuple(w.shape)} in K and E")
    # the base inputs checked before the shrink writes into x's columns past K
    sizes = check_gemm_inputs(x, w, align, top_k, out, routed_weights, gather, "moe_gemm_lora_wide")
    xs, M = x.stride(0), x.shape[0] if gather else x.shape[0] // top_k
    # u (M, top_k, P, C // P): pair (token, j)'s columns in x_wide, past K of its own row (down) or of its token's
    u = torch.as_strided(x, (M, top_k, P, C // P), (xs, C, C // P, 1) if gather else (top_k * xs, xs, C, 1),
                         x.storage_offset() + K)
    if window and (gather or per_block):
        raise ValueError("moe_gemm_lora_wide: window is the down GEMM's (gather=False) and excludes per_block")
    blk = torch.empty((align.expert_ids.shape[1], 2), dtype=torch.int32, device=x.device)
    cols = torch.empty(1, dtype=torch.int32, device=x.device)
    lora_shrink_packed(x, lora_a, align, top_k, token_lora_mapping, lora_ids, adapter_enabled, u, blk, gather=gather,
                       u_pair=True, tail_cols=cols, tail_win=window, **(shrink or {}))
    # x's and w's rows were checked above for the tail's C columns (x's for each of a token's top_k when gathered)
    checked_gemm(x, w, align, top_k, out, sizes, routed_weights, gather, config, None,
                 Tail(C, cols, C if gather else 0, blk if per_block or window else None, P, window))
    return out
