"""What one MoE layer does, step by step, in the order the host issues it: the ONE description
that the model (model/moe.py: MiniMoEModel.forward and MoELayer.forward) follows and the
simulator (sim/cost.py) turns into ops. A step the MoE layer gains is added here, and the
simulator then needs its cost (a test checks that every MoE step has one; the simulator models
the MoE blocks, and the decoder's attention steps are listed for the reader and the guard sites).

The Triton backend runs some steps inside another's kernel: `softmax_topk` in `router_gemm`'s epilogue
(kernels/router.py) and, in one process, `residual_add` in `topk_sum`'s pass (kernels/moe_sum.py; under TP the
add waits for the all-reduce). The steps stay listed apart: they are the work the simulator prices, and the
torch backend still runs them as separate ops (sim/cost.py's DEFAULT_LAUNCHES counts the launches of each).

Per layer, the guard runs first (its `sites_per_layer` checks: with a `device_check` guard each is
a device reduction plus a host sync), then these steps; the `lora` steps run only when the guard
decides to launch (always under CUDA-graph capture).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    name: str
    block: str  # "attention" or "moe": which half of a decoder layer it belongs to
    lora: bool = False  # part of the LoRA path: skipped when the guard says no adapter is active
    what: str = ""


# One decoder layer (model/decoder.py, model/attention.py), in issue order: the attention steps,
# then the MoE steps (whose `rmsnorm` is then the post-attention norm). The MoE-only mini model
# (model/moe.py) runs the "moe" steps alone.  (name, block, lora, what)
_TABLE = (
    ("attn_rmsnorm", "attention", False, "pre-norm of the residual stream before attention"),
    ("qkv_gemm", "attention", False, "fused q, k, v projection (this rank's heads under TP)"),
    ("qk_norm", "attention", False, "per-head RMSNorm of q and of k over head_dim (two kernels)"),
    ("rope", "attention", False, "rotary position embedding of q and k (rotate-half), positions from host lists"),
    ("sdpa", "attention", False, "causal attention per request (one call when all requests have one length)"),
    ("o_proj_gemm", "attention", False, "output projection (row-parallel under TP: a partial sum)"),
    ("attn_residual_add", "attention", False, "h + attention(h) (after the all-reduce under TP)"),
    ("rmsnorm", "moe", False, "pre-norm of the residual stream (one Triton kernel on a GPU)"),
    ("router_gemm", "moe", False, "router logits x @ W.T in the model dtype, fp32 accumulation (+ skew bias)"),
    ("softmax_topk", "moe", False, "softmax, top-k, renormalise (Triton: in the router GEMM's epilogue)"),
    ("align", "moe", False, "group (token, k) pairs by expert, padded to blocks"),
    ("gate_up_gemm", "moe", False, "base grouped GEMM x @ w13.T"),
    ("lora_align", "moe", True, "per-adapter alignment"),
    ("lora_gate_up", "moe", True, "fused LoRA shrink+expand added into the intermediate"),
    ("silu_mul", "moe", False, "SiLU(gate) * up in fp32 (Triton: one kernel)"),
    ("down_gemm", "moe", False, "base grouped GEMM act @ w2.T, times the routed weight"),
    ("lora_down", "moe", True, "fused LoRA delta of the down projection, times the routed weight"),
    ("topk_sum", "moe", False, "sum of the top-k expert outputs in fp32"),
    ("residual_add", "moe", False, "h + layer(h) (Triton, one process: in the top-k sum's pass)"),
)
DECODER_LAYER_STEPS: tuple[Step, ...] = tuple(Step(*row) for row in _TABLE)
ATTENTION_STEPS: tuple[Step, ...] = tuple(s for s in DECODER_LAYER_STEPS if s.block == "attention")
MOE_LAYER_STEPS: tuple[Step, ...] = tuple(s for s in DECODER_LAYER_STEPS if s.block == "moe")

# the guard's device check, when it has one: a reduction kernel and its `.item()`
GUARD_CHECK_KERNEL = "lora_any"
GUARD_CHECK_SYNC = "lora_any.item"

# Where the decoder's guard sites sit: call point -> the step it precedes. A layer's sites are
# dealt to these points in turn (site j at point j % 4); the first decides the layer.
GUARD_SITE_POINTS: dict[str, str] = {
    "qkv_proj": "qkv_gemm",
    "o_proj": "o_proj_gemm",
    "moe_gate_up": "router_gemm",  # the MoE's LoRA call: router, then gate_up GEMM and its delta
    "moe_down": "down_gemm",
}
