"""The write path of the GPU study recorders, on the CPU with synthetic rows (no model is built): each table is
written whole (temp file + os.replace, or whole fsynced appends for the clock log), its seal (rows + sha256) lands
in its metadata so schemas.read_csv checks it, and a table of another kind, other settings or an earlier run is
refused before any work unless --overwrite. The kill cases kill a writer process by its own pid."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from helpers import ROOT, load_script

from lora_moe_lab.instruments.analysers import schemas as S
from lora_moe_lab.instruments.recorders import tables
from lora_moe_lab.instruments.recorders.clocks import ClockLog
from lora_moe_lab.instruments.recorders.harness import Recorder

META = dict(gpu="NVIDIA H200", torch="2.11.0", triton="3.6.0", cuda="13.0", python="3.12.3", commit="abc1234",
            date="2026-12-01T00:00:00Z", params={})


def _sealed(csv: Path, meta: Path) -> dict:
    m = json.loads(meta.read_text())
    assert m["files"][csv.name] == S.seal(csv), m.get("files")
    return m


def _backend_rows(n=3):
    return [dict(preset="tiny", layers=2, M=m, dtype="float32", rank=32, torch_us=10.0 * m, triton_us=5.0 * m,
                 speedup=2.0, rel_err=1e-3, ok=True, **{k: META[k] for k in ("gpu", "torch", "commit")})
            for m in (1, 16, 128)[:n]]


def test_backends_write_is_whole_sealed_and_read(tmp_path):
    rec = load_script("studies.backends.record")
    f = Path(rec.write(str(tmp_path), _backend_rows(), META))
    _sealed(f, tmp_path / "backends.meta.json")
    assert len(S.read_csv(f, "backends")) == 3
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp file left
    g = Path(rec.write(str(tmp_path), _backend_rows(), META, check_only=True))  # its own metadata file
    _sealed(g, tmp_path / "backends_check.meta.json")
    _sealed(f, tmp_path / "backends.meta.json")


def test_backends_refuses_an_existing_or_foreign_table_before_any_work(tmp_path, capsys):
    rec = load_script("studies.backends.record")
    (tmp_path / "backends.csv").write_text("a,b\n1,2\n")
    with pytest.raises(tables.HeaderMismatchError, match="backends.csv: header differs"):
        rec.write(str(tmp_path), _backend_rows(), META)
    with pytest.raises(SystemExit) as e:
        rec.main(["--out", str(tmp_path)])  # refused before a model is built
    assert e.value.code == 2 and "backends.csv: a recording is already here (1 rows)" in capsys.readouterr().err
    rec.write(str(tmp_path), _backend_rows(), META, overwrite=True)
    with pytest.raises(SystemExit):
        rec.main(["--out", str(tmp_path)])
    assert "already here (3 rows)" in capsys.readouterr().err


def test_graphs_tables_and_checks_are_sealed_in_their_metadata(tmp_path):
    rec = load_script("studies.graphs.record")
    cap = [dict(model="moe", tokens_per_request=1, sizes="1 2", strategy=s, graphs=2, capture_s=0.5, pool_mib=8.0)
           for s in ("a", "b")]
    rep = [dict(model="moe", tokens=1, requests=1, tokens_per_request=1, active=0, variant="a", rows=4, rep=r, us=9.0)
           for r in range(3)]
    rec.write_all(str(tmp_path), cap, rep, [], dict(META, notes={}))
    m = json.loads((tmp_path / "meta.json").read_text())
    assert set(m["files"]) == {"graph_capture.csv", "graph_replay.csv"} and m["notes"] == {}
    assert not (tmp_path / "graph_switches.csv").exists()  # no rows, no file
    for name, kind in (("graph_capture.csv", "graph_capture"), ("graph_replay.csv", "graph_replay")):
        _sealed(tmp_path / name, tmp_path / "meta.json")
        S.validate(pd.read_csv(tmp_path / name), kind, tmp_path / name)
    with pytest.raises(SystemExit):
        rec.main(["--out", str(tmp_path)])  # an earlier recording: refused unless --overwrite
    checks = load_script("studies.graphs.record_checks")
    checks.write(str(tmp_path), [dict(check="x", ok=True)], [dict(M=1, guard="sync", mode="eager", median_ms=1.0)],
                 META)
    doc = json.loads((tmp_path / "checks.json").read_text())
    assert doc["checks"] == [dict(check="x", ok=True)] and "graph_timing.csv" in doc["files"]


def test_hidden_syncs_write_is_sealed_and_a_session_is_recorded_once(tmp_path, capsys):
    rec = load_script("studies.hidden_syncs.record")
    row = pd.read_csv(ROOT + "/data/hidden_syncs/hidden_syncs_s1.csv").head(3)
    f = rec.write(rec.table_path(str(tmp_path), "s1", False), row, META)
    _sealed(Path(f), tmp_path / "hidden_syncs_s1.meta.json")
    assert len(S.read_csv(f, "hidden_syncs")) == 3
    rec.write(rec.table_path(str(tmp_path), "s1", True), row, META)
    with pytest.raises(SystemExit) as e:  # refused before anything is timed
        rec.main(["--smoke", "--session", "s1", "--out", str(tmp_path), "--only", "mask_index"])
    assert e.value.code == 2 and "hidden_syncs_s1_smoke.csv: a recording is already here" in capsys.readouterr().err


def _task_frames():
    df = pd.read_csv(ROOT + "/data/production/signature_s1/default_C8192.csv").head(4)
    s = pd.read_csv(ROOT + "/data/production/signature_s1/default_C8192.summary.csv")
    return df, s


@pytest.mark.parametrize("study", ["production", "tp_emulation"])
def test_session_tables_are_whole_and_sealed_in_the_session_meta(study, tmp_path):
    rec = load_script(f"studies.{study}.record")
    work = tmp_path / "s"
    work.mkdir()
    df, s = _task_frames()
    rec.write_task(work, "default_C8192", df, s)
    (work / "clocks.csv").write_text("t_unix,sm_mhz,mem_mhz,power_w,temp_c,throttle\n1.5,1980,3201,190,43,0x0\n")
    meta = rec.seal_session(work, dict(META), open_logs=[work / "clocks.csv"])
    assert set(meta["files"]) == {"default_C8192.csv", "default_C8192.summary.csv"}  # the open log: not yet
    (work / "meta.json").write_text(json.dumps(rec.seal_session(work, meta)))
    assert len(S.read_csv(work / "default_C8192.csv", "production_task")) == 4
    assert len(S.read_csv(work / "clocks.csv", "clocks")) == 1
    with pytest.raises(tables.TableExistsError, match="holds 3 table"):
        tables.claim_session(work, overwrite=False)
    tables.claim_session(work, overwrite=True)
    assert not list(work.glob("*.csv"))


def test_tp_emulation_summaries_refuse_a_foreign_table(tmp_path):
    rec = load_script("studies.tp_emulation.record")
    v = pd.read_csv(ROOT + "/data/tp_emulation/validation.csv")
    p = pd.read_csv(ROOT + "/data/tp_emulation/prediction.csv")
    rec.write_summaries(tmp_path, v, p, META)
    for name, kind in (("validation", "tp_validation"), ("prediction", "tp_prediction")):
        _sealed(tmp_path / f"{name}.csv", tmp_path / f"{name}.meta.json")
        S.read_csv(tmp_path / f"{name}.csv", kind)
    with pytest.raises(tables.HeaderMismatchError, match="validation.csv"):
        rec.write_summaries(tmp_path, p, v, META)  # swapped: each file would get the other's kind


def test_kernel_recorder_keeps_its_seal_and_refuses_an_earlier_run(tmp_path):
    r = Recorder("kernels_x", tmp_path, rows=[])
    r.row(section="sweep", preset="tiny", M=1, time_us=2.0)
    r.write()
    r.row(section="sweep", preset="tiny", M=2, time_us=3.0, extra=1)  # a column that comes later: rewritten whole
    f = Path(r.write())
    _sealed(f, tmp_path / "kernels_x.meta.json")
    with pytest.raises(tables.TableExistsError, match="kernels_x.csv: a recording is already here"):
        Recorder.claim(tmp_path, "kernels_x", overwrite=False)
    Recorder.claim(tmp_path, "kernels_x", overwrite=True)
    (tmp_path / "kernels.csv").write_bytes(f.read_bytes())
    kr = load_script("studies.kernels.record")
    with pytest.raises(tables.TableExistsError, match="kernels.csv"):
        kr.main(["--out", str(tmp_path)])  # before the CPU smoke check runs


def test_settings_mismatch_is_refused_and_named(tmp_path):
    f = tmp_path / "t.csv"
    tables.write_table(f, [dict(seed=0, x=1)], settings=dict(seed=0))
    with pytest.raises(tables.SettingsMismatchError, match="row 1: its rows were made with seed=0"):
        tables.write_table(f, [dict(seed=1, x=1)], settings=dict(seed=1))
    with pytest.raises(tables.SettingsMismatchError):
        tables.claim(f, settings=dict(seed=1))
    tables.write_table(f, [dict(seed=1, x=1)], replace=True)
    assert f.read_text() == "seed,x\n1,1\n"


def test_clock_log_refuses_to_append_onto_a_cut_sample(tmp_path):
    log = ClockLog.__new__(ClockLog)  # the writer alone: no nvidia-smi here
    log.path, log.proc = tmp_path / "clocks.csv", None
    log.append(1.0, "1980, 3201, 190.5, 43, 0x0\n")
    with open(log.path, "a") as fh:
        fh.write("2.000,1980,32")  # a process killed inside a write
    with pytest.raises(tables.CutRowError, match="clocks.csv: row 2 is cut"):
        log.append(3.0, "1980, 3201, 190.5, 43, 0x0\n")
    tables.drop_cut_row(log.path, quiet=True)
    log.append(3.0, "1980, 3201, 190.5, 43, 0x0\n")
    assert list(S.read_csv(log.path, "clocks")["t_unix"]) == [1.0, 3.0]


_WRITER = """
import sys, pandas as pd
from pathlib import Path
sys.path.insert(0, {root!r})
from studies.tp_emulation import record as rec
from lora_moe_lab.instruments.recorders.clocks import ClockLog
work = Path(sys.argv[1])
df = pd.read_csv({root!r} + "/data/production/signature_s1/default_C8192.csv")
s = pd.read_csv({root!r} + "/data/production/signature_s1/default_C8192.summary.csv")
log = ClockLog.__new__(ClockLog); log.path, log.proc = work / "clocks.csv", None
big = pd.concat([df] * 20, ignore_index=True)
i = 0
print("ready", flush=True)
while True:
    rec.write_task(work, "default_C8192", big.assign(rep=range(i * len(big), (i + 1) * len(big))), s)
    log.append(float(i + 1), "1980, 3201, 190.5, 43, 0x0")
    i += 1
"""


def test_a_writer_killed_by_its_pid_leaves_whole_tables(tmp_path):
    work = tmp_path / "s"
    work.mkdir()
    p = subprocess.Popen([sys.executable, "-c", _WRITER.format(root=ROOT), str(work)], stdout=subprocess.PIPE,
                         text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    try:
        assert p.stdout.readline().strip() == "ready"
        t0 = time.monotonic()
        while not (work / "clocks.csv").exists() and time.monotonic() - t0 < 20:
            time.sleep(0.02)
        time.sleep(0.3)
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    df = S.read_csv(work / "default_C8192.csv", "production_task")  # the last whole version, never half of one
    one = len(pd.read_csv(ROOT + "/data/production/signature_s1/default_C8192.csv"))
    assert len(df) == 20 * one and df["rep"].min() % len(df) == 0 and df["rep"].max() - df["rep"].min() == len(df) - 1
    n = tables.check_tail(work / "clocks.csv")  # whole rows only: one write per sample
    assert n >= 1 and list(S.read_csv(work / "clocks.csv", "clocks")["t_unix"]) == [float(i + 1) for i in range(n)]


def test_a_recording_starts_from_no_rows_when_another_ran_in_the_process_before(tmp_path):
    """Recorders share the process's row list (`harness.row`); a second recording in one process (two recorders'
    tests in one worker) must not write the first one's rows as its own."""
    from lora_moe_lab.instruments.recorders import harness
    harness.row(section="check", op="left over")
    rec = Recorder("second", tmp_path)
    harness.row(section="sweep", op="mine")
    rec.write()
    assert pd.read_csv(tmp_path / "second.csv").section.tolist() == ["sweep"]
