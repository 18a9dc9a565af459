"""The notebook panels without a browser: pure builders, control changes redraw, Run/Stop, what-if,
and the early-exit helpers of notebook 02 (host codes, summary, map figure)."""
import threading

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
import torch

from lora_moe_lab import simulate as sim, widgets

ipywidgets = pytest.importorskip("ipywidgets")


def _sweep_rows():
    from lora_moe_lab.bench import COLUMNS

    rows = []
    for g in widgets.GUARDS:
        for m in (16, 128):
            t = sim.forward_us("qwen3-30b-a3b", m, g, layers=8, active=0.5, rank=16)
            rows.append(dict(gpu="NVIDIA H200", preset="qwen3-30b-a3b", layers=8, tokens=m, guard=g, active=0.5,
                             rank=16, mode="eager", dtype="bfloat16", backend="triton", requests=8, warmup=3,
                             reps=10, median_us=t * 1.1, p10_us=t, p90_us=t * 1.2, mean_us=t, wall_median_us=t,
                             timer="cuda_events", syncs_per_forward=8 if g == "sync" else 0, error=""))
    return pd.DataFrame([{c: r.get(c, "") for c in COLUMNS} for r in rows])


def test_pure_builders():
    curve = widgets.simulated_curve(sim.CostModel(), "qwen3-30b-a3b", 8, 0.5, 16, "eager", tokens=(16, 128))
    assert set(curve.guard) == set(widgets.GUARDS) and len(curve) == 6
    rec = widgets.recorded_rows(_sweep_rows(), "qwen3-30b-a3b", 8, 0.5, 16, "eager")
    assert len(rec) == 6 and rec.source.iloc[0] == "recorded (NVIDIA H200)"
    assert len(widgets.recorded_rows(_sweep_rows(), "qwen3-30b-a3b", 4, 0.5, 16, "eager")) == 0
    assert len(widgets.recorded_rows(None, "tiny", 4, 0.5, 16, "eager")) == 0
    sel = dict(preset="qwen3-30b-a3b", layers=8, tokens=128, guard="sync", active=0.5, rank=16, mode="eager")
    fig = widgets.bench_view_figure(curve, rec, None, sel)
    assert isinstance(fig, go.Figure) and "sync at M=128" in fig.layout.title.text
    assert fig.data[-1].name == "selected" and fig.data[-1].x == (128,)
    assert isinstance(widgets.results_figure(pd.DataFrame()), go.Figure)


def test_bench_panel_redraws_on_control_change_and_runs():
    p = widgets.BenchPanel(live=False, sweep=_sweep_rows(), defaults=dict(preset="qwen3-30b-a3b", layers=8, tokens=16))
    f1 = p.update(guard="sync")
    assert "sync at M=16" in f1.layout.title.text and len(p.view_out.outputs) == 1
    out = p.view_out.outputs[0]
    assert out["output_type"] == "display_data" and "application/vnd.plotly.v1+json" in out["data"]
    p.controls["guard"].value = "cpu_flag"  # what a browser does: the observer redraws
    assert "cpu_flag at M=16" in p.last_figure.layout.title.text
    p.controls["tokens"].value = 128
    assert "cpu_flag at M=128" in p.last_figure.layout.title.text
    rows = p.run(blocking=True)
    assert set(rows.source) == {"simulator", "recorded (NVIDIA H200)"}
    sim_rows = rows[rows.source == "simulator"].set_index("guard")
    assert sim_rows.loc["sync", "syncs_per_forward"] == 8 and sim_rows.loc["cpu_flag", "syncs_per_forward"] == 0
    assert "No GPU here" in p.status.value and p.progress.value == p.progress.max == 3
    assert len(p.results_out.outputs) == 2 and len(p.results) == 6
    with pytest.raises(ValueError, match="unknown control"):
        p.set(colour="red")


def test_bench_panel_stop_and_thread():
    p = widgets.BenchPanel(live=False, all_guards=True)
    p.stop()
    p._stop.set()
    rows = p._run(p.params())  # stop flag checked before the first guard
    assert len(rows) == 0
    p.run(blocking=False)  # the Run button's path: a thread
    p._thread.join(timeout=60)
    assert not p._thread.is_alive() and len(p.results) == 3
    assert not p.run_button.disabled and p.stop_button.disabled


def test_what_if_panel():
    fig, table = widgets.what_if_view(sim.CostModel(), launch_us=5.0, tokens=8192, layers=4)
    assert isinstance(fig, go.Figure) and set(table.guard) == set(widgets.GUARDS)
    assert table.set_index("guard").loc["sync", "syncs"] == 4
    w = widgets.WhatIfPanel(sim.CostModel(), tokens=8192, layers=4)
    a = w.update(launch_us=2.0)
    b = w.update(launch_us=20.0)
    assert a.layout.title.text != b.layout.title.text and "launch 20 us" in b.layout.title.text
    w.controls["tokens"].value = 32768  # observer redraws
    assert "M=32768" in w.last_figure.layout.title.text


def test_early_exit_helpers():
    from lora_moe_lab import early_exit as ee
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
    fig = ee.exit_map_figure(codes, title="t")
    assert isinstance(fig, go.Figure) and fig.data[0].z.shape == (3, 4)
    assert fig.data[0].z.tolist() == [[1, 1, 4, 4], [3, 3, 3, 3], [1, 1, 1, 4]]  # codes -> colour bands
    assert ee.tolerance(torch.float32, torch.device("cpu")) == 1e-5
    assert ee.tolerance(torch.bfloat16, torch.device("cpu")) == 2e-2


def test_recorded_disabled_launches(tmp_path):
    from lora_moe_lab import early_exit as ee

    assert ee.recorded_disabled_launches(tmp_path) == (None, {})
    pd.DataFrame([dict(section="lora_gate_up", preset="p", M=16, time_us=50.0),
                  dict(section="disabled", preset="p", M=16, time_us=3.0, empty_kernel_us=2.5, ratio=1.2,
                       programs=100, config="bm16")]).to_csv(tmp_path / "kernels.csv", index=False)
    (tmp_path / "kernels_meta.json").write_text('{"gpu": "NVIDIA H200"}')
    pd.DataFrame([dict(section="disabled", preset="p", M=16, time_us=9.0, empty_kernel_us=2.5, ratio=3.6)]).to_csv(
        tmp_path / "earlier_abc1234_kernels.csv", index=False)
    rec, meta = ee.recorded_disabled_launches(tmp_path)
    assert meta["gpu"] == "NVIDIA H200"
    cur = rec[rec.kernel == "current"].iloc[0]
    assert cur[["all_disabled_us", "empty_kernel_us", "enabled_us"]].tolist() == [3.0, 2.5, 50.0]
    assert rec[rec.kernel == "earlier abc1234"].all_disabled_us.tolist() == [9.0]


def test_early_exit_case_plan_and_items():
    """One real launch under the interpreter (or on the GPU): codes, items and programs agree."""
    from lora_moe_lab import early_exit as ee
    from lora_moe_lab.moe import build_lab

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
    tol = ee.tolerance(lab.dtype, lab.device)
    assert ee.check_against_reference(case, out, tol)["ok"]
    assert ee.check_against_reference(case, ee.run_delta(case), tol)["ok"]


BAD = [("02_kernel_early_exit", {"num_tokens": 0}, "bad notebook parameter num_tokens"),
       ("02_kernel_early_exit", {"max_loras": 2}, "bad notebook parameter max_loras"),
       ("04_live_microbenchmarks", {"tokens": 100}, "bad notebook parameter tokens"),
       ("04_live_microbenchmarks", {"guard": "sometimes"}, "bad notebook parameter guards"),
       ("05_scale_model", {"chunks": []}, "bad notebook parameter chunks")]


@pytest.mark.notebook
@pytest.mark.parametrize("stem,params,msg", BAD, ids=[f"{s[:2]}-{next(iter(p))}" for s, p, _ in BAD])
def test_notebooks_02_04_05_reject_bad_parameters(stem, params, msg, tmp_path):
    from pathlib import Path

    import papermill as pm
    import yaml

    root = Path(__file__).resolve().parents[1]
    ci = yaml.safe_load((root / "notebooks" / "params" / "ci.yaml").read_text())[stem]
    nb = root / "notebooks" / f"{stem}.ipynb"
    with pytest.raises(pm.PapermillExecutionError, match=msg):
        pm.execute_notebook(str(nb), str(tmp_path / nb.name), parameters={**ci, **params}, cwd=str(nb.parent),
                            kernel_name="python3", progress_bar=False, execution_timeout=300)
