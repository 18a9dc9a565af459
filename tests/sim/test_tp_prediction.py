"""The TP=4 prediction's method: the all-reduce fit, the TP=2 check and the recording's smoke run."""
import numpy as np
import pandas as pd
import pytest

from lora_moe_lab.provenance import DATA
from lora_moe_lab.sim import tp_emulation as E
from helpers import load_script

# the recorded all-reduce fit and summaries, reproduced: studies/tp_emulation/test_findings.py


def test_validation_compares_like_with_like(tmp_path):
    def summary(task, fwd):  # a session with one task: sync and cpu_flag forward medians
        return pd.DataFrame([dict(task=task, guard=g, adapters="none", forward_median_ms=f, forward_median_ms_lo=f - 1,
                                  forward_median_ms_hi=f + 1) for g, f in fwd.items()])

    cols = ["forward_median_ms", "forward_median_ms_lo", "forward_median_ms_hi", "fix_throughput_gain_pct",
            "fix_throughput_gain_pct_lo", "fix_throughput_gain_pct_hi"]
    figs = {"sync": dict(zip(cols, (290.0, 270.0, 297.0, 20.0, 13.0, 25.0))),
            "cpu_flag": dict(zip(cols, (238.0, 237.5, 238.1, 0.0, 0.0, 0.0)))}
    # a whole prefill summary (the reader checks its schema): the committed one's rows with these figures
    real = pd.read_csv(DATA / "production" / "tp2_C16384_gs5.42.summary.csv")
    real = real[(real.adapters == "none") & real.guard.isin(list(figs))].reset_index(drop=True)
    for c in figs["sync"]:
        real[c] = [figs[g][c] for g in real.guard]
    real.to_csv(tmp_path / "real.csv", index=False)

    class S:  # the production_runs.Session fields the check reads
        def __init__(self, s):
            self.summary = s

    sessions = {"s1": S(summary("tp2_gs5.42_C16384", {"sync": 260.0, "cpu_flag": 236.0})),
                "s2": S(summary("tp2_gs5.42_C16384", {"sync": 262.0, "cpu_flag": 235.0}))}
    v = E.tp2_validation(sessions, measured={"gs5.42": tmp_path / "real.csv"}).set_index("guard")
    assert v.loc["cpu_flag", "passed"] and v.loc["cpu_flag", "sessions"] == 2
    assert v.loc["sync", "emulated"] == pytest.approx(261.0)  # the mean of the two sessions
    assert v.loc["sync", "emulated_lo"] == 259.0 and v.loc["sync", "emulated_hi"] == 263.0  # their union
    assert not v.loc["sync", "passed"]  # -10 %, outside the measured interval: a miss, named
    assert not E.passed(v.reset_index())


def test_recording_smoke_writes_a_session_the_readers_take(tmp_path):
    rec = load_script("studies.tp_emulation.record")
    assert rec.parse_task("tp4_prodlike_C8192") == (4, "prodlike", 8192)
    assert rec.main(["--smoke", "--tasks", "tp4_prodlike_C8192", "--out", str(tmp_path), "--session", "t"]) == 0
    s = E.load_sessions(tmp_path)
    assert list(s) == ["t"] and set(s["t"].summary["guard"]) == {"sync", "cpu_flag"}
    assert (s["t"].rows["tp"] == 2).all()  # smoke: the tiny preset splits in two at most
    gain = s["t"].summary.set_index("guard").loc["sync", "fix_throughput_gain_pct"]
    # a TP=4 row exactly when the session has the fix's gain (an unsettled CPU run has none)
    assert ("tp4_prodlike_C8192" in set(E.tp4_prediction(s)["task"])) == bool(np.isfinite(gain))


def test_tp2_measured_reads_guard_sites_from_the_names(tmp_path):
    a, b = tmp_path / "tp2_C16384_gs5.42.summary.csv", tmp_path / "tp2_C16384_gs1.summary.csv"
    assert E.tp2_measured([a, b]) == {"gs5.42": a, "gs1": b}  # in the order handed
    with pytest.raises(ValueError, match="no _gs<sites>.summary.csv"):
        E.tp2_measured([tmp_path / "tp2.csv"])
    assert list(E.tp2_measured()) == ["gs5.42", "gs1"]
