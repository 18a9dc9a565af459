"""The packed path: the delta inside the op's base GEMM. A small shrink kernel (`packed_shrink_kernel`) writes each
pair's u = x @ A[slot, expert].T into a dense (pairs, C) buffer, zeros where the pair's adapter is not live, and each
alignment block's range of live columns; then `fused_moe_kernel` (PACKED) runs its K loop a few more iterations over
u and B_packed, every slot's B side by side (kernels/fused_moe_lora_packed.py says why this beats a separate
expand). No alignment of its own: it runs on the base GEMM's blocks.

Rule: a table entry "packed" (and a "wide" entry where the wide build cannot run) with its options: `per_slot` (the
base alignment ordered by LoRA row inside each expert, the expand one dot per slot), `shrink` and `expand`
(`lora_shrink_packed`'s and `moe_gemm_lora_packed`'s keyword options, checked by kernels/table_checks.py). Only a
layer's first hook may take it. Weights: B_packed per op (`pack_lora_b`), kept beside the pool's stacks and rewritten
in place by every load and unload. Exits: the one table's `packed_shrink_kernel` and `fused_moe_kernel` rows
(kernels/exits.py)."""
from __future__ import annotations

from ..common import pow2
from ..configs import block_r
from ..plan import LoRAPlan
from .registry import LoRAPath, Question, register, stacks


def _repack(lw, op, t) -> None:
    from ..fused_moe_lora_packed import pack_lora_b  # the kernels import Triton: only when used
    t.copy_(pack_lora_b(stacks(lw, op)[1]))


def packed_b(lw, op: str):
    """`pack_lora_b` of the op's B, built at first use (outside any graph: the layer's warm-up) and rewritten in
    place by every load and unload, so a captured graph that reads it sees the new adapter as it does the stacks."""
    from ..fused_moe_lora_packed import pack_lora_b
    return lw.derive(("packed", op), lambda: pack_lora_b(stacks(lw, op)[1]), lambda w, t, op=op: _repack(w, op, t))


class PackedPath(LoRAPath):
    name = "packed"
    in_gemm = True

    def rule(self, q: Question) -> LoRAPlan:
        e = q.entry
        return LoRAPlan(q.op, self.name, q.block_m, e.per_slot, shrink=e.shrink, expand=e.expand,
                        decided_by=e.decided_by)

    def gemm(self, hook, p, x, w, align, top_k, out, routed_weights=None):
        i, lw = hook.info, hook.info.weights
        return hook.backend.moe_gemm_lora_packed(
            x, w, align, top_k, out, *stacks(lw, p.op), i.token_lora_mapping, i.lora_ids,
            i.adapter_enabled, routed_weights=routed_weights, gather=p.op == "gate_up", b_packed=packed_b(lw, p.op),
            per_slot=p.order_by_row, shrink=p.shrink_options, expand=p.expand_options)

    def layer_bytes(self, shape, lora, dtype, backend: str) -> int:
        """B_packed of gate_up (P = 2 slices of pow2(S) * BLOCK_R columns over 2I rows) and down (one over K)."""
        if backend != "triton":
            return 0
        per_slice = pow2(lora.max_loras) * block_r(lora.max_rank)
        return shape.num_experts * (2 * shape.intermediate * 2 + shape.hidden) * per_slice * dtype.itemsize

    def warmup_jobs(self, c, M: int) -> list:
        import torch

        from ..configs import gemm_config
        from ..fused_moe_lora_packed import moe_gemm_lora_packed
        p13, p2 = c.shared["gate_up"], c.shared["down"]  # beside a second hook a wide entry runs packed
        jobs = []
        if p13.path == self.name:
            jobs.append(("folded13", gemm_config(M, c.bm_base, 2 * c.I, c.K, c.E), c.bm_base, lambda cfg: (
                moe_gemm_lora_packed(c.x1, c.w13, c.al_f, c.k, torch.empty(c.k, 2 * c.I, dtype=c.dtype,
                                                                            device=c.device),
                                     c.a13, c.b13, c.slot, c.lora_ids, c.enabled, per_slot=p13.order_by_row,
                                     shrink=p13.shrink_options, expand=p13.expand_options, config=cfg))))
        if p2.path == self.name:
            jobs.append(("folded2", gemm_config(M, c.bm_base, c.K, c.I, c.E), c.bm_base, lambda cfg: (
                moe_gemm_lora_packed(c.h, c.w2, c.al_f, c.k, torch.empty(c.k, c.K, dtype=c.dtype, device=c.device),
                                     c.a2, c.b2, c.slot, c.lora_ids, c.enabled, routed_weights=c.rw, gather=False,
                                     per_slot=p2.order_by_row, shrink=p2.shrink_options, expand=p2.expand_options,
                                     config=cfg))))
        return jobs


PACKED = register(PackedPath())
