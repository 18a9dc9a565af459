"""The guards recording as recorded: its sessions, the archived file beside them, the catalog's default."""
import pandas as pd

from lora_moe_lab.instruments.analysers.recordings import load_guards
from studies.guards import read
from helpers import catalog_naming


def test_the_canonical_recording_is_two_checked_sessions():
    rec = read.sessions()
    assert rec.sessions == ["s1", "s2"] and rec.checked and len(rec.paths) == 2
    assert rec.label.startswith("s1: H200") and "; s2: H200" in rec.label
    p = rec.paired("sync", "cpu_flag")
    ok = p[p["stable"]]
    assert len(ok) and (ok["sessions"] == 2).all() and (ok["lost_lo95_us"] <= ok["lost_us"]).all()


def test_load_guards_reads_the_catalogued_sessions_by_default(monkeypatch, tmp_path):
    rec = load_guards()
    assert [p.name for p in rec.paths] == ["h200_guards_s1.csv", "h200_guards_s2.csv"]
    assert len(rec.samples) == sum(len(pd.read_csv(p)) for p in rec.paths)  # every row of both files
    s2 = rec.paths[1]
    catalog_naming(monkeypatch, tmp_path, guards=[s2])  # the default follows the catalog, not a path of its own
    one = load_guards()
    assert one.paths == [s2] and one.sessions == ["s2"] and len(one.samples) == len(pd.read_csv(s2))


def test_the_archived_recording_reads_unchecked_until_asked():
    a = read.archived()
    assert not a.checked and a.meta["commit"].startswith("b5af87d")
    assert set(a.warmup()["status"]) == {"unchecked"}
    assert read.archived(check_warmup=True).checked
