"""Float64 reference of the LoRA delta with LoRA rows decoupled from weight slots (the rule of the
decode path, kernels/lora_decode.py): for the pair (t, k), row = token_lora_mapping[t] (-1: none),
weight slot = lora_ids[row] (-1: none), adapter_enabled[row] (0: off), expert = topk_ids[t, k]
(-1: none). The exit codes are one plain loop over pairs: small shapes only.
"""
from __future__ import annotations

import torch

from .reference import f64, ref_lora_delta


def decode_exit_codes(topk_ids, token_lora_mapping, lora_ids, adapter_enabled, num_live_pairs=None):
    """(M*top_k,) int32 per-pair codes, first rule that applies: 3 past the live count, 5 token
    without adapter, 1 row without adapter, 2 disabled, 4 expert -1, 0 ran."""
    ids = topk_ids.detach().cpu().long().reshape(-1)
    k = topk_ids.shape[1]
    mapping, lid, en = (t.detach().cpu().long() for t in (token_lora_mapping, lora_ids, adapter_enabled))
    live = ids.numel() if num_live_pairs is None else int(num_live_pairs)
    codes = []
    for pair in range(ids.numel()):
        row = int(mapping[pair // k])
        if pair >= live:
            codes.append(3)
        elif row < 0:
            codes.append(5)
        elif lid[row] < 0:
            codes.append(1)
        elif en[row] == 0:
            codes.append(2)
        else:
            codes.append(4 if ids[pair] < 0 else 0)
    return torch.tensor(codes, dtype=torch.int32)


def ref_lora_delta_rows(x, lora_a, lora_b, topk_ids, token_lora_mapping, lora_ids, adapter_enabled,
                        routed_weights=None, gather=True, num_live_pairs=None):
    """(M*top_k, P*N) float64 delta and the per-pair codes: `reference.ref_lora_delta` (which already
    follows rows -> weight slots) with the pairs that exit for the decode path's own reasons (past
    the live count, expert -1) zeroed as well."""
    codes = decode_exit_codes(topk_ids, token_lora_mapping, lora_ids, adapter_enabled, num_live_pairs)
    d = ref_lora_delta(x, lora_a, lora_b, topk_ids.clamp(min=0), token_lora_mapping, lora_ids, adapter_enabled,
                       topk_ids.shape[1], routed_weights=routed_weights, gather=gather)
    return d * (codes == 0).to(f64)[:, None], codes
