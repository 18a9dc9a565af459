"""The packed build with the options the studies tried and no plan takes (studies/kernels/README.md): a study-owned
copy of the library's packed shrink (lora_moe_lab/kernels/fused_moe_lora_packed.py) with X_KEEP (cache hints: x
evict_last, A and u evict_first), and `moe_gemm_lora_packed_switches`, the packed GEMM with the expand options
`unroll`, `prefetch`, `u_ptr` and `early` (tried/fused_moe_switches.py) beside the library's `depth` and `tile`.
`LAST_PACKED_LAUNCH` holds the last launch's shrink grid and expand depth (recordings, tests). With none of the
tried options set they compute what the library computes, bit for bit (tried/test_tried_builds.py)."""
from dataclasses import replace

import torch
import triton
import triton.language as tl

from lora_moe_lab.kernels.align import slot_major_order
from lora_moe_lab.kernels.common import pow2, reg_cap, stages_for
from lora_moe_lab.kernels.configs import GemmConfig, block_r, gemm_config
from lora_moe_lab.kernels.fused_moe import block_pairs, moe_gemm
from lora_moe_lab.kernels.fused_moe_lora_packed import _u_tile, check_lora_gemm_inputs, lora_rows, pack_lora_b
from studies.kernels.tried.fused_moe_switches import PackedSwitches, moe_gemm_switches

EXPAND_OPTIONS = frozenset({"unroll", "prefetch", "depth", "u_ptr", "early", "tile"})
LAST_PACKED_LAUNCH: dict = {}  # the last launch's shrink grid and expand depth (recordings, tests)


@triton.jit(do_not_specialize=["num_pairs", "L"])
def packed_shrink_switches_kernel(
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
    P_ALL: tl.constexpr = 1, ROW_PTRS: tl.constexpr = False, X_KEEP: tl.constexpr = False,
    U_PAIR: tl.constexpr = False, ORDERED: tl.constexpr = False, TAIL_WIN: tl.constexpr = 0,
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
            # x rows come back for each of a token's top_k experts: X_KEEP asks L2 to keep them (evict_last) and to
            # stream A and u, each used once (evict_first); ncu saw the L2 hit rate unchanged (H200)
            xt = tl.load(x_ptrs, mask=row_w[:, None] & k_ok[None, :], other=0.0,
                         eviction_policy="evict_last" if X_KEEP else "")  # rows of other windows: no bytes
            at = tl.load(a_ptrs, mask=k_ok[:, None] & use_c[None, :], other=0.0,
                         eviction_policy="evict_first" if X_KEEP else "")  # (BLOCK_K, CW): A.T tiles side by side
            t = tl.dot(xt, at, t)
            if not ROW_PTRS:
                x_ptrs += BLOCK_K * stride_xk
                a_ptrs += BLOCK_K * stride_ak
        # Kept in the weights' dtype, as the matrix units take it (the separate kernel casts its intermediate the
        # same way). Every real row is written, zeros where the pair has no live adapter in the window's slots: the
        # GEMM masks nothing per row.
        up, u_ok = _u_tile(u_ptr, rows, c_p, offs_c, w0, stride_up, W * BLOCK_R, BLOCK_R, shift)
        tl.store(up, tl.where(hit, t, 0.0).to(u_ptr.dtype.element_ty), mask=valid[:, None] & u_ok,
                 eviction_policy="evict_first" if X_KEEP else "")


def lora_shrink_packed_switches(x, lora_a, align, top_k, token_lora_mapping, lora_ids, adapter_enabled, u, blk, *,
                       gather=True, block_k: int = 64, num_warps: int = 4, num_stages: int = 3, sub_m: int = 0,
                       slot_window: int = 0, both_slices: bool = False, row_ptrs: bool = False,
                       x_keep: bool = False, max_regs: int = 0, u_pair: bool = False, tail_cols=None,
                       slot_order: bool = False, block_order=None, tail_win: int = 0):
    """The library's `lora_shrink_packed` with x_keep: x loaded evict_last, A and u evict_first (meant to keep x
    rows, read once per expert of a token, in L2; the counters saw no change on the H200). As there:
    sub_m: rows per program when fewer than the alignment's BLOCK_M (a power of two dividing it; 0: all of them).
    slot_window: slots per dot (a power of two; 0: every slot in one dot). Only the windows between the program's
    first and last live slot are computed (the others get zeros), so on the alignment ordered by LoRA row (one or two
    slots per block) a window of 1 computes about the rank columns each pair needs instead of every slot's.
    both_slices: gate_up's two slices from one x tile (x read once) instead of one program per slice.
    row_ptrs: the pointer tiles rebuilt from 1-D bases each K step (fewer registers). x_keep: x loaded evict_last,
    A and u evict_first (meant to keep x rows, read once per expert of a token, in L2; the counters saw no change on
    the H200). max_regs: a register cap per thread (ptxas maxnreg: 128 fits four programs of 4 warps per
    SM; a dot over every slot needs more). u_pair: u's rows are the pairs' (u (M, top_k, P, C), any strides with unit
    columns: the wide build's columns past K of the down GEMM's x rows, or of gate_up's token rows), every real row
    written, and tail_cols ((1,) int32) the columns the wide GEMM walks: P * C, or 0 when no adapter is live.
    slot_order: the programs take the alignment's blocks slot by slot (`align.slot_major_order`, one more launch:
    gate_up's x rows, read once per expert of a token, come back from DRAM less often). block_order: that order, or
    any int32 permutation of the blocks, given (the same result either way, bit for bit: each block is computed as
    without it). tail_win (u_pair, one slice): each pair's u is written shifted to its block's window (from its first
    live slot's column, kept inside C, where its live slots lie within tail_win columns; else unshifted) and
    tail_cols is tail_win when every block fits, C when one does not (the GEMM's window: `Tail.win`), 0 when nothing
    is live."""
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
    bk = min(block_k, max(16, triton.next_power_of_2(K)))
    stages = stages_for(num_stages, (rows * bk + bk * p_all * win * br) * x.element_size())
    packed_shrink_switches_kernel[(nb_launch * (bm // rows), P // p_all)](
        x, lora_a, u, blk, tail_cols if u_pair else blk, align.sorted_token_ids, align.expert_ids,
        align.num_tokens_post_padded,
        token_lora_mapping, lora_ids, adapter_enabled, blk if block_order is None else block_order,
        K, R, S, L, num_pairs, top_k, x.stride(0), x.stride(1), *lora_a.stride(), u.stride(0), u.stride(-2),
        u.stride(1) if u_pair else 0,
        BLOCK_M=rows, BLOCK_K=bk, BLOCK_R=br, S_POW2=pow2(S), GATHER=bool(gather), L_POW2=pow2(L), SUB=bm // rows,
        SLOT_W=win, P_ALL=p_all, ROW_PTRS=bool(row_ptrs), X_KEEP=bool(x_keep), U_PAIR=bool(u_pair),
        ORDERED=block_order is not None, TAIL_WIN=int(tail_win),
        num_warps=num_warps,
        num_stages=stages, **reg_cap(max_regs),
    )
    LAST_PACKED_LAUNCH.update(shrink_programs=nb_launch * (bm // rows) * (P // p_all), BLOCK_M=bm, BLOCK_K=bk,
                              BLOCK_R=br, PACK_C=u.shape[-1], shrink_stages=stages, shrink_rows=rows,
                              shrink_window=win, shrink_slices=p_all)
    return u


def moe_gemm_lora_packed_switches(x, w, align, top_k, out, lora_a, lora_b, token_lora_mapping, lora_ids,
                                  adapter_enabled, *, routed_weights=None, gather=True,
                                  config: GemmConfig | None = None, b_packed=None, shrink_out=None,
                                  per_slot: bool = False, shrink: dict | None = None, expand: dict | None = None):
    """The library's `moe_gemm_lora_packed` with every expand option the studies tried (its shrink takes x_keep):
    out[pair] = (x[row] @ w[e].T + delta[pair]) (* routed weight), computed as the packed shrink + the base GEMM
    with the adapters' columns as extra K iterations. Fully
    writes `out`; pairs without a live adapter get the plain GEMM's output bit for bit (0 * finite B: every slot's
    B must be finite, loaded or not).

    b_packed: `pack_lora_b(lora_b)`, built once (else built here, per call). shrink_out: an optional (EM, P, C)
    buffer for u. per_slot: one expand dot of depth BLOCK_R per slot in the block's range instead of one over all C
    columns (pays where the alignment is ordered by LoRA row, `moe_align(order_by=)`: few slots per block).
    shrink: the shrink's options (`lora_shrink_packed`'s keywords: sub_m, slot_window, both_slices, ...).
    expand: the GEMM's expand options, `unroll` (guarded steps instead of a loop), `prefetch` (its operands'
    first lines into L2 before the K loop; the GPU only), `depth` (the columns of one expand dot, a power of two
    from BLOCK_R to C: e.g. two slots per dot with per_slot; default BLOCK_R per slot, else C) and `u_ptr` (u by
    pointer loads beside B's TMA copy, so the two are in flight together) and `early` (the first step's operands
    loaded before the K loop, by pointers; not with `unroll`) and `tile` (GemmConfig fields replaced in the GEMM's
    tile, `config` else the table's: e.g. dict(persistent=0, flatten=False), a program per tile)."""
    expand = dict(expand or {})
    if set(expand) - EXPAND_OPTIONS:
        raise ValueError(f"moe_gemm_lora_packed: unknown expand options {sorted(set(expand) - EXPAND_OPTIONS)}; "
                         f"known: {sorted(EXPAND_OPTIONS)}")
    N, K, num_pairs, bm, P, R, L = check_lora_gemm_inputs(x, w, align, top_k, out, lora_a, lora_b,
                                                          token_lora_mapping, lora_ids, adapter_enabled,
                                                          routed_weights, gather, "moe_gemm_lora_packed")
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
    if expand.get("early") and expand.get("unroll"):
        raise ValueError("moe_gemm_lora_packed: expand options `early` and `unroll` exclude each other (`early` "
                         "loads the first step of the expand's loop, `unroll` has no loop)")
    if expand.get("tile"):
        cfg = config or gemm_config(num_pairs // top_k, bm, N, K, E)
        try:
            config = replace(cfg, **expand["tile"])
        except TypeError as e:
            raise ValueError(f"moe_gemm_lora_packed: expand tile {expand['tile']} names a field GemmConfig does not "
                             f"have") from e
    blk = torch.empty((align.expert_ids.shape[1], 2), dtype=torch.int32, device=x.device)
    lora_shrink_packed_switches(x, lora_a, align, top_k, token_lora_mapping, lora_ids, adapter_enabled, u, blk,
                                gather=gather, **(shrink or {}))
    opts = (bool(expand.get(o)) for o in ("unroll", "prefetch", "u_ptr", "early"))
    moe_gemm_switches(x, w, align, top_k, out, routed_weights=routed_weights, gather=gather, config=config,
                      packed=PackedSwitches(u, blk, b_packed, ek, *opts))
    LAST_PACKED_LAUNCH.update(expand_k=ek, tile=config)  # tile: None = the plain GEMM's table tile
    return out
