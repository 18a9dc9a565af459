"""The wide path: the packed path's columns moved into the GEMM's own operands. Each op's base weight is stored
with the op's B_packed as C more columns past K (`wide_weights`: w_wide (E, N, K + C)), and the op's input rows carry
C more columns that the shrink fills with u; the base GEMM's own K loop then runs over K + C (kernels/
fused_moe_lora_packed.py: `moe_gemm_lora_wide`). down: each pair's row has its u past I; gate_up: each token's row
has top_k tails, one per pair, and the GEMM's row pointers jump to the pair's tail after the last base step.

Rule: a table entry "wide" with `per_slot`, `shrink` (gate_up: `wide_shrink` where given) and, for down, `window`
(the columns per tile: two slots' where the tile reads w through TMA and steps evenly). It needs the hook to be the
layer's only one (it writes its columns into the layer's buffers) and, for gate_up, K a multiple of the tile's
BLOCK_K; elsewhere the entry runs packed. Weights: the layer's w13 and w2 live in the wide builds (`hold`: the
layer keeps the view [..., :K], so the weights exist once); the columns past K are rewritten by every load and
unload. Exits: as the packed path's."""
from __future__ import annotations

from ..common import pow2
from .. import configs
from ..plan import LoRAPlan
from .packed import PACKED, packed_b
from .registry import LoRAPath, Question, register, stacks


def wide_columns(op: str, lora) -> int:
    """C: the op's adapter columns per pair (every slice's and slot's BLOCK_R side by side, the slots rounded up to a
    power of two, as kernels/fused_moe_lora_packed.py: pack_lora_b lays them); lora: the plan's LoRADims."""
    return (2 if op == "gate_up" else 1) * pow2(lora.slots) * configs.block_r(lora.rank)


def _window(e, M, bm, N, K, E, C, slots) -> int:
    """The wide down GEMM's columns per tile: two slots' (2 * BLOCK_R) where the entry takes the window, the tile
    reads w through TMA and steps evenly over K and the window, and the window is narrower than all C; else 0."""
    br = C // pow2(slots)
    if not e.window or 2 * br >= C:
        return 0
    cfg = configs.gemm_config(M, bm, N, K, E)
    return 2 * br if cfg.w_desc and K % cfg.block_k == 0 and (2 * br) % cfg.block_k == 0 else 0


def _refresh(lw, op, t) -> None:
    t[..., t.shape[2] - packed_b(lw, op).shape[2]:].copy_(packed_b(lw, op))  # packed_b is refreshed first


def wide_w(lw, op: str, w):
    """`wide_weights(w, packed_b(op))` for op "gate_up" (w = w13) or "down" (w = w2), kept per op and weight (a
    weight not held in it gets a wide copy at first use, outside any graph) and refreshed in place."""
    from ..fused_moe_lora_packed import wide_weights  # the kernels import Triton: only when used
    return lw.derive(("wide", op), lambda: wide_weights(w, packed_b(lw, op)), lambda w_, t, op=op: _refresh(w_, op, t),
                     tag=(w.data_ptr(), tuple(w.shape)))


class WidePath(LoRAPath):
    name = "wide"
    in_gemm = True

    def rule(self, q: Question) -> LoRAPlan:
        e, op, sh, M, bm = q.entry, q.op, q.shape, q.M, q.block_m
        N, K = (2 * sh.intermediate, sh.hidden) if op == "gate_up" else (sh.hidden, sh.intermediate)
        if not q.alone or (op == "gate_up" and K % configs.gemm_config(M, bm, N, K, sh.num_experts).block_k):
            return PACKED.rule(q)  # beside a second hook; gate_up's row pointers would jump between two K steps
        C = wide_columns(op, q.lora)
        if op == "gate_up":
            shrink = e.wide_shrink if e.wide_shrink is not None else e.shrink
            return LoRAPlan(op, self.name, bm, e.per_slot, shrink=shrink, columns=sh.top_k * C,
                            decided_by=e.decided_by)
        return LoRAPlan(op, self.name, bm, e.per_slot, shrink=e.shrink, columns=C, decided_by=e.decided_by,
                        window=_window(e, M, bm, N, K, sh.num_experts, C, q.lora.slots))

    def gemm(self, hook, p, x, w, align, top_k, out, routed_weights=None):
        """x is the first K columns of a wider buffer: p.columns more (the layer's norm writes gate_up's input there,
        silu_and_mul down's)."""
        i, lw = hook.info, hook.info.weights
        gate_up = p.op == "gate_up"
        ww = wide_w(lw, p.op, w)
        return hook.backend.moe_gemm_lora_wide(x, ww[..., :w.shape[2]], align, top_k, out, stacks(lw, p.op)[0],
                                               i.token_lora_mapping, i.lora_ids, i.adapter_enabled,
                                               routed_weights=routed_weights,
                                               gather=gate_up, shrink=p.shrink_options, per_block=gate_up,
                                               window=p.window)

    def hold(self, lw, op: str, w, backend: str):
        """The op's base weight moved into its wide build (the Triton backend only: no other runs this path):
        returns the view [..., :K] of `wide_w`, which the layer holds instead of w (w's storage is then free once
        the layer drops it). Already held: the same view. A CUDA graph captured on the old storage is stale, as is
        one captured on another pool's stacks: hold the weights when the pool is attached, before any capture."""
        if backend != "triton":
            return w
        ww = wide_w(lw, op, w)
        lw.derive(("wide", op), lambda: ww, lambda w_, t, op=op: _refresh(w_, op, t),
                  tag=(ww.data_ptr(), tuple(w.shape)))  # the key of the view the layer now holds
        return ww[..., :w.shape[2]]

    def layer_bytes(self, shape, lora, dtype, backend: str) -> int:
        """The C columns past K of w13's and w2's wide builds (as many as B_packed's)."""
        return PACKED.layer_bytes(shape, lora, dtype, backend)

    def warmup_jobs(self, c, M: int) -> list:
        import torch

        from ..fused_moe_lora_packed import moe_gemm_lora_wide, pack_lora_b
        from ..fused_moe_lora_packed import wide_columns as columns_of
        from ..fused_moe_lora_packed import wide_weights
        jobs = []
        p = c.alone["down"]
        if p.path == self.name:  # x and w with the adapters' C columns past K
            C = columns_of(c.a2)
            hw, w2w = torch.zeros(c.k, c.I + C, dtype=c.dtype, device=c.device), wide_weights(c.w2, pack_lora_b(c.b2))
            jobs.append((f"wide2_w{p.window}", configs.gemm_config(M, c.bm_base, c.K, c.I, c.E), c.bm_base,
                         lambda cfg, p=p: moe_gemm_lora_wide(
                             hw[:, :c.I], w2w[..., :c.I], c.al_f, c.k,
                             torch.empty(c.k, c.K, dtype=c.dtype, device=c.device), c.a2, c.slot, c.lora_ids,
                             c.enabled, routed_weights=c.rw, shrink=p.shrink_options, config=cfg, window=p.window)))
        p = c.alone["gate_up"]
        if p.path == self.name:  # gate_up per block: top_k tails a row
            C13 = columns_of(c.a13)
            xw = torch.zeros(1, c.K + c.k * C13, dtype=c.dtype, device=c.device)
            w13w = wide_weights(c.w13, pack_lora_b(c.b13))
            jobs.append(("wide13", configs.gemm_config(M, c.bm_base, 2 * c.I, c.K, c.E), c.bm_base,
                         lambda cfg, p=p: moe_gemm_lora_wide(
                             xw[:, :c.K], w13w[..., :c.K], c.al_f, c.k,
                             torch.empty(c.k, 2 * c.I, dtype=c.dtype, device=c.device), c.a13, c.slot, c.lora_ids,
                             c.enabled, gather=True, shrink=p.shrink_options, per_block=True, config=cfg)))
        return jobs


register(WidePath())
