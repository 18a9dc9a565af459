"""The TP emulation as recorded: the summaries are what the method computes from the sessions, the
all-reduce cost what its fit gives on the recorded TP=2 traces."""
import json

import numpy as np
import pandas as pd
import pytest

from lora_moe_lab.provenance import catalog
from lora_moe_lab.sim import tp_emulation as E
from studies.tp_emulation import read


def _same(a: pd.DataFrame, b: pd.DataFrame):
    assert list(a.columns) == list(b.columns) and len(a) == len(b)
    for c in b.columns:
        if b[c].dtype.kind in "fi":
            assert np.allclose(a[c].astype(float), b[c].astype(float), equal_nan=True), c
        else:
            assert (a[c].astype(str) == b[c].astype(str)).all(), c


def test_the_summaries_are_what_the_sessions_give():
    s = read.sessions()
    assert list(s) == ["s1", "s2"]
    _same(E.tp2_validation(s), read.validation())
    _same(E.tp4_prediction(s), read.prediction())


def test_fit_reproduces_the_recorded_allreduce_cost():
    traces = [p for p in catalog("production.traces") if "_tp2_" in p.name and "rank" in p.name]
    cost, info = E.fit_allreduce(traces, hidden=2048)
    rec = json.loads(catalog("tp_emulation.allreduce").read_text())
    assert cost.bus_gbps == pytest.approx(rec["bus_gbps"], rel=1e-9)
    assert E.allreduce_cost().bus_gbps == pytest.approx(rec["bus_gbps"])
    assert info["nbytes"] == 16384 * 2048 * 2 and info["size"] == 2
    assert len(info["traces"]) == sum("_cpu_flag_" in p.name for p in traces)  # sync traces are left out
    with pytest.raises(ValueError, match="no cpu_flag TP trace"):
        E.fit_allreduce([p for p in traces if "_sync_" in p.name], hidden=2048)
