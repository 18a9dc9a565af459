"""The model: adapter pool and batch metadata (lora), the guard registry (guards), the layer's
step list (spec), the MoE layer and model (moe), attention and the Qwen3-shaped decoder
(attention, decoder), tensor parallelism (tp), the one-call set-ups (lab, decoder), CUDA graphs (graphs) and
the three LoRA-under-graphs strategies (graph_strategies)."""
from .guards import Guard, count_guard_syncs, get_guard, guard_names, register_guard  # noqa: F401
from .lab import Lab, LabCache, build_lab, split_tokens  # noqa: F401
from .lora import AdapterPool, LoRABatchInfo, LoRABatchTensors, LoRAInfo  # noqa: F401
from .moe import MiniMoEModel, MoELayer  # noqa: F401
from .decoder import DecoderModel, build_decoder_lab  # noqa: F401
