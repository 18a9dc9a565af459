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
