"""Helpers the tests share (imported as `from helpers import ...`: tests/ is on the path)."""
import os

import torch

from lora_moe_lab.ops.reference import rel, tolerance

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))  # the checkout


def rel_err(a, b):
    """ops.reference.rel on the CPU (the one relative-error measure)."""
    return rel(a.double().cpu(), b.double().cpu())


def fp32_tol(device):
    """The fp32 tolerance (ops/reference.py: fp32 exact paths < 1e-5; fp32 on GPU with tf32 dots < 5e-3)."""
    return tolerance(torch.float32, device)


def load_script(name: str):
    """scripts/<name>.py as a module (the scripts are not a package): tests call its functions."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "scripts", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def torch_library_function(src: str, name: str, ns: dict, file: str = "_fake_sync.py"):
    """Compile `src` under a file name inside torch's package, so that the sync tools count its
    frames as library code (as torch's own C++ warning at a sync is), and return `ns[name]`."""
    exec(compile(src, os.path.join(os.path.dirname(torch.__file__), file), "exec"), ns)
    return ns[name]
