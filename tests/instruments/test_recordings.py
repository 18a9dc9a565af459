"""The canonical guards recording: the median's distribution-free interval, paired differences per
repetition, the sweep view the simulator reads, and clear errors for a file of another schema."""
import math

import numpy as np
import pandas as pd
import pytest

from lora_moe_lab.instruments.recordings import SAMPLE_COLUMNS, load_guards, median_ci


def test_median_ci_order_statistics():
    x = np.arange(1.0, 16.0)  # n = 15: the 95 % interval of the median is [x(4), x(12)]
    med, lo, hi = median_ci(np.random.default_rng(0).permutation(x))
    assert (med, lo, hi) == (8.0, 4.0, 12.0)
    assert median_ci([1.0, 2.0, 3.0])[1] == -math.inf  # too few samples for 95 %: unbounded, not a lie
    assert math.isnan(median_ci([])[0])


def _write(tmp_path, reps=11, base=1000.0, lost=48 * 40.0):
    rng = np.random.default_rng(1)
    rows = []
    for M in (16, 4096):
        for rep in range(reps):
            noise = rng.normal(0, 20.0)  # shared by the repetition: the pairing cancels it
            for v, t, syncs in (("sync", base + lost, 48), ("cpu_flag", base, 0), ("graph", base * 0.8, 0)):
                rows.append(dict(preset="tiny", layers=48, tokens=M, active=0.0, variant=v,
                                 guard="cpu_flag" if v == "graph" else v, mode="graph" if v == "graph" else "eager",
                                 rep=rep, us=t + noise + rng.normal(0, 1.0), syncs_per_forward=syncs))
    p = tmp_path / "g.csv"
    pd.DataFrame(rows, columns=SAMPLE_COLUMNS).to_csv(p, index=False)
    (tmp_path / "g.meta.json").write_text('{"gpu": "NVIDIA H200", "git_commit": "abcdef0123", "date_utc": "2026-11-30"}')
    return p


def test_paired_lost_per_sync_and_labels(tmp_path):
    rec = load_guards(_write(tmp_path))
    assert rec.label == "H200 · commit abcdef0 · 2026-11-30"
    p = rec.paired("sync", "cpu_flag")
    assert len(p) == 2 and (p["n"] == 11).all()
    assert np.allclose(p["us_per_sync"], 40.0, atol=0.5)  # 40 us per sync, noise paired away
    assert (p["lost_lo95_us"] < p["lost_us"]).all() and (p["lost_us"] < p["lost_hi95_us"]).all()
    assert (p["lost_hi95_us"] - p["lost_lo95_us"] < 10.0).all()  # the shared noise (sd 20) cancels
    s = rec.summary()
    assert set(s["variant"]) == {"sync", "cpu_flag", "graph"} and (s["lo95_us"] <= s["median_us"]).all()
    sw = rec.as_sweep()
    assert set(sw["mode"]) == {"eager", "graph"} and (sw["gpu"] == "NVIDIA H200").all()


def test_wrong_schema_and_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="gpu_side_by_side"):
        load_guards(tmp_path / "none.csv")
    bad = tmp_path / "bad.csv"
    pd.DataFrame(dict(preset=["tiny"], median_us=[1.0])).to_csv(bad, index=False)
    with pytest.raises(ValueError, match="not a guards recording"):
        load_guards(bad)
