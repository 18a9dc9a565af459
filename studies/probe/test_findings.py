"""The probe study's recordings as recorded: freshly started H200s and H100s with their hosts, every session's
lean-host gain predicted without its own points (and without its own GPU model's) within the goal."""
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


def test_each_gpu_model_predicted_without_its_own_points_within_the_goal():
    # the saving relation, fitted with no point of the session's GPU model, predicts every session within the goal;
    # the lead relation cannot be fitted across models (one model's leads span too little to give a slope)
    v = read.validation()
    by_gpu = v[(v["left_out"] == "gpu") & (v["relation"] == "saving")]
    assert by_gpu["gpu"].nunique() >= 2 and len(by_gpu) >= 5
    assert by_gpu["within_goal"].all() and (by_gpu["error_pp"].abs() <= H.GOAL_PP).all(), by_gpu
    assert all(s not in f.split(", ") for s, f in zip(v["session"], v["fitted_on"]))  # none predicts itself
    for _, r in by_gpu.iterrows():  # nor any session of its own model
        own = set(v.loc[v["gpu"] == r["gpu"], "session"])
        assert not own & set(r["fitted_on"].split(", ")), r


def test_within_a_gpu_model_the_lead_relation_holds_the_goal():
    v = read.validation()
    by_session = v[(v["left_out"] == "session") & (v["relation"] == "lead")]
    assert len(by_session) >= 5 and (by_session["error_pp"].abs() <= H.GOAL_PP).all(), by_session


def test_the_written_tables_are_the_recordings_read_now():
    import pandas as pd

    pd.testing.assert_frame_equal(pd.read_csv(catalog("probe.points")), read.points(), check_dtype=False)
    w = pd.read_csv(catalog("probe.points").with_name("validation.csv"))
    w["fitted_on"] = w["fitted_on"].fillna("")  # a relation that could not be fitted names no session
    pd.testing.assert_frame_equal(w, read.validation(), check_dtype=False)
