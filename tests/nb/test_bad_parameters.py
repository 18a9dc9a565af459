"""The notebooks' parameter checks (nb/params.py) refuse a bool where a number is asked (papermill's
`-p active_fraction True` used to run as 1.0), out-of-range fractions, unknown devices, presets, guards and dtypes,
with a NotebookParameterError naming the parameter; and one real notebook fails that way under papermill."""
import math
from pathlib import Path

import pytest
import yaml

from lora_moe_lab.nb import live
from lora_moe_lab.nb import params as nbk

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("value", [True, False, math.nan, math.inf, 1.5, -0.1, "0.5", None, [0.5]])
def test_fraction_refuses(value):
    with pytest.raises(nbk.NotebookParameterError, match=r"bad notebook parameter active_fraction="):
        nbk.check_fraction("active_fraction", value)


@pytest.mark.parametrize("value,want", [(0, 0.0), (1, 1.0), (0.25, 0.25)])
def test_fraction_takes_numbers(value, want):
    assert nbk.check_fraction("active_fraction", value) == want


@pytest.mark.parametrize("value", [True, False, 0, -3, 2.0, "4", None])
def test_positive_int_refuses(value):
    with pytest.raises(nbk.NotebookParameterError, match="bad notebook parameter num_layers="):
        nbk.check_positive_int("num_layers", value)


@pytest.mark.parametrize("value", [True, math.nan, "1", -1.0])
def test_number_refuses(value):
    with pytest.raises(nbk.NotebookParameterError, match="bad notebook parameter host_us="):
        nbk.check_number("host_us", value, lo=0)


@pytest.mark.parametrize("value", [1, 0, "yes", None])
def test_bool_refuses_non_bools(value):
    with pytest.raises(nbk.NotebookParameterError, match="bad notebook parameter graph="):
        nbk.check_bool("graph", value)


@pytest.mark.parametrize("device", ["foo", "gpu", "cuda:0x", 0, True, ["cpu"], None])
def test_device_refuses(device):
    with pytest.raises(nbk.NotebookParameterError, match="bad notebook parameter device="):
        nbk.check_device(device)


@pytest.mark.parametrize("preset", ["qwen9", ["tiny"], None, 3])
def test_preset_refuses(preset):
    with pytest.raises(nbk.NotebookParameterError, match="bad notebook parameter preset="):
        nbk.check_preset(preset)


@pytest.mark.parametrize("guards", [[], ["sync", "sometimes"], 3, [True], None])
def test_guards_refuse(guards):
    with pytest.raises(nbk.NotebookParameterError, match="bad notebook parameter guards="):
        nbk.check_guards(guards)


@pytest.mark.parametrize("dtype", ["int8", "float64x", None, True, ["float32"]])
def test_dtype_refuses(dtype):
    with pytest.raises(nbk.NotebookParameterError, match="bad notebook parameter dtype="):
        nbk.pick_dtype(dtype, "cpu")


@pytest.mark.parametrize("active", [True, math.nan, 2.0, "0.5"])
def test_live_batch_refuses_bad_active(active):
    with pytest.raises(ValueError, match="active"):
        live.batch_adapters(4, active, "a")


@pytest.mark.notebook
def test_papermill_bool_fraction_fails_naming_the_parameter(tmp_path):
    """`-p active_fraction True` on notebook 01: papermill fails at the parameter checks, naming the parameter
    (the run stops in the first code cell, so only the kernel start and the imports are paid)."""
    import papermill as pm

    from lora_moe_lab.nb.runner import kernel_config

    nb = ROOT / "notebooks" / "01_sync_bubble.ipynb"
    params = {**yaml.safe_load((ROOT / "notebooks" / "params" / "ci.yaml").read_text())[nb.stem],
              "active_fraction": True}
    with pytest.raises(pm.PapermillExecutionError, match=r"bad notebook parameter active_fraction=True"):
        pm.execute_notebook(str(nb), str(tmp_path / nb.name), parameters=params, cwd=str(nb.parent),
                            kernel_name="python3", progress_bar=False, execution_timeout=300, config=kernel_config())
