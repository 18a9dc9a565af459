"""The base GEMM with every compile-time switch the kernel studies tried (studies/kernels/README.md), a study-owned
copy of the library's `fused_moe_kernel` (lora_moe_lab/kernels/fused_moe.py) from before the switches the plan never
takes left it. Its launcher `moe_gemm_switches` takes what the library's `moe_gemm` takes, and:

- lora (`Folded`): the folded rows build's expand (LORA, BLOCK_R, FOLD_DESC: t and B through TMA descriptors), the
  build of tried/fused_moe_lora_folded.py;
- packed (`PackedSwitches`): the packed expand with the four options no plan table sets: `unroll` (guarded steps,
  no loop: EXPAND_UNROLL), `prefetch` (its operands' first lines into L2 before the K loop: EXPAND_PREFETCH, inline
  PTX, off under the interpreter), `u_ptr` (u by pointer loads beside B's TMA copy: EXPAND_U_PTR) and `early` (the
  first step's operands loaded before the K loop: EXPAND_EARLY). Each lost or tied on the H200 (record_fold.py's
  expand section, studies/kernels/README.md, "The expand's waits").

With none of them set it computes what the library's kernel computes, bit for bit (tried/test_tried_builds.py)."""
from dataclasses import replace
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from lora_moe_lab import runtime
from lora_moe_lab.kernels.common import BASE_SMEM_BUDGET, cdiv, num_sms, reg_cap, stages_for
from lora_moe_lab.kernels.configs import GemmConfig, gemm_config
from lora_moe_lab.kernels.fused_moe import (Tail, _check_tail, _tma_device, block_pairs, check_gemm_inputs,
                                            check_tail_rows, grouped_tile, packed_tma_ok, rows_desc, tma_ok)
from lora_moe_lab.kernels.fused_moe_lora_packed import lora_rows

LAST_SWITCHES_LAUNCH: dict = {}  # the last launch's switches (tests, recordings)


@triton.jit
def _folded_expand(acc, lrow, live, expert, offs_n, n_ok, pid_m, pid_n, t_ptr, b_ptr, lora_ids_ptr, R, L, NS,
                   stride_tm, stride_tp, stride_bp, stride_bs, stride_be, stride_bn, stride_br, t_desc, b_desc,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, P: tl.constexpr,
                   STRADDLE: tl.constexpr, FOLD_DESC: tl.constexpr):
    """The LoRA expand as extra K iterations of the base GEMM: for each LoRA row l with a live adapter
    that some pair of this tile uses, acc += t_l @ B[p, slot(l), expert].T, one dot of depth BLOCK_R,
    where t_l is the shrink of the pairs of row l (the other pairs masked to 0: their loads move no
    bytes). A row no live pair of the tile uses costs a reduction, no load, no MMA; with every adapter
    disabled the tile is the plain GEMM plus one reduction (its metadata loads were issued before the K
    loop). Pairs without a live adapter get exact zeros added (0 * finite B), so their output is the plain
    GEMM's bit for bit. lrow, live: from `_folded_rows`, loaded before the K loop.

    t holds the shrink in the alignment's order (row pid_m * BLOCK_M + m: the tile's rows are one dense
    box). FOLD_DESC: t and B come through TMA descriptors (t as (EM, P * BLOCK_R), B as (P*S*E*NS, R)),
    so no (BLOCK_M, BLOCK_R) or (BLOCK_R, BLOCK_N) tensor of 64-bit addresses is live beside the
    accumulator; rows of other LoRA rows, other slices and columns past R are zeroed after the load."""
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_r = tl.arange(0, BLOCK_R)
    r_ok = offs_r < R
    p_n = offs_n // NS  # the slice (gate / up) of each column
    p0 = (pid_n * BLOCK_N) // NS  # the tile's first column's slice
    if tl.max(live.to(tl.int32), 0) > 0:  # one reduction; a tile without a live adapter ends here
        for l in range(0, L):
            here = live & (lrow == l)  # the pairs of row l, if its adapter is live
            if tl.max(here.to(tl.int32), 0) > 0:
                slot = tl.maximum(tl.load(lora_ids_ptr + l), 0).to(tl.int64)
                b_base = b_ptr + slot * stride_bs + expert * stride_be
                for q in tl.static_range(2 if STRADDLE else 1):  # a tile across the gate/up boundary: both slices
                    p = p0 + q
                    cols = n_ok & (p_n == p)
                    if FOLD_DESC:
                        t_box = t_desc.load([(pid_m * BLOCK_M).to(tl.int32), (p * BLOCK_R).to(tl.int32)])
                        tt = tl.where((here & (p < P))[:, None], t_box, 0.0).to(t_box.dtype)
                        # B's rows of (slice p, slot, expert) start at this row of the (P*S*E*NS, R) view; a tile
                        # across the slice boundary reads the neighbours' rows too, and they are masked out.
                        b_row = ((p * stride_bp + slot * stride_bs + expert * stride_be) // stride_bn
                                 + pid_n * BLOCK_N - p * NS)
                        b_box = b_desc.load([b_row.to(tl.int32), 0]).T  # (BLOCK_R, BLOCK_N) = B.T
                        bt = tl.where(cols[None, :], b_box, 0.0).to(b_box.dtype)
                    else:
                        tt = tl.load(t_ptr + offs_m[:, None] * stride_tm + p * stride_tp + offs_r[None, :],
                                     mask=here[:, None] & (p < P), other=0.0)
                        b_ptrs = (b_base + p * stride_bp + (offs_n - p * NS)[None, :] * stride_bn
                                  + offs_r[:, None] * stride_br)
                        bt = tl.load(b_ptrs, mask=r_ok[:, None] & cols[None, :], other=0.0)  # (BLOCK_R, BLOCK_N) = B.T
                    acc = tl.dot(tt, bt, acc)
    return acc


@triton.jit
def _packed_expand(acc, valid, expert, offs_n, pid_m, pid_n, blk_lo, blk_hi, u_ptr, bp_ptr, u_desc, bp_desc, N, NS,
                   stride_um, stride_pe, stride_pn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, P: tl.constexpr,
                   STRADDLE: tl.constexpr, PACK_C: tl.constexpr, EXPAND_K: tl.constexpr, PACK_DESC: tl.constexpr,
                   UNROLL: tl.constexpr, U_PTR: tl.constexpr, eu, eb, EARLY: tl.constexpr):
    """The packed LoRA expand (kernels/fused_moe_lora_packed.py): more K iterations of the base GEMM, no per-row
    logic. u (EM, P * PACK_C) holds each pair's shrink in the columns of its slice and its adapter's slot (zeros
    elsewhere, and in every real row without a live adapter), in the alignment's order, so the tile's rows are one
    dense box; B_packed (E * N, P * PACK_C) holds, for output column n, every slot's B row of n's slice side by side
    (zeros in the other slice's columns). [blk_lo, blk_hi): the columns of the slots this block's live pairs use
    (0, 0: nothing live, no iteration at all), walked EXPAND_K at a time (BLOCK_R: one dot per slot; PACK_C: one
    over every slot). A tile inside one slice reads that slice's columns; one across the gate/up boundary
    (STRADDLE) reads both, and the zeros of B_packed keep each column to its own slice. PACK_DESC: both operands
    through TMA descriptors, straight into shared memory (pointer loads would stage the (EXPAND_K, BLOCK_N) tile
    through registers beside the accumulator). EARLY: eu, eb are the first step's operands of the first slice,
    loaded before the K loop (`_packed_first`)."""
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
        if UNROLL:
            # No loop: PACK_C / EXPAND_K guarded steps. A second loop inside a persistent tile loop stops Triton from
            # flattening the two (FuseNestedLoops wants the K loop alone), and the flattened loop is where the plain
            # GEMM's next tile loads while this one drains. Rejected on the H200: the flattened loop pipelines these
            # loads too and spills (studies/kernels/README.md, "The expand's waits").
            for j in tl.static_range(PACK_C // EXPAND_K):
                c0 = base + lo + j * EXPAND_K
                if c0 < base + hi:
                    acc = _packed_step(acc, c0, valid, expert, offs_n, offs_u, offs_c, pid_m, pid_n, u_ptr, bp_ptr,
                                       u_desc, bp_desc, N, stride_um, stride_pe, stride_pn, BLOCK_M, BLOCK_N,
                                       PACK_DESC, U_PTR)
        else:
            start = base + lo
            if EARLY and q == 0:
                if lo < hi:
                    # Columns past the block's last slot to zero (u's are zero already): a select the compiler
                    # cannot drop, so eu and eb stay in registers across the K loop. Copied into shared memory at
                    # their load instead, they would wait for their data there, before the loop's first copies.
                    in_u = (start + offs_c)[None, :] < base + hi
                    in_b = (start + offs_c)[:, None] < base + hi
                    acc = tl.dot(tl.where(in_u, eu, 0.0).to(eu.dtype), tl.where(in_b, eb, 0.0).to(eb.dtype), acc)
                start += EXPAND_K
            # not pipelined: its buffers then fit beside (and reuse) the K loop's in shared memory
            for c0 in tl.range(start, base + hi, EXPAND_K, num_stages=1):
                acc = _packed_step(acc, c0, valid, expert, offs_n, offs_u, offs_c, pid_m, pid_n, u_ptr, bp_ptr, u_desc,
                                   bp_desc, N, stride_um, stride_pe, stride_pn, BLOCK_M, BLOCK_N, PACK_DESC, U_PTR)
    return acc


@triton.jit
def _packed_step(acc, c0, valid, expert, offs_n, offs_u, offs_c, pid_m, pid_n, u_ptr, bp_ptr, u_desc, bp_desc, N,
                 stride_um, stride_pe, stride_pn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 PACK_DESC: tl.constexpr, U_PTR: tl.constexpr):
    """One expand step: acc += u[tile rows, c0 : c0 + EXPAND_K] @ B_packed[tile columns, c0 : c0 + EXPAND_K].T."""
    if PACK_DESC:
        if U_PTR:  # u's rows by pointer loads: issued before B's TMA copy, so the two round trips overlap
            ut = tl.load(u_ptr + offs_u[:, None] * stride_um + (c0 + offs_c)[None, :])
        else:  # each TMA copy is waited for before the next is issued (ncu source view, studies/kernels/README.md)
            ut = u_desc.load([(pid_m * BLOCK_M).to(tl.int32), c0])
        bt = bp_desc.load([(expert * N + pid_n * BLOCK_N).to(tl.int32), c0]).T
    else:
        ut = tl.load(u_ptr + offs_u[:, None] * stride_um + (c0 + offs_c)[None, :], mask=valid[:, None], other=0.0)
        bt = tl.load(bp_ptr + expert * stride_pe + offs_n[None, :].to(tl.int64) * stride_pn + (c0 + offs_c)[:, None],
                     mask=(offs_n < N)[None, :], other=0.0)
    return tl.dot(ut, bt, acc)


@triton.jit
def _packed_first(blk_lo, blk_hi, expert, pid_m, pid_n, u_ptr, bp_ptr, N, NS, stride_um, stride_pe, stride_pn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STRADDLE: tl.constexpr, PACK_C: tl.constexpr,
                  EXPAND_K: tl.constexpr):
    """Before the K loop: the expand's first step (the first slice's EXPAND_K columns from the block's first slot),
    u's (BLOCK_M, EXPAND_K) and B_packed's (EXPAND_K, BLOCK_N) tiles, by pointer loads. A load does not block until
    its registers are read, so both round trips pass under the K loop's MMAs; the price is their registers, held
    across the loop. Their addresses wait only for blk, loaded beside the expert id the K loop waits for anyway.
    Nothing is read where the block has no live slot (zeros: the expand then skips the step)."""
    if STRADDLE:
        p0 = 0
    else:
        p0 = (pid_n * BLOCK_N) // NS
    c0 = p0 * PACK_C + (blk_lo // EXPAND_K) * EXPAND_K
    on = blk_hi > blk_lo
    offs_c = tl.arange(0, EXPAND_K)
    rows = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    eu = tl.load(u_ptr + rows[:, None] * stride_um + (c0 + offs_c)[None, :], mask=on, other=0.0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    eb = tl.load(bp_ptr + expert * stride_pe + offs_n[None, :].to(tl.int64) * stride_pn + (c0 + offs_c)[:, None],
                 mask=(offs_n < N)[None, :] & on, other=0.0)
    return eu, eb


@triton.jit
def _l2_prefetch(ptrs, mask):
    """prefetch.global.L2 of each pointer's line where mask: the line's DRAM read starts now and nothing waits for
    it; a later load of the line is an L2 hit. (PTX: not run by Triton's CPU interpreter; launchers turn it off.)"""
    tl.inline_asm_elementwise("{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.b32 $0, 0; }",
                              "=r,l,r", [ptrs, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _packed_prefetch(blk_lo, blk_hi, expert, pid_m, pid_n, u_ptr, bp_ptr, N, NS, stride_um, stride_pe, stride_pn,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STRADDLE: tl.constexpr, PACK_C: tl.constexpr):
    """Before the K loop: the expand's u rows and B_packed rows, the first 128 columns of the block's range, into L2
    (two 128-byte lines per row), so the expand's loads after the loop wait for L2, not for DRAM."""
    if STRADDLE:
        p0 = 0
    else:
        p0 = (pid_n * BLOCK_N) // NS
    c0 = p0 * PACK_C + (blk_lo // 64) * 64
    on = blk_hi > blk_lo
    rows_u = u_ptr + (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64) * stride_um + c0
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows_b = bp_ptr + expert * stride_pe + offs_n.to(tl.int64) * stride_pn + c0
    for h in tl.static_range(2):
        more = on & (blk_lo // 64 * 64 + h * 64 < blk_hi)
        _l2_prefetch(rows_u + h * 64, tl.full((BLOCK_M,), 0, tl.int1) | more)
        _l2_prefetch(rows_b + h * 64, (offs_n < N) & more)


# num_pairs / num_blocks depend on the number of tokens M. They are excluded from Triton's integer
# specialisation (divisible-by-16, equal-to-1) so that one compiled binary serves every M: a warm-up


@triton.jit(do_not_specialize=["num_pairs", "num_blocks", "L"])
def fused_moe_switches_kernel(
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
    # ---- the folded LoRA expand (read only when LORA; the tried rows build, studies/kernels/tried/) ----
    t_ptr,  # (EM, P, BLOCK_R) the shrink of each pair with a live adapter, in the alignment's order
    b_ptr,  # (P, S, E, NS, R) LoRA B, scaling folded in; N = P * NS
    mapping_ptr, lora_ids_ptr, enabled_ptr,  # (M,) LoRA row per token; (L,) weight slot / enabled per row
    R, L, NS,
    stride_tm, stride_tp, stride_bp, stride_bs, stride_be, stride_bn, stride_br,
    t_desc, b_desc,  # TMA descriptors of t (EM, P * BLOCK_R) and B (P*S*E*NS, R); read only when FOLD_DESC
    # ---- the packed LoRA expand (read only when PACKED; kernels/fused_moe_lora_packed.py) ----
    u_ptr,  # (EM, P * PACK_C): each pair's shrink in its slice's and slot's columns, in the alignment's order
    blk_ptr,  # (alignment blocks, 2) int32: the columns [lo, hi) of the slots each block's live pairs use
    bp_ptr,  # (E, N, P * PACK_C): B of every slot side by side, scaling folded in (`pack_lora_b`)
    stride_um, stride_pe, stride_pn,
    u_desc, bp_desc,  # TMA descriptors of u and B_packed (as (E * N, P * PACK_C)); read only when PACK_DESC
    tail_ptr,  # (1,) int32: the columns past K every tile walks (read only when TAIL)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    GATHER: tl.constexpr, HAS_RW: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, W_DESC: tl.constexpr,
    LORA: tl.constexpr = False, BLOCK_R: tl.constexpr = 16, P: tl.constexpr = 1, STRADDLE: tl.constexpr = False,
    FOLD_DESC: tl.constexpr = False, PERSIST: tl.constexpr = False, FLATTEN: tl.constexpr = False,
    EARLY_LOADS: tl.constexpr = False, SUB: tl.constexpr = 1,
    PACKED: tl.constexpr = False, PACK_C: tl.constexpr = 16, EXPAND_K: tl.constexpr = 16,
    PACK_DESC: tl.constexpr = False, EXPAND_UNROLL: tl.constexpr = False, EXPAND_PREFETCH: tl.constexpr = False,
    EXPAND_U_PTR: tl.constexpr = False, EXPAND_EARLY: tl.constexpr = False,
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
            _gemm_tile_switches(x_ptr, w_ptr, out_ptr, sorted_ids_ptr, rw_ptr, pid_m, pid_n, tl.maximum(expert, 0),
                       expert >= 0, N, K, num_pairs, top_k, stride_xm, stride_xk, stride_we, stride_wn, stride_wk,
                       stride_om, stride_on, w_desc, t_ptr, b_ptr, mapping_ptr, lora_ids_ptr, enabled_ptr, R, L, NS,
                       stride_tm, stride_tp, stride_bp, stride_bs, stride_be, stride_bn, stride_br, t_desc, b_desc,
                       u_ptr, blk_ptr + (pid_m // SUB) * 2, bp_ptr, stride_um, stride_pe, stride_pn, u_desc, bp_desc,
                       BLOCK_M, BLOCK_N, BLOCK_K, GATHER, HAS_RW, EVEN_K, EVEN_N, W_DESC, False, BLOCK_R, P,
                       STRADDLE, FOLD_DESC, EARLY_LOADS, PACKED, PACK_C, EXPAND_K, PACK_DESC, EXPAND_UNROLL,
                       EXPAND_PREFETCH, EXPAND_U_PTR, EXPAND_EARLY, kb, TAIL_J, TAIL_BLK, TAIL_WIN)
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
        _gemm_tile_switches(x_ptr, w_ptr, out_ptr, sorted_ids_ptr, rw_ptr, pid_m, pid_n, expert, True, N, K, num_pairs,
                   top_k, stride_xm, stride_xk, stride_we, stride_wn, stride_wk, stride_om, stride_on, w_desc,
                   t_ptr, b_ptr, mapping_ptr, lora_ids_ptr, enabled_ptr, R, L, NS, stride_tm, stride_tp, stride_bp,
                   stride_bs, stride_be, stride_bn, stride_br, t_desc, b_desc,
                   u_ptr, blk_ptr + (pid_m // SUB) * 2, bp_ptr, stride_um, stride_pe, stride_pn, u_desc, bp_desc,
                   BLOCK_M, BLOCK_N, BLOCK_K, GATHER, HAS_RW, EVEN_K, EVEN_N, W_DESC, LORA, BLOCK_R, P, STRADDLE,
                   FOLD_DESC, EARLY_LOADS, PACKED, PACK_C, EXPAND_K, PACK_DESC, EXPAND_UNROLL, EXPAND_PREFETCH,
                   EXPAND_U_PTR, EXPAND_EARLY, kb, TAIL_J, TAIL_BLK, TAIL_WIN)


@triton.jit
def _gemm_tile_switches(x_ptr, w_ptr, out_ptr, sorted_ids_ptr, rw_ptr, pid_m, pid_n, expert, owned, N, K, num_pairs,
                        top_k,
               stride_xm, stride_xk, stride_we, stride_wn, stride_wk, stride_om, stride_on, w_desc,
               t_ptr, b_ptr, mapping_ptr, lora_ids_ptr, enabled_ptr, R, L, NS,
               stride_tm, stride_tp, stride_bp, stride_bs, stride_be, stride_bn, stride_br, t_desc, b_desc,
               u_ptr, blk, bp_ptr, stride_um, stride_pe, stride_pn, u_desc, bp_desc,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GATHER: tl.constexpr,
               HAS_RW: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, W_DESC: tl.constexpr,
               LORA: tl.constexpr, BLOCK_R: tl.constexpr, P: tl.constexpr, STRADDLE: tl.constexpr,
               FOLD_DESC: tl.constexpr, EARLY_LOADS: tl.constexpr, PACKED: tl.constexpr, PACK_C: tl.constexpr,
               EXPAND_K: tl.constexpr, PACK_DESC: tl.constexpr, EXPAND_UNROLL: tl.constexpr,
               EXPAND_PREFETCH: tl.constexpr, EXPAND_U_PTR: tl.constexpr, EXPAND_EARLY: tl.constexpr, kb,
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
        if LORA:
            lrow, _, live = lora_rows(pair, valid, top_k, mapping_ptr, lora_ids_ptr, enabled_ptr, L)
    if PACKED:  # the block's slot columns: two scalars, loaded before the K loop so their latency hides under it
        blk_lo = tl.load(blk)
        blk_hi = tl.load(blk + 1)
        if EXPAND_PREFETCH:
            _packed_prefetch(blk_lo, blk_hi, expert, pid_m, pid_n, u_ptr, bp_ptr, N, NS, stride_um, stride_pe,
                             stride_pn, BLOCK_M, BLOCK_N, STRADDLE, PACK_C)
        if EXPAND_EARLY:
            eu, eb = _packed_first(blk_lo, blk_hi, expert, pid_m, pid_n, u_ptr, bp_ptr, N, NS, stride_um, stride_pe,
                                   stride_pn, BLOCK_M, BLOCK_N, STRADDLE, PACK_C, EXPAND_K)
        else:
            eu, eb = 0, 0
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

    if LORA:
        if not EARLY_LOADS:
            lrow, _, live = lora_rows(pair, valid, top_k, mapping_ptr, lora_ids_ptr, enabled_ptr, L)
        acc = _folded_expand(acc, lrow, live, expert, offs_n, n_ok, pid_m, pid_n, t_ptr, b_ptr, lora_ids_ptr, R, L,
                             NS, stride_tm, stride_tp, stride_bp, stride_bs, stride_be, stride_bn, stride_br, t_desc,
                             b_desc, BLOCK_M, BLOCK_N, BLOCK_R, P, STRADDLE, FOLD_DESC)
    if PACKED:
        acc = _packed_expand(acc, valid, expert, offs_n, pid_m, pid_n, blk_lo, blk_hi, u_ptr, bp_ptr, u_desc,
                             bp_desc, N, NS, stride_um, stride_pe, stride_pn, BLOCK_M, BLOCK_N, P, STRADDLE, PACK_C,
                             EXPAND_K, PACK_DESC, EXPAND_UNROLL, EXPAND_U_PTR, eu, eb, EXPAND_EARLY)
    if HAS_RW:
        if not EARLY_LOADS:
            rw = tl.load(rw_ptr + pair, mask=valid, other=0.0)
        acc = acc * rw[:, None]
    out_ptrs = out_ptr + pair[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=valid[:, None] & n_ok[None, :])



class Folded(NamedTuple):
    """The folded LoRA expand's operands (studies/kernels/tried/fused_moe_lora_folded.py checks and builds them):
    t (EM, P, BLOCK_R) the shrink in the alignment's order, lora_b (P, S, E, N/P, R), the (M,) token ->
    LoRA row mapping and the (L,) weight slot / enabled of each row; desc: read t and B through TMA
    descriptors where they allow it (`fold_tma_ok`)."""
    t: torch.Tensor
    lora_b: torch.Tensor
    mapping: torch.Tensor
    lora_ids: torch.Tensor
    enabled: torch.Tensor
    desc: bool = False


def fold_tma_ok(t, b) -> bool:
    """Whether the folded expand may read t (EM, P, BLOCK_R) and B (P, S, E, NS, R) through TMA: both
    contiguous at 16-byte aligned bases, B's rows (R elements) a 16-byte multiple, 32-bit coordinates;
    on compute capability 9 or newer, or the interpreter."""
    return _tma_device(t) and (t.is_contiguous() and b.is_contiguous() and t.data_ptr() % 16 == 0
                               and b.data_ptr() % 16 == 0 and (b.shape[4] * b.element_size()) % 16 == 0
                               and b.numel() // b.shape[4] < 2 ** 31 and t.shape[0] < 2 ** 31)




class PackedSwitches(NamedTuple):
    """The packed expand's operands as the library's `fused_moe.Packed`, with the tried expand options."""
    u: torch.Tensor
    blk: torch.Tensor
    b_packed: torch.Tensor
    expand_k: int
    unroll: bool = False  # the expand as guarded steps, no loop (EXPAND_UNROLL)
    prefetch: bool = False  # its operands' first lines into L2 before the K loop (EXPAND_PREFETCH; GPU only)
    u_ptr: bool = False  # u by pointer loads, B through TMA: the two loads in flight together (EXPAND_U_PTR)
    early: bool = False  # the first step's u and B tiles loaded before the K loop, by pointers (EXPAND_EARLY)


def moe_gemm_switches(x, w, align, top_k, out, *, routed_weights=None, gather=True, config: GemmConfig | None = None,
                      lora: Folded | None = None, packed: PackedSwitches | None = None, tail: Tail | None = None):
    """out[pair] = x[row] @ w[expert(pair)].T (* routed weight), row = pair // top_k if gather else pair.

    x: (M, K) or (M*top_k, K); w: (E, N, K); align: Alignment with S=1; out: (M*top_k, N), fully written.
    lora (`Folded`, from `moe_gemm_lora_folded` only): each pair's LoRA expand added before the scaling;
    the folded GEMM always runs a program per tile at the alignment's BLOCK_M (config.persistent and config.sub_m
    apply to the plain GEMM only). packed (`PackedSwitches`, from `packed_switches.moe_gemm_lora_packed_switches`):
    the packed expand added before the scaling, with its tried options; it runs on the plain GEMM's tile table as it
    is (persistent grids and sub-blocks included).
    tail (`Tail`, from `moe_gemm_lora_wide` only): x's and w's rows go on for tail.c columns (the adapters'), which
    the K loop walks when any adapter is live (with tail.blk: only the columns of the slots in the tile's block, of
    the tile's slice); the plain GEMM's kernel, tile table and loop otherwise.
    """
    N, K, num_pairs, bm = check_gemm_inputs(x, w, align, top_k, out, routed_weights, gather)
    M = num_pairs // top_k
    cfg = config or gemm_config(M, bm, N, K, w.shape[0])
    if config is None and lora is not None and cfg.max_regs:
        # A table's register cap is the plain GEMM's (e.g. 128 for 2 programs/SM at TP=4 gate_up); the folded
        # build holds the expand's tiles too and does not compile under it (ptxas asks for >= 154): drop it.
        cfg = replace(cfg, max_regs=0)
    # sub_m (plain GEMM only): the kernel's tile takes sub_m of the alignment's bm rows, SUB sub-blocks per block
    sub_m = cfg.sub_m if cfg.sub_m and lora is None else bm
    if bm % sub_m:
        raise ValueError(f"moe_gemm: config.sub_m={cfg.sub_m} must divide the alignment's block_m={bm}")
    SUB = bm // sub_m
    # Blocks past num_tokens_post_padded only hold sentinels, and every busy block holds at least one
    # pair, so at most min(nb, num_pairs) blocks are busy: a static bound, no need to read ntpp. A busy block's
    # sub-blocks past its first may be padding only (they return at once), so all SUB of each are launched.
    nb_launch = min(align.expert_ids.shape[1], num_pairs) * SUB
    tiles = nb_launch * cdiv(N, cfg.block_n)
    # persistent (plain GEMM only): a static grid of programs per SM that loop over the busy tiles
    persist = bool(cfg.persistent) and lora is None
    grid = (min(tiles, num_sms(x.device) * cfg.persistent) if persist else tiles,)
    rw = routed_weights if routed_weights is not None else out  # dummy pointer, never read
    stages = stages_for(cfg.num_stages, (sub_m * cfg.block_k + cfg.block_k * cfg.block_n) * x.element_size(),
                        BASE_SMEM_BUDGET)
    check_tail_rows(tail, x, w, K, gather, top_k)
    tail_c, tail_kw = _check_tail(tail, x, w, K, lora is not None or packed is not None, gather, top_k)
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
    if lora is None:  # dummy pointers and strides, never read
        fold, fold_ints, fold_descs, fold_kw = (out,) * 5, (0,) * 10, (out, out), {}
    else:
        b, t = lora.lora_b, lora.t
        P, R, L, BR = b.shape[0], b.shape[4], lora.lora_ids.shape[0], t.shape[2]
        fold = (t, b, lora.mapping, lora.lora_ids, lora.enabled)
        fold_ints = (R, L, N // P, t.stride(0), t.stride(1), *b.stride())
        desc = lora.desc and fold_tma_ok(t, b)
        fold_descs = ((TensorDescriptor.from_tensor(t.view(t.shape[0], P * BR), [bm, BR]),
                       TensorDescriptor.from_tensor(b.view(-1, R), [cfg.block_n, BR])) if desc else (out, out))
        fold_kw = dict(LORA=True, BLOCK_R=BR, P=P, STRADDLE=P == 2 and (N // P) % cfg.block_n != 0, FOLD_DESC=desc)
    if packed is None:
        pack, pack_ints = (out,) * 3, (0,) * 3 + (out, out)
        if tail is not None and tail.blk is not None:  # the per-block slot columns, as the packed expand reads them
            pack = (out, tail.blk, out)
            fold_ints = (0, 0, N // tail.slices) + fold_ints[3:]
            fold_kw = dict(P=tail.slices, PACK_C=tail_c // tail.slices)
    else:
        if lora is not None:
            raise ValueError("moe_gemm: pass lora (the folded expand) or packed, not both")
        u, bp, ek = packed.u, packed.b_packed, packed.expand_k
        P, C = u.shape[1], u.shape[2]
        pdesc = _tma_device(u) and u.is_contiguous() and bp.is_contiguous() and packed_tma_ok(bp)
        u2, bp2 = u.view(u.shape[0], P * C), bp.view(-1, P * C)
        descs = ((TensorDescriptor.from_tensor(u2, [sub_m, ek]), TensorDescriptor.from_tensor(bp2, [cfg.block_n, ek]))
                 if pdesc else (out, out))
        pack, pack_ints = (u2, packed.blk, bp), (u2.stride(0), bp.stride(0), bp.stride(1)) + descs
        fold_ints = (0, 0, N // P) + fold_ints[3:]  # NS: the slice width (gate / up)
        fold_kw = dict(PACKED=True, P=P, STRADDLE=P == 2 and (N // P) % cfg.block_n != 0, PACK_C=C, EXPAND_K=ek,
                       PACK_DESC=pdesc, EXPAND_UNROLL=bool(packed.unroll),
                       EXPAND_PREFETCH=bool(packed.prefetch) and not runtime.interpreter(),  # inline PTX
                       EXPAND_U_PTR=bool(packed.u_ptr), EXPAND_EARLY=bool(packed.early))
    kw = dict(**fold_kw, **tail_kw)
    LAST_SWITCHES_LAUNCH.clear()
    LAST_SWITCHES_LAUNCH.update(kw)
    fused_moe_switches_kernel[grid](
        x, w, out, align.sorted_token_ids, align.expert_ids, align.num_tokens_post_padded, rw,
        N, K, num_pairs, nb_launch, top_k,
        x.stride(0), x.stride(1), w.stride(0), w.stride(1), w.stride(2), out.stride(0), out.stride(1), w_desc,
        *fold, *fold_ints, *fold_descs, *pack, *pack_ints, tail.cols if tail is not None else out,
        BLOCK_M=sub_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, SUB=SUB,
        GATHER=bool(gather), HAS_RW=routed_weights is not None,
        EVEN_K=cfg.even and K % cfg.block_k == 0 and tail_c % cfg.block_k == 0,
        EVEN_N=cfg.even and N % cfg.block_n == 0, W_DESC=use_desc,
        PERSIST=persist, FLATTEN=persist and cfg.flatten, EARLY_LOADS=cfg.early_loads,
        num_warps=cfg.num_warps, num_stages=stages, **fold_kw, **tail_kw, **reg_cap(cfg.max_regs),
    )
    return out

