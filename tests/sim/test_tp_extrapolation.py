"""TP=4 extrapolation from measured TP=1 / TP=2 summaries: every row labelled extrapolated, the
arithmetic of the gain and the TTFT change, rank shapes."""
import pandas as pd
import pytest

from lora_moe_lab.sim.cost import CostModel
from lora_moe_lab.sim.tp import extrapolate_tp, fitted_params, rank_shape


def _summary(stalls):
    rows = []
    for tp, (F, s) in stalls.items():
        for guard, fwd, n in (("sync", F + 260 * s, 260.0), ("cpu_flag", F, 0.0)):
            rows.append(dict(tp=tp, chunk=16384, guard_sites=260 / 48, adapters="none", layers=48, guard=guard,
                             syncs_per_forward=n, forward_median_ms=fwd))
    return pd.DataFrame(rows)


def test_rank_shape_splits_heads_and_intermediate():
    s = rank_shape(4)
    assert (s.intermediate, s.num_heads, s.num_kv_heads, s.num_layers) == (192, 8, 1, 48)
    with pytest.raises(ValueError, match="does not split"):
        rank_shape(5)


def test_extrapolation_rows():
    ex = extrapolate_tp(_summary({1: (370.0, 0.08), 2: (240.0, 0.14)}), params=CostModel())
    assert (ex["kind"] == "extrapolated").all()
    assert list(ex["method"]) == ["cost model", "cost model"] and list(ex["source_tp"]) == [1, 2]
    r = ex.iloc[1]
    assert r["stall_ms_per_sync"] == pytest.approx(0.14)
    gain = 100 * 260 * r["stall_ms_per_sync_tp4"] / r["forward_ms_tp4"]
    assert r["throughput_gain_pct"] == pytest.approx(gain)
    assert r["ttft_change_pct"] == pytest.approx(100 * (1 / (1 + gain / 100) - 1))
    assert 0 < r["forward_ms_tp4"] < r["forward_ms"]  # a quarter of the work per rank is less than half


def test_no_pair_no_row_and_fitted_params():
    one = _summary({2: (240.0, 0.14)})
    assert extrapolate_tp(one[one["guard"] == "sync"]).empty
    assert fitted_params().launch_us > 0
