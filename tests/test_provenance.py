"""One metadata schema: versions, commit, date, no hostname; legacy keys normalised."""
import json
import platform
import re

import torch

from lora_moe_lab import provenance, runtime


def test_metadata_has_versions_commit_and_no_hostname():
    m = provenance.metadata()
    assert set(provenance.META_KEYS) <= set(m)
    assert m["dirty"] in (True, False, None) and isinstance(m["gpu_state"], dict)
    assert m["torch"] == torch.__version__
    assert m["gpu"] == (torch.cuda.get_device_name() if runtime.has_cuda() else "cpu")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", m["date"])
    assert m["commit"] == "" or re.fullmatch(r"[0-9a-f]{7,40}", m["commit"])  # GIT_COMMIT may be short
    assert platform.node() not in json.dumps(m)


def test_git_commit_reads_packed_refs_and_detached_head(tmp_path, monkeypatch):
    monkeypatch.delenv("GIT_COMMIT", raising=False)
    sha = "0123456789abcdef0123456789abcdef01234567"
    g = tmp_path / "repo" / ".git"
    (g / "refs" / "heads").mkdir(parents=True)
    (g / "HEAD").write_text("ref: refs/heads/main\n")
    (g / "packed-refs").write_text(f"# pack-refs with: peeled\n{sha} refs/heads/main\n")
    assert provenance.git_commit(tmp_path / "repo" / "sub") == sha
    (g / "HEAD").write_text(sha[::-1] + "\n")
    assert provenance.git_commit(tmp_path / "repo") == sha[::-1]
    assert provenance.git_commit(tmp_path) == ""
    monkeypatch.setenv("GIT_COMMIT", "abc123")
    assert provenance.git_commit(tmp_path) == "abc123"


def test_legacy_keys_are_normalised_and_labelled():
    m = provenance.normalize_meta({"gpu": "NVIDIA H200", "git_commit": "1c65309abc",
                                   "date_utc": "2026-11-29T10:00:00Z"})
    assert m == {"gpu": "NVIDIA H200", "commit": "1c65309abc", "date": "2026-11-29T10:00:00Z"}
    assert provenance.label(m) == "H200 · commit 1c65309 · 2026-11-29"


def test_git_dirty_env_wins(monkeypatch):
    monkeypatch.setenv("GIT_DIRTY", "1")
    assert provenance.metadata()["dirty"] is True
    monkeypatch.setenv("GIT_DIRTY", "0")
    assert provenance.metadata()["dirty"] is False


def test_metadata_records_repo_relative_paths(tmp_path, monkeypatch):
    from lora_moe_lab.provenance import ROOT, metadata

    monkeypatch.setenv("OUT", str(tmp_path))
    p = metadata(params=dict(out=str(ROOT / "build" / "x"), dev=str(tmp_path / "run1"), n=3))["params"]
    assert p == dict(out="build/x", dev="$OUT/run1", n=3)


def test_recorded_metadata_names_no_machine_path():
    from helpers import load_script

    assert load_script("tidy_meta_paths").main(["--check"]) == 0


def test_catalog_resolves_relative_to_its_folder_and_names_what_is_missing(tmp_path):
    import pytest

    (tmp_path / "guards").mkdir()
    for n in ("a_guards_s2.csv", "a_guards_s1.csv", "old.csv"):
        (tmp_path / "guards" / n).write_text("x\n")
    cat = tmp_path / "catalog.json"
    cat.write_text(json.dumps({
        "_about": "a note, not an entry",
        "one": {"path": "guards/old.csv", "what": "a file"},
        "folder": {"path": "guards", "what": "a folder"},
        "both": {"paths": ["guards/a_guards_s2.csv", "guards/a_guards_s1.csv"], "what": "files in this order"},
        "sessions": {"glob": "guards/*_guards_s*.csv", "what": "sorted matches"},
        "gone": {"path": "guards/nope.csv", "what": "a missing file"},
        "empty": {"glob": "guards/*.json", "what": "matches nothing"}}))
    assert provenance.catalog("one", cat) == tmp_path / "guards" / "old.csv"
    assert provenance.catalog("folder", cat) == tmp_path / "guards"
    assert [p.name for p in provenance.catalog("both", cat)] == ["a_guards_s2.csv", "a_guards_s1.csv"]
    assert [p.name for p in provenance.catalog("sessions", cat)] == ["a_guards_s1.csv", "a_guards_s2.csv"]
    assert "_about" not in provenance.catalog_entries(cat)
    with pytest.raises(KeyError, match=r"catalog\.json has no entry 'nope'"):
        provenance.catalog("nope", cat)
    with pytest.raises(FileNotFoundError, match=r"entry 'gone' names a missing file: .*nope\.csv"):
        provenance.catalog("gone", cat)
    with pytest.raises(FileNotFoundError, match=r"entry 'empty' \(guards/\*\.json\) matches no file"):
        provenance.catalog("empty", cat)
    with pytest.raises(FileNotFoundError, match="no catalog at"):
        provenance.catalog("one", tmp_path / "none.json")
    cat.write_text(json.dumps({"bad": {"path": "x", "glob": "y", "what": "two kinds"}}))
    with pytest.raises(ValueError, match="'bad' needs exactly one of path, paths, glob and a `what` line"):
        provenance.catalog_entries(cat)
