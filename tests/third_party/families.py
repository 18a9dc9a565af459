"""Every MoE family of the installed transformers, found and built tiny without a hand list.

A family is a package of `transformers.models` whose configuration module names an expert count
(`num_experts`, `num_local_experts`, `n_routed_experts`, `moe_num_experts`). Each is built from its
own config class with tiny sizes (TINY, applied where the config has the field: to the text config
of a composite model) and run on 16 tokens of random ids. A family that cannot be built tiny this
way is named in CANNOT_BUILD with the reason; the corpus test fails on one that fails to build and
is not named there, and on a named one that builds (a stale entry)."""

from __future__ import annotations

import importlib
import inspect
import os
import re

import torch

TOKENS = 16
VOCAB = 96
EXPERT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
_WORD = re.compile(r"\b(" + "|".join(EXPERT_FIELDS) + r")\b")
# tiny sizes, set on every config that has the field
TINY = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
            head_dim=16, intermediate_size=64, moe_intermediate_size=32, shared_expert_intermediate_size=32,
            num_experts=8, num_local_experts=8, n_routed_experts=8, num_experts_per_tok=2, max_position_embeddings=128,
            decoder_sparse_step=1, first_k_dense_replace=0, n_group=2, topk_group=1, n_shared_experts=1,
            kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=16, v_head_dim=16, qk_nope_head_dim=16,
            num_mtp_layers=0, mlp_only_layers=[], sliding_window=8)


MAX_PARAMS = 6_000_000


class TooBig(RuntimeError):
    """A family whose tiny build would still be large."""


# the fields a family needs beyond TINY (set on its config after TINY)
OVERRIDES = {
    "dbrx": dict(d_model=64, n_heads=4, n_layers=2, max_seq_len=128,
                 attn_config=dict(kv_n_heads=2, rope_theta=10000.0, clip_qkv=8.0),
                 ffn_config=dict(ffn_hidden_size=32, moe_num_experts=8, moe_top_k=2)),
    "step3p7": dict(sliding_window=8),
    "zaya": dict(num_experts_per_tok=1),  # its validator: top-1 routing only
    "mimo_v2_flash": dict(num_key_value_heads=2),  # its attention keeps its own kv-head count
    "lfm2_moe": dict(layer_types=["conv", "full_attention"], num_dense_layers=0),  # None by default, read per layer
}


# the families TINY + OVERRIDES do not build into a model that runs on 16 token ids, and why
CANNOT_BUILD = {
    "deepseek_ocr2": "vision-language OCR model: its vision encoder keeps its full size (TooBig)",
    "diffusion_gemma": "per-layer config (head_dim per layer_config): TINY's global fields are refused",
    "ernie4_5_vl_moe": "moe_intermediate_size is a per-modality list: TINY's int is refused",
    "gemma4": "per-layer config (head_dim per layer_config); its audio tower wants input_features",
    "glm4v_moe": "its multimodal rotary splits head_dim into fixed sections (8, 12, 12) > TINY's head",
    "glm5_next": "its validator wants NoPE sparse-attention layers TINY does not describe",
    "mistral4": "its attention's rope / nope split does not fit TINY's head sizes (a broadcast fails)",
    "muse_spark": "its vision tower keeps its full size (TooBig)",
    "nemotron3_5_transcribe": "speech model: its forward wants input_features, not token ids",
    "nllb_moe": "encoder-decoder translation model: its full-size parts stay (TooBig)",
    "qwen3_omni_moe": "omni model: its audio and vision towers keep their full size (TooBig)",
    "switch_transformers": "encoder-decoder model: its full-size parts stay (TooBig)",
    "unlimited_ocr": "OCR model: its vision encoder keeps its full size (TooBig)",
    "vitpose_backbone": "a vision backbone (experts per dataset): no model class takes token ids",
}


def families() -> list[str]:
    """Packages of transformers.models whose configuration names an expert count (read as text: no import)."""
    import transformers.models as tm

    root = os.path.dirname(tm.__file__)
    out = []
    for fam in sorted(os.listdir(root)):
        d = os.path.join(root, fam)
        for f in (os.listdir(d) if os.path.isdir(d) else []):
            if f.startswith("configuration_") and f.endswith(".py"):
                with open(os.path.join(d, f), encoding="utf-8") as fh:
                    if _WORD.search(fh.read()):
                        out.append(fam)
                        break
    return out


def _config_classes(fam: str) -> list[type]:
    from transformers import PretrainedConfig

    root = importlib.import_module(f"transformers.models.{fam}")
    mods = [m for m in os.listdir(os.path.dirname(root.__file__))
            if m.startswith("configuration_") and m.endswith(".py")]
    out = []
    for m in mods:
        mod = importlib.import_module(f"transformers.models.{fam}.{m[:-3]}")
        out += [c for _, c in inspect.getmembers(mod, inspect.isclass)
                if issubclass(c, PretrainedConfig) and c.__module__ == mod.__name__ and getattr(c, "model_type", "")]
    return out


def _model_class(model_type: str):
    import transformers
    from transformers.models.auto import modeling_auto as ma

    for names in (ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, ma.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
                  ma.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES, ma.MODEL_MAPPING_NAMES):
        n = names.get(model_type)
        if n:
            return getattr(transformers, n)
    return None


def _shrink(cfg) -> None:
    """TINY on the config and on every sub-config that has the field (a composite model's text config)."""
    subs = [cfg] + [getattr(cfg, k) for k in getattr(cfg, "sub_configs", {}) if getattr(cfg, k, None) is not None]
    for c in subs:
        for k, v in TINY.items():
            if hasattr(c, k) and getattr(c, k) is not None:
                setattr(c, k, list(v) if isinstance(v, list) else v)
        for k in ("pad_token_id", "bos_token_id", "eos_token_id"):
            if isinstance(getattr(c, k, None), int) and getattr(c, k) >= VOCAB:
                setattr(c, k, 0)
        n = getattr(c, "num_hidden_layers", None)
        lt = getattr(c, "layer_types", None)
        if n and isinstance(lt, list) and len(lt) != n:
            c.layer_types = (lt * n)[:n]


def build(fam: str, impl: str = "eager", seed: int = 0):
    """(model, ids, config class name): the family's tiny model in float32 on the CPU, eval mode."""
    classes = [c for c in _config_classes(fam) if _model_class(c.model_type) is not None]
    if not classes:
        raise LookupError(f"no model class for its config classes {[c.__name__ for c in _config_classes(fam)]}")
    # the config that holds the experts itself (a composite model's text config) with a causal LM, first
    def holds_experts(c) -> bool:
        return any(f in inspect.signature(c.__init__).parameters or hasattr(c, f) for f in EXPERT_FIELDS)

    classes.sort(key=lambda c: (not holds_experts(c), "CausalLM" not in _model_class(c.model_type).__name__))
    cfg_cls = classes[0]
    params = inspect.signature(cfg_cls.__init__).parameters
    over = OVERRIDES.get(fam, {})
    cfg = cfg_cls(**{k: v for k, v in {**TINY, **over}.items() if k in params or k in over})
    _shrink(cfg)
    for k, v in over.items():
        if not isinstance(v, dict):
            setattr(cfg.get_text_config(), k, v)
    for c in [cfg] + [getattr(cfg, k) for k in getattr(cfg, "sub_configs", {}) if getattr(cfg, k, None) is not None]:
        c._experts_implementation = impl
    cls = _model_class(cfg_cls.model_type)
    with torch.device("meta"):  # its size first: a part TINY does not reach (a vision tower) stays full size
        n = sum(p.numel() for p in cls(cfg).parameters())
    if n > MAX_PARAMS:
        raise TooBig(f"{n / 1e6:.0f} M parameters with TINY applied (a part keeps its full size)")
    torch.manual_seed(seed)
    model = cls(cfg).to(torch.float32).eval()
    g = torch.Generator().manual_seed(seed)
    vocab = getattr(cfg.get_text_config(), "vocab_size", VOCAB) if hasattr(cfg, "get_text_config") else VOCAB
    ids = torch.randint(0, min(vocab, VOCAB), (1, TOKENS), generator=g)
    return model, ids, cfg_cls.__name__


def forward(model, ids):
    with torch.no_grad():
        kw = dict(use_cache=False)
        if getattr(model.config, "is_encoder_decoder", False):
            kw["decoder_input_ids"] = ids
        out = model(input_ids=ids, **kw)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state
