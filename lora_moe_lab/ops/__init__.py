"""Ops: the backend interface (backend), the torch and Triton backends behind it, and the float64
references (reference; reference_rows for the per-pair decode path). `get_backend` is the one place a backend name \
becomes a backend."""
from __future__ import annotations

import torch

from .. import runtime
from .backend import Backend


def get_backend(name: str | Backend = "auto", device: torch.device | str | None = None) -> Backend:
    """'torch', 'triton', or 'auto' (runtime.resolve_backend: Triton on a GPU, torch on CPU)."""
    if isinstance(name, Backend):
        return name
    if runtime.resolve_backend(name, device) == "torch":
        from .torch_backend import TorchBackend
        return TorchBackend()
    from .triton_backend import TritonBackend
    return TritonBackend()
