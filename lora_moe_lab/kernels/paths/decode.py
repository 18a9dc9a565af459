"""The decode path: the delta straight from the routing, `lora_decode_kernel` (kernels/lora_decode.py: one program
per (token, k) pair, slice and N share, reading its token's LoRA row, its expert and its adapter's rank), with no
alignment kernel at all. At a few tokens the alignment costs more than the delta.

Rule: the separate path's rule hands over to it up to the table's decode bound of (token, k) pairs
(`decode.max_pairs` of kernels/tile_tables/lora_plan_*.json); a table entry never names it. Its tile comes from
kernels/configs.py (`decode_config`). Weights: the pool's stacks as they are. Exits: the one table's
`lora_decode_kernel` row (kernels/exits.py)."""
from __future__ import annotations

from dataclasses import replace

from .registry import LoRAPath, register


class DecodePath(LoRAPath):
    name = "decode"
    in_table = False

    def prepare(self, hook, p, topk_ids) -> None:
        hook.align, hook.topk_ids = None, topk_ids

    def delta(self, hook, p, x, a, b, out, top_k, **kw) -> None:
        i = hook.info
        # each row's own rank where some adapter sits below the padding: a program reads its adapter's rows
        hook.backend.lora_delta_decode(x, a, b, hook.topk_ids, i.token_lora_mapping, i.lora_ids, i.adapter_enabled,
                                       out, lora_ranks=hook.ranks(), **kw)

    def warmup_jobs(self, c, M: int) -> list:
        import torch

        from ..configs import decode_config
        from ..lora_decode import lora_delta_decode
        from ..plan import plan
        if plan("down", M, c.shape, c.device, lora=c.dims, first=False).path != self.name:
            return []
        # the table's tile for M (split_n is a run-time argument, so configs differing only in it share one binary;
        # the key drops it)
        c13, c2 = decode_config(M * c.k, 2, c.I, c.K, c.R), decode_config(M * c.k, 1, c.K, c.I, c.R)
        return [
            ("decode13", replace(c13, split_n=1), 0, lambda cfg: lora_delta_decode(
                c.x1, c.a13, c.b13, c.ids, c.slot, c.lora_ids, c.enabled,
                torch.zeros(c.k, 2 * c.I, dtype=c.dtype, device=c.device), config=c13)),
            ("decode2", replace(c2, split_n=1), 0, lambda cfg: lora_delta_decode(
                c.h, c.a2, c.b2, c.ids, c.slot, c.lora_ids, c.enabled,
                torch.zeros(c.k, c.K, dtype=c.dtype, device=c.device), routed_weights=c.rw, gather=False,
                config=c2)),
        ]


register(DecodePath())
