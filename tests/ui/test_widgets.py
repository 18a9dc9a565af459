"""The notebook panels without a browser: pure builders, control changes redraw, Run/Stop, what-if."""

import pandas as pd
import plotly.graph_objects as go
import pytest

from lora_moe_lab import sim
from lora_moe_lab.ui import widgets

ipywidgets = pytest.importorskip("ipywidgets")


def assert_axis_titles(fig: go.Figure) -> None:
    """Every axis that carries a trace has a title."""
    for t in fig.data:
        for ref, key in ((getattr(t, "xaxis", None) or "x", "xaxis"), (getattr(t, "yaxis", None) or "y", "yaxis")):
            ax = fig.layout[key + ref[1:]]
            assert ax.title.text, f"{fig.layout.title.text!r}: {key + ref[1:]} has no title"


def _sweep_rows():
    from lora_moe_lab.instruments.recorders.bench import COLUMNS

    rows = []
    for g in widgets.guard_names():
        for m in (16, 128):
            t = sim.forward_us("qwen3-30b-a3b", m, g, layers=8, active=0.5, rank=16)
            rows.append(dict(gpu="NVIDIA H200", preset="qwen3-30b-a3b", layers=8, tokens=m, guard=g, active=0.5,
                             rank=16, mode="eager", dtype="bfloat16", backend="triton", requests=8, warmup=3,
                             reps=10, median_us=t * 1.1, p10_us=t, p90_us=t * 1.2, mean_us=t, wall_median_us=t,
                             timer="cuda_events", syncs_per_forward=8 if g == "sync" else 0, error=""))
    return pd.DataFrame([{c: r.get(c, "") for c in COLUMNS} for r in rows])


def test_pure_builders():
    curve = widgets.simulated_curve(sim.CostModel(), "qwen3-30b-a3b", 8, 0.5, 16, "eager", tokens=(16, 128))
    assert set(curve.guard) == set(widgets.guard_names()) and len(curve) == 6
    rec = widgets.recorded_rows(_sweep_rows(), "qwen3-30b-a3b", 8, 0.5, 16, "eager")
    assert len(rec) == 6 and rec.source.iloc[0] == "recorded (NVIDIA H200)" and (rec.interval == "p10-p90").all()
    assert len(widgets.recorded_rows(_sweep_rows(), "qwen3-30b-a3b", 4, 0.5, 16, "eager")) == 0
    assert len(widgets.recorded_rows(None, "tiny", 4, 0.5, 16, "eager")) == 0
    sel = dict(preset="qwen3-30b-a3b", layers=8, tokens=128, guard="sync", active=0.5, rank=16, mode="eager")
    fig = widgets.bench_view_figure(curve, rec, None, sel)
    assert isinstance(fig, go.Figure) and "sync at M=128" in fig.layout.title.text
    assert fig.data[-1].name == "selected" and fig.data[-1].x == (128,)
    # the simulator (x1) vs the recorded median (x1.1): agrees; within +-15 % of it or not, says so
    assert "simulator -9.1 %, agrees" in fig.layout.title.text
    assert "MISSES" in widgets.agreement(1.0, rec.assign(forward_ms=2.0), "sync", 128)
    assert widgets.agreement(1.0, rec, "sync", 4096) == ""
    empty = widgets.results_figure(pd.DataFrame())
    assert isinstance(empty, go.Figure) and empty.layout.xaxis.title.text and empty.layout.yaxis.title.text
    assert_axis_titles(fig)


def test_recorded_rows_read_the_canonical_recording(tmp_path):
    from lora_moe_lab.instruments.analysers.recordings import SAMPLE_COLUMNS, load_guards

    rows = [dict(preset="qwen3-30b-a3b", layers=8, tokens=128, active=0.5, variant=g, guard=g, mode="eager", rep=i,
                 us=1000.0 + i, syncs_per_forward=8 if g == "sync" else 0)
            for g in widgets.guard_names() for i in range(9)]
    pd.DataFrame(rows, columns=SAMPLE_COLUMNS).to_csv(tmp_path / "g.csv", index=False)
    (tmp_path / "g.meta.json").write_text('{"gpu": "NVIDIA H200", "git_commit": "abc1234", "date_utc": "2026-11-30"}')
    r = load_guards(tmp_path / "g.csv")
    rec = widgets.recorded_rows(r.as_sweep(), "qwen3-30b-a3b", 8, 0.5, 16, "eager", label=r.label)
    assert len(rec) == 3 and (rec.interval == "95 % CI of the median").all()
    assert rec.source.iloc[0] == "recorded (H200 · commit abc1234 · 2026-11-30)"
    assert (rec.lo_ms < rec.forward_ms).all() and (rec.forward_ms < rec.hi_ms).all()
    # 1.0 ms recorded, interval [1.001, 1.007]: 1.1 ms is within 15 %, 1.2 ms is outside both
    assert "agrees" in widgets.agreement(1.1, rec, "sync", 128)
    assert "MISSES" in widgets.agreement(1.2, rec, "sync", 128)


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
    assert sim_rows["vs_recorded"].str.contains("agrees").all()
    assert_axis_titles(p.last_figure)
    assert_axis_titles(widgets.results_figure(p.results))
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
