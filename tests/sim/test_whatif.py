"""sim/whatif.py: the what-if bench on the recorded traces (CPU, recorded data only)."""
import numpy as np
import pytest

from lora_moe_lab.sim import replay as R
from lora_moe_lab.sim import whatif as W


def test_sources_cover_both_models():
    s = W.sources()
    assert s.index.is_unique and {"dec", "moe"} <= set(s.model)
    assert (s[s.model == "dec"].steps * s[s.model == "dec"].tokens == 64 * 2048).all()


@pytest.mark.parametrize("m", ["16", "4096"])
def test_held_out_moe_points_match_the_validation(m):
    v = W.validation()
    for src, tr, tgt in (("sync", "remove_syncs", "cpu_flag"), ("cpu_flag", "add_syncs", "sync")):
        w = W.run(f"moe M={m} {src} eager", tr)
        row = v[(v.model == "moe") & (v.config == m) & (v.source == src)].iloc[0]
        assert w.held_out and w.target == f"moe {m} {tgt} eager"
        assert w.predicted_ms == pytest.approx(row.predicted_ms, rel=1e-4)
        assert w.measured["estimate"] == pytest.approx(row.measured_ms, rel=1e-4)
        assert w.passed == bool(row.passed)
        steps = int(W.sources().loc[f"moe M={m} {src} eager"].steps)  # the replay ran: every step, every kernel
        assert len(w.result.step_ns) == steps and len(w.result.k_end) == steps * w.graph.n_kernels > 0


def test_validation_covers_the_first_recordings_points():
    """studies/replay/record.py: the signature sessions' 10 points and the first recording's 8 (adapters mix at
    TP=1; TP=2 at gs 260/48 none and mix, gs 1/48 none), both directions, one session each; every miss has a cause."""
    v = W.validation()
    assert len(v) == 18 and not v.duplicated(["model", "config", "source"]).any()
    first = v[v.config.str.startswith("tp")]
    assert sorted(first.config.unique()) == ["tp1_mix_C16384", "tp2_mix_C16384", "tp2_none_C16384",
                                             "tp2_none_C16384_gs1"]
    assert (first.sessions == 1).all() and (v[~v.index.isin(first.index)].sessions == 2).all()
    assert (first.groupby("config").target.apply(set) == {"sync", "cpu_flag"}).all()
    assert (first.steps == 128 * 2048 // 16384).all()
    assert first.source_trace.str.contains("data/production/traces/").all()
    assert (first.measured_lo <= first.measured_ms).all() and (first.measured_ms <= first.measured_hi).all()
    miss = v[~v.passed.astype(bool)]
    assert miss.cause.notna().all() and (miss.cause.astype(str).str.len() > 0).all()
    # whatif's host factors still resolve the bench's own traces (the new configs do not shadow them)
    assert W.host_factor("dec", "default_C16384", "sync")[0] == pytest.approx(
        float(v[(v.config == "default_C16384") & (v.source == "sync")].alpha.iloc[0]))


def test_no_measurement_and_named_errors():
    w = W.run("moe M=16 cpu_flag eager", "scale_host", factor=0.5)
    assert w.measured is None and w.passed is None and np.isnan(w.err_pct)
    assert w.predicted_ms < w.source_ms  # a faster host: a host-bound forward gets shorter
    with pytest.raises(R.GraphError, match="no syncs"):
        W.run("moe M=16 cpu_flag eager", "remove_syncs")
    with pytest.raises(R.UnknownTransformationError, match="unknown bench transformation"):
        W.run("moe M=16 cpu_flag eager", "fix_everything")
    with pytest.raises(W.UnknownSourceError, match="no recorded trace named"):
        W.run("moe M=17 cpu_flag eager")
    with pytest.raises(W.R.GraphError, match="already syncs at its guard sites"):  # not a silent re-synthesis
        W.run("moe M=4096 sync eager", "add_syncs")


def test_replay_tables_hold_the_replayed_forward():
    from lora_moe_lab.ui import plots

    w = W.run("moe M=4096 cpu_flag eager", "add_syncs")
    t = w.tables()
    assert len(t.kernels) == w.graph.n_kernels and len(t.syncs) == w.graph.n_syncs == 48
    assert int(t.kernels["end_ns"].max()) == int(w.result.k_end.max())
    assert plots.timeline(t, forward=0).data


def test_guard_predictions():
    p = W.guard_predictions(4096).set_index("guard")
    assert p.loc["sync", "syncs_per_forward"] == 48 and p.loc["cpu_flag", "syncs_per_forward"] == 0
    assert p.loc["sync", "held_out"] and p.loc["sync", "forward_ms"] > p.loc["cpu_flag", "forward_ms"]
    assert len(W.guard_predictions(16, layers=16)) == 3
    with pytest.raises(W.TracedPointError, match="no profiled forward at M=128"):
        W.guard_predictions(128)
    with pytest.raises(W.TracedPointError, match="multiples of 8"):
        W.guard_predictions(16, layers=12)


# the recorded simulator-vs-replay table: studies/replay/test_findings.py
