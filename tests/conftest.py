import os
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)
# Notebook kernels started by papermill/JupyterLab in tests import the package from this checkout.
os.environ["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
import lora_moe_lab  # noqa: E402,F401  (sets TRITON_INTERPRET before any kernel module is imported)
import torch  # noqa: E402

from lora_moe_lab import runtime  # noqa: E402
from lora_moe_lab.ops.reference import tolerance  # noqa: E402


def rel_err(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


@pytest.fixture
def device():
    return runtime.default_device()


def fp32_tol(device):
    """The fp32 tolerance (ops/reference.py: fp32 exact paths < 1e-5; fp32 on GPU with tf32 dots < 5e-3)."""
    return tolerance(torch.float32, device)
