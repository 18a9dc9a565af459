"""The per-sync signature on hand-made traces with known answers."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "fixtures"))
from synth_traces import hand_trace, model_trace  # noqa: E402

from lora_moe_lab.instruments.analysers import signature as S, trace as T
from lora_moe_lab.model.guards import SyncEvent


def test_hand_trace_per_sync_known_answer():
    s = S.per_sync(T.load_trace(hand_trace()))
    assert len(s) == 1  # forward 1 has no sync
    r = s.iloc[0]
    assert r.host_blocked_us == pytest.approx(11.5)  # cudaStreamSynchronize 12000-23500 ns
    assert r.lead_us == pytest.approx(10.701)  # the copy launched before it ends at 22701
    # the queue drained at 22701: K3 starts at 55000 (after the sync, 32.299 us), K4 waits for its
    # launch at 80000 (75000 -> 84003, 9.003 us); the gaps before the drain are not the sync's
    assert r.idle_after_sync_us == pytest.approx(32.299) and r.idle_host_launch_wait_us == pytest.approx(9.003)
    assert r.idle_after_us == pytest.approx(41.302)


def test_model_trace_first_and_later_syncs():
    doc, expected = model_trace("sync", n_forwards=2, n_layers=4)
    f = S.per_forward(T.load_trace(doc))
    assert list(f["n_syncs"]) == [e["n_syncs"] for e in expected] == [4, 4]
    assert (f["host_blocked_ms"] > 0).all() and (f["first_share"] < 0.5).all()
    assert f["nccl_ms"].eq(0).all()
    # every idle ns after a sync in the simulated trace is counted once
    s = S.per_sync(T.load_trace(doc))
    assert s.groupby("forward")["idle_after_sync_us"].sum().to_numpy() * 1e3 == pytest.approx(
        [e["idle"]["after_sync"] for e in expected])


def test_cpu_flag_trace_has_no_signature():
    doc, _ = model_trace("cpu_flag")
    assert S.per_sync(T.load_trace(doc)).empty


def test_from_sync_events_skips_the_first_forward():
    ev = [SyncEvent("sync", "guards.py:1", int(b * 1e3)) for b in [5, 1, 1, 70_000, 100, 120, 70_000, 110, 130]]
    r = S.from_sync_events(ev, forwards=3)
    assert r["first_blocked_ms"] == pytest.approx(70.0)
    assert r["later_blocked_median_us"] == pytest.approx(115.0)
    assert r["first_share"] == pytest.approx(70_000 / 70_230, rel=1e-3)
    assert np.isnan(S.from_sync_events(ev[:-1], forwards=3)["first_blocked_ms"])  # unequal forwards


def test_host_cost_for_lead_known_answer():
    # first sync (ignored), then pairs: one after host work (1000 us) and one back to back (20 us)
    b = [5000] + [1000, 20] * 10
    w = [True] + [True, False] * 10
    h = S.host_cost_for_lead(b, w, target_us=116.0)
    # mean = (max(20, 1000 - h) + 20) / 2 = 116  ->  h = 788
    assert h == pytest.approx(788.0, abs=0.01)
    assert S.host_cost_for_lead(b, w, target_us=600.0) == 0.0  # already below the target
    with pytest.raises(ValueError, match="floor"):
        S.host_cost_for_lead(b, w, target_us=10.0)
    with pytest.raises(ValueError, match="one flag per sync"):
        S.host_cost_for_lead(b, w[:-1], 116.0)
