"""The production study's recordings as recorded: two sessions of the three tasks, the fix's gain pooled."""
import numpy as np

from lora_moe_lab.instruments.analysers import production_runs as PR
from studies.production import read
from helpers import catalog_naming


def test_two_sessions_of_every_task():
    s = read.sessions()
    assert list(s) == ["s1", "s2"]
    for name, x in s.items():
        assert set(x.summary["task"]) == set(PR.TASK_TITLES) and x.meta["params"]["session"] == name


def test_the_default_load_is_the_catalogued_sessions(monkeypatch, tmp_path):
    a = PR.load_sessions()
    assert list(a) == ["s1", "s2"] and [d.name for d in PR.session_folders()] == ["signature_s1", "signature_s2"]
    catalog_naming(monkeypatch, tmp_path, production__sessions=PR.session_folders()[1:])  # the default follows it
    b = PR.load_sessions()
    assert list(b) == ["s2"] and b["s2"].summary.equals(a["s2"].summary)


def test_the_fix_gains_in_every_task_over_both_sessions():
    h = PR.headline(read.sessions())
    gain = h[h["metric"] == "fix_throughput_gain_pct"]
    assert set(gain["task"]) == set(PR.TASK_TITLES) and (gain["sessions"] == 2).all()
    assert (gain["lo"] > 0).all()  # every task's pooled interval lies above zero
    sig = PR.signature_table(read.sessions())
    assert len(sig) == 6 and np.isfinite(sig["host_blocked_ms"]).all()


def test_tp2_summaries_per_guard_sites():
    t = read.tp2_summaries()
    assert list(t) == ["gs5.42", "gs1"]
    for d in t.values():
        assert {"sync", "cpu_flag"} <= set(d["guard"])
