"""BenchPanel's live path on the CPU (a tiny lab built on the CPU stands in for the GPU one): the
guards are interleaved, Stop keeps whole repetitions only, the samples carry the recording schema."""
import pytest

from lora_moe_lab.instruments.analysers.recordings import SAMPLE_COLUMNS
from lora_moe_lab.model.lab import build_lab
from lora_moe_lab.ui import widgets

pytest.importorskip("ipywidgets")


def _cpu_build(**kw):
    return build_lab("tiny", num_layers=kw["num_layers"], max_loras=kw["max_loras"], max_rank=kw["max_rank"],
                     device="cpu")  # a CPU lab on any machine: the wall clock


def _panel(reps):
    return widgets.BenchPanel(live=True, build=_cpu_build, reps=reps, warmup=1,
                              defaults=dict(preset="tiny", layers=2, tokens=8, active=0.5, rank=8))


def test_live_run_interleaves_the_guards_and_keeps_pairs():
    p = _panel(reps=6)
    rows = p.run(blocking=True)
    guards = list(widgets.guard_names())
    assert list(rows.guard) == guards and (rows.reps == 6).all() and rows.source.str.startswith("live (cpu)").all()
    assert (rows.interval == "95 % CI of the median").all() and (rows.lo_ms <= rows.median_ms).all()
    s = p.last_samples
    assert set(SAMPLE_COLUMNS) <= set(s.columns) and (s.timer == "wall").all()
    assert s.groupby("rep").variant.nunique().eq(len(guards)).all()  # every repetition ran every guard
    assert s[s.variant == "sync"].syncs_per_forward.eq(2).all() and "interleaved" in p.status.value


def test_stop_keeps_whole_repetitions_only():
    p = _panel(reps=4)
    calls = {"n": 0}
    orig = widgets.BenchPanel._measure

    def stop_midway(self, params, guards):  # Stop pressed while the second repetition runs
        from lora_moe_lab.instruments.recorders import timing

        real = timing.time_once

        def once(fn, cuda=None):
            calls["n"] += 1
            if calls["n"] == len(guards) + 2:
                self._stop.set()
            return real(fn, cuda)

        timing.time_once = once
        try:
            return orig(self, params, guards)
        finally:
            timing.time_once = real

    widgets.BenchPanel._measure = stop_midway
    try:
        rows = p.run(blocking=True)
    finally:
        widgets.BenchPanel._measure = orig
    assert (rows.reps == 1).all() and p.last_samples.rep.max() == 0 and "stopped early" in p.status.value
    assert (rows.interval == "p10-p90").all()  # one repetition: no 95 % interval of a median
