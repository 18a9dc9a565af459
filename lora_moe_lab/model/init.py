"""Seeded random weights, the same on every rank: what the model's modules are built from."""
from __future__ import annotations

import torch


def frozen(t: torch.Tensor) -> torch.nn.Parameter:
    """A weight registered as a Parameter (so `.to()` and `state_dict()` see it), inference only:
    no autograd bookkeeping."""
    return torch.nn.Parameter(t, requires_grad=False)


def randn(gen: torch.Generator, device, *size, std: float) -> torch.Tensor:
    """N(0, std^2) in fp32 from `gen`. Every rank draws the FULL tensor in the same order and keeps
    its slice, so a tensor-parallel model holds exactly the slices of the one-process weights."""
    return torch.randn(*size, generator=gen, device=device, dtype=torch.float32).mul_(std)
