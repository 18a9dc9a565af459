"""The bad inputs the checked read path refuses (schemas.read_csv / read_trace, provenance.catalog, the studies'
readers): seals that would switch off (unsealed, sealed for another file, partly sealed), traces damaged, swapped
or foreign, catalog entries that match nothing, implausible values. Each case is refused with an error naming the
file (and the row, "meta", "header" or "trace"); copies of the real recordings are made in tmp_path."""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

import lora_moe_lab.provenance as prov
from lora_moe_lab.instruments.analysers import recordings, trace
from lora_moe_lab.instruments.analysers import schemas as S
from lora_moe_lab.instruments.analysers.schemas import RecordingError
from test_recording_corpus import CORPUS, DATA, TEXT, _copy

SEALED = [k for k, v in CORPUS.items() if v[0] is not None]
OTHER = "guards/h200_guards_s2.csv"  # another recording (its seal is another file's)


def _meta(f: Path, kind: str) -> tuple[Path, dict]:
    mp = S.meta_path(f, kind)
    return mp, json.loads(mp.read_text())


SEAL_DAMAGES = {
    # the metadata gone: under data/ (DATA pointed at the copy) the file is read unsealed no more
    "unsealed": (lambda m, name: None, ["meta", "unsealed"]),
    # metadata of another recording: it seals other files, not this one
    "other_files": (lambda m, name: {"files": {"other.csv": S.seal(DATA / OTHER)}}, ["meta", "sealed for another"]),
    # this file's name sealed with another file's seal (another session's meta.json of the same layout)
    "other_session": (lambda m, name: {**m, "files": {**m["files"], name: S.seal(DATA / OTHER)}},
                      ["data rows", "seal"]),
    "entry_not_a_dict": (lambda m, name: {**m, "files": {**m["files"], name: "sealed"}}, ["meta", "partly sealed"]),
    "rows_only": (lambda m, name: {**m, "files": {**m["files"], name: {"rows": m["files"][name]["rows"]}}},
                  ["meta", "partly sealed", "sha256"]),
    "files_not_a_dict": (lambda m, name: {**m, "files": [name]}, ["meta", "partly sealed"]),
}


@pytest.mark.parametrize("damage", list(SEAL_DAMAGES))
@pytest.mark.parametrize("kind", SEALED)
def test_a_seal_that_would_switch_off_is_refused_by_name(kind, damage, tmp_path, monkeypatch):
    f = _copy(kind, tmp_path)
    mp, m = _meta(f, kind)
    make, expect = SEAL_DAMAGES[damage]
    new = make(m, f.name)
    if new is None:
        mp.unlink()
        monkeypatch.setattr(prov, "DATA", tmp_path)  # the copy is the repository's recording now
    else:
        mp.write_text(json.dumps(new))
    with pytest.raises(RecordingError) as e:
        S.read_csv(f, kind, **TEXT.get(kind, {}))
    msg = str(e.value)
    assert str(f) in msg and all(x in msg for x in expect), (expect, msg)


# -- traces ---------------------------------------------------------------------------------------
TRACE = DATA / "traces" / "qwen3-30b-a3b_sync_eager_M16.json.gz"


def _trace_copy(tmp_path, name=TRACE.name) -> Path:
    t = tmp_path / name
    shutil.copy(TRACE, t)
    shutil.copy(TRACE.with_name(TRACE.name.replace(".json.gz", ".meta.json")),
                tmp_path / name.replace(".json.gz", ".meta.json"))
    return t


def _write_trace(t: Path, doc) -> None:
    t.write_bytes(gzip.compress(doc if isinstance(doc, bytes) else json.dumps(doc).encode()))


TRACE_DAMAGES = {
    "no_trace_events": (lambda d: {"schemaVersion": 1, "deviceProperties": []}, "no traceEvents list"),
    "trace_events_not_a_list": (lambda d: {"traceEvents": {"ph": "X"}}, "no traceEvents list"),
    "cut_json": (lambda d: json.dumps(d).encode()[:5000], "invalid JSON"),
    "invalid_json": (lambda d: b"{\"traceEvents\": [}", "invalid JSON"),
    "ts_abc": (lambda d: {"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": "abc", "dur": 1}]},
               "traceEvents[0]: ts 'abc' is not a time"),
    "dur_bad": (lambda d: {"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": "1.2.3"}]},
                "traceEvents[0]: dur '1.2.3' is not a time"),
    "event_not_an_object": (lambda d: {"traceEvents": [{"ph": "X", "ts": 1, "dur": 1, "name": "a"}, 7]},
                            "traceEvents[1]: an event that is not an object"),
    "a_list_of_numbers": (lambda d: [1, 2, 3], "traceEvents[0]: an event that is not an object"),
}


@pytest.mark.parametrize("damage", list(TRACE_DAMAGES))
def test_a_damaged_trace_is_refused_by_name(damage, tmp_path):
    t = tmp_path / "t.json.gz"
    make, expect = TRACE_DAMAGES[damage]
    _write_trace(t, make(S.read_trace(TRACE)))
    with pytest.raises(RecordingError, match="t.json.gz: trace: .*" + expect.replace("[", r"\[").replace("]", r"\]")):
        trace.load_trace(t)


def test_a_trace_cut_in_its_gzip_stream_is_refused(tmp_path):
    t = tmp_path / "t.json.gz"
    t.write_bytes(TRACE.read_bytes()[:3000])
    with pytest.raises(RecordingError, match="t.json.gz: trace: damaged or cut compressed file"):
        trace.load_trace(t)


def test_a_trace_saved_under_another_points_name_is_refused(tmp_path):
    # the M = 16 trace saved under the M = 4096 name: its seal (the M = 4096 trace's) disagrees
    name = "qwen3-30b-a3b_sync_eager_M4096.json.gz"
    src = DATA / "traces" / name
    shutil.copy(src.with_name(name.replace(".json.gz", ".meta.json")), tmp_path)
    shutil.copy(TRACE, tmp_path / name)
    with pytest.raises(RecordingError, match=f"{name}: meta: .*(bytes|content hash)"):
        trace.load_trace(tmp_path / name)


@pytest.mark.parametrize("damage", ["unsealed", "rows_only", "edited"])
def test_a_trace_unsealed_partly_sealed_or_edited_is_refused(damage, tmp_path, monkeypatch):
    t = _trace_copy(tmp_path)
    mp = S.file_meta_path(t)
    m = json.loads(mp.read_text())
    if damage == "unsealed":
        del m["files"]
        monkeypatch.setattr(prov, "DATA", tmp_path)
        expect = "meta: unsealed"
    elif damage == "rows_only":
        m["files"][t.name] = {"rows": 3}
        expect = "meta: partly sealed"
    else:
        _write_trace(t, S.read_trace(TRACE))  # the same events, re-exported: other bytes than sealed
        expect = "meta: .*(bytes|content hash)"
    mp.write_text(json.dumps(m))
    with pytest.raises(RecordingError, match=f"{t.name}: {expect}"):
        trace.load_trace(t)


def test_an_in_memory_dict_without_trace_events_is_named():
    with pytest.raises(ValueError, match="no traceEvents list"):
        trace.load_trace({"events": []})


# -- the catalog ------------------------------------------------------------------------------------
def _catalog(tmp_path, edit=None, seal=True) -> Path:
    c = tmp_path / "catalog.json"
    doc = json.loads(prov.CATALOG.read_text())
    if edit:
        edit(doc)
    c.write_text(json.dumps(doc, indent=1))
    if seal:
        S.write_seal(c, tmp_path / "catalog.meta.json")
    for d in ("guards", "probe"):
        shutil.copytree(DATA / d, tmp_path / d)
    return c


def test_a_catalog_glob_that_matches_nothing_is_an_error_not_the_archived_recording(tmp_path, monkeypatch):
    c = _catalog(tmp_path, lambda d: d["guards"].update(glob="guards/*_gaurds_s*.csv"))  # a typo
    monkeypatch.setattr(prov, "CATALOG", c)
    with pytest.raises(FileNotFoundError, match=r"catalog.json: entry 'guards' \(guards/\*_gaurds_s\*.csv\) matches "
                                                r"no file"):
        recordings.load_guards()


def test_the_probe_sessions_entry_that_matches_nothing_is_an_error(tmp_path, monkeypatch):
    from studies.probe import read

    c = _catalog(tmp_path, lambda d: d["probe.sessions"].update(glob="probe/probe_q*.csv"))
    monkeypatch.setattr(prov, "CATALOG", c)
    with pytest.raises(FileNotFoundError, match="entry 'probe.sessions'"):
        read.hosts()


@pytest.mark.parametrize("damage,expect", [("edited", "changed since it was sealed"),
                                           ("unsealed", "unsealed"), ("not_json", "not JSON")])
def test_the_repositorys_catalog_is_held_to_its_seal(damage, expect, tmp_path, monkeypatch):
    c = _catalog(tmp_path, seal=damage != "unsealed")
    monkeypatch.setattr(prov, "CATALOG", c)
    if damage == "edited":
        c.write_text(c.read_text().replace("guards/*_guards_s*.csv", "guards/h200_guards_s1.csv"))
    elif damage == "not_json":
        c.write_text(c.read_text()[:-30])
        S.write_seal(c, tmp_path / "catalog.meta.json")
    with pytest.raises(prov.CatalogError, match=f"{c}: .*{expect}"):
        prov.catalog("guards")


# -- implausible values -----------------------------------------------------------------------------
def _guards_sessions(tmp_path) -> tuple[Path, Path]:
    for f in (DATA / "guards").glob("h200_guards_s*"):
        shutil.copy(f, tmp_path / f.name)
    return tmp_path / "h200_guards_s1.csv", tmp_path / "h200_guards_s2.csv"


def test_a_guards_session_in_another_unit_is_refused_row_by_row(tmp_path):
    s1, _ = _guards_sessions(tmp_path)
    d = pd.read_csv(s1)
    d["us"] = d["us"] * 1000  # ms written as µs
    d.to_csv(s1, index=False)
    S.write_seal(s1, kind="guards")
    with pytest.raises(RecordingError, match=r"h200_guards_s1.csv: row \d+: column 'us': .* at most 1e\+07 µs"):
        recordings.load_guards(tmp_path)


def test_a_guards_session_in_another_unit_is_refused_beside_the_others(tmp_path):
    s1, _ = _guards_sessions(tmp_path)
    d = pd.read_csv(s1)
    d = d[d["us"] < 9000].assign(us=lambda x: x["us"] * 1000)  # the fast rows only: every value in range
    d.to_csv(s1, index=False)
    S.write_seal(s1, kind="guards")
    with pytest.raises(RecordingError, match=r"h200_guards_s1.csv: header: column 'us': 1e\+03x the other sessions"):
        recordings.load_guards(tmp_path)


def _block_copy(tmp_path, rel: str) -> Path:
    src = DATA / rel
    (tmp_path / src.parent.name).mkdir(exist_ok=True)
    for f in src.parent.iterdir():
        if f.is_file() and not f.name.endswith(".json.gz"):
            shutil.copy(f, tmp_path / src.parent.name / f.name)
    return tmp_path / src.parent.name / src.name


@pytest.mark.parametrize("damage", ["negative_syncs", "cut"])
def test_the_traces_block_refuses_an_implausible_or_cut_summary(damage, tmp_path, monkeypatch):
    from studies.traces import block

    f = _block_copy(tmp_path, "traces/traces_summary.csv")
    d = pd.read_csv(f)
    if damage == "negative_syncs":
        d.loc[0, "n_syncs"] = -5
        d.to_csv(f, index=False)
        S.write_seal(f, kind="traces_summary")
        expect = r"row 1: column 'n_syncs': -5"
    else:
        f.write_text("".join(f.read_text().splitlines(keepends=True)[:-2]))
        expect = "row \\d+: .* cut since it was sealed"
    monkeypatch.setattr(block, "DATA", tmp_path)
    with pytest.raises(RecordingError, match=f"traces_summary.csv: {expect}"):
        block.traces_block()


@pytest.mark.parametrize("damage", ["duplicated", "cut"])
def test_the_replay_block_refuses_a_duplicated_or_cut_validation(damage, tmp_path, monkeypatch):
    from studies.replay import block

    f = _block_copy(tmp_path, "replay/validation.csv")
    lines = f.read_text().splitlines(keepends=True)
    if damage == "duplicated":
        f.write_text("".join(lines + lines[1:2]))
        S.write_seal(f, kind="replay_validation")
        expect = "duplicate key"
    else:
        f.write_text("".join(lines[:-3]))
        expect = "cut since it was sealed"
    monkeypatch.setattr(block, "DATA", tmp_path)
    with pytest.raises(RecordingError, match=f"validation.csv: row \\d+: .*{expect}"):
        block.replay_block()


@pytest.mark.parametrize("damage", ["cut", "edited", "column_missing"])
def test_superseded_csv_is_checked_before_it_leaves_cells_out(damage, tmp_path):
    from studies.lora_tax import read

    f = _block_copy(tmp_path, "lora_tax/superseded.csv")
    lines = f.read_text().splitlines(keepends=True)
    if damage == "cut":
        f.write_text("".join(lines[:-1]))  # one entry fewer: the README's LoRA line would move
        expect = "row \\d+: .*cut"
    elif damage == "edited":
        f.write_text("".join(lines).replace("s1,", "s2,", 1))
        expect = "meta: content hash differs"
    else:
        pd.read_csv(f).drop(columns=["why"]).to_csv(f, index=False)
        S.write_seal(f, kind="lora_tax_superseded")
        expect = "header: missing column"
    with pytest.raises(RecordingError, match=f"superseded.csv: {expect}"):
        read.superseded(f)


def test_a_tp2_summary_edited_after_its_seal_is_refused(tmp_path):
    from lora_moe_lab.sim import tp_emulation as E

    f = _block_copy(tmp_path, "production/tp2_C16384_gs1.summary.csv")
    d = pd.read_csv(f)
    d["forward_median_ms"] = d["forward_median_ms"] * 10
    d.to_csv(f, index=False)
    with pytest.raises(RecordingError, match="tp2_C16384_gs1.summary.csv: meta: content hash differs"):
        E.tp2_validation({}, measured={"gs1": f})
