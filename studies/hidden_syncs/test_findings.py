"""The hidden-sync patterns as recorded: thirteen, each timed in both device sessions."""
from lora_moe_lab.instruments.analysers import hidden_sync_runs
from lora_moe_lab.instruments.recorders import hidden_syncs as HS
from studies.hidden_syncs import read


def test_every_pattern_in_both_sessions():
    r = read.recorded()
    assert len(r) == 13 and r["pattern"].is_unique and (r["sessions"] == "s1, s2").all()
    assert set(r["pattern"]) == {p.name for p in HS.PATTERNS}
    assert (r["per_occ_lo_us"] <= r["per_occ_hi_us"]).all()


def test_the_default_read_is_the_catalogued_sessions():
    assert hidden_sync_runs.recorded().equals(read.recorded())
