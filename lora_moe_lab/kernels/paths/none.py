"""The path without LoRA work: the op's base GEMM alone. The plan returns it for a batch without hooks (the guard
decided no adapter is active) and for the torch backend's base plan; a table never names it."""
from __future__ import annotations

from .registry import LoRAPath, register


class NonePath(LoRAPath):
    name = "none"
    in_table = False


register(NonePath())
