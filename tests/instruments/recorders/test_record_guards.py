"""studies/guards/record.py end to end with tiny settings (any machine; CPU: the torch backend,
wall-clock timing): two sessions written, read back and pooled; every repetition kept in the
file, the warm-up verdict per point, metadata without machine paths; bad arguments refused."""
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lora_moe_lab.instruments.analysers import stats
from lora_moe_lab.instruments.analysers.recordings import CHECK_COLUMNS, SAMPLE_COLUMNS, load_guards
from lora_moe_lab.model.guards import guard_names
from helpers import load_script

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def script():
    return load_script("studies.guards.record")


@pytest.fixture(scope="module")
def two_sessions(script, tmp_path_factory):
    out = tmp_path_factory.mktemp("guards")
    paths = [Path(script.main(["--dry", "--out", str(out), "--session", s])) for s in ("s1", "s2")]
    return out, paths


def test_two_sessions_written_and_read_back(two_sessions):
    out, paths = two_sessions
    assert [p.name.split("_guards_")[1] for p in paths] == ["s1.csv", "s2.csv"]
    for p in paths:
        df = pd.read_csv(p)
        assert set(SAMPLE_COLUMNS + CHECK_COLUMNS) <= set(df.columns)
        assert set(guard_names()) <= set(df.variant)
        assert len(df.groupby(["tokens", "active"])) == 4  # --dry: M = 8, 16; active 0, 0.5
        for _, g in df.groupby(["tokens", "active"]):  # every arm the same repetitions, all kept in the file
            reps = g.groupby("variant").rep.apply(lambda r: tuple(sorted(r)))
            assert reps.nunique() == 1 and len(reps.iloc[0]) >= stats.MIN_PAIRED_REPS
            assert g.status.nunique() == 1 and g.status.iloc[0] in ("ok", "unstable")
            assert g.groupby("rep").warmup_drift.nunique().eq(1).all()  # a repetition is dropped from every arm
        assert (df[df.variant == "sync"].syncs_per_forward == 2).all()  # one guard sync per layer
        meta_text = p.with_name(p.stem + ".meta.json").read_text()
        meta = json.loads(meta_text)
        assert str(out) not in meta_text and "out" not in meta["params"]  # no machine paths
        assert {"dirty", "driver", "gpu_state", "gpu_state_end", "methods", "points", "session"} <= set(meta)
        assert meta["methods"]["paired"] == stats.METHOD_BOOT and meta["methods"]["median"] == stats.METHOD_MEDIAN
        assert len(meta["points"]) == 4 and all(pt["status"] in ("ok", "unstable") for pt in meta["points"])
    rec = load_guards(out)
    assert rec.sessions == ["s1", "s2"] and rec.checked
    per = rec.paired(by_session=True)
    p = rec.paired()
    assert len(p) == 4 and len(per) == 8
    for r in p[p.stable & (p.sessions == 2)].itertuples():  # the pooled figure is between_sessions of the two
        a = per[(per.tokens == r.tokens) & (per.active == r.active)].sort_values("session")
        want = stats.between_sessions(*[(x.us_per_sync, x.us_per_sync_lo95, x.us_per_sync_hi95)
                                        for x in a.itertuples()])
        assert np.isclose(r.us_per_sync, want["estimate"]) and r.agree == want["agree"]
        assert r.us_per_sync_lo95 == want["lo"] and r.us_per_sync_hi95 == want["hi"]


def test_a_session_is_recorded_once_and_bad_arguments_are_refused(script, two_sessions, capsys):
    out, _ = two_sessions
    with pytest.raises(SystemExit, match="exists"):
        script.main(["--dry", "--out", str(out), "--session", "s1"])
    for bad in (["--reps", "5"], ["--session", "../x"], ["--warmup", "0"], ["--max-reps", "12", "--reps", "16"],
                ["--active", "1.5"]):
        with pytest.raises(SystemExit):
            script.parse(bad)
    assert "at least 10 paired repetitions" in capsys.readouterr().err
    assert script.gpu_tag("NVIDIA H200") == "h200" and script.gpu_tag("cpu") == "cpu"
