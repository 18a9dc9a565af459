"""The guards recording as recorded: its sessions, the archived file beside them, the catalog's default."""
from lora_moe_lab.instruments.analysers.recordings import load_guards
from studies.guards import read


def test_the_canonical_recording_is_two_checked_sessions():
    rec = read.sessions()
    assert rec.sessions == ["s1", "s2"] and rec.checked and len(rec.paths) == 2
    assert rec.label.startswith("s1: H200") and "; s2: H200" in rec.label
    p = rec.paired("sync", "cpu_flag")
    ok = p[p["stable"]]
    assert len(ok) and (ok["sessions"] == 2).all() and (ok["lost_lo95_us"] <= ok["lost_us"]).all()


def test_load_guards_reads_the_catalogued_sessions_by_default():
    rec, canon = load_guards(), read.sessions()
    assert rec.paths == canon.paths and rec.paired().equals(canon.paired())


def test_the_archived_recording_reads_unchecked_until_asked():
    a = read.archived()
    assert not a.checked and a.meta["commit"].startswith("b5af87d")
    assert set(a.warmup()["status"]) == {"unchecked"}
    assert read.archived(check_warmup=True).checked
