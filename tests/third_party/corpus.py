"""Tiny random-init MoE models from transformers (and PEFT adapters on one): the audit's corpus of code
no one here wrote. Each builder returns a Corpus: the model, its input ids, and the experts class whose
source the tests read to derive the syncs they expect (independently of the audit).

Shapes are small enough for a CPU test (hidden 32-64, 2 layers, 4-8 experts, 12-16 tokens) and large
enough that several experts are hit in every layer. Weights are seeded; nothing is downloaded."""

from __future__ import annotations

import dataclasses

import torch

VOCAB = 96
TOKENS = 16


@dataclasses.dataclass
class Corpus:
    name: str
    model: torch.nn.Module
    ids: torch.Tensor
    experts_cls: type  # the class holding the per-expert loop (its forward's source is read)
    experts_attr: str  # where it sits in a decoder layer (for the routing hook)

    def forward(self):
        with torch.no_grad():
            return self.model(self.ids, use_cache=False).logits


def _ids(device, tokens=TOKENS, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (1, tokens), generator=g).to(device)


def _attn(**kw):
    base = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=128)
    base.update(kw)
    return base


def _qwen3_moe(impl):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    cfg = Qwen3MoeConfig(**_attn(intermediate_size=64, moe_intermediate_size=32, head_dim=16, num_experts=8,
                                 num_experts_per_tok=2, decoder_sparse_step=1))
    return Qwen3MoeForCausalLM, cfg, Qwen3MoeExperts, "mlp.experts"


def _qwen2_moe(impl):
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeExperts

    cfg = Qwen2MoeConfig(**_attn(intermediate_size=64, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                                 num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1))
    return Qwen2MoeForCausalLM, cfg, Qwen2MoeExperts, "mlp.experts"


def _mixtral(impl):
    from transformers import MixtralConfig, MixtralForCausalLM
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts

    cfg = MixtralConfig(**_attn(intermediate_size=32, num_local_experts=8, num_experts_per_tok=2))
    return MixtralForCausalLM, cfg, MixtralExperts, "mlp.experts"


def _olmoe(impl):
    from transformers import OlmoeConfig, OlmoeForCausalLM
    from transformers.models.olmoe.modeling_olmoe import OlmoeExperts

    cfg = OlmoeConfig(**_attn(intermediate_size=32, num_experts=8, num_experts_per_tok=2))
    return OlmoeForCausalLM, cfg, OlmoeExperts, "mlp.experts"


def _deepseek_v3(impl):
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Experts

    cfg = DeepseekV3Config(**_attn(intermediate_size=64, moe_intermediate_size=32, num_key_value_heads=4,
                                   n_shared_experts=1, n_routed_experts=8, num_experts_per_tok=2, n_group=2,
                                   topk_group=1, first_k_dense_replace=0, kv_lora_rank=16, q_lora_rank=32,
                                   qk_rope_head_dim=8, v_head_dim=16, qk_nope_head_dim=16, num_mtp_layers=0))
    return DeepseekV3ForCausalLM, cfg, DeepseekV3Experts, "mlp.experts"


def _gpt_oss(impl):
    from transformers import GptOssConfig, GptOssForCausalLM
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    cfg = GptOssConfig(**_attn(intermediate_size=32, head_dim=16, num_local_experts=8, num_experts_per_tok=2,
                               sliding_window=8, layer_types=["sliding_attention", "full_attention"]))
    return GptOssForCausalLM, cfg, GptOssExperts, "mlp.experts"


def _granitemoe(impl):
    from transformers import GraniteMoeConfig, GraniteMoeForCausalLM
    from transformers.models.granitemoe.modeling_granitemoe import GraniteMoeExperts

    cfg = GraniteMoeConfig(**_attn(intermediate_size=32, num_local_experts=8, num_experts_per_tok=2))
    return GraniteMoeForCausalLM, cfg, GraniteMoeExperts, "block_sparse_moe.experts"


def _dbrx(impl):
    from transformers import DbrxConfig, DbrxForCausalLM
    from transformers.models.dbrx.modeling_dbrx import DbrxExperts

    attn = dict(kv_n_heads=2, rope_theta=10000.0, clip_qkv=8.0)  # clip_qkv=None fails in DBRX's clamp
    ffn = dict(ffn_hidden_size=32, moe_num_experts=8, moe_top_k=2)
    cfg = DbrxConfig(d_model=64, n_heads=4, n_layers=2, max_seq_len=128, vocab_size=VOCAB, attn_config=attn,
                     ffn_config=ffn)
    return DbrxForCausalLM, cfg, DbrxExperts, "ffn.experts"


BUILDERS = {
    "qwen3_moe": _qwen3_moe,
    "qwen2_moe": _qwen2_moe,
    "mixtral": _mixtral,
    "olmoe": _olmoe,
    "deepseek_v3": _deepseek_v3,
    "gpt_oss": _gpt_oss,
    "granitemoe": _granitemoe,
    "dbrx": _dbrx,
}


def build(name: str, impl: str = "eager", device: str = "cpu", dtype=torch.float32, seed: int = 0) -> Corpus:
    """A tiny random-init model of one family, with its experts implementation `impl` ("eager": the
    per-expert loop; "grouped_mm": transformers' default). DBRX has the loop only."""
    model_cls, cfg, experts_cls, attr = BUILDERS[name](impl)
    cfg._experts_implementation = impl
    torch.manual_seed(seed)
    model = model_cls(cfg).to(device=device, dtype=dtype).eval()
    return Corpus(name, model, _ids(device), experts_cls, attr)


def qwen3_moe_full(device: str, tokens: int = 2048, layers: int = 4, seed: int = 0) -> Corpus:
    """Qwen3-30B-A3B's MoE layer at full width (hidden 2048, 128 experts, top-8, moe intermediate 768),
    `layers` of them, bf16, the eager per-expert loop: the GPU check's audit case. The weights are drawn
    on the device (a CPU init of 2.4 B parameters would take minutes)."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    cfg = Qwen3MoeConfig(vocab_size=4096, hidden_size=2048, num_hidden_layers=layers, num_attention_heads=32,
                         num_key_value_heads=4, max_position_embeddings=max(4096, tokens), head_dim=128,
                         intermediate_size=6144, moe_intermediate_size=768, num_experts=128,
                         num_experts_per_tok=8, decoder_sparse_step=1)
    cfg._experts_implementation = "eager"
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen3MoeForCausalLM(cfg).to(dtype=torch.bfloat16).eval()
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size, (1, tokens), generator=g).to(device)
    return Corpus("qwen3_moe_full", model, ids, Qwen3MoeExperts, "mlp.experts")
