"""The fit on the canonical recording: deterministic, bounded, recovers the parameters that made a
synthetic recording, and the held-out validation flags a point the model cannot explain."""
import numpy as np
import pandas as pd
import pytest

from lora_moe_lab import sim

TRUTH = sim.CostModel(launch_us=9.0, sync_us=40.0, graph_launch_us=30.0, kernel_us=3.0, tflops=400.0, tbps=3.5,
                      triton_extra_us=60.0)
SMALL = dict(tokens=(16, 1024, 16384), reps=7)  # 48 points: 3 folds, a few seconds


def test_fit_recovers_known_parameters_and_is_deterministic(make_recording):
    sweep = make_recording(TRUTH, **SMALL).as_sweep()
    a = sim.fit(sweep, params=sim.FIT_PARAMS_RECORDED)
    b = sim.fit(sweep.sample(frac=1.0, random_state=3), params=sim.FIT_PARAMS_RECORDED)  # row order too
    assert a.params == sim.fit(sweep, params=sim.FIT_PARAMS_RECORDED).params  # bit for bit, twice
    for p in a.fitted:
        assert getattr(a.params, p) == pytest.approx(getattr(TRUTH, p), rel=1e-3), p
        assert getattr(b.params, p) == pytest.approx(getattr(a.params, p), rel=1e-6), p
    assert a.rows == 48 and a.rms_log_error < 1e-6 and a.at_bound == ()
    assert set(a.fitted) == set(sim.FIT_PARAMS_RECORDED)


def test_fit_stays_inside_its_bounds(make_recording):
    # a memory rate above any H200's (8 TB/s > the 6 TB/s bound): the fit stops at the bound and says so
    sweep = make_recording(TRUTH.with_(tbps=8.0), **SMALL).as_sweep()
    f = sim.fit(sweep, params=sim.FIT_PARAMS_RECORDED)
    for p in f.fitted:
        lo, hi = sim.FIT_BOUNDS[p]
        assert lo * (1 - 1e-9) <= getattr(f.params, p) <= hi * (1 + 1e-9), p
    assert "tbps" in f.at_bound and f.params.tbps == pytest.approx(6.0, rel=1e-3)


def test_judge_passes_inside_target_or_a_wider_interval():
    pred = pd.DataFrame(dict(median_us=[100.0] * 4, predicted_us=[110.0, 130.0, 130.0, 80.0],
                             lo95_us=[95.0, 95.0, 70.0, 90.0], hi95_us=[105.0, 105.0, 140.0, 110.0]))
    pred["error_pct"] = 100 * (pred.predicted_us / pred.median_us - 1)
    j = sim.judge(pred, target_pct=15.0)
    assert j["passes"].tolist() == [True, False, True, False]
    assert j["in_interval"].tolist() == [False, False, True, False]
    assert "+30.0 %" in j["why"][1] and "+-5 %" in j["why"][1] and j["why"][0] == ""


def test_holdout_flags_the_point_the_model_cannot_explain(make_recording):
    bent = dict(preset="qwen3-30b-a3b", tokens=1024, active=0.5, variant="sync")

    def distort(row):  # this one point measured 40 % slower than the model can be
        return 1.4 if all(row[k] == v for k, v in bent.items()) else 1.0

    rec = make_recording(TRUTH, noise=0.01, distort=distort, **SMALL)
    v = sim.holdout(rec.as_sweep(), params=sim.FIT_PARAMS_RECORDED)
    assert len(v.points) == 48 and set(v.points["fold"]) == {"tokens=16", "tokens=1024", "tokens=16384"}
    m = v.misses
    assert len(m) == 1 and m.iloc[0][["preset", "tokens", "active", "guard"]].tolist() == \
        ["qwen3-30b-a3b", 1024, 0.5, "sync"]
    assert m.iloc[0]["error_pct"] < -15 and "below" in m.iloc[0]["why"]
    s = v.summary.set_index(["guard", "mode"])
    assert s.loc[("sync", "eager"), "passed"] == 11 and not s.loc[("sync", "eager"), "ok"]
    assert s.drop(("sync", "eager"))["ok"].all()
    rep = v.report()
    assert "47 of 48 points pass" in rep and "M=1024" in rep and len(rep.splitlines()) == 1 + 5 + 2


def test_calibrate_save_load_round_trip(make_recording, tmp_path):
    rec = make_recording(TRUTH, noise=0.01, **SMALL)
    cal = sim.calibrate(rec)
    cal.save(tmp_path / "sim")
    back = sim.load_calibration(tmp_path / "sim")
    assert back.label == cal.label == "synthetic · commit 5e7e7e7 · 2026-11-30"
    assert back.params == cal.params and back.headline() == pytest.approx(cal.headline())
    assert back.validation.points["passes"].tolist() == cal.validation.points["passes"].tolist()
    # the same table (dtypes may differ after a CSV round trip: pandas versions read them differently)
    pd.testing.assert_frame_equal(back.validation.summary.reset_index(drop=True),
                                  cal.validation.summary.reset_index(drop=True), check_dtype=False)
    # the production figures are one extrapolation of the saved parameters
    again = sim.production_figures(back.params)
    assert np.allclose(again["predicted"], back.production["predicted"])
    assert back.headline()["syncs_per_forward"] == 48
    assert set(back.production["tokens"]) == set(sim.PRODUCTION_SETTINGS["chunks"])
    # the README paragraph is written from the saved files only
    block = sim.readme_block(tmp_path / "sim")
    assert cal.label in block and f"{int(cal.validation.points['passes'].sum())} of 48 pass" in block
    assert f"{cal.headline()['input_throughput_gain_pct']:+.1f} % input throughput" in block
