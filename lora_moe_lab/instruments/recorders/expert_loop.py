"""The eager per-expert MoE loop that transformers ships, rewritten with its syncs hoisted: one
`.tolist()` per layer instead of 1 + 5 per expert hit.

transformers' generic eager experts forward (Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE, DeepSeek-V3,
Granite-MoE) walks the experts hit with device tensors as loop state:

    expert_hit = (...).nonzero()                      # 1 sync: the output size is data
    for expert_idx in expert_hit:
        if expert_idx == self.num_experts: ...        # bool(): 1 sync
        torch.where(expert_mask[expert_idx])          # a 0-d index -> .item(), where(cond): 2 syncs
        self.gate_up_proj[expert_idx]                 # a 0-d index -> .item(): 1 sync
        self.down_proj[expert_idx]                    # 1 sync

Each of them drains the GPU's queue; the host then issues the next expert's few small kernels, so
the GPU idles between experts. `hoisted_experts_forward` computes the same thing from ONE host read
per layer: each expert's token count (`.tolist()`), after a stable sort of the routing table in the
order `torch.where` walks it, so every expert sees its rows in the same order and the output is
bit-equal. Indexing with Python ints and slicing by host offsets launch kernels without a sync.

It reads only what the eager loop reads (`gate_up_proj` (E, 2I, K), `down_proj` (E, K, I),
`act_fn`, `num_experts`): it knows nothing of transformers. `register()` adds it to transformers'
experts interface under the name "hoisted" (`config._experts_implementation = "hoisted"`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["hoisted_experts_forward", "register", "NAME"]

NAME = "hoisted"


def hoisted_experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                            top_k_weights: torch.Tensor) -> torch.Tensor:
    """Same result as the eager loop (bit-equal on the same device), one host sync per call."""
    final = torch.zeros_like(hidden_states)
    T, top_k = top_k_index.shape
    # the eager loop visits expert e's pairs as torch.where(mask[e]) does: k-major, then token. A stable
    # sort of the (k, token)-flattened expert ids gives that order inside each expert's segment.
    flat = top_k_index.t().reshape(-1)  # position j = k * T + t
    order = torch.sort(flat, stable=True).indices
    counts = torch.zeros(self.num_experts + 1, dtype=torch.long, device=flat.device)
    counts.scatter_add_(0, flat.clamp(max=self.num_experts), torch.ones_like(flat))  # static shape, no sync
    sizes = counts.tolist()  # THE one host-device sync of the layer
    start = 0
    for e, n in enumerate(sizes[: self.num_experts]):
        if n == 0:
            continue
        seg = order[start: start + n]  # host offsets: a view, no sync
        start += n
        token_idx, top_k_pos = seg % T, seg // T
        current = hidden_states[token_idx]
        gate, up = F.linear(current, self.gate_up_proj[e]).chunk(2, dim=-1)  # a Python int index: no sync
        h = self.act_fn(gate) * up
        h = F.linear(h, self.down_proj[e])
        h = h * top_k_weights[token_idx, top_k_pos, None]
        final.index_add_(0, token_idx, h.to(final.dtype))
    return final


def register() -> str:
    """Register the rewrite with transformers' experts interface; returns its name."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    ALL_EXPERTS_FUNCTIONS.register(NAME, hoisted_experts_forward)
    return NAME
