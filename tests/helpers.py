"""Helpers the tests share (imported as `from helpers import ...`: tests/ is on the path)."""
import os

import torch

from lora_moe_lab.ops.reference import tolerance

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))  # the checkout


def rel_err(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def fp32_tol(device):
    """The fp32 tolerance (ops/reference.py: fp32 exact paths < 1e-5; fp32 on GPU with tf32 dots < 5e-3)."""
    return tolerance(torch.float32, device)
