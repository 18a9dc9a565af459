"""Figure builders of notebook 06: axis titles, error bars, the extrapolated bars, and the
per-rank timeline (alignment, window, named errors)."""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lora_moe_lab.instruments.analysers import trace as T
from lora_moe_lab.ui import production_plots as pp

FIX = Path(__file__).resolve().parents[1] / "fixtures"


def _summary():
    return pd.DataFrame([dict(tp=tp, chunk=16384, adapters="none", guard=g, y=v, lo=v - 1, hi=v + 2)
                         for tp in (1, 2) for g, v in (("sync", 7.0), ("launch_always", 0.2))])


def test_guard_bars():
    ex = pd.DataFrame(dict(config=["TP=4 EXTRAPOLATED"], g=[15.0]))
    fig = pp.guard_bars(_summary(), "y", lo="lo", hi="hi", reference=14.4, extrapolated=ex, extrapolated_y="g",
                        title="t", yaxis_title="gain (%)")
    assert fig.layout.xaxis.title.text and fig.layout.yaxis.title.text == "gain (%)"
    sync = next(t for t in fig.data if t.name == "sync")
    assert list(sync.x) == ["TP=1 · C=16384 · none", "TP=2 · C=16384 · none"]
    assert list(sync.error_y.array) == [2.0, 2.0] and list(sync.error_y.arrayminus) == [1.0, 1.0]
    assert any("EXTRAPOLATED" in t.name for t in fig.data)


def test_rank_timeline_aligns_and_windows():
    t = T.load_trace(FIX / "model_sync_L4.json.gz")
    fig = pp.rank_timeline({0: t, 1: t}, align="clock")
    assert fig.layout.xaxis.title.text and fig.layout.yaxis.title.text
    lanes = {tr.y[0] for tr in fig.data}
    assert {"rank 0 · GPU", "rank 1 · GPU", "rank 0 · GPU idle"} <= lanes
    k0 = next(tr for tr in fig.data if tr.y[0] == "rank 0 · GPU" and tr.name == "kernel")
    k1 = next(tr for tr in fig.data if tr.y[0] == "rank 1 · GPU" and tr.name == "kernel")
    assert np.allclose(np.asarray(k0.base, float), np.asarray(k1.base, float))  # same trace, same place
    w = pp.rank_timeline({0: t}, window_us=(0, 50))
    kw = next(tr for tr in w.data if tr.name == "kernel")
    assert float(np.min(kw.base)) <= 50 and list(w.layout.xaxis.range) == [0, 50]
    with pytest.raises(ValueError, match="align"):
        pp.rank_timeline({0: t}, align="nope")
    with pytest.raises(ValueError, match="no traces"):
        pp.rank_timeline({})


def test_signature_along_forward_keeps_quantities_apart():
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "fixtures"))
    from synth_traces import model_trace

    from lora_moe_lab.instruments.analysers import signature as S
    from lora_moe_lab.sim import PRODUCTION_SIGNATURE

    s = S.per_sync(T.load_trace(model_trace("sync")[0])).assign(label="synthetic")
    fig = pp.signature_along_forward(s, production=PRODUCTION_SIGNATURE)
    names = [tr.name for tr in fig.data]
    assert "synthetic: host blocked" in names and "synthetic: GPU idle after" in names
    prod = [tr for tr in fig.data if tr.name.startswith("production")]
    assert prod and all(tr.yaxis in (None, "y") for tr in prod)  # production's figures: host panel only
    assert fig.layout.title.text and fig.layout.xaxis2.title.text and fig.layout.yaxis.title.text
