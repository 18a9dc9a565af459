"""The production-setting recorder end to end at tiny shapes (two sessions), and the one loader."""
import tarfile
from pathlib import Path

import pytest

from helpers import load_script

from lora_moe_lab.instruments.analysers import production_runs as PR
from lora_moe_lab.provenance import DATA

PR_DATA = DATA / "production"

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def sessions(tmp_path_factory):
    out = tmp_path_factory.mktemp("sig")
    script = load_script("studies.production.record")
    for s in ("s1", "s2"):
        assert script.main(["--smoke", "--session", s, "--out", str(out / "dev"), "--tasks", "prodlike_C16384"]) == 0
        with tarfile.open(out / "dev" / f"signature_{s}.tar.gz") as t:
            t.extractall(out / "data", filter="data")
    return PR.load_sessions(out / "data")


def test_two_sessions_load_with_metadata(sessions):
    assert list(sessions) == ["s1", "s2"]
    for s in sessions.values():
        assert set(s.summary["task"]) == {"prodlike_C16384"}
        assert s.meta["params"]["session"] == s.name and "calibration" in s.meta and "dirty" in s.meta
        assert (s.summary["reps"] >= 10).all() and "bootstrap" in s.summary["ci_method"].iloc[0]


def test_headline_combines_sessions(sessions):
    h = PR.headline(sessions)
    assert set(h["task"]) <= {"prodlike_C16384"}
    for r in h.itertuples():
        if r.sessions < 2:  # a CPU session may be flagged unstable (no figure): the combination needs two
            continue
        assert r.lo == min(r.s1_lo, r.s2_lo) and r.hi == max(r.s1_hi, r.s2_hi)
        assert r.estimate == pytest.approx((r.s1 + r.s2) / 2)


def test_signature_table_host_side(sessions):
    t = PR.signature_table(sessions)
    assert len(t) == 2 and (t["syncs_per_forward"] > 0).all()
    assert (t["host_blocked_ms"] >= 0).all() and t["first_share"].between(0, 1).all()
    from lora_moe_lab import runtime

    if runtime.has_cuda():  # profiled steady forwards: real GPU idle
        assert (t["idle_after_ms"] >= 0).all()
    else:
        assert t["idle_after_ms"].isna().all()  # CPU: no profile, never a made-up GPU figure
    assert PR.headline({}).empty and PR.signature_table({}).empty


def test_headline_takes_the_wider_interval_when_sessions_disagree():
    import pandas as pd

    def sess(name, est, lo, hi):
        row = dict(task="default_C16384", guard="sync")
        for m in ("fix_throughput_gain_pct", "fix_throughput_gain_net_pct", "fix_ttft_change_pct"):
            row.update({m: est, m + "_lo": lo, m + "_hi": hi})
        return PR.Session(name, pd.DataFrame([row]), pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), {})

    h = PR.headline({"s1": sess("s1", 6.6, 6.1, 9.1), "s2": sess("s2", 10.1, 9.5, 14.3)}).iloc[0]
    assert not h.agree and (h.lo, h.hi) == (6.1, 14.3) and h.spread == pytest.approx(3.5)


def test_clocks_by_guard_joins_samples_to_prefills():
    import pandas as pd

    rows = pd.DataFrame(dict(task="t", guard=["sync", "cpu_flag"], t_unix=[100.0, 200.0], prefill_ms=[1000.0, 1000.0]))
    clocks = pd.DataFrame(dict(t_unix=[100.5, 100.9, 150.0, 200.2], sm_mhz=[1980, 1970, 500, 1755],
                               mem_mhz=3201, power_w=[400, 410, 90, 690], temp_c=50,
                               throttle=["0x0", "0x0", "0x0", "0x0000000000000004"]))
    s = PR.Session("s1", pd.DataFrame(), rows, pd.DataFrame(), pd.DataFrame(), {}, clocks)
    c = PR.clocks_by_guard(s).set_index("guard")
    assert c.loc["sync", "samples"] == 2 and c.loc["sync", "sm_mhz"] == 1975 and c.loc["cpu_flag", "sm_mhz"] == 1755
    assert c.loc["sync", "power_capped_share"] == 0 and c.loc["cpu_flag", "power_capped_share"] == 1
    assert PR.clocks_by_guard(PR.Session("s", pd.DataFrame(), rows, pd.DataFrame(), pd.DataFrame(), {})).empty


def test_a_sessions_clock_log_is_not_read_as_rows(tmp_path):
    """clocks.csv (nvidia-smi samples) sits beside the task CSVs: it is the clocks, never rows."""
    d = tmp_path / "signature_s9"
    d.mkdir()
    (d / "meta.json").write_text("{}")
    real = (PR_DATA / "signature_s1" / "default_C8192.csv").read_text().splitlines()
    (d / "task.csv").write_text("\n".join(real[:2]) + "\n")  # a real task's header and first row
    (d / "clocks.csv").write_text("t_unix,sm_mhz,mem_mhz,power_w,temp_c,throttle\n1.0,1980,3201,500,40,0x0\n")
    s = PR.load_sessions(tmp_path)["s9"]
    assert len(s.rows) == 1 and list(s.clocks["sm_mhz"]) == [1980]


def test_smoke_calibration_survives_a_floor_above_the_target(monkeypatch):
    # A GPU shared with other work (the suite under pytest-xdist) can put the back-to-back syncs' round trip above
    # production's later-sync target: --smoke records why and adds no host work; a real run stops with the error.
    script = load_script("studies.production.record")

    def unreachable(*a, **k):
        raise ValueError("a later-sync mean of 115.83 us is below this forward's floor (218 us: round trips)")

    monkeypatch.setattr(script.P, "calibrate_host_work", unreachable)
    cal = script.calibrate(None, None, None, smoke=True)
    assert cal["host_us_per_layer"] == 0.0 and "below this forward's floor" in cal["unreachable"]
    with pytest.raises(ValueError, match="floor"):
        script.calibrate(None, None, None)


def test_session_folders_handed_one_by_one_or_by_their_parent(tmp_path):
    """A folder holding session folders, one session folder, or a list: the same sessions, named by their folder
    (<what>_<session>); a folder without meta.json is no session."""
    for n in ("signature_s1", "signature_s2", "traces"):
        (tmp_path / n).mkdir()
    for n in ("signature_s1", "signature_s2"):
        (tmp_path / n / "meta.json").write_text("{}")
    assert list(PR.load_sessions(tmp_path)) == ["s1", "s2"]
    assert list(PR.load_sessions(tmp_path / "signature_s2")) == ["s2"]
    assert list(PR.load_sessions([tmp_path / "signature_s2", tmp_path / "signature_s1"])) == ["s2", "s1"]
    assert list(PR.load_sessions(tmp_path, prefix="signature_")) == ["s1", "s2"]
    assert PR.session_folders(tmp_path / "traces") == []
