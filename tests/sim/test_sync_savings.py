"""The audit's replay estimate on a recorded-shape trace (tests/fixtures: 4 layers, one sync each):
one site's syncs removed saves a quarter of removing all, a site with no sync is not estimated."""

import numpy as np
import pytest

from lora_moe_lab.instruments.recorders import audit as A
from lora_moe_lab.instruments.analysers import trace as T
from lora_moe_lab.sim import replay_transforms as RT
from lora_moe_lab.sim import sync_savings as SS
from lora_moe_lab.sim.replay import GraphError, build_graph, replay

FIX = "tests/fixtures/model_sync_L4.json.gz"


@pytest.fixture(scope="module")
def tables():
    import os

    return T.load_trace(os.path.join(os.path.dirname(__file__), "..", "fixtures", "model_sync_L4.json.gz"))


def test_per_site_saving_and_total(tables):
    a = tables.annotations
    f0 = tables.forwards.sort_values("start_ns").iloc[0]
    la = a[a["name"].str.startswith("moe_layer") & (a["start_ns"] < f0["end_ns"])]
    r = list(zip(la["start_ns"].astype(int), la["end_ns"].astype(int)))
    out, total, note = SS.estimate(tables, {"all": r, "first": r[:1], "none": [(0, 1)]})
    g = build_graph(tables, 0)
    every = replay(g).step_ns[0] - replay(RT.remove_syncs(g, which="all")).step_ns[0]
    assert out["all"] == total == every > 0
    assert 0 < out["first"] < out["all"] and out["none"] is None and "replay" in note


def test_remove_syncs_calls_are_checked(tables):
    g = build_graph(tables, 0)
    not_sync = int(np.nonzero(g.host["kind"] != 1)[0][0])
    with pytest.raises(GraphError, match="indices of sync calls"):
        RT.remove_syncs(g, which="all", calls=[not_sync])
    with pytest.raises(GraphError, match="which='all'"):
        RT.remove_syncs(g, calls=[0])


def test_the_priced_audit_hands_the_replay_estimator_down():
    """No registry: the library audit prices nothing unless handed an estimator; lora_moe_lab.audit hands the
    replay's (so no import of the audit's layer points up to sim/)."""
    import inspect

    from lora_moe_lab import audit as face

    assert inspect.signature(face.audit).parameters["estimator"].default is SS.estimate
    assert inspect.signature(A.audit).parameters["estimator"].default is None
    assert not hasattr(A, "set_saving_estimator")
