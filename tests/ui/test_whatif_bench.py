"""ui/whatif_bench.py: the bench panel and notebook 04's replay panel, offline (no GPU)."""
from lora_moe_lab.instruments.analysers.recordings import load_guards
from lora_moe_lab.sim import whatif as W
from lora_moe_lab.ui import whatif_bench as B


def test_whatif_figure_with_and_without_a_measurement():
    f = B.whatif_figure(W.run("moe M=16 sync eager", "remove_syncs"))
    assert len(f.data[0].x) == 3 and "passes" in f.layout.title.text
    f = B.whatif_figure(W.run("moe M=16 sync eager", "scale_host", factor=2.0))
    assert len(f.data[0].x) == 2 and "no measurement" in f.layout.title.text


def test_bench_updates_and_shows_named_errors():
    b = B.WhatIfBench("moe M=16 sync eager", "remove_syncs")
    w = b.update()
    assert w is not None and len(b.last_figures) == 2 and b.last_figures[1].layout.xaxis.title.text
    assert b.update(transform="scale_host", factor=2.0).predicted_ms > w.source_ms
    assert b.update(source="moe M=16 cpu_flag eager", transform="remove_syncs") is None
    assert "GraphError" in b.status.value and b.last_figures == ()


def test_replay_panel_offline():
    rec = load_guards()
    d = dict(preset="qwen3-30b-a3b", layers=48, tokens=4096, guard="sync", active=0.5)
    p = B.ReplayBenchPanel(live=False, sweep=rec.as_sweep(), label=rec.label, defaults=d)
    assert "replay" in p.update().layout.title.text
    rows = p.run(blocking=True)
    rep = rows[rows["source"] == "replay"].set_index("guard")
    assert rep.loc["sync", "syncs_per_forward"] == 48 and rep.loc["cpu_flag", "syncs_per_forward"] == 0
    assert rep["vs_recorded"].str.startswith("recorded").all()
    assert "no profiled forward at M=128" in p.update(tokens=128).layout.title.text
    assert "preset=tiny" in p.update(preset="tiny").layout.title.text
    new = p.run(blocking=True)  # no trace of this preset: a "none" row per guard says why
    assert (new["source"] == "replay: none").all() and new["vs_recorded"].str.contains("preset=tiny").all()
    assert "no replay prediction" in p.status.value
