"""The launch-cost recorder's rows (studies/launch_cost/record.py), run on the tiny preset on any machine: every path
the plan can return has its steps, each timed with the kernels and then the checks taken out (put back afterwards),
and Triton's binder is timed with the arguments each step launched. No figure is asserted: the figures are a GPU's,
in data/launch_cost/."""
import torch

from lora_moe_lab.kernels import common, fused_moe_lora
from studies.launch_cost import record as R


def test_every_path_has_its_steps_and_parts():
    kernel, check = fused_moe_lora.fused_moe_lora_kernel, common.check_tensor
    df = R.record("tiny", [4], inner=1, reps=10)
    steps = set(zip(df.path, df.step))
    for p in ("separate", "decode"):
        assert {(p, "prepare"), (p, "gate_up delta"), (p, "down delta")} <= steps
    for p in ("packed", "wide"):
        assert {(p, "gate_up gemm"), (p, "down gemm")} <= steps
    timed = df[df["error"].isna()] if "error" in df else df  # a direct launcher call that failed says why
    assert {"no_triton", "no_checks", "binder"} <= set(df.part) and (timed.host_us > 0).all()
    assert ("launcher" in set(df.part)) == torch.cuda.is_available()
    binder = df[df.part == "binder"]
    # Triton's binder is timed for every step that launches a kernel, with the launches the step made
    for p, st in [(p, st) for p, st in steps if p != "empty" and st != "prepare"]:
        assert len(binder[(binder.path == p) & (binder.step == st)]) == 1, (p, st)
    assert set(binder[binder.path == "empty"].step) == {"1 pointer", "12 pointers, 23 ints"}
    assert fused_moe_lora.fused_moe_lora_kernel is kernel and common.check_tensor is check  # put back
