"""The early-exit helpers of notebook 02: host exit codes (the kernel's rule), summary, map figure,
recorded all-disabled launches, the case / launch plan / work items of a real layer."""
import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch

from lora_moe_lab.ops.reference import tolerance
from lora_moe_lab.ui.kernel_plots import exit_map_figure


def test_early_exit_helpers():
    from lora_moe_lab.instruments.recorders import early_exit as ee
    from lora_moe_lab.kernels.align import Alignment

    ei = torch.tensor([[0, 2, -1, -1], [1, -1, -1, -1], [3, 4, 5, -1]], dtype=torch.int32)
    al = Alignment(torch.zeros(3, 64, dtype=torch.int32), ei, torch.tensor([32, 16, 48], dtype=torch.int32), 16)
    ei2 = ei.clone()
    ei2[2, 1] = -1  # a busy block without expert
    al2 = al._replace(expert_ids=ei2)
    codes = ee.host_exit_codes(al2, torch.tensor([0, -1, 2], dtype=torch.int32), [1, 1, 1])
    assert codes.tolist() == [[0, 0, 3, 3], [1, 1, 1, 1], [0, 4, 0, 3]]
    codes = ee.host_exit_codes(al, [0, 1, 2], [1, 0, 1])
    assert codes.tolist() == [[0, 0, 3, 3], [2, 2, 2, 2], [0, 0, 0, 3]]
    s = ee.exit_summary(codes)
    assert list(s.columns) == ["slot", "0 ran", "1 empty slot", "2 disabled", "3 past the end", "4 expert -1"]
    assert s["2 disabled"].tolist() == [0, 4, 0] and s["0 ran"].tolist() == [2, 0, 3]
    fig = exit_map_figure(codes, title="t")
    assert isinstance(fig, go.Figure) and fig.data[0].z.shape == (3, 4)
    assert fig.data[0].z.tolist() == [[1, 1, 4, 4], [3, 3, 3, 3], [1, 1, 1, 4]]  # codes -> colour bands
    assert tolerance(torch.float32, torch.device("cpu")) == 1e-5
    assert tolerance(torch.bfloat16, torch.device("cpu")) == 2e-2


def test_recorded_disabled_launches(tmp_path):
    from lora_moe_lab.instruments.recorders import early_exit as ee

    assert ee.recorded_disabled_launches(tmp_path) == (None, {})
    pd.DataFrame([dict(section="lora_gate_up", preset="p", M=16, time_us=50.0),
                  dict(section="disabled", preset="p", M=16, time_us=3.0, empty_kernel_us=2.5, ratio=1.2,
                       programs=100, config="bm16")]).to_csv(tmp_path / "kernels.csv", index=False)
    (tmp_path / "kernels.meta.json").write_text('{"gpu": "NVIDIA H200"}')
    pd.DataFrame([dict(section="disabled", preset="p", M=16, time_us=9.0, empty_kernel_us=2.5, ratio=3.6)]).to_csv(
        tmp_path / "earlier_abc1234_kernels.csv", index=False)
    rec, meta = ee.recorded_disabled_launches(tmp_path)
    assert meta["gpu"] == "NVIDIA H200"
    cur = rec[rec.kernel == "current"].iloc[0]
    assert cur[["all_disabled_us", "empty_kernel_us", "enabled_us"]].tolist() == [3.0, 2.5, 50.0]
    assert rec[rec.kernel == "earlier abc1234"].all_disabled_us.tolist() == [9.0]


def test_early_exit_case_plan_and_items():
    """One real launch under the interpreter (or on the GPU): codes, items and programs agree."""
    from lora_moe_lab.instruments.recorders import early_exit as ee
    from lora_moe_lab.model.lab import build_lab

    lab = build_lab("tiny", num_layers=1, backend="triton")
    lab.pool.load("a", rank=8)
    lab.pool.load("b", rank=4)
    case = ee.make_case(lab, ["a", None, "b"], [3, 2, 3], seed=2)
    plan = ee.launch_plan(case)
    items = ee.work_items(case)
    assert items["items"].tolist()[2:] == [0, 0] and items["items"].sum() <= plan["work_items_max"]
    codes, out = ee.run_exit_map(case)
    want = ee.host_exit_codes(case.align, case.lora_ids, case.adapter_enabled)
    assert np.array_equal(codes.cpu().numpy(), want)
    assert int((want == 0).sum()) * plan["split_n"] == items["items"].sum()
    progs = ee.item_programs(case)
    assert ((progs >= 0) == (want == 0)).all() and progs.max() < plan["programs"]
    tol = tolerance(lab.dtype, lab.device)
    assert ee.check_against_reference(case, out, tol)["ok"]
    assert ee.check_against_reference(case, ee.run_delta(case), tol)["ok"]
