"""The probe study's recordings as recorded: three freshly started H200s with their hosts, every session's
lean-host gain predicted from the others within the goal."""
import json

from lora_moe_lab.instruments.analysers import host_lead as H
from lora_moe_lab.provenance import catalog
from studies.probe import read


def test_three_fresh_machines_each_naming_its_host():
    files = catalog("probe.sessions")
    assert len(files) >= 3
    metas = [json.loads(p.with_name(p.name.replace(".csv", ".meta.json")).read_text()) for p in files]
    assert all(m["host"]["cpu_model"] and m["host"]["cores"] and m["host"]["python_build"] for m in metas)
    assert len({m["date"] for m in metas}) == len(metas)  # one call each: a machine started for it


def test_every_session_within_the_goal_left_out_of_its_own_fit():
    v = read.validation()
    assert len(v) >= 5 and v["within_goal"].all() and (v["error_pp"].abs() <= H.GOAL_PP).all()
    assert all(s not in f for s, f in zip(v["session"], v["fitted_on"]))


def test_the_written_tables_are_the_recordings_read_now():
    import pandas as pd

    pd.testing.assert_frame_equal(pd.read_csv(catalog("probe.points")), read.points(), check_dtype=False)
    w = pd.read_csv(catalog("probe.points").with_name("validation.csv"))
    pd.testing.assert_frame_equal(w, read.validation(), check_dtype=False)
