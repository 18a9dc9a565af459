"""Fused MoE-LoRA shrink + expand (the `@triton.jit` kernel, its per-item helper,
and its launcher `lora_delta`).

For every adapter slot s and every (token, k) pair of that slot routed to expert e:

    out[pair, p*N:(p+1)*N] += (x[row(pair)] @ A[p, s, e].T) @ B[p, s, e].T   (* routed_weight[pair])

for the P slices p (P=2: gate and up of gate_up, which share the same x rows; P=1: down).

Work item = one block of BLOCK_M pairs of one slot's alignment (all of one expert) and a
1/SPLIT_N share of the N columns:
  * shrink: t_p = x_rows @ A[p, s, e].T for every slice, a (BLOCK_M, BLOCK_R) fp32 tile that stays in
    registers; each x tile is loaded once and used for both slices;
  * expand: for its N columns, out += t_p @ B[p, s, e].T, read-add-write of `out` in place; with
    PREFETCH (config `prefetch`) the loop is pipelined by hand, the next tile's loads issued before
    this tile's store (docs/design.md, "Bytes in flight").
No intermediate ever goes to memory and nothing is zero-filled. At small M there are few blocks, so
SPLIT_N > 1 spreads the columns of one block over several work items (each recomputes the cheap
shrink, whose A tiles then come from L2) to occupy more SMs.

The grid is persistent: a few programs per SM (a static number), each loops over the work items
g = pid, pid + nprog, ... The items are enumerated from the slot metadata only, live slots' busy
blocks first to last, so there are no idle programs at large M and no per-block launch cost.

Early exit (docs/design.md): no activation or weight is loaded for a slot whose lora_ids entry is -1,
whose adapter is disabled, for blocks at or past the slot's num_tokens_post_padded (those three
are decided for all slots at once from one round of metadata loads: with every slot disabled
each program returns right there, so the launch costs about an empty launch), or for a block
whose expert id is -1 (checked per item). With WRITE_EXIT each (slot, block) gets its code in
exit_ptr: 0 ran, 1 lora_id -1, 2 disabled, 3 past the end, 4 expert -1.

The rank is zero-padded to the pool's max rank R; BLOCK_R = next power of two >= max(R, 16) (the
matrix units need 16) and rows >= R are masked, so a BLOCK_R above R costs nothing extra in memory. Given
`lora_ranks` (the batch's (L,) rank per row, loaded whole with the exits' metadata) a work item masks past its own
adapter's rank instead, rounded up to 16 where R is a multiple of 16 (a mask on whole 16-lane vectors keeps B's
loads, R contiguous, 16 wide; a mask at an arbitrary lane would split them): a rank-8 adapter in a rank-64 pool
reads a quarter of the A rows. The padded lanes held zeros, so the result is the padded launch's bit for bit.
"""
import torch
import triton
import triton.language as tl

from .. import runtime  # noqa: F401  (first: TRITON_INTERPRET before the kernels are decorated)
from .common import (FLOAT_DTYPES, cdiv, check_alignment, check_compute_dtype, check_routed_weights,
                     check_tensor, num_pairs_of, num_sms, occupancy, pow2, reg_cap, stages_for)
from .configs import LoRAKernelConfig, block_r, lora_config
from .exits import names as _exit_names

# The exit codes the kernel writes with WRITE_EXIT, from the one table (kernels/exits.py; the rule itself is in the
# kernel below and, for the host, in ops/reference.py:exit_codes).
EXIT_CODES = _exit_names("fused_moe_lora_kernel")


@triton.jit
def own_rank(rks, offs, row, R, R16: tl.constexpr):
    """The rank LoRA row `row` reads (both LoRA kernels): its entry of the (L,) rank vector `rks` (`offs` its lanes),
    at most the padded R; 0 (not filled in, a hand-made buffer) reads R. R16 (R a multiple of 16): rounded up to 16,
    zeros past the rank, so the masks fall on whole 16-lane vectors and keep the loads wide."""
    rk = tl.sum(tl.where(offs == row, rks, 0), 0)
    if R16:
        rank = tl.multiple_of(tl.where(rk > 0, tl.minimum((rk + 15) // 16 * 16, R), R), 16)
    else:
        rank = tl.where(rk > 0, tl.minimum(rk, R), R)
    return rank


@triton.jit(do_not_specialize=["num_pairs", "num_blocks"])
def fused_moe_lora_kernel(
    x_ptr,  # (rows, K) activations; rows = M (GATHER) or M*top_k
    a_ptr,  # (P, S, E, R, K) LoRA A (shrink), R = padded max rank
    b_ptr,  # (P, S, E, N, R) LoRA B (expand), scaling folded in
    out_ptr,  # (M*top_k, P*N): the delta is ADDED here in place
    sorted_ids_ptr,  # (L, EM) int32 per-row alignment, sentinel = num_pairs
    expert_ids_ptr,  # (L, EM // BLOCK_M) int32, -1 = unused block
    ntpp_ptr,  # (L,) int32 num_tokens_post_padded per row
    lora_ids_ptr,  # (L,) int32 weight slot of each LoRA row, -1 = no adapter
    enabled_ptr,  # (L,) int32, 0 = adapter disabled for this batch
    ranks_ptr,  # (L,) int32 rank of each LoRA row (HAS_RANKS only; 0 = the padded R)
    rw_ptr,  # (M*top_k,) float32 routed weights (HAS_RW only)
    exit_ptr,  # (L, EM // BLOCK_M) int32 exit codes (WRITE_EXIT only)
    N, K, R,
    num_pairs,  # M * top_k, also the sentinel
    num_blocks,  # EM // BLOCK_M (blocks per slot row)
    top_k,
    n_per_split,  # columns per work item along N, a multiple of BLOCK_N
    stride_xm, stride_xk,
    stride_ap, stride_as, stride_ae, stride_ar, stride_ak,
    stride_bp, stride_bs, stride_be, stride_bn, stride_br,
    stride_om, stride_on,
    stride_ss,  # sorted_ids row stride (EM)
    stride_es,  # expert_ids row stride (EM // BLOCK_M)
    NUM_SLOTS: tl.constexpr, SLOTS_POW2: tl.constexpr,
    P: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_R: tl.constexpr, SPLIT_N: tl.constexpr,
    GATHER: tl.constexpr, HAS_RW: tl.constexpr, WRITE_EXIT: tl.constexpr, PREFETCH: tl.constexpr,
    EXPAND_STAGES: tl.constexpr = 0, HAS_RANKS: tl.constexpr = False, R16: tl.constexpr = False,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)

    # ---- debug: one exit code per (slot, block), from the metadata alone ----
    if WRITE_EXIT:
        for i in range(pid, NUM_SLOTS * num_blocks, nprog):
            s_ = i // num_blocks
            b_ = i % num_blocks
            lid_ = tl.load(lora_ids_ptr + s_)
            en_ = tl.load(enabled_ptr + s_)
            nt_ = tl.load(ntpp_ptr + s_)
            e_ = tl.load(expert_ids_ptr + s_ * stride_es + b_)
            code = tl.where(lid_ == -1, 1, tl.where(en_ == 0, 2, tl.where(b_ * BLOCK_M >= nt_, 3,
                                                                           tl.where(e_ == -1, 4, 0))))
            tl.store(exit_ptr + s_ * num_blocks + b_, code)

    # ---- early exits 1-3, for all slots at once: metadata only, one round of loads ----
    # Work item = (slot, block, N share). A slot contributes work only if it holds an adapter
    # (lora_ids != -1), the adapter is enabled, and only for its blocks below
    # num_tokens_post_padded. With every slot disabled `total` is 0 and the program ends here,
    # before any activation or weight load: the launch costs about an empty launch.
    offs_s = tl.arange(0, SLOTS_POW2)
    s_ok = offs_s < NUM_SLOTS
    lid = tl.load(lora_ids_ptr + offs_s, mask=s_ok, other=-1)
    en = tl.load(enabled_ptr + offs_s, mask=s_ok, other=0)
    nt = tl.load(ntpp_ptr + offs_s, mask=s_ok, other=0)
    if HAS_RANKS:
        rks = tl.load(ranks_ptr + offs_s, mask=s_ok, other=0)
    busy = tl.minimum((nt + BLOCK_M - 1) // BLOCK_M, num_blocks)
    items = tl.where((lid != -1) & (en != 0), busy * SPLIT_N, 0)
    cum = tl.cumsum(items, 0)  # inclusive prefix sum over slots
    total = tl.sum(items, 0)

    # Persistent loop: the grid is a few programs per SM (static), each takes every nprog-th item.
    for g in range(pid, total, nprog):
        slot = tl.sum((cum <= g).to(tl.int32), 0)  # the LoRA row whose item range holds g
        local = g - tl.sum(tl.where(offs_s < slot, items, 0), 0)
        pid_n = local % SPLIT_N
        b = local // SPLIT_N
        expert = tl.load(expert_ids_ptr + slot * stride_es + b)
        wslot = tl.sum(tl.where(offs_s == slot, lid, 0), 0)  # the row's weight slot (already loaded)
        if HAS_RANKS:
            rank = own_rank(rks, offs_s, slot, R, R16)
        else:
            rank = R
        if expert != -1:  # early exit 4, before any activation or weight load
            _lora_block(x_ptr, a_ptr, b_ptr, out_ptr, sorted_ids_ptr, rw_ptr, slot, wslot, b, pid_n, expert,
                        N, K, rank, num_pairs, top_k, n_per_split,
                        stride_xm, stride_xk, stride_ap, stride_as, stride_ae, stride_ar, stride_ak,
                        stride_bp, stride_bs, stride_be, stride_bn, stride_br, stride_om, stride_on, stride_ss,
                        P, BLOCK_M, BLOCK_N, BLOCK_K, BLOCK_R, GATHER, HAS_RW, PREFETCH, EXPAND_STAGES)


@triton.jit
def _lora_block(x_ptr, a_ptr, b_ptr, out_ptr, sorted_ids_ptr, rw_ptr, slot, wslot, b, pid_n, expert,
                N, K, R, num_pairs, top_k, n_per_split,
                stride_xm, stride_xk, stride_ap, stride_as, stride_ae, stride_ar, stride_ak,
                stride_bp, stride_bs, stride_be, stride_bn, stride_br, stride_om, stride_on, stride_ss,
                P: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                BLOCK_R: tl.constexpr, GATHER: tl.constexpr, HAS_RW: tl.constexpr, PREFETCH: tl.constexpr,
                EXPAND_STAGES: tl.constexpr):
    """One work item: BLOCK_M pairs of one (LoRA row, expert), N columns [pid_n * n_per_split, +n_per_split).
    `slot` indexes the alignment (the row), `wslot` the weight stacks (lora_ids[row])."""
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
    a_base = a_ptr + wslot.to(tl.int64) * stride_as + expert.to(tl.int64) * stride_ae
    b_base = b_ptr + wslot.to(tl.int64) * stride_bs + expert.to(tl.int64) * stride_be

    if PREFETCH >= 2:  # the first expand tile's loads overlap the shrink (they do not depend on it)
        n_start, n_end, n, n_ok, o_rows, b_cols = _expand_geometry(out_ptr, b_base, pair, offs_r, pid_n, n_per_split, N,
                                                                   stride_om, stride_br, BLOCK_N)
        bt0, o0, bt1, o1 = _expand_loads(b_cols, o_rows, n, n_ok, valid, r_ok, N, stride_bn, stride_on, stride_bp,
                                         P)

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
    else:
        rw = tl.zeros((BLOCK_M,), dtype=tl.float32)  # never read

    # ---- expand: out[:, p*N + n] += t_p @ B[p].T over this program's share of N ----
    if PREFETCH < 2:  # computed here, not before the shrink: fewer registers live across its loop
        n_start, n_end, n, n_ok, o_rows, b_cols = _expand_geometry(out_ptr, b_base, pair, offs_r, pid_n, n_per_split, N,
                                                                   stride_om, stride_br, BLOCK_N)
    if PREFETCH >= 1:
        # Software-pipelined by hand: the loads of tile j+1 (B and `out`) are issued before tile j
        # is stored, so two tiles of `out` are in flight per program instead of one. The stage
        # pipeliner only overlaps loads that feed a dot across iterations; the load of `out` feeds an
        # add whose result is stored to `out`, which the compiler may not reorder around the store.
        # At large M each work item is a read-add-write stream of (BLOCK_M, N) bytes, so the bytes in
        # flight per SM decide the bandwidth (Little's law: ~1 us of HBM latency x 4.8 TB/s).
        if PREFETCH == 1:
            bt0, o0, bt1, o1 = _expand_loads(b_cols, o_rows, n, n_ok, valid, r_ok, N, stride_bn, stride_on,
                                             stride_bp, P)
        for n0 in range(n_start, n_end, BLOCK_N):
            nn = n + BLOCK_N
            nn_ok = nn < n_end  # past this program's share: masked, no memory traffic
            bn0, on0, bn1, on1 = _expand_loads(b_cols, o_rows, nn, nn_ok, valid, r_ok, N, stride_bn, stride_on,
                                               stride_bp, P)
            _expand_store(t0, t1, bt0, o0, bt1, o1, rw, o_rows, n, n_ok, valid, N, stride_on, P, HAS_RW)
            n, n_ok, bt0, o0, bt1, o1 = nn, nn_ok, bn0, on0, bn1, on1
    elif EXPAND_STAGES > 0:
        # Pipelined by Triton's loop pipeliner (config `expand_stages`): tl.range's num_stages pipelines
        # every load of the loop, not only those that feed a dot, so the `out` tiles of the next
        # EXPAND_STAGES - 1 iterations stream into shared memory by cp.async while this one is added
        # and stored: the bytes in flight sit in shared memory (228 KB per SM) instead of registers.
        # Safe because the iterations touch disjoint columns of `out`.
        for n0 in tl.range(0, n_per_split, BLOCK_N, num_stages=EXPAND_STAGES):
            n = n_start + n0 + tl.arange(0, BLOCK_N)
            n_ok = n < n_end
            bt0, o0, bt1, o1 = _expand_loads(b_cols, o_rows, n, n_ok, valid, r_ok, N, stride_bn, stride_on,
                                             stride_bp, P)
            _expand_store(t0, t1, bt0, o0, bt1, o1, rw, o_rows, n, n_ok, valid, N, stride_on, P, HAS_RW)
    else:
        for n0 in range(0, n_per_split, BLOCK_N):
            n = n_start + n0 + tl.arange(0, BLOCK_N)
            n_ok = n < n_end
            # All loads of the iteration first (both slices), then the dots, then the stores: the
            # compiler may not move a load of `out` above a store to `out`, so this order keeps the
            # two slices' memory round trips overlapped instead of back to back.
            bt0, o0, bt1, o1 = _expand_loads(b_cols, o_rows, n, n_ok, valid, r_ok, N, stride_bn, stride_on,
                                             stride_bp, P)
            _expand_store(t0, t1, bt0, o0, bt1, o1, rw, o_rows, n, n_ok, valid, N, stride_on, P, HAS_RW)


@triton.jit
def _expand_geometry(out_ptr, b_base, pair, offs_r, pid_n, n_per_split, N, stride_om, stride_br, BLOCK_N: tl.constexpr):
    """This program's columns [n_start, n_end) of N, its first tile's columns, the row pointers of `out`
    and the B.T tile's row pointers (columns are added per tile)."""
    n_start = pid_n * n_per_split
    n_end = tl.minimum(n_start + n_per_split, N)
    n = n_start + tl.arange(0, BLOCK_N)
    return n_start, n_end, n, n < n_end, out_ptr + pair[:, None] * stride_om, b_base + offs_r[:, None] * stride_br


@triton.jit
def _expand_loads(b_cols, o_rows, n, n_ok, valid, r_ok, N, stride_bn, stride_on, stride_bp, P: tl.constexpr):
    """The B.T tiles and the `out` tiles of columns n, for both slices (slice 1 only when P == 2)."""
    b_ptrs = b_cols + n[None, :] * stride_bn
    b_mask = r_ok[:, None] & n_ok[None, :]
    o_ptrs = o_rows + n[None, :] * stride_on
    o_mask = valid[:, None] & n_ok[None, :]
    bt0 = tl.load(b_ptrs, mask=b_mask, other=0.0)
    o0 = tl.load(o_ptrs, mask=o_mask, other=0.0)
    if P == 2:
        bt1 = tl.load(b_ptrs + stride_bp, mask=b_mask, other=0.0)
        o1 = tl.load(o_ptrs + N * stride_on, mask=o_mask, other=0.0)
    else:
        bt1 = bt0
        o1 = o0
    return bt0, o0, bt1, o1


@triton.jit
def _expand_store(t0, t1, bt0, o0, bt1, o1, rw, o_rows, n, n_ok, valid, N, stride_on, P: tl.constexpr,
                  HAS_RW: tl.constexpr):
    """out[:, n] = o + t @ B.T (* routed weight) for both slices, accumulated in fp32."""
    o_ptrs = o_rows + n[None, :] * stride_on
    o_mask = valid[:, None] & n_ok[None, :]
    d0 = tl.dot(t0, bt0)
    if HAS_RW:
        d0 = d0 * rw[:, None]
    tl.store(o_ptrs, (o0.to(tl.float32) + d0).to(o_rows.dtype.element_ty), mask=o_mask)
    if P == 2:
        d1 = tl.dot(t1, bt1)
        if HAS_RW:
            d1 = d1 * rw[:, None]
        tl.store(o_ptrs + N * stride_on, (o1.to(tl.float32) + d1).to(o_rows.dtype.element_ty), mask=o_mask)


# --------------------------------------------------------------------------------------------
# Launcher
# --------------------------------------------------------------------------------------------
_OCCUPANCY: dict = {}  # compiled-kernel key -> programs of it that fit on one SM at once
_RESOURCES: dict = {}  # compiled-kernel key -> registers per thread and shared memory bytes (GPU only)


def lora_delta(x, lora_a, lora_b, align, lora_ids, adapter_enabled, top_k, out, *, routed_weights=None,
               gather=True, exit_codes=None, config: LoRAKernelConfig | None = None, lora_ranks=None):
    """ADD the LoRA delta into `out` in place (see ops/torch_backend.py: lora_delta for the exact contract).

    lora_a (P, S, E, r, K), lora_b (P, S, E, N, r), out (M*top_k, P*N); align: per-row Alignment with
    L LoRA rows (1 <= L <= S); lora_ids (L,) maps each row to its weight slot (or -1), adapter_enabled
    (L,). The pool's batches use L = S, row s = slot s; a compacted batch (the `per_active_count`
    graph strategy) has one row per active adapter. exit_codes: optional int32 (L, EM // BM) that
    receives each program's exit code. lora_ranks: optional int32 (L,) rank per row (the batch's
    `LoRABatchTensors.lora_ranks`): each work item reads only its adapter's rank of the zero-padded stacks (the same
    result, fewer bytes); it must cover the row's adapter (0 reads the padded rank).
    """
    check_tensor("x", x, 2, FLOAT_DTYPES)
    dev = x.device
    check_compute_dtype(x)
    check_tensor("lora_a", lora_a, 5, (x.dtype,), dev)
    check_tensor("lora_b", lora_b, 5, (x.dtype,), dev)
    check_tensor("out", out, 2, (x.dtype,), dev)
    P, S, E, R, K = lora_a.shape
    if P not in (1, 2):
        raise ValueError(f"lora_a must have 1 or 2 slices (P), got shape {tuple(lora_a.shape)}")
    Pb, Sb, Eb, N, Rb = lora_b.shape
    for nm, a, b in (("slices P", P, Pb), ("slots S", S, Sb), ("experts E", E, Eb), ("rank r", R, Rb)):
        if a != b:
            raise ValueError(f"lora_a {tuple(lora_a.shape)} and lora_b {tuple(lora_b.shape)} disagree on {nm}: "
                             f"{a} vs {b}")
    if x.shape[1] != K:
        raise ValueError(f"x has K={x.shape[1]} columns but lora_a is (P, S, E, r, K)={tuple(lora_a.shape)}")
    if out.shape[1] != P * N:
        raise ValueError(f"out must have P*N={P}*{N}={P * N} columns, got shape {tuple(out.shape)}")
    num_pairs = num_pairs_of(x, top_k, gather, out)
    bm = check_alignment(align, num_pairs, E, None, dev, "lora_delta")
    L = align.sorted_token_ids.shape[0]  # LoRA rows of this batch
    if not 1 <= L <= S:
        raise ValueError(f"lora_delta: the alignment has {L} LoRA rows; it needs 1 to S={S} (the weight slots)")
    for nm, t in (("lora_ids", lora_ids), ("adapter_enabled", adapter_enabled), ("lora_ranks", lora_ranks)):
        if t is None and nm == "lora_ranks":
            continue
        check_tensor(nm, t, 1, (torch.int32,), dev)
        if t.shape != (L,):
            raise ValueError(f"{nm} must be (L,)=({L},), one per LoRA row of the alignment, got {tuple(t.shape)}")
    check_routed_weights(routed_weights, num_pairs, top_k, dev)
    nb = align.expert_ids.shape[1]
    if exit_codes is not None:
        check_tensor("exit_codes", exit_codes, 2, (torch.int32,), dev)
        if exit_codes.shape != (L, nb):
            raise ValueError(f"exit_codes must be (L, EM // block_m)=({L}, {nb}), got {tuple(exit_codes.shape)}")
    if R == 0:
        return out  # nothing to add; decided from the static shape
    plan = _lora_plan(dev, x.dtype, num_pairs, top_k, P, L, E, R, N, K, bm, nb, bool(gather),
                      routed_weights is not None, exit_codes is not None, config, lora_ranks is not None)
    cfg, split, br, stages, key, pps, grid = (plan[k] for k in ("cfg", "split", "br", "stages", "key", "pps", "grid"))
    n_per_split = plan["n_per_split"]
    rw = routed_weights if routed_weights is not None else out  # dummy pointers, never read
    ex = exit_codes if exit_codes is not None else align.expert_ids
    compiled = fused_moe_lora_kernel[grid](
        x, lora_a, lora_b, out, align.sorted_token_ids, align.expert_ids, align.num_tokens_post_padded,
        lora_ids, adapter_enabled, lora_ranks if lora_ranks is not None else lora_ids, rw, ex,
        N, K, R, num_pairs, nb, top_k, n_per_split,
        x.stride(0), x.stride(1),
        *lora_a.stride(), *lora_b.stride(),
        out.stride(0), out.stride(1),
        align.sorted_token_ids.stride(0), align.expert_ids.stride(0),
        NUM_SLOTS=L, SLOTS_POW2=pow2(L),
        P=P, BLOCK_M=bm, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, BLOCK_R=br, SPLIT_N=split,
        GATHER=bool(gather), HAS_RW=routed_weights is not None, WRITE_EXIT=exit_codes is not None,
        PREFETCH=cfg.prefetch, EXPAND_STAGES=cfg.expand_stages, HAS_RANKS=lora_ranks is not None, R16=R % 16 == 0,
        num_warps=cfg.num_warps, num_stages=stages, **reg_cap(cfg.max_regs),
    )
    if key not in _OCCUPANCY and dev.type == "cuda":
        _OCCUPANCY[key] = occupancy(compiled, cfg.num_warps, dev, cfg.programs_per_sm)
        _RESOURCES[key] = dict(regs=getattr(compiled, "n_regs", None),
                               shared=getattr(compiled.metadata, "shared", None))
    return out


_PLANS: dict = {}  # the static part of a launch per arguments (the tile's config among them): worked out once


def _lora_plan(dev, dtype, num_pairs, top_k, P, S, E, R, N, K, bm, nb, gather, has_rw, write_exit, config,
               has_ranks=False):
    """The launch's tile, split, stages and persistent grid, from static shapes only. All but the grid is kept per
    arguments (every eager launch asks); the grid reads the programs per SM that fit, known after the first compile."""
    cfg = config or lora_config(num_pairs // top_k, top_k, E, S, bm, N, K)
    args = (dev, dtype, num_pairs, top_k, P, S, E, R, N, K, bm, nb, gather, has_rw, write_exit, cfg, has_ranks)
    p = _PLANS.get(args)
    if p is None:
        if len(_PLANS) > 4096:  # eager batches of many distinct sizes: keep the memo bounded
            _PLANS.clear()
        p = _PLANS[args] = _static_plan(*args)
    pps = _OCCUPANCY.get(p["key"], cfg.programs_per_sm)
    return dict(p, pps=pps, grid=(max(1, min(p["max_items"], num_sms(dev) * pps)),))


def _static_plan(dev, dtype, num_pairs, top_k, P, S, E, R, N, K, bm, nb, gather, has_rw, write_exit, cfg, has_ranks):
    n_tiles = cdiv(N, cfg.block_n)
    split = max(1, min(cfg.split_n, n_tiles))
    n_per_split = cdiv(n_tiles, split) * cfg.block_n
    # Persistent grid, from static shapes only: a few programs per SM, never more than the work
    # items there can be (busy blocks of a slot number at most num_pairs: each holds a pair).
    # Programs per SM: the config's cap, lowered to what fits on an SM at once (known after the first
    # compile of this variant; `warmup` makes that happen before any capture). All programs then run
    # in one wave: an all-disabled launch costs one round of metadata loads, and no program waits
    # for a slot while others hold several items.
    max_items = S * min(nb, num_pairs) * split
    br = block_r(R)
    elt = dtype.itemsize
    stages = stages_for(cfg.num_stages, (bm * cfg.block_k + P * cfg.block_k * br) * elt)
    # one entry per compiled variant: every constexpr that changes the build (its registers, so what fits on an SM)
    key = (dev, dtype, N, K, R, P, S, bm, cfg, split, stages, gather, has_rw, write_exit, has_ranks)
    return dict(cfg=cfg, split=split, n_per_split=n_per_split, br=br, stages=stages, key=key, max_items=max_items)


def lora_launch_plan(x, lora_a, lora_b, align, top_k, *, gather=True, routed_weights=None, exit_codes=False,
                     config: LoRAKernelConfig | None = None, lora_ranks=None) -> dict:
    """What `lora_delta` launches for these inputs, from static shapes only (for notebooks/program maps).

    The grid is persistent: `programs` programs loop over work items (slot, token block, N share):
    at most `work_items_max` of them, the live slots' busy blocks; each program takes every
    `programs`-th item. `programs_per_sm` is the config's cap until the first launch of this
    variant has measured what fits on an SM (then that); `regs` and `shared` (registers per thread, shared memory
    bytes) are the compiled variant's once a launch on a GPU has compiled it, else None."""
    P, S, E, R, K = lora_a.shape
    N = lora_b.shape[3]
    num_pairs = x.shape[0] * top_k if gather else x.shape[0]
    bm, (L, nb) = align.block_m, align.expert_ids.shape
    p = _lora_plan(x.device, x.dtype, num_pairs, top_k, P, L, E, R, N, K, bm, nb, bool(gather),
                   routed_weights is not None, bool(exit_codes), config, lora_ranks is not None)
    c = p["cfg"]
    return dict(slots_S=S, lora_rows_L=L, experts_E=E, tokens_M=num_pairs // top_k, top_k=top_k, pairs=num_pairs,
                BLOCK_M=bm,
                EM=align.sorted_token_ids.shape[1], blocks_per_slot=nb, N=N, BLOCK_N=c.block_n, BLOCK_K=c.block_k,
                split_n=p["split"], rank_r=R, BLOCK_R=p["br"], num_warps=c.num_warps, num_stages=p["stages"],
                prefetch=c.prefetch, max_regs=c.max_regs, expand_stages=c.expand_stages,
                programs=p["grid"][0], programs_per_sm=p["pps"], work_items_max=p["max_items"], persistent=True,
                regs=_RESOURCES.get(p["key"], {}).get("regs"), shared=_RESOURCES.get(p["key"], {}).get("shared"))
