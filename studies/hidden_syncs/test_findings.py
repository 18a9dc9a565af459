"""The hidden-sync patterns as recorded: thirteen, each timed in both device sessions."""
from lora_moe_lab.instruments.analysers import hidden_sync_runs
from lora_moe_lab.instruments.recorders import hidden_syncs as HS
from studies.hidden_syncs import read
from helpers import catalog_naming


def test_every_pattern_in_both_sessions():
    r = read.recorded()
    assert len(r) == 13 and r["pattern"].is_unique and (r["sessions"] == "s1, s2").all()
    assert set(r["pattern"]) == {p.name for p in HS.PATTERNS}
    assert (r["per_occ_lo_us"] <= r["per_occ_hi_us"]).all()


def test_the_default_read_is_the_catalogued_sessions(monkeypatch, tmp_path):
    files = hidden_sync_runs.session_files()
    assert [f.name for f in files] == ["hidden_syncs_s1.csv", "hidden_syncs_s2.csv"]
    catalog_naming(monkeypatch, tmp_path, hidden_syncs=files[:1])  # the default follows the catalog
    one = hidden_sync_runs.recorded()
    assert len(one) == 13 and (one["sessions"] == "s1").all()
