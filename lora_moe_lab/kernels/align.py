"""Per-adapter token alignment with static shapes and no host sync.

For every slot s, the flattened (token, k) ids routed to each expert are grouped by expert and
each group is padded to a multiple of BM with the sentinel M*top_k, so that one program of a
grouped GEMM handles BM rows of one expert. Shapes depend only on (M, top_k, E, BM, S) - never on
the data - so the whole path can be captured in a CUDA graph, and nothing is read back to the host.

    sorted_token_ids (S, EM) int32, EM = round_up(M*top_k + E*(BM-1), BM)
    expert_ids       (S, EM // BM) int32, -1 for a block past the slot's last token
    num_tokens_post_padded (S,) int32

A token whose slot is -1 (request without adapter) belongs to no slot.

`order_by` (M,) int32 (the folded LoRA path's LoRA row per token, -1 first) orders the pairs inside each
expert group by that key without changing anything else: the same padding, expert_ids and
num_tokens_post_padded as without it, so the base GEMM's blocks are the same; a block then spans few
LoRA rows. Both implementations do it. The torch one keeps token order within one key (a stable sort);
the Triton one counts per (group, key) instead of per group, one more small launch, and keys from
ORDER_KEYS - 2 up share its last run (still a valid alignment, only less ordered).
"""
from __future__ import annotations

from typing import NamedTuple

import torch


class Alignment(NamedTuple):
    sorted_token_ids: torch.Tensor
    expert_ids: torch.Tensor
    num_tokens_post_padded: torch.Tensor
    block_m: int


def padded_size(num_pairs: int, num_experts: int, block_m: int) -> int:
    """EM: the static upper bound on the padded length (every expert may waste BM-1 rows)."""
    n = num_pairs + num_experts * (block_m - 1)
    return (n + block_m - 1) // block_m * block_m


# On a GPU the Triton version below is used (measured on an H200 by studies/kernels/record.py, section
# "align"; data/kernels/): a handful of launches instead of a few dozen small torch ops.
TRITON_ON_CUDA = True


def _geometry(topk_ids, token_slot, num_experts: int, block_m: int):
    """Validate the inputs; (M, top_k, pairs, EM, blocks per slot) from shapes alone."""
    if topk_ids.dim() != 2:
        raise ValueError(f"topk_ids must be (M, top_k), got shape {tuple(topk_ids.shape)}")
    M, k = topk_ids.shape
    if token_slot is not None and token_slot.shape != (M,):
        raise ValueError(f"token_slot must be ({M},), got shape {tuple(token_slot.shape)}")
    EM = padded_size(M * k, num_experts, block_m)
    return M, k, M * k, EM, EM // block_m


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int,
              token_slot: torch.Tensor | None = None, num_slots: int = 1,
              order_by: torch.Tensor | None = None) -> Alignment:
    """Group (token, k) pairs by (slot, expert). token_slot=None puts every token in slot 0. order_by:
    see the module docstring (on CUDA the Triton implementation orders too)."""
    if TRITON_ON_CUDA and topk_ids.is_cuda:
        return moe_align_triton(topk_ids, num_experts, block_m, token_slot, num_slots, order_by)
    return moe_align_torch(topk_ids, num_experts, block_m, token_slot, num_slots, order_by)


def _check_order_by(order_by, M: int) -> None:
    if order_by is not None and (order_by.shape != (M,) or order_by.dtype != torch.int32):
        raise ValueError(f"order_by must be an int32 ({M},) tensor, got {order_by.dtype} {tuple(order_by.shape)}")


def moe_align_torch(topk_ids: torch.Tensor, num_experts: int, block_m: int,
                    token_slot: torch.Tensor | None = None, num_slots: int = 1,
                    order_by: torch.Tensor | None = None) -> Alignment:
    """The torch implementation (sync-free, static shapes; CPU and reference)."""
    M, k, n, EM, nb = _geometry(topk_ids, token_slot, num_experts, block_m)
    _check_order_by(order_by, M)
    dev, S, E, BM = topk_ids.device, num_slots, num_experts, block_m
    expert = topk_ids.reshape(-1).long()
    if token_slot is None:
        slot = torch.zeros(n, dtype=torch.long, device=dev)
    else:
        slot = token_slot.long().repeat_interleave(k)  # int repeats: no sync
    valid = slot >= 0
    trash = S * E  # key of pairs that belong to no slot
    key = torch.where(valid, slot * E + expert, torch.full_like(expert, trash))
    counts = torch.zeros(S * E + 1, dtype=torch.long, device=dev).scatter_add_(0, key, torch.ones_like(key))
    padded = (counts[:trash].view(S, E) + BM - 1) // BM * BM
    ends = padded.cumsum(dim=1)  # (S, E): padded end of each expert's group in its slot's row
    starts = ends - padded
    ntpp = ends[:, -1]
    # Rank of each pair inside its (slot, expert) group: a stable sort keeps token order. With order_by
    # the sort key also carries the pair's sub-key below the group key (same groups, ordered inside).
    if order_by is None:
        sorted_key, order = torch.sort(key, stable=True)
    else:
        sub_key = order_by.long().repeat_interleave(k) + 1  # -1 (no row) -> 0: those pairs first
        span = 1 << 16  # above every sub-key (LoRA rows number far fewer); key * span stays in int64
        _, order = torch.sort(key * span + sub_key.clamp(0, span - 1), stable=True)
        sorted_key = key[order]
    group_first = counts.cumsum(0) - counts  # first sorted position of each key
    rank = torch.empty_like(order)
    rank.scatter_(0, order, torch.arange(n, device=dev) - group_first[sorted_key])
    # Destination in the flattened (S*EM) table; pairs of no slot go to one trash cell at the end.
    dest = slot.clamp(min=0) * EM + starts.reshape(-1)[key.clamp(max=trash - 1)] + rank
    dest = torch.where(valid, dest, torch.full_like(dest, S * EM))
    table = torch.full((S * EM + 1,), n, dtype=torch.int32, device=dev)
    table.scatter_(0, dest, torch.arange(n, dtype=torch.int32, device=dev))
    sorted_ids = table[: S * EM].view(S, EM)
    # Expert of each block: the first expert whose padded end lies past the block's first row.
    block_start = (torch.arange(nb, device=dev) * BM).expand(S, nb).contiguous()
    e_of_block = torch.searchsorted(ends.contiguous(), block_start, right=True)
    expert_ids = torch.where(block_start < ntpp[:, None], e_of_block, torch.full_like(e_of_block, -1))
    return Alignment(sorted_ids, expert_ids.to(torch.int32), ntpp.to(torch.int32), BM)


# --------------------------------------------------------------------------------------------------
# Triton version of the same alignment (GPU): four launches instead of a few dozen small torch ops.
# Same outputs except the order of pairs inside one (slot, expert) group, which follows the order of
# the atomic increments (each output row is computed independently, so results do not change).
# --------------------------------------------------------------------------------------------------
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _pair_block(topk_ids_ptr, token_slot_ptr, offs, n, top_k, HAS_SLOT: tl.constexpr, BLOCK: tl.constexpr):
    """Expert, slot and 'belongs to a slot' of the flattened (token, k) pairs `offs`."""
    m = offs < n
    e = tl.load(topk_ids_ptr + offs, mask=m, other=0)
    if HAS_SLOT:
        s = tl.load(token_slot_ptr + offs // top_k, mask=m, other=-1)
    else:
        s = tl.zeros([BLOCK], dtype=tl.int32)
    return e, s, m & (s >= 0)


@triton.jit
def _align_count_kernel(topk_ids_ptr, token_slot_ptr, counts_ptr, rank_ptr, n, top_k, E,
                        HAS_SLOT: tl.constexpr, BLOCK: tl.constexpr):
    # counts[slot * E + expert] += 1 for each pair; the value before the increment is the pair's
    # rank inside its group.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    e, s, ok = _pair_block(topk_ids_ptr, token_slot_ptr, offs, n, top_k, HAS_SLOT, BLOCK)
    r = tl.atomic_add(counts_ptr + s * E + e, tl.full([BLOCK], 1, tl.int32), mask=ok)
    tl.store(rank_ptr + offs, r, mask=ok)


@triton.jit
def _align_count_ordered_kernel(topk_ids_ptr, token_slot_ptr, order_ptr, sub_counts_ptr, rank_ptr, n, top_k, E,
                                NK: tl.constexpr, HAS_SLOT: tl.constexpr, BLOCK: tl.constexpr):
    # As _align_count_kernel, one counter per (group, key): sub_counts[(slot * E + expert) * NK + key] += 1,
    # key = order_by[token] + 1 clamped to [0, NK); the value before the increment is the pair's rank in its run.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    e, s, ok = _pair_block(topk_ids_ptr, token_slot_ptr, offs, n, top_k, HAS_SLOT, BLOCK)
    key = _order_key(order_ptr, offs, ok, top_k, NK)
    r = tl.atomic_add(sub_counts_ptr + (s * E + e) * NK + key, tl.full([BLOCK], 1, tl.int32), mask=ok)
    tl.store(rank_ptr + offs, r, mask=ok)


@triton.jit
def _order_key(order_ptr, offs, ok, top_k, NK: tl.constexpr):
    key = tl.load(order_ptr + offs // top_k, mask=ok, other=-1) + 1  # -1 (no LoRA row) -> 0: those pairs first
    return tl.minimum(tl.maximum(key, 0), NK - 1)


@triton.jit
def _align_key_offsets_kernel(sub_counts_ptr, counts_ptr, G, NK: tl.constexpr, BLOCK_G: tl.constexpr):
    # Per group: its size (counts[g], what the layout kernel pads) and where each key's run starts inside it
    # (an exclusive prefix sum over the NK keys, written over the counts it was read from).
    g = tl.program_id(0) * BLOCK_G + tl.arange(0, BLOCK_G)
    mg = g < G
    j = tl.arange(0, NK)
    p = sub_counts_ptr + g[:, None] * NK + j[None, :]
    c = tl.load(p, mask=mg[:, None], other=0)
    tl.store(p, tl.cumsum(c, 1) - c, mask=mg[:, None])
    tl.store(counts_ptr + g, tl.sum(c, 1), mask=mg)


@triton.jit
def _align_layout_kernel(counts_ptr, starts_ptr, sorted_ptr, expert_ids_ptr, ntpp_ptr, n, E, EM, nb,
                         chunk, chunk_nb, BM: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK: tl.constexpr):
    # Program (slot, part): padded group offsets of the slot (a prefix sum over E counts, cheap
    # enough to redo in every program), then its part of the sentinel fill and of expert_ids.
    s = tl.program_id(0)
    part = tl.program_id(1)
    offs_e = tl.arange(0, BLOCK_E)
    me = offs_e < E
    c = tl.load(counts_ptr + s * E + offs_e, mask=me, other=0)
    padded = (c + BM - 1) // BM * BM
    ends = tl.cumsum(padded, 0)
    total = tl.sum(padded, 0)
    if part == 0:
        tl.store(starts_ptr + s * E + offs_e, ends - padded, mask=me)
        tl.store(ntpp_ptr + s, total)
    lo = part * chunk
    for i in range(lo, lo + chunk, BLOCK):
        o = i + tl.arange(0, BLOCK)
        tl.store(sorted_ptr + s * EM + o, tl.full([BLOCK], 0, tl.int32) + n, mask=o < EM)
    lo = part * chunk_nb
    for i in range(lo, lo + chunk_nb, BLOCK):
        # expert of block j: number of experts whose padded end lies at or before the block start
        j = i + tl.arange(0, BLOCK)
        bs = j * BM
        e_of = tl.sum(((ends[None, :] <= bs[:, None]) & me[None, :]).to(tl.int32), 1)
        tl.store(expert_ids_ptr + s * nb + j, tl.where(bs < total, e_of, -1), mask=j < nb)


@triton.jit
def _align_scatter_kernel(topk_ids_ptr, token_slot_ptr, rank_ptr, starts_ptr, sorted_ptr, n, top_k, E, EM,
                          order_ptr, key_start_ptr, HAS_SLOT: tl.constexpr, ORDERED: tl.constexpr,
                          NK: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    e, s, ok = _pair_block(topk_ids_ptr, token_slot_ptr, offs, n, top_k, HAS_SLOT, BLOCK)
    r = tl.load(rank_ptr + offs, mask=ok, other=0)
    if ORDERED:  # the pair's place: its group's start + its key's run start in the group + its rank in the run
        key = _order_key(order_ptr, offs, ok, top_k, NK)
        r += tl.load(key_start_ptr + (s * E + e) * NK + key, mask=ok, other=0)
    start = tl.load(starts_ptr + s * E + e, mask=ok, other=0)
    tl.store(sorted_ptr + s.to(tl.int64) * EM + start + r, offs, mask=ok)


ORDER_KEYS = 64  # per-(group, key) counters of the ordered Triton alignment: LoRA rows -1 .. 61 get a run each


def moe_align_triton(topk_ids: torch.Tensor, num_experts: int, block_m: int,
                     token_slot: torch.Tensor | None = None, num_slots: int = 1,
                     order_by: torch.Tensor | None = None) -> Alignment:
    """`moe_align` in three Triton kernels (plus one memset; with order_by four); same shapes, no host sync."""
    M, k, n, EM, nb = _geometry(topk_ids, token_slot, num_experts, block_m)
    _check_order_by(order_by, M)
    dev, S, E, BM = topk_ids.device, num_slots, num_experts, block_m
    ids = topk_ids.reshape(-1).to(torch.int32).contiguous()
    if token_slot is not None:
        slot = token_slot.to(torch.int32).contiguous()
    else:
        slot = ids  # dummy pointer, never read
    ordered, NK = order_by is not None, ORDER_KEYS
    counts = (torch.empty if ordered else torch.zeros)(S * E, dtype=torch.int32, device=dev)  # ordered: summed
    rank = torch.empty(max(n, 1), dtype=torch.int32, device=dev)
    starts = torch.empty(S * E, dtype=torch.int32, device=dev)
    sorted_ids = torch.empty(S, EM, dtype=torch.int32, device=dev)
    expert_ids = torch.empty(S, nb, dtype=torch.int32, device=dev)
    ntpp = torch.empty(S, dtype=torch.int32, device=dev)
    BLOCK = 256
    has_slot = token_slot is not None
    if ordered:
        order = order_by.contiguous()
        key_start = torch.zeros(S * E * NK, dtype=torch.int32, device=dev)  # counts per (group, key), then starts
        _align_count_ordered_kernel[(triton.cdiv(n, BLOCK),)](ids, slot, order, key_start, rank, n, k, E, NK=NK,
                                                              HAS_SLOT=has_slot, BLOCK=BLOCK)
        _align_key_offsets_kernel[(triton.cdiv(S * E, 16),)](key_start, counts, S * E, NK=NK, BLOCK_G=16)
    else:
        order = key_start = ids  # dummy pointers, never read
        _align_count_kernel[(triton.cdiv(n, BLOCK),)](ids, slot, counts, rank, n, k, E, HAS_SLOT=has_slot,
                                                      BLOCK=BLOCK)
    parts = max(1, min(64, triton.cdiv(EM, 4 * BLOCK)))
    chunk = triton.cdiv(triton.cdiv(EM, parts), BLOCK) * BLOCK
    block_e = max(16, triton.next_power_of_2(E))
    fill_block = 64 if block_e <= 256 else 16  # (BLOCK, BLOCK_E) compare tile stays small
    chunk = triton.cdiv(chunk, fill_block) * fill_block
    chunk_nb = triton.cdiv(triton.cdiv(nb, parts), fill_block) * fill_block
    _align_layout_kernel[(S, parts)](counts, starts, sorted_ids, expert_ids, ntpp, n, E, EM, nb, chunk, chunk_nb,
                                     BM=BM, BLOCK_E=block_e, BLOCK=fill_block)
    _align_scatter_kernel[(triton.cdiv(n, BLOCK),)](ids, slot, rank, starts, sorted_ids, n, k, E, EM, order,
                                                    key_start, HAS_SLOT=has_slot, ORDERED=ordered, NK=NK,
                                                    BLOCK=BLOCK)
    return Alignment(sorted_ids, expert_ids, ntpp, BM)


# --------------------------------------------------------------------------------------------------
# The blocks of an alignment in slot-major order (a launch order for gate_up's packed shrink)
# --------------------------------------------------------------------------------------------------
@triton.jit
def _block_keys(sorted_ids_ptr, mapping_ptr, lora_ids_ptr, b, nb, num_pairs, top_k, L, S,
                BM: tl.constexpr):
    """Each block's key: the slot of its first pair's adapter, S for padding and pairs without one."""
    first = tl.load(sorted_ids_ptr + b * BM, mask=b < nb, other=num_pairs)
    valid = first < num_pairs
    row = tl.load(mapping_ptr + first // top_k, mask=valid, other=-1)
    slot = tl.load(lora_ids_ptr + row, mask=valid & (row >= 0) & (row < L), other=-1)
    return tl.where((slot >= 0) & (slot < S), slot, S)


@triton.jit(do_not_specialize=["nb", "num_pairs", "L"])
def _slot_order_kernel(sorted_ids_ptr, mapping_ptr, lora_ids_ptr, enabled_ptr, order_ptr, nb, num_pairs, top_k, L,
                       S: tl.constexpr, BM: tl.constexpr, L_POW2: tl.constexpr, CHUNK: tl.constexpr,
                       KP: tl.constexpr):
    # One program, a stable counting sort of the nb blocks by key (S + 1 keys): key v's blocks after the lower keys',
    # in block order (a running count per key). Nothing live in the launch (a graph replayed without LoRA): it returns
    # at once, writing nothing, and the shrink reads no order either.
    offs_l = tl.arange(0, L_POW2)
    lid = tl.load(lora_ids_ptr + offs_l, mask=offs_l < L, other=-1)
    en = tl.load(enabled_ptr + offs_l, mask=offs_l < L, other=0)
    if tl.max(((lid >= 0) & (en != 0)).to(tl.int32), 0) == 0:
        return
    offs = tl.arange(0, CHUNK)
    if nb <= CHUNK:  # every block in one chunk (the presets' sizes): the keys gathered once, three dependent loads
        key = _block_keys(sorted_ids_ptr, mapping_ptr, lora_ids_ptr, offs, nb, num_pairs, top_k, L, S, BM)
        place = tl.zeros((CHUNK,), dtype=tl.int32)
        start = 0
        for v in tl.static_range(S + 1):
            hit = ((key == v) & (offs < nb)).to(tl.int32)
            place = tl.where(hit != 0, start + tl.cumsum(hit, 0) - 1, place)
            start += tl.sum(hit, 0)
        tl.store(order_ptr + place, offs, mask=offs < nb)
    else:  # chunk by chunk: each key's count first, then each chunk placed after the lower keys' and its own
        keys = tl.arange(0, KP)  # key's blocks of the earlier chunks (counts per key held in registers)
        tot = tl.zeros((KP,), dtype=tl.int32)
        for c0 in range(0, nb, CHUNK):
            key = _block_keys(sorted_ids_ptr, mapping_ptr, lora_ids_ptr, c0 + offs, nb, num_pairs, top_k, L, S, BM)
            tot += tl.sum(((key[:, None] == keys[None, :]) & (c0 + offs < nb)[:, None]).to(tl.int32), 0)
        first = tl.cumsum(tot, 0) - tot  # each key's first place
        for c0 in range(0, nb, CHUNK):
            b = c0 + offs
            key = _block_keys(sorted_ids_ptr, mapping_ptr, lora_ids_ptr, b, nb, num_pairs, top_k, L, S, BM)
            place = tl.zeros((CHUNK,), dtype=tl.int32)
            for v in tl.static_range(S + 1):
                hit = ((key == v) & (b < nb)).to(tl.int32)
                at = tl.sum(tl.where(keys == v, first, 0), 0)
                place = tl.where(hit != 0, at + tl.cumsum(hit, 0) - 1, place)
                first = tl.where(keys == v, first + tl.sum(hit, 0), first)
            tl.store(order_ptr + place, b, mask=b < nb)


ORDER_CHUNK = 4096  # the order kernel's blocks per step: one step up to 4096 blocks (M = 16384 at BLOCK_M 64: 2174)


def slot_major_order(align: Alignment, top_k: int, token_lora_mapping: torch.Tensor, lora_ids: torch.Tensor,
                     num_slots: int, adapter_enabled: torch.Tensor | None = None,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """An int32 permutation of the alignment's blocks (slot 0 of `align` only), slot-major: every block whose first
    pair's adapter sits in slot 0, in the alignment's order, then slot 1's, ...; padding and blocks without an adapter
    last. One Triton launch (no host sync: capture-safe); `slot_major_order_torch` is its reference. With
    adapter_enabled and no adapter live, the kernel returns at once and the order (`out`, an int32 (blocks,) buffer,
    else a new one) is left unwritten: the shrink does not read it then.

    For gate_up's packed shrink (`lora_shrink_packed(slot_order=True)`) on the alignment ordered by LoRA row: each
    token's x row is read once per expert of the token, and blocks taken expert by expert need rows of every token at
    once. Taken slot by slot, the programs in flight read only one slot's tokens' rows (a quarter with four adapters),
    and fewer come back from DRAM (ncu on the H200; studies/kernels/README.md)."""
    nb, dev = align.expert_ids.shape[1], align.sorted_token_ids.device
    if out is not None and (out.dtype != torch.int32 or out.shape != (nb,)):
        raise ValueError(f"slot_major_order: out must be an int32 ({nb},) tensor, got {out.dtype} {tuple(out.shape)}")
    order = torch.empty(nb, dtype=torch.int32, device=dev) if out is None else out
    enabled = torch.ones_like(lora_ids) if adapter_enabled is None else adapter_enabled
    chunk = min(ORDER_CHUNK, max(16, triton.next_power_of_2(nb)))
    _slot_order_kernel[(1,)](align.sorted_token_ids, token_lora_mapping, lora_ids, enabled, order, nb,
                             token_lora_mapping.shape[0] * top_k, top_k, lora_ids.shape[0], S=num_slots,
                             BM=align.block_m, L_POW2=triton.next_power_of_2(max(lora_ids.shape[0], 1)), CHUNK=chunk,
                             KP=triton.next_power_of_2(num_slots + 1), num_warps=max(4, min(16, chunk // 128)))
    return order


def slot_major_order_torch(align: Alignment, top_k: int, token_lora_mapping: torch.Tensor, lora_ids: torch.Tensor,
                           num_slots: int) -> torch.Tensor:
    """`slot_major_order` by torch operations (the reference; a dozen launches)."""
    bm, nb = align.block_m, align.expert_ids.shape[1]
    num_pairs = token_lora_mapping.shape[0] * top_k
    first = align.sorted_token_ids[0, ::bm][:nb].long()  # each block's first pair (num_pairs: padding)
    valid = first < num_pairs
    row = token_lora_mapping[torch.clamp(first // top_k, max=token_lora_mapping.shape[0] - 1)].long()
    ok = valid & (row >= 0) & (row < lora_ids.shape[0])
    slot = lora_ids[row.clamp(0, lora_ids.shape[0] - 1)].long()
    key = torch.where(ok & (slot >= 0) & (slot < num_slots), slot, num_slots)
    return torch.sort(key, stable=True).indices.to(torch.int32)
