"""The probe on the CPU (tiny model: the pipeline, not the figure) and the relation it predicts from.

Expectations are derived by hand, apart from the code: points on an exact line give back that line, and a
session left out of its own fit is predicted from the others only."""
import math

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
    # c is off the line through a and b by +3 pp: its prediction comes from a and b alone
    p = _pts([("a", 0, 1000, 10, 9, 11), ("b", 0, 500, 15, 14, 16), ("c", 0, 700, 16, 15, 17)])
    v = H.validate(p).set_index("session")
    assert v.loc["c", "predicted_gain_pct"] == pytest.approx(13) and v.loc["c", "error_pp"] == pytest.approx(-3)
    assert v.loc["c", "fitted_on"] == "a, b" and bool(v.loc["c", "within_goal"])


def test_too_few_points_and_bad_leads_are_named_errors():
    with pytest.raises(H.RelationError, match="without session 'a'"):
        H.fit(_pts([("a", 0, 1000, 10, 9, 11), ("b", 0, 500, 15, 14, 16)]), exclude="a")
    with pytest.raises(H.RelationError, match="different leads"):
        H.fit(_pts([("a", 0, 800, 10, 9, 11), ("b", 0, 800, 15, 14, 16)]))
    rel = H.fit(_pts([("a", 0, 1000, 10, 9, 11), ("b", 0, 500, 15, 14, 16)]))
    for bad in (math.nan, -1.0, math.inf):
        with pytest.raises(ValueError, match="lead_us"):
            rel.predict(bad)


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
