"""Float64 reference of the LoRA delta with LoRA rows decoupled from weight slots (the rule of the
decode path, kernels/lora_decode.py): for the pair (t, k), row = token_lora_mapping[t] (-1: none),
weight slot = lora_ids[row] (-1: none), adapter_enabled[row] (0: off), expert = topk_ids[t, k]
(-1: none). One plain loop over pairs: small shapes only.
"""
from __future__ import annotations

import torch

f64 = torch.float64


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
    """(M*top_k, P*N) float64 delta; zero rows where the pair exits (decode_exit_codes != 0)."""
    P, N = lora_a.shape[0], lora_b.shape[3]
    k = topk_ids.shape[1]
    a, b, xs = (t.detach().to("cpu", f64) for t in (lora_a, lora_b, x))
    ids = topk_ids.detach().cpu().long().reshape(-1)
    rw = None if routed_weights is None else routed_weights.detach().to("cpu", f64).reshape(-1)
    codes = decode_exit_codes(topk_ids, token_lora_mapping, lora_ids, adapter_enabled, num_live_pairs)
    slots = lora_ids.detach().cpu().long()[token_lora_mapping.detach().cpu().long().clamp(min=0)]
    out = torch.zeros(ids.numel(), P * N, dtype=f64)
    for pair in range(ids.numel()):
        if codes[pair] != 0:
            continue
        s, e = int(slots[pair // k]), int(ids[pair])
        xr = xs[pair // k if gather else pair]
        for p in range(P):
            out[pair, p * N:(p + 1) * N] = b[p, s, e] @ (a[p, s, e] @ xr)
        if rw is not None:
            out[pair] *= rw[pair]
    return out, codes
