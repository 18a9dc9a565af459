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


@pytest.fixture
def device():
    return runtime.default_device()
