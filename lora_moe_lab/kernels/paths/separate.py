"""The separate path: the op's base GEMM as it is, then the delta as its own kernel, `fused_moe_lora_kernel`
(kernels/fused_moe_lora.py: shrink and expand in one program per (LoRA row, block, N share), with the early exit),
over an alignment of the batch's (token, k) pairs per LoRA row (`moe_align` with the token-to-row mapping).

Rule: a table entry "separate" runs here, as does an in-GEMM entry of a layer's later hook (only the first may); up
to the table's decode bound of (token, k) pairs the decode path runs instead (no alignment at all). The alignment's
rows per block and the down delta's launch config come from kernels/configs.py (`lora_block_m`,
`lora_down_config`). Weights: the pool's stacks as they are. Exits: the one table's `fused_moe_lora_kernel` row
(kernels/exits.py). The torch backend's plan is always this path (ops/torch_backend.py runs it block by block)."""
from __future__ import annotations

from .. import configs
from ..plan import LoRAPlan
from .registry import LoRAPath, Question, register


class SeparatePath(LoRAPath):
    name = "separate"

    def rule(self, q: Question) -> LoRAPlan:
        k, E = q.shape.top_k, q.shape.num_experts
        if q.M * k <= q.table.decode_max_pairs:
            return LoRAPlan(q.op, "decode", q.block_m)
        lbm = configs.lora_block_m(q.M, k, E, q.lora.rows)
        # the down delta's launch config (N = hidden, K = intermediate); gate_up's comes from the kernel's table
        cfg = (configs.lora_down_config(q.M, k, E, q.lora.rows, lbm, q.shape.hidden, q.shape.intermediate)
               if q.op == "down" else None)
        why = q.entry.decided_by if q.entry.path == self.name else ()  # an in-GEMM entry did not decide this
        return LoRAPlan(q.op, self.name, q.block_m, lora_block_m=lbm, config=cfg, decided_by=why)

    def prepare(self, hook, p, topk_ids) -> None:
        i = hook.info
        hook.align = hook.backend.align(topk_ids, hook.E, p.lora_block_m, i.token_lora_mapping, i.lora_ids.shape[0])
        hook.topk_ids = None

    def delta(self, hook, p, x, a, b, out, top_k, **kw) -> None:
        i = hook.info
        hook.backend.lora_delta(x, a, b, hook.align, i.lora_ids, i.adapter_enabled, top_k, out, plan=p,
                                lora_ranks=hook.ranks(), **kw)

    def warmup_jobs(self, c, M: int) -> list:
        import torch

        from ..align import moe_align
        from ..configs import lora_config, lora_down_config
        from ..fused_moe_lora import lora_delta
        jobs = []
        for bm in (configs.lora_block_m(M, c.k, c.E, c.S), c.bm_base):  # the layer may align LoRA with either size
            al = moe_align(c.ids, c.E, bm, c.slot, c.S)
            jobs += [
                ("lora13", lora_config(M, c.k, c.E, c.S, bm, c.I, c.K), bm,
                 lambda cfg, al=al: lora_delta(c.x1, c.a13, c.b13, al, c.lora_ids, c.enabled, c.k,
                                               torch.zeros(c.k, 2 * c.I, dtype=c.dtype, device=c.device),
                                               config=cfg)),
                ("lora2", lora_down_config(M, c.k, c.E, c.S, bm, c.K, c.I), bm,
                 lambda cfg, al=al: lora_delta(c.h, c.a2, c.b2, al, c.lora_ids, c.enabled, c.k,
                                               torch.zeros(c.k, c.K, dtype=c.dtype, device=c.device),
                                               routed_weights=c.rw, gather=False, config=cfg)),
            ]
        return jobs


register(SeparatePath())
