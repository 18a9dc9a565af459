"""The model: adapter pool and batch metadata (lora), the guard registry (guards), the layer's
step list (spec), the MoE layer and model (moe), the one-call set-up (lab), CUDA graphs (graphs)."""
from .guards import Guard, get_guard, guard_names, register_guard  # noqa: F401
from .lab import Lab, LabCache, build_lab, split_tokens  # noqa: F401
from .lora import AdapterPool, LoRABatchInfo, LoRABatchTensors, LoRAInfo  # noqa: F401
from .moe import MiniMoEModel, MoELayer  # noqa: F401
