"""scripts/record.py lists every recording script of the naming rule studies/<folder>/record[_<part>].py, and
each names a data folder; the harness writes a CSV beside its .meta.json."""
import json

from pathlib import Path

from helpers import ROOT, load_script

ROOT_P = Path(ROOT)


def test_every_recording_script_is_listed():
    rec = load_script("record")
    scripts = {p.relative_to(ROOT_P).as_posix() for p in (ROOT_P / "studies").glob("*/record*.py")}
    listed = {rec.script(sec) for sec in rec.RECORDINGS}
    assert scripts == listed, (scripts - listed, listed - scripts)
    out = rec.table()
    assert "scripts/gpu_check.py" in out and "data/gpu_tests/" in out
    for sec, (folder, *_rest) in rec.RECORDINGS.items():
        assert sec == folder or sec.startswith(folder + "_"), sec


def test_harness_writes_csv_and_meta(tmp_path):
    from lora_moe_lab.instruments.recorders.harness import Recorder

    r = Recorder("x", tmp_path, params=dict(out=str(tmp_path)), rows=[])
    r.row(section="a", M=1, us=2.5)
    r.section("boom", lambda: 1 / 0)
    f = r.write()
    meta = json.loads((tmp_path / "x.meta.json").read_text())
    assert open(f).read().splitlines() == ["section,M,us", "a,1,2.5"]
    assert meta["errors"] and "ZeroDivisionError" in meta["errors"][0] and "commit" in meta




