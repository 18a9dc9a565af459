"""lora_moe_lab: a workbench for the host-device sync lesson of LoRA on Mixture-of-Experts."""
from . import runtime  # noqa: F401  (first: sets TRITON_INTERPRET before any kernel is decorated)
from .config import PRESETS, MoEShape, get_shape  # noqa: F401
from .runtime import capture_mode, in_capture_mode  # noqa: F401

__version__ = "0.1.0"
