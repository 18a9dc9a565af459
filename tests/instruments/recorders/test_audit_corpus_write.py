"""studies/audit_corpus/record.py's write path on the CPU: a session's rows replace that session's earlier
rows, the metadata keeps every session, and the seals match the tables as written (the recorder itself
needs an H200; its tables are checked by the recording corpus)."""
import shutil
import sys
from pathlib import Path

import pandas as pd

from lora_moe_lab.instruments.analysers import schemas

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "studies" / "audit_corpus"))
import record  # noqa: E402


def test_a_session_rewritten_replaces_only_its_rows_and_reseals(tmp_path):
    for f in ("priced.csv", "sites.csv", "priced.meta.json"):
        shutil.copy(ROOT / "data" / "audit_corpus" / f, tmp_path / f)
    old = pd.read_csv(tmp_path / "priced.csv")
    row = old[old["session"] == "s4"].iloc[0].to_dict()
    site = pd.read_csv(tmp_path / "sites.csv").iloc[0].to_dict()
    for _ in range(2):  # the same session twice: no duplicates
        record.write_session(str(tmp_path), "sX", [dict(row, session="sX", new_column=1.0)],
                             [dict(site, session="sX")], {"gpu": "test"})
    new = pd.read_csv(tmp_path / "priced.csv")
    assert len(new) == len(old) + 1 and (new["session"] == "sX").sum() == 1
    assert new["new_column"].isna().sum() == len(old)  # a column new in this session: empty on older rows
    meta = schemas.read_json(tmp_path / "priced.meta.json")
    assert meta["sX"] == {"gpu": "test"} and "s4" in meta
    for f in ("priced.csv", "sites.csv"):
        assert meta["files"][f] == schemas.seal(tmp_path / f)
