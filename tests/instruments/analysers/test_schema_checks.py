"""The schema checks themselves (analysers/schemas.py), one rule at a time on small frames and files: which error
wins (the header, the first bad row, a duplicated key before it), the unique key a file is held to, the seal's rows,
size and hash, and every way a seal is refused, each with the row and the words a reader sees.

test_schema_bounds.py probes every declared bound; test_recording_corpus.py damages real recordings. This file pins
the functions both go through, fast enough to run against each mutant (scripts/mutate.py: `schemas`).
"""
import json
import random
from types import SimpleNamespace

import pandas as pd
import pytest

from lora_moe_lab.instruments.analysers import schemas as S
from lora_moe_lab.instruments.analysers.schemas import RecordingError

WHAT = S.KINDS["guards"].what


def _guards(n: int = 3) -> pd.DataFrame:
    """A valid guards frame of n rows (fresh random times), one per repetition."""
    rng = random.Random()
    return pd.DataFrame(dict(preset="tiny", layers=2, tokens=16, active=0.5, variant="a", guard="sync", mode="eager",
                             rep=list(range(n)), us=[rng.uniform(1, 100) for _ in range(n)], syncs_per_forward=0))


def _refused(df, match=None) -> RecordingError:
    with pytest.raises(RecordingError) as e:
        S.validate(df, "guards", "g.csv")
    assert e.value.path.name == "g.csv"
    if match is not None:
        assert e.value.what == match, e.value.what
    return e.value


# --- validate -----------------------------------------------------------------------------------------
def test_a_valid_frame_is_returned_as_read():
    df = _guards()
    assert S.validate(df, "guards", "g.csv") is df
    assert S.validate(df.drop(columns=[]), S.KINDS["guards"], "g.csv") is not None  # a Kind as well as its name


def test_the_header_is_checked_before_the_rows():
    assert _refused(pd.DataFrame(), "no columns: not a guards recording").row == "header"
    e = _refused(_guards().drop(columns=["us", "rep"]))
    assert e.row == "header" and e.what == f"missing column(s) ['rep', 'us']: not a guards recording ({WHAT})"
    S.validate(_guards().drop(columns=["session"], errors="ignore"), "guards", "g.csv")  # optional: may be absent
    e = _refused(_guards().iloc[:0], "no data rows: an empty guards recording")
    assert e.row == 1
    bare = S.Kind("bare", S.KINDS["guards"].schema)  # a kind that does not say what it holds
    with pytest.raises(RecordingError, match=r"^g.csv: header: missing column\(s\) \['us'\]: not a bare recording "
                                             r"\(see schemas.KINDS\)$"):
        S.validate(_guards().drop(columns=["us"]), bare, "g.csv")


def test_a_column_named_index_is_a_column_like_any_other():
    df = _guards(3).assign(index=[7, 8, 9])
    S.validate(df, "guards", "g.csv")
    df.loc[1, "us"] = 0.0
    assert _refused(df).row == 2


def test_a_duplicated_key_wins_over_a_failure_of_the_whole_header():
    schema = S.pa.DataFrameSchema({"a": S.pa.Column(int), "v": S.pa.Column(float)}, strict=True)
    k = S.Kind("strict", schema, unique=("a",))
    df = pd.DataFrame(dict(a=[1, 2, 2], v=[1.0, 2.0, 3.0], extra=0))  # a column the schema refuses, a repeated key
    with pytest.raises(RecordingError) as e:
        S.validate(df, k, "s.csv")
    assert e.value.row == 3 and e.value.what.startswith("duplicate key {'a': 2}")
    with pytest.raises(RecordingError) as e:
        S.validate(df.drop_duplicates("a"), k, "s.csv")
    assert e.value.row == "header" and "extra" in e.value.what


def test_rows_exempt_from_the_key_do_not_win_over_a_bad_row():
    """A kind's unique_except rows (a check run twice) are no duplicate, before a bad row or in a valid frame."""
    schema = S.pa.DataFrameSchema({"a": S.pa.Column(int), "s": S.pa.Column(str), "v": S.pa.Column(float, S.POS)})
    k = S.Kind("checked", schema, unique=("a",), unique_except=(("s", ("check",)),))
    df = pd.DataFrame(dict(a=[1, 1, 2], s=["check", "check", "x"], v=[1.0, 2.0, 3.0]))
    S.validate(df, k, "c.csv")
    df.loc[2, "v"] = -1.0
    with pytest.raises(RecordingError) as e:
        S.validate(df, k, "c.csv")
    assert e.value.row == 3 and "'v'" in e.value.what


def test_the_first_bad_row_is_named_by_its_position_not_its_index():
    df = _guards(4)
    df.loc[2, "us"] = -1.0
    df.loc[3, "active"] = 2.0
    df.index = [10, 11, 12, 13]
    e = _refused(df)
    assert e.row == 3 and e.what.startswith("column 'us': -1.0 fails greater_than(0)"), e.what
    assert str(e) == f"g.csv: row 3: {e.what}"


def test_a_duplicated_key_before_the_first_bad_row_wins():
    dup = _guards(4)
    dup.loc[1, "rep"] = 0  # row 2 repeats row 1's key
    dup.loc[2, "us"] = -1.0  # row 3 is bad
    e = _refused(dup)
    key = dict(preset="tiny", layers=2, tokens=16, active=0.5, variant="a", rep=0)
    assert e.row == 2 and e.what == (f"duplicate key {key} (unique ['preset', 'layers', 'tokens', 'active', "
                                     "'variant', 'rep']): a row written twice?")
    later = _guards(4)
    later.loc[1, "us"] = -1.0  # row 2 is bad
    later.loc[2, "rep"] = 0  # row 3 repeats row 1's key
    assert _refused(later).row == 2 and "fails" in _refused(later).what
    same = _guards(4)
    same.loc[1, ["rep", "us"]] = [0, -1.0]  # row 2 both repeats a key and is bad: the bad value is named
    assert _refused(same).row == 2 and "fails" in _refused(same).what


def test_a_duplicated_key_in_an_otherwise_valid_frame():
    df = _guards(3)
    df.loc[2, "rep"] = 1
    df.index = [5, 6, 7]
    e = _refused(df)
    assert e.row == 3 and e.what.startswith("duplicate key") and "'rep': 1" in e.what


# --- the unique key --------------------------------------------------------------------------------------
def test_unique_failure_names_the_first_repeat_and_skips_the_exempt_rows():
    df = pd.DataFrame(dict(a=[1, 1, 2, 1, 2], b=[0, 5, 0, 5, 0], s=["x", "y", "y", "x", "z"]))
    assert S._unique_failure(df, ["a", "b"]) == (4, "duplicate key {'a': 1, 'b': 5} (unique ['a', 'b']): a row "
                                                    "written twice?")
    assert S._unique_failure(df, ["a"]) == (2, "duplicate key {'a': 1} (unique ['a']): a row written twice?")
    assert S._unique_failure(df, ["a", "b"], exempt=(("s", ("x",)),)) == (
        5, "duplicate key {'a': 2, 'b': 0} (unique ['a', 'b']): a row written twice?")
    assert S._unique_failure(df, ["a", "b"], exempt=(("s", ("x", "z")),)) is None
    assert S._unique_failure(df, ["a", "b"], exempt=(("missing", ("x",)),))[0] == 4  # no such column: no exemption
    assert S._unique_failure(df, ["a", "c"]) is None  # the key needs every one of its columns
    assert S._unique_failure(df, []) is None and S._unique_failure(df.iloc[:0], ["a"]) is None
    assert S._unique_failure(df.iloc[:3], ["a", "b"]) is None


def test_the_key_adds_session_and_gpu_and_drops_what_the_file_lacks():
    k = SimpleNamespace(unique=("preset", "rep", "variant"))
    cols = lambda *c: pd.DataFrame(columns=list(c))  # noqa: E731
    assert S._key_for(k, cols("rep", "preset", "variant")) == ["preset", "rep", "variant"]
    assert S._key_for(k, cols("rep", "preset")) == ["preset", "rep"]
    assert S._key_for(k, cols("gpu", "rep", "session")) == ["session", "gpu", "rep"]
    assert S._key_for(k, cols("gpu", "rep", "preset")) == ["gpu", "preset", "rep"]
    assert S._key_for(k, cols("gpu", "session")) == []  # no key column: no key, not a key of the partition alone
    assert S._key_for(SimpleNamespace(unique=("session", "rep")), cols("rep", "session", "gpu")) == ["gpu", "session",
                                                                                                    "rep"]


def test_a_plausibility_bound_names_its_unit_and_reason():
    c = S._at_most(1e7, "us", "ten seconds a forward")
    assert c.statistics == {"max_value": 1e7} and c.error == "at most 1e+07 us (ten seconds a forward)"
    schema = S.pa.DataFrameSchema({"v": S.pa.Column(float, S._at_most(2.5, "ms", "why"))})
    schema.validate(pd.DataFrame({"v": [2.5, -3.0]}))
    with pytest.raises(S.SchemaError, match=r"at most 2.5 ms \(why\)"):
        schema.validate(pd.DataFrame({"v": [2.5000001]}))


# --- seals ---------------------------------------------------------------------------------------------
def test_rows_count_records_not_lines():
    assert S._rows(b"") == 0 and S._rows(b"a,b\n") == 0 and S._rows(b"a,b\n1,2\n") == 1
    assert S._rows(b'a,b\n1,"x\ny"\n3,4\n') == 2  # a quoted newline is one record
    assert S._rows(b"a\n1\n2") == 2  # a last line without its newline is a record
    assert S._rows("a\n\xe9\n".encode("latin-1")) == 1  # undecodable bytes are counted, not an error
    assert S._seal_keys("x.csv") == ("rows", "sha256") and S._seal_keys("x.json.gz") == ("bytes", "sha256")


HASH = "0" * 64


@pytest.mark.parametrize("meta,what", [
    ([], "partly sealed: m.json is a list, not an object"),
    ({"files": []}, 'partly sealed: m.json\'s "files" is a list, not an object of seals'),
    ({"files": {"b.csv": {}, "a.csv": {}}}, "sealed for another file: m.json seals a.csv, b.csv, not x.csv (the "
                                            "metadata of another recording or session?)"),
    ({"files": {}}, "sealed for another file: m.json seals nothing, not x.csv (the metadata of another recording or "
                    "session?)"),
    ({"note": 1}, "unsealed: m.json holds no seal for x.csv; seal it (scripts/seal_recordings.py) or record it again"),
    ({"files": {"x.csv": [1]}}, "partly sealed: its seal in m.json is a list, not {rows, sha256}"),
    ({"files": {"x.csv": {"rows": 1}}}, "partly sealed: its seal in m.json lacks sha256"),
    ({"files": {"x.csv": {}}}, "partly sealed: its seal in m.json lacks rows, sha256"),
    ({"rows": 1}, "partly sealed: its seal in m.json lacks sha256"),
    ({"files": {f"{c}.csv": {} for c in "edcba"}}, "sealed for another file: m.json seals a.csv, b.csv, c.csv, d.csv, "
                                                   "not x.csv (the metadata of another recording or session?)"),
    ({"sha256": HASH}, "partly sealed: its seal in m.json lacks rows"),
    ({"rows": 1, "sha256": "0" * 63}, "partly sealed: its seal in m.json has sha256 '" + "0" * 63 + "', not 64 hex "
                                      "digits"),
    ({"rows": 1, "sha256": "A" * 64}, "partly sealed: its seal in m.json has sha256 '" + "A" * 64 + "', not 64 hex "
                                      "digits"),
    ({"rows": 1, "sha256": 0}, "partly sealed: its seal in m.json has sha256 0, not 64 hex digits"),
    ({"rows": -1, "sha256": HASH}, "partly sealed: its seal in m.json has rows -1, not a count"),
    ({"rows": True, "sha256": HASH}, "partly sealed: its seal in m.json has rows True, not a count"),
    ({"rows": 1.0, "sha256": HASH}, "partly sealed: its seal in m.json has rows 1.0, not a count"),
])
def test_a_seal_that_is_not_complete_is_refused_by_name(meta, what):
    with pytest.raises(RecordingError) as e:
        S.seal_of("d/x.csv", "d/m.json", meta)
    assert (e.value.path.name, e.value.row, e.value.what) == ("x.csv", "meta", what)


def test_a_complete_seal_is_returned():
    s = {"rows": 0, "sha256": HASH}
    assert S.seal_of("x.csv", "m.json", {"files": {"x.csv": s}, "rows": -1}) is s  # "files" wins over the top level
    top = {"rows": 2, "sha256": HASH, "gpu": "x"}
    assert S.seal_of("x.csv", "m.json", top) is top
    assert S.seal_of("t.json.gz", "m.json", {"bytes": 5, "sha256": HASH}) == {"bytes": 5, "sha256": HASH}
    with pytest.raises(RecordingError, match="lacks bytes"):
        S.seal_of("t.json.gz", "m.json", {"rows": 5, "sha256": HASH})


def _sealed(tmp_path, text: bytes, name="x.csv"):
    p = tmp_path / name
    p.write_bytes(text)
    mp = tmp_path / "m.json"
    S.write_seal(p, mp)
    return p, mp


def test_check_seal_refuses_a_cut_an_append_and_an_edit(tmp_path):
    data = b"a,b\n1,2\n3,4\n"
    p, mp = _sealed(tmp_path, data)
    assert S.check_seal(p, data, meta=mp) is None
    with pytest.raises(RecordingError) as e:
        S.check_seal(p, b"a,b\n1,2\n", meta=mp)
    assert e.value.path == p and e.value.row == 2
    assert e.value.what == "1 data rows, but its seal in m.json says 2: cut since it was sealed"
    with pytest.raises(RecordingError) as e:
        S.check_seal(p, data + b"5,6\n7,8\n", meta=mp)
    assert e.value.path == p and e.value.row == 3
    assert e.value.what == "4 data rows, but its seal in m.json says 2: rows appended since it was sealed"
    with pytest.raises(RecordingError) as e:
        S.check_seal(p, b"a,b\n1,2\n3,5\n", meta=mp)
    digest = S._hash(data)[:12]
    assert e.value.path == p and e.value.row == "meta"
    assert e.value.what == (f"content hash differs from its seal in m.json (sha256 {digest}...): the file changed "
                            "since it was sealed")


def test_check_seal_of_a_file_that_is_not_a_table_counts_bytes(tmp_path):
    data = b'{"traceEvents": []}'
    p, mp = _sealed(tmp_path, data, "t.json")
    assert json.loads(mp.read_text())["files"]["t.json"]["bytes"] == len(data)
    S.check_seal(p, data, meta=mp)
    for cut, word in ((data[:-1], "cut"), (data + b" ", "grown")):
        with pytest.raises(RecordingError) as e:
            S.check_seal(p, cut, meta=mp)
        assert e.value.path == p and e.value.row == "meta"
        assert e.value.what == f"{len(cut)} bytes, but its seal in m.json says {len(data)}: {word} since it was sealed"
    with pytest.raises(RecordingError, match="content hash differs"):
        S.check_seal(p, data.replace(b"[", b"{"), meta=mp)


def test_check_seal_without_metadata(tmp_path):
    p = tmp_path / "x.csv"
    p.write_bytes(b"a\n1\n")
    with pytest.raises(RecordingError) as e:
        S.check_seal(p, p.read_bytes(), "guards")  # its sibling x.meta.json does not exist
    assert e.value.path == p and e.value.row == "meta" and e.value.what == (
        "unsealed: no metadata x.meta.json beside it holds its seal; seal it (scripts/seal_recordings.py) or record "
        "it again")
    with pytest.raises(RecordingError, match="unsealed: no metadata meta.json beside it"):
        S.check_seal(p, p.read_bytes(), "clocks")  # a session's kind: the folder's meta.json, by the kind
    assert S.check_seal(p, p.read_bytes(), "guards", sealed=False) is None  # a caller's own file
    (tmp_path / "x.meta.json").write_text('{"gpu": "H100"}')  # metadata written before seals
    assert S.check_seal(p, p.read_bytes(), "guards", sealed=False) is None
    with pytest.raises(RecordingError, match="unsealed: x.meta.json holds no seal for x.csv"):
        S.check_seal(p, p.read_bytes(), "guards")
    (tmp_path / "x.meta.json").write_text('{"files": {"y.csv": {}}}')  # another file's seal: refused even unsealed
    with pytest.raises(RecordingError, match="sealed for another file"):
        S.check_seal(p, p.read_bytes(), "guards", sealed=False)
    (tmp_path / "x.meta.json").write_text('{"sha256": "x"}')  # a partial seal: refused even unsealed
    with pytest.raises(RecordingError, match="partly sealed"):
        S.check_seal(p, p.read_bytes(), "guards", sealed=False)
    for partial in ('{"bytes": 3}', '{"rows": 1}'):
        (tmp_path / "x.meta.json").write_text(partial)
        with pytest.raises(RecordingError, match="partly sealed"):
            S.check_seal(p, p.read_bytes(), "guards", sealed=False)
    S.write_seal(p, kind="guards")  # into its sibling, found by the kind
    assert S.check_seal(p, p.read_bytes(), "guards") is None
