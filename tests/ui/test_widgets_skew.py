"""The bench panel's router-skew control: recorded rows match on skew (no column: skew 0), and
the panel says that the simulator ignores skew."""
import pandas as pd

from lora_moe_lab.instruments.recorders.bench import COLUMNS
from lora_moe_lab.ui import widgets


def _sweep(with_skew: bool):
    rows = [dict(gpu="NVIDIA H200", preset="tiny", layers=2, tokens=16, guard=g, active=0.5, rank=16, mode="eager",
                 median_us=1000.0 + 100 * s, p10_us=990.0, p90_us=1010.0 + 100 * s, skew=s, error="")
            for g in widgets.guard_names() for s in ((0.0, 1.0) if with_skew else (0.0,))]
    cols = COLUMNS if with_skew else [c for c in COLUMNS if c != "skew"]
    return pd.DataFrame([{c: r.get(c, "") for c in cols} for r in rows])


def test_recorded_rows_match_skew():
    new, old = _sweep(True), _sweep(False)
    assert len(widgets.recorded_rows(new, "tiny", 2, 0.5, 16, "eager", skew=1.0)) == 3
    assert (widgets.recorded_rows(new, "tiny", 2, 0.5, 16, "eager", skew=1.0).forward_ms == 1.1).all()
    assert len(widgets.recorded_rows(old, "tiny", 2, 0.5, 16, "eager")) == 3  # no column: uniform
    assert len(widgets.recorded_rows(old, "tiny", 2, 0.5, 16, "eager", skew=1.0)) == 0


def test_bench_panel_skew_control_and_note():
    p = widgets.BenchPanel(live=False, sweep=_sweep(True), defaults=dict(preset="tiny", layers=2, tokens=16))
    assert p.params()["skew"] == 0.0
    notes = [a.text for a in p.update().layout.annotations]
    assert not any("skew" in n for n in notes)
    p.controls["skew"].value = 1.0  # the observer redraws
    assert any("simulator ignores it" in a.text for a in p.last_figure.layout.annotations)
    rows = p.run(blocking=True)
    assert (rows["skew"] == 1.0).all() and "simulator ignores it" in p.status.value
    assert (rows[rows.source.str.startswith("recorded")].median_ms == 1.1).all()
