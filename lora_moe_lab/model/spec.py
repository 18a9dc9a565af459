"""What one MoE layer does, step by step, in the order the host issues it: the ONE description
that the model (model/moe.py: MiniMoEModel.forward and MoELayer.forward) follows and the
simulator (sim/cost.py) turns into ops. A step the model gains is added here, and the
simulator then needs its cost (a test checks that every step has one).

Per layer, the guard runs first (its `sites_per_layer` checks: with a `device_check` guard each is
a device reduction plus a host sync), then these steps; the `lora` steps run only when the guard
decides to launch (always under CUDA-graph capture).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    name: str
    lora: bool = False  # part of the LoRA path: skipped when the guard says no adapter is active
    what: str = ""


MOE_LAYER_STEPS: tuple[Step, ...] = (
    Step("rmsnorm", what="pre-norm of the residual stream (one Triton kernel on a GPU)"),
    Step("router_gemm", what="router logits in fp32"),
    Step("softmax_topk", what="softmax, top-k, renormalise"),
    Step("align", what="group (token, k) pairs by expert, padded to blocks"),
    Step("gate_up_gemm", what="base grouped GEMM x @ w13.T"),
    Step("lora_align", lora=True, what="per-adapter alignment"),
    Step("lora_gate_up", lora=True, what="fused LoRA shrink+expand added into the intermediate"),
    Step("silu_mul", what="SiLU(gate) * up"),
    Step("down_gemm", what="base grouped GEMM act @ w2.T, times the routed weight"),
    Step("lora_down", lora=True, what="fused LoRA delta of the down projection, times the routed weight"),
    Step("topk_sum", what="sum of the top-k expert outputs"),
    Step("residual_add", what="h + layer(h)"),
)

# the guard's device check, when it has one: a reduction kernel and its `.item()`
GUARD_CHECK_KERNEL = "lora_any"
GUARD_CHECK_SYNC = "lora_any.item"

# The decoder layer (model/decoder.py, model/attention.py): these attention steps, then the MoE
# steps above (whose `rmsnorm` is then the post-attention norm).
ATTENTION_STEPS: tuple[Step, ...] = (
    Step("attn_rmsnorm", what="pre-norm of the residual stream before attention"),
    Step("qkv_gemm", what="fused q, k, v projection (this rank's heads under TP)"),
    Step("qk_norm", what="per-head RMSNorm of q and of k over head_dim (two kernels)"),
    Step("rope", what="rotary position embedding of q and k (rotate-half), positions from host lists"),
    Step("sdpa", what="causal attention per request (one call when all requests have one length)"),
    Step("o_proj_gemm", what="output projection (row-parallel under TP: a partial sum)"),
    Step("attn_residual_add", what="h + attention(h) (after the all-reduce under TP)"),
)
DECODER_LAYER_STEPS: tuple[Step, ...] = ATTENTION_STEPS + MOE_LAYER_STEPS

# Where the decoder's guard sites sit: call point -> the step it precedes. A layer's sites are
# dealt to these points in turn (site j at point j % 4); the first decides the layer.
GUARD_SITE_POINTS: dict[str, str] = {
    "qkv_proj": "qkv_gemm",
    "o_proj": "o_proj_gemm",
    "moe_gate_up": "router_gemm",  # the MoE's LoRA call: router, then gate_up GEMM and its delta
    "moe_down": "down_gemm",
}
