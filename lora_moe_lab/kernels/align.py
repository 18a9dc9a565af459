"""Per-adapter token alignment with static shapes and no host sync.

For every slot s, the flattened (token, k) ids routed to each expert are grouped by expert and
each group is padded to a multiple of BM with the sentinel M*top_k, so that one program of a
grouped GEMM handles BM rows of one expert. Shapes depend only on (M, top_k, E, BM, S) - never on
the data - so the whole path can be captured in a CUDA graph, and nothing is read back to the host.

    sorted_token_ids (S, EM) int32, EM = round_up(M*top_k + E*(BM-1), BM)
    expert_ids       (S, EM // BM) int32, -1 for a block past the slot's last token
    num_tokens_post_padded (S,) int32

A token whose slot is -1 (request without adapter) belongs to no slot.
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


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int,
              token_slot: torch.Tensor | None = None, num_slots: int = 1) -> Alignment:
    """Group (token, k) pairs by (slot, expert). token_slot=None puts every token in slot 0."""
    if topk_ids.dim() != 2:
        raise ValueError(f"topk_ids must be (M, top_k), got shape {tuple(topk_ids.shape)}")
    M, k = topk_ids.shape
    dev, S, E, BM = topk_ids.device, num_slots, num_experts, block_m
    n = M * k
    EM = padded_size(n, E, BM)
    nb = EM // BM
    expert = topk_ids.reshape(-1).long()
    if token_slot is None:
        slot = torch.zeros(n, dtype=torch.long, device=dev)
    else:
        if token_slot.shape != (M,):
            raise ValueError(f"token_slot must be ({M},), got shape {tuple(token_slot.shape)}")
        slot = token_slot.long().repeat_interleave(k)  # int repeats: no sync
    valid = slot >= 0
    trash = S * E  # key of pairs that belong to no slot
    key = torch.where(valid, slot * E + expert, torch.full_like(expert, trash))
    counts = torch.zeros(S * E + 1, dtype=torch.long, device=dev).scatter_add_(0, key, torch.ones_like(key))
    padded = (counts[:trash].view(S, E) + BM - 1) // BM * BM
    ends = padded.cumsum(dim=1)  # (S, E): padded end of each expert's group in its slot's row
    starts = ends - padded
    ntpp = ends[:, -1]
    # Rank of each pair inside its (slot, expert) group: a stable sort keeps token order.
    sorted_key, order = torch.sort(key, stable=True)
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
