"""studies/hidden_syncs/record.py --smoke on the CPU: a CSV and its metadata, the reader reads them."""

import json
import shutil

import pytest
import torch
from helpers import load_script

from lora_moe_lab.instruments.analysers import hidden_sync_runs


def test_smoke_run_writes_csv_meta_and_is_read(tmp_path):
    mod = load_script("studies.hidden_syncs.record")
    assert (
        mod.main(["--smoke", "--out", str(tmp_path), "--reps", "10", "--only", "offsets_item", "mask_index"])
        == 0
    )
    csv = tmp_path / "hidden_syncs_s1_smoke.csv"
    meta = json.loads((tmp_path / "hidden_syncs_s1_smoke.meta.json").read_text())
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"  # --smoke runs where it is
    assert meta["params"]["smoke"] is True and meta["gpu"] == gpu and "commit" in meta
    assert hidden_sync_runs.recorded(tmp_path) is None  # a smoke run is never read as a recording
    for s in ("s1", "s2"):
        shutil.copy(csv, tmp_path / f"hidden_syncs_{s}.csv")
    r = hidden_sync_runs.recorded(tmp_path).set_index("pattern")
    assert list(r.index) == ["offsets_item", "mask_index"] and r.loc["mask_index", "occurrences"] == 6
    assert r.loc["offsets_item", "sessions"] in ("s1, s2", "")  # "" only when the CPU timings never settled


def test_bad_arguments(tmp_path):
    mod = load_script("studies.hidden_syncs.record")
    for argv in (["--smoke", "--session", "one"], ["--smoke", "--reps", "5"], ["--smoke", "--only", "nope"]):
        with pytest.raises(SystemExit):
            mod.main(argv + ["--out", str(tmp_path)])
