"""The decode path of the MoE-LoRA delta: no alignment step, one program per (pair, slice, N share).

At decode sizes the per-adapter alignment (a few small kernels) costs as much as the delta itself,
and there are too few pairs per (adapter, expert) for a block of rows to reuse a weight tile. So
each program takes ONE (token, k) pair straight from `topk_ids` and the per-token row mapping:

    row = token_lora_mapping[t]      -1: the token has no adapter           -> exit 5
    slot = lora_ids[row]             -1: the row holds no adapter           -> exit 1
    adapter_enabled[row] == 0:       adapter disabled for this batch        -> exit 2
    pair >= num_live_pairs[0]:       pair past the live count (checked first) -> exit 3
    expert = topk_ids[t, k]          -1: no expert                          -> exit 4
    out[pair, p*N + n] += (x[row(pair)] . A[p, slot, expert]) @ B[p, slot, expert].T  (* rw[pair])

PER-ROW RANKS. The pool pads every slot's A and B with zeros to its max rank R. Given `lora_ranks` (the batch's
(L,) rank per row, read in the same round as the exits' metadata), a program loads only its adapter's rows of A
and columns of B, the rank rounded up to 16 where R is a multiple of 16 (masks on whole 16-lane vectors keep the
loads wide): masked lanes issue no memory request, so a rank-8 adapter in a rank-64 pool streams a quarter of the
A bytes. The padded lanes held zeros, so the result is bit for bit the padded launch's (the same tiles, the same
order of adds).

A single row makes both products GEMVs: the matrix units need 16 rows, so the products run on the
CUDA cores (multiply + reduce in fp32), which is memory-bound anyway: each program streams one
A[p] (R x K) and its share of B[p] (N/split x R). Programs of one pair are adjacent in the grid,
so the split_n programs that re-read the same A[p] find it in L2 after the first.

The grid is static: capacity * P * split_n programs (capacity = M * top_k of the static batch), so
it can be captured in a CUDA graph. `num_live_pairs` (optional int32 (1,) device tensor) marks how
many of the capacity's pairs are real in a replay of a padded batch; pairs at or past it exit.
No activation or weight is loaded by a program that exits; the exits read metadata only (one round
of independent loads: the (L,) lora_ids and enabled vectors whole, the pair's expert and row), so with
every adapter disabled the launch costs about an empty launch of the same grid (EMPTY=True below
compiles exactly that: the same signature and grid with the body removed, the fair reference).
"""
import torch
import triton
import triton.language as tl

from .common import FLOAT_DTYPES, cdiv, check_compute_dtype, check_routed_weights, check_tensor, pow2
from . import exits
from .configs import DecodeConfig, block_r, decode_config
from .fused_moe_lora import own_rank

DECODE_EXIT_CODES = exits.names("lora_decode_kernel")  # the one table (kernels/exits.py)


@triton.jit(do_not_specialize=["L", "num_pairs", "split_n", "n_per_split"])
def lora_decode_kernel(
    x_ptr,  # (M or M*top_k, K) activations
    a_ptr,  # (P, S, E, R, K) LoRA A
    b_ptr,  # (P, S, E, N, R) LoRA B, scaling folded in
    out_ptr,  # (M*top_k, P*N): the delta is ADDED here in place
    topk_ids_ptr,  # (M, top_k) int32 expert per pair, -1 = none
    mapping_ptr,  # (M,) int32 LoRA row per token, -1 = none
    lora_ids_ptr,  # (L,) int32 weight slot per row, -1 = none
    enabled_ptr,  # (L,) int32 per row, 0 = disabled
    ranks_ptr,  # (L,) int32 rank per row (HAS_RANKS only): lanes past it load nothing
    rw_ptr,  # (M*top_k,) float32 routed weights (HAS_RW only)
    count_ptr,  # (1,) int32 live pairs (HAS_COUNT only)
    exit_ptr,  # (M*top_k,) int32 exit codes (WRITE_EXIT only)
    N, K, R, L, num_pairs, top_k, split_n, n_per_split,
    stride_xm, stride_xk,
    stride_ap, stride_as, stride_ae, stride_ar, stride_ak,
    stride_bp, stride_bs, stride_be, stride_bn, stride_br,
    stride_om, stride_on,
    P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr, L_POW2: tl.constexpr,
    GATHER: tl.constexpr, HAS_RW: tl.constexpr, HAS_COUNT: tl.constexpr, WRITE_EXIT: tl.constexpr,
    EMPTY: tl.constexpr, HAS_RANKS: tl.constexpr = False, R16: tl.constexpr = False,
):
    if not EMPTY:
        pid = tl.program_id(0)
        per_pair = P * split_n
        pair = pid // per_pair
        p = (pid % per_pair) // split_n
        pid_n = pid % split_n
        # ---- the exits: metadata only, in ONE round of independent loads (the row's lora_id and
        # enabled flag are picked from the whole (L,) vectors, not loaded after the mapping) ----
        tok = pair // top_k
        expert = tl.load(topk_ids_ptr + pair)
        row = tl.load(mapping_ptr + tok)
        offs_l = tl.arange(0, L_POW2)
        l_ok = offs_l < L
        lids = tl.load(lora_ids_ptr + offs_l, mask=l_ok, other=-1)
        ens = tl.load(enabled_ptr + offs_l, mask=l_ok, other=0)
        if HAS_COUNT:
            live = pair < tl.load(count_ptr)
        else:
            live = pair < num_pairs
        slot = tl.sum(tl.where(offs_l == row, lids, 0), 0)  # row -1 matches nothing (exit 5 first)
        en = tl.sum(tl.where(offs_l == row, ens, 0), 0)
        if HAS_RANKS:  # the row's own rank, from the (L,) vector loaded whole in the same round
            rank = own_rank(tl.load(ranks_ptr + offs_l, mask=l_ok, other=0), offs_l, row, R, R16)
        else:
            rank = R
        code = tl.where(~live, 3, tl.where(row < 0, 5, tl.where(slot < 0, 1, tl.where(en == 0, 2,
                                                                                   tl.where(expert < 0, 4, 0)))))
        if WRITE_EXIT:
            if pid % per_pair == 0:
                tl.store(exit_ptr + pair, code)
        if code == 0:
            _decode_pair(x_ptr, a_ptr, b_ptr, out_ptr, rw_ptr, pair, tok, p, pid_n, slot, expert,
                         N, K, rank, n_per_split, stride_xm, stride_xk,
                         stride_ap, stride_as, stride_ae, stride_ar, stride_ak,
                         stride_bp, stride_bs, stride_be, stride_bn, stride_br, stride_om, stride_on,
                         BLOCK_N, BLOCK_K, BLOCK_R, GATHER, HAS_RW)


@triton.jit
def _decode_pair(x_ptr, a_ptr, b_ptr, out_ptr, rw_ptr, pair, tok, p, pid_n, slot, expert,
                 N, K, R, n_per_split, stride_xm, stride_xk,
                 stride_ap, stride_as, stride_ae, stride_ar, stride_ak,
                 stride_bp, stride_bs, stride_be, stride_bn, stride_br, stride_om, stride_on,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr,
                 GATHER: tl.constexpr, HAS_RW: tl.constexpr):
    """One (pair, slice p, N share): t = A[p] . x_row (R values, fp32), out[n] += B[p][n] . t. R here is the rank
    the program reads (the row's own, or the padded one): lanes past it load nothing."""
    xrow = tok if GATHER else pair
    offs_r = tl.arange(0, BLOCK_R)
    r_ok = offs_r < R
    offs_k = tl.arange(0, BLOCK_K)
    a_base = (a_ptr + p * stride_ap + slot.to(tl.int64) * stride_as + expert.to(tl.int64) * stride_ae
              + offs_r[:, None] * stride_ar)
    x_base = x_ptr + xrow.to(tl.int64) * stride_xm
    # shrink: K contiguous in A's rows and in x, so the (BLOCK_R, BLOCK_K) tile loads 16 bytes a lane.
    # Products accumulate elementwise; the one reduction over K (across lanes and warps, through
    # shared memory) runs once after the loop, so each iteration is loads + FMAs only.
    acc = tl.zeros((BLOCK_R, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        k_ok = k < K
        xv = tl.load(x_base + k * stride_xk, mask=k_ok, other=0.0).to(tl.float32)
        at = tl.load(a_base + k[None, :] * stride_ak, mask=r_ok[:, None] & k_ok[None, :], other=0.0)
        acc += at.to(tl.float32) * xv[None, :]
    t = tl.sum(acc, axis=1)
    if HAS_RW:  # the routed weight scales the R-vector, not the N outputs: R multiplies instead of N
        t = t * tl.load(rw_ptr + pair)
    # expand: this program's N share; R contiguous in B's rows
    offs_n = tl.arange(0, BLOCK_N)
    b_base = (b_ptr + p * stride_bp + slot.to(tl.int64) * stride_bs + expert.to(tl.int64) * stride_be
              + offs_r[None, :] * stride_br)
    o_base = out_ptr + pair.to(tl.int64) * stride_om + (p * N) * stride_on
    n_start = pid_n * n_per_split
    for n0 in range(0, n_per_split, BLOCK_N):
        n = n_start + n0 + offs_n
        n_ok = n < N
        bt = tl.load(b_base + n[:, None] * stride_bn, mask=n_ok[:, None] & r_ok[None, :], other=0.0)
        o = tl.load(o_base + n * stride_on, mask=n_ok, other=0.0)
        d = tl.sum(bt.to(tl.float32) * t[None, :], axis=1)
        tl.store(o_base + n * stride_on, (o.to(tl.float32) + d).to(out_ptr.dtype.element_ty), mask=n_ok)


def _check_decode_inputs(x, lora_a, lora_b, topk_ids, token_lora_mapping, lora_ids, adapter_enabled, out,
                         routed_weights, gather, num_live_pairs, exit_codes, lora_ranks=None):
    check_tensor("x", x, 2, FLOAT_DTYPES)
    dev = x.device
    check_compute_dtype(x)
    for nm, t, nd in (("lora_a", lora_a, 5), ("lora_b", lora_b, 5), ("out", out, 2)):
        check_tensor(nm, t, nd, (x.dtype,), dev)
    for nm, t, nd in (("topk_ids", topk_ids, 2), ("token_lora_mapping", token_lora_mapping, 1),
                      ("lora_ids", lora_ids, 1), ("adapter_enabled", adapter_enabled, 1)):
        check_tensor(nm, t, nd, (torch.int32,), dev)
    P, S, E, R, K = lora_a.shape
    N = lora_b.shape[3]
    if P not in (1, 2) or lora_b.shape != (P, S, E, N, R):
        raise ValueError(f"lora_a (P, S, E, r, K)={tuple(lora_a.shape)} and lora_b (P, S, E, N, r)="
                         f"{tuple(lora_b.shape)} must agree, with P 1 or 2")
    M, top_k = topk_ids.shape
    if token_lora_mapping.shape != (M,):
        raise ValueError(f"token_lora_mapping must be (M,)=({M},) like topk_ids' rows, "
                         f"got {tuple(token_lora_mapping.shape)}")
    L = lora_ids.shape[0]
    if adapter_enabled.shape != (L,) or not 1 <= L <= S:
        raise ValueError(f"lora_ids {tuple(lora_ids.shape)} and adapter_enabled {tuple(adapter_enabled.shape)} "
                         f"must both be (L,) with 1 <= L <= S={S}")
    rows = M if gather else M * top_k
    if x.shape != (rows, K):
        raise ValueError(f"x must be ({'M' if gather else 'M*top_k'}, K)=({rows}, {K}), got {tuple(x.shape)}")
    if out.shape != (M * top_k, P * N):
        raise ValueError(f"out must be (M*top_k, P*N)=({M * top_k}, {P * N}), got {tuple(out.shape)}")
    check_routed_weights(routed_weights, M * top_k, top_k, dev)
    for nm, t, shape in (("num_live_pairs", num_live_pairs, (1,)), ("exit_codes", exit_codes, (M * top_k,)),
                         ("lora_ranks", lora_ranks, (L,))):
        if t is not None:
            check_tensor(nm, t, 1, (torch.int32,), dev)
            if t.shape != shape:
                raise ValueError(f"{nm} must be {shape}, got {tuple(t.shape)}")
    return P, R, K, N, M, top_k


def lora_delta_decode(x, lora_a, lora_b, topk_ids, token_lora_mapping, lora_ids, adapter_enabled, out, *,
                      routed_weights=None, gather=True, num_live_pairs=None, exit_codes=None,
                      config: DecodeConfig | None = None, empty=False, lora_ranks=None):
    """ADD the LoRA delta into `out` (M*top_k, P*N) in place, straight from topk_ids (M, top_k) int32
    and token_lora_mapping (M,) int32 (LoRA row per token); lora_ids / adapter_enabled (L,) per row.
    gather=True: x has M rows (gate_up); False: M*top_k rows (down, with routed_weights (M, top_k)).
    num_live_pairs: optional int32 (1,) device count; pairs at or past it are left alone.
    exit_codes: optional int32 (M*top_k,) that receives each pair's code (DECODE_EXIT_CODES).
    empty=True launches the same grid and arguments with the body compiled out (a timing reference).
    lora_ranks: optional int32 (L,) rank per row (the batch's, `LoRABatchTensors.lora_ranks`): each program reads
    only its adapter's rank of the zero-padded A and B (the same result, fewer bytes). It must cover each row's
    adapter (a smaller value drops columns); 0 reads the padded rank.
    No host sync; the grid depends on static shapes only."""
    P, R, K, N, M, top_k = _check_decode_inputs(x, lora_a, lora_b, topk_ids, token_lora_mapping, lora_ids,
                                                adapter_enabled, out, routed_weights, gather, num_live_pairs,
                                                exit_codes, lora_ranks)
    if R == 0 or N == 0:
        return out  # nothing to add; decided from the static shape
    plan = decode_launch_plan(M * top_k, P, N, K, R, config)
    cfg = plan["config"]
    dummy = topk_ids  # pointers of absent optional inputs, never read
    lora_decode_kernel[(plan["programs"],)](
        x, lora_a, lora_b, out, topk_ids, token_lora_mapping, lora_ids, adapter_enabled,
        lora_ranks if lora_ranks is not None else dummy, routed_weights if routed_weights is not None else out,
        num_live_pairs if num_live_pairs is not None else dummy,
        exit_codes if exit_codes is not None else dummy,
        N, K, R, lora_ids.shape[0], M * top_k, top_k, plan["split_n"], plan["n_per_split"],
        x.stride(0), x.stride(1), *lora_a.stride(), *lora_b.stride(), out.stride(0), out.stride(1),
        P=P, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, BLOCK_R=plan["BLOCK_R"], L_POW2=pow2(lora_ids.shape[0]),
        GATHER=bool(gather),
        HAS_RW=routed_weights is not None, HAS_COUNT=num_live_pairs is not None,
        WRITE_EXIT=exit_codes is not None, EMPTY=bool(empty), HAS_RANKS=lora_ranks is not None,
        R16=R % 16 == 0, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out


def decode_launch_plan(num_pairs: int, P: int, N: int, K: int, R: int, config: DecodeConfig | None = None) -> dict:
    """What `lora_delta_decode` launches, from static shapes only: one program per (pair, slice,
    N share), pairs major (the programs that share one A[p] run side by side)."""
    cfg = config or decode_config(num_pairs, P, N, K, R)
    n_tiles = cdiv(N, cfg.block_n)
    split = max(1, min(cfg.split_n, n_tiles))
    n_per_split = cdiv(n_tiles, split) * cfg.block_n
    split = cdiv(N, n_per_split)  # no program without columns
    return dict(config=cfg, pairs=num_pairs, P=P, split_n=split, n_per_split=n_per_split,
                BLOCK_R=block_r(R), programs=num_pairs * P * split, alignment_kernels=0)
