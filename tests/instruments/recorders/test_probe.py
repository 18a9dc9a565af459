"""The probe on the CPU (tiny model: the pipeline, not the figure) and the relation it predicts from.

Expectations are derived by hand, apart from the code: points on an exact line give back that line, and a
session left out of its own fit is predicted from the others only."""
import math
import re

import pandas as pd
import pytest

from lora_moe_lab.instruments.analysers import host_lead as H
from lora_moe_lab.instruments.recorders import probe as PB


def _pts(rows):
    return pd.DataFrame([dict(zip(H.POINT_COLUMNS, r)) for r in rows])


def test_a_line_is_recovered_exactly():
    # gain = 20 - 0.01 * lead: at 1000 us, 10 %; at 500 us, 15 %
    p = _pts([("a", 0, 1000, 10, 9, 11), ("b", 0, 500, 15, 14, 16), ("c", 0, 700, 13, 12, 14)])
    rel = H.fit(p)
    assert rel.intercept == pytest.approx(20) and rel.slope == pytest.approx(-0.01)
    assert rel.predict(800) == pytest.approx(12)


def test_leave_one_session_out_never_sees_the_session():
    # c is off the line through a and b by +2 pp, then by +4 pp (the goal is 3, away from either: a least-squares
    # fit's last bits differ between CPUs): its prediction comes from a and b alone
    for measured, within in ((15, True), (17, False)):
        p = _pts([("a", 0, 1000, 10, 9, 11), ("b", 0, 500, 15, 14, 16), ("c", 0, 700, measured, 14, 18)])
        v = H.validate(p)
        v = v[v["relation"] == "lead"].set_index("session")
        assert v.loc["c", "predicted_gain_pct"] == pytest.approx(13)
        assert v.loc["c", "error_pp"] == pytest.approx(13 - measured)
        assert v.loc["c", "fitted_on"] == "a, b" and bool(v.loc["c", "within_goal"]) is within


def test_too_few_points_and_bad_leads_are_named_errors():
    with pytest.raises(H.RelationError, match="without session 'a'"):
        H.fit(_pts([("a", 0, 1000, 10, 9, 11), ("b", 0, 500, 15, 14, 16)]), exclude="a")
    with pytest.raises(H.RelationError, match="leads span"):
        H.fit(_pts([("a", 0, 800, 10, 9, 11), ("b", 0, 800, 15, 14, 16)]))
    rel = H.fit(_pts([("a", 0, 1000, 10, 9, 11), ("b", 0, 500, 15, 14, 16)]))
    for bad in (math.nan, -1.0, math.inf):
        with pytest.raises(ValueError, match="lead_us"):
            rel.predict(bad)


def test_the_saving_relation_prices_each_sync_over_the_forward_and_leaves_a_gpu_model_out():
    # by hand: b = T g / (1 + g) / n. A: T = 110 ms, n = 100, g = 10 % -> b = 100 us; B: T = 220, g = 10 % (the same
    # syncs over a forward twice as long, a slower GPU) -> b = 200 us... with n = 200 -> b = 100 us again
    rows = [("a", 0, 900, 10, 9, 11), ("b", 0, 1200, 10, 9, 11), ("c", 0, 1000, 25, 24, 26)]
    p = _pts(rows).assign(sync_forward_ms=[110.0, 220.0, 125.0], syncs_per_forward=[100, 200, 100],
                          gpu=["X", "Y", "Y"])
    assert list(H.saving_us(p).round(6)) == [100.0, 100.0, 250.0]
    sav = H.fit_saving(p, exclude="c")
    assert sav.saving_us == pytest.approx(100.0)
    # 100 syncs of 100 us over a sync forward of 110 ms: the fix's forward is 100 ms, the gain 10 %
    assert sav.predict(110.0, 100) == pytest.approx(10.0) and sav.predict(60.0, 100) == pytest.approx(20.0)
    with pytest.raises(ValueError, match="exceed the whole forward"):
        sav.predict(5.0, 100)
    v = H.validate(p, by="gpu")
    s = v[v["relation"] == "saving"].set_index("session")
    assert s.loc["a", "fitted_on"] == "b, c"  # X is predicted from Y's points only
    assert s.loc["b", "fitted_on"] == "a" and s.loc["b", "predicted_gain_pct"] == pytest.approx(10.0)
    assert s.loc["c", "predicted_gain_pct"] == pytest.approx(100 * 10 / 115)  # from a's b: 10 ms over 115
    lead = v[v["relation"] == "lead"].set_index("session")["predicted_gain_pct"]
    assert lead[["b", "c"]].isna().all() and lead["a"] == pytest.approx(32.5)  # X's one point gives Y no slope
    with pytest.raises(ValueError, match="by must be"):
        H.validate(p, by="host")


def test_an_unstable_point_is_left_out_not_guessed():
    p = H.points([_pts([("a", 0, 1000, math.nan, math.nan, math.nan), ("b", 0, 500, 15, 14, 16)])])
    assert list(p["session"]) == ["b"]


def test_the_smoke_probe_writes_whole_rows(tmp_path, capsys):
    out = tmp_path / "p.csv"
    assert PB.main(["--smoke", "--reps", "10", "--out", str(out)]) == 0
    df = pd.read_csv(out)
    assert len(df) == 1 and df["reps"].iloc[0] == 10 and df["lead_us"].iloc[0] > 0
    assert {"cpu_model", "cores", "python_build", "measured_gain_pct_lo"} <= set(df.columns)
    printed = capsys.readouterr().out
    assert "lead:" in printed and "measured:" in printed
    with pytest.raises(SystemExit):  # never over an existing file
        PB.main(["--smoke", "--out", str(out)])


def test_timings_that_never_settle_are_measured_again_then_named(tmp_path, capsys, monkeypatch):
    """A block of repetitions whose warm-up never settles has no figure (NaN, never an average of drifting data):
    the probe measures another block, and after the last says so and exits 3, never printing a NaN as a gain."""
    real, calls = PB.P.summarize, []

    def unsettled(df):
        calls.append(len(df))
        return real(df).assign(stable=False, warmup_note="drifting (planted)", fix_throughput_gain_pct=math.nan)
    monkeypatch.setattr(PB.P, "summarize", unsettled)
    out = tmp_path / "p.csv"
    assert PB.main(["--smoke", "--reps", "10", "--out", str(out)]) == 3
    printed = capsys.readouterr().out
    assert len(calls) == PB.BLOCKS and printed.count("never settled (drifting (planted))") == PB.BLOCKS
    assert "measured:" not in printed and not re.search(r"[+-]nan|nan %", printed, re.I)  # no NaN as a figure
    df = pd.read_csv(out)
    assert not bool(df["stable"].iloc[0]) and math.isnan(df["measured_gain_pct"].iloc[0])


@pytest.mark.parametrize("args", [["--reps", "5"], ["--host-us-per-layer", "-1"], ["--host-us-per-layer", "inf"],
                                  ["--reps", "True"]])
def test_bad_parameters_stop_before_any_work(args, capsys):
    with pytest.raises(SystemExit) as e:
        PB.main(args)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--reps" in err or "--host-us-per-layer" in err


def test_without_a_gpu_the_full_probe_refuses_before_building(capsys, monkeypatch):
    """`make gpu-probe` on a CPU machine: a named refusal, not a 48-layer model grown to tens of GB."""
    monkeypatch.setattr(PB.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(PB, "build", lambda smoke: pytest.fail("built a model without a GPU"))
    with pytest.raises(SystemExit) as e:
        PB.main([])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "CUDA GPU" in err and "--smoke" in err
