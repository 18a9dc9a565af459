"""HTA-style idle breakdown and the per-layer trace diff (instruments/analysers/idle.py, ui/idle_plots.py),
on the synthetic fixtures (exact ns from tests/fixtures/synth_traces.py) and one recorded pair."""
import copy
import importlib.util
import os

import pytest

from lora_moe_lab.instruments.analysers import idle as I
from lora_moe_lab.instruments.analysers import trace as T
from lora_moe_lab.ui import idle_plots as P

HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
FIX = os.path.join(HERE, "fixtures")
TRACES = os.path.join(os.path.dirname(HERE), "data", "traces")
_spec = importlib.util.spec_from_file_location("synth_traces", os.path.join(FIX, "synth_traces.py"))
S = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(S)
B = S.BASE_NS
# model_trace's defaults: the GPU waits, after each sync, for the sync to return (1500 ns after
# the copy), the host's gap before its next call (1009) and the launch latency (2001)
AFTER_SYNC_GAP = 1500 + 1009 + 2001
K2K = 601  # model_trace's gap between two queued ops


@pytest.fixture(scope="module")
def hand():
    return T.load_trace(os.path.join(FIX, "hand.json.gz"))


@pytest.fixture(scope="module")
def sync4():
    return T.load_trace(os.path.join(FIX, "model_sync_L4.json.gz"))


@pytest.fixture(scope="module")
def flag4():
    return T.load_trace(os.path.join(FIX, "model_cpu_flag_L4.json.gz"))


def test_mapping_covers_our_categories():
    assert set(I.OURS_TO_HTA) == set(T.GAP_CATEGORIES)


def test_hand_gaps_hta(hand):
    g = I.stream_gaps(hand, kernel_wait_ns=300)
    got = [(r.forward, r.stream, r.start_ns - B, r.dur_ns, r.hta_category) for r in g.itertuples()]
    assert got == [(0, 7, 16000, 500, "other"), (0, 7, 21500, 200, "kernel_wait"),
                   (0, 7, 22701, 32299, "after_sync"), (0, 7, 75000, 9003, "host_wait"),
                   (1, 7, 216000, 500, "other"), (1, 7, 221500, 33500, "host_wait"),
                   (1, 7, 275000, 9003, "host_wait")]
    s = I.hta_idle_breakdown(hand, kernel_wait_ns=300).streams
    assert s[["after_sync_ns", "host_wait_ns", "kernel_wait_ns", "other_ns"]].values.tolist() == \
        [[32299, 9003, 200, 500], [0, 42503, 0, 500]]


@pytest.mark.parametrize("name", ["hand", "model_sync_L4", "model_cpu_flag_L4"])
@pytest.mark.parametrize("thr", [0, 30, 601, 602, 10**9])
def test_categories_sum_to_idle(name, thr):
    t = T.load_trace(os.path.join(FIX, f"{name}.json.gz"))
    b = I.hta_idle_breakdown(t, kernel_wait_ns=thr)
    cats = [f"{c}_ns" for c in I.HTA_CATEGORIES]
    for df in (b.streams, b.forwards):
        assert (df[cats].sum(axis=1) == df["idle_ns"]).all()
        assert str(df["idle_ns"].dtype) == "int64"
    # one stream: the per-stream idle is the device idle of forward_metrics, to the ns
    m = T.forward_metrics(t)
    assert b.forwards["idle_ns"].tolist() == m["idle_ns"].tolist()
    assert b.forwards["n_gaps"].tolist() == m["n_gaps"].tolist()


def test_model_fixture_exact(sync4, flag4):
    _, expected = S.model_trace("sync")
    b = I.hta_idle_breakdown(sync4, kernel_wait_ns=K2K + 1)
    for row, e in zip(b.forwards.itertuples(), expected):
        assert row.after_sync_ns == e["idle"]["after_sync"] == 4 * AFTER_SYNC_GAP
        assert row.kernel_wait_ns == e["idle"]["kernel_to_kernel"] == 23 * K2K
        assert row.host_wait_ns == row.other_ns == 0
    f = I.hta_idle_breakdown(flag4, kernel_wait_ns=K2K + 1).forwards
    assert f["after_sync_ns"].tolist() == [0, 0] and f["kernel_wait_ns"].tolist() == [23 * K2K] * 2


def test_threshold_moves_queued_gaps(sync4):
    """A queued gap of 601 ns is kernel wait under a 602 ns threshold, other under 601 (strict <);
    after-sync gaps never move."""
    lo = I.hta_idle_breakdown(sync4, kernel_wait_ns=K2K).forwards
    hi = I.hta_idle_breakdown(sync4, kernel_wait_ns=K2K + 1).forwards
    assert lo["kernel_wait_ns"].tolist() == [0, 0] and lo["other_ns"].tolist() == [23 * K2K] * 2
    assert hi["kernel_wait_ns"].tolist() == [23 * K2K] * 2 and hi["other_ns"].tolist() == [0, 0]
    assert lo["after_sync_ns"].tolist() == hi["after_sync_ns"].tolist() == [4 * AFTER_SYNC_GAP] * 2


def _two_streams():
    """The hand trace with K3 and K4 moved to stream 9."""
    doc = copy.deepcopy(S.hand_trace())
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel" and e["name"] in ("K3", "K4"):
            e["tid"] = e["args"]["stream"] = 9
    return T.load_trace(doc)


def test_threshold_per_stream():
    t = _two_streams()
    s = I.hta_idle_breakdown(t, kernel_wait_ns={7: 300, 9: 10_000}).streams
    f0 = s[s["forward"] == 0].set_index("stream")
    # stream 7: K1 -500- K2 -200- copy; stream 9: K3 -9003- K4 (the copy->K3 gap crosses streams)
    assert f0.loc[7, ["kernel_wait_ns", "other_ns", "threshold_ns"]].tolist() == [200, 500, 300]
    assert f0.loc[9, ["host_wait_ns", "kernel_wait_ns", "threshold_ns"]].tolist() == [9003, 0, 10_000]
    both = I.hta_idle_breakdown(t, kernel_wait_ns={7: 600, 9: 0}).streams
    assert both.set_index(["forward", "stream"]).loc[(0, 7), "kernel_wait_ns"] == 700
    with pytest.raises(I.ThresholdError, match="stream"):
        I.hta_idle_breakdown(t, kernel_wait_ns={7: 300})


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "30", None, True, {7: -5}])
def test_bad_threshold(hand, bad):
    with pytest.raises(I.ThresholdError):
        I.hta_idle_breakdown(hand, kernel_wait_ns=bad)


def test_diff_of_fixtures(sync4, flag4):
    d = I.trace_diff(sync4, flag4, names=("sync", "cpu_flag"))
    assert len(d) == 8 and d.attrs["names"] == ("sync", "cpu_flag")
    assert d["layer_index"].tolist() == [0, 1, 2, 3] * 2
    assert d["added_idle_ns"].tolist() == [AFTER_SYNC_GAP] * 8
    assert d["after_sync_ns_a"].tolist() == [AFTER_SYNC_GAP] * 8
    # layer 0 has no gap before its first op; later layers open with one queued gap
    assert d["idle_ns_a"].tolist() == [AFTER_SYNC_GAP + 5 * K2K] + [AFTER_SYNC_GAP + 6 * K2K] * 3 \
        + [AFTER_SYNC_GAP + 5 * K2K] + [AFTER_SYNC_GAP + 6 * K2K] * 3
    assert d["idle_ns_b"].tolist() == ([5 * K2K] + [6 * K2K] * 3) * 2
    assert d["n_syncs_a"].tolist() == [1] * 8 and d["n_syncs_b"].tolist() == [0] * 8
    assert d["sync_to_launch_ns_a"].tolist() == [1009] * 8  # model_trace's host_gap_ns
    one = I.trace_diff(sync4, flag4, forward=1)
    assert one["forward"].tolist() == [1] * 4 and one["added_idle_ns"].tolist() == [AFTER_SYNC_GAP] * 4


def test_sync_launch_gaps(sync4):
    s = I.sync_launch_gaps(sync4)
    assert len(s) == 8 and s["host_ns"].tolist() == [1009] * 8
    assert s["layer"].tolist() == [f"moe_layer_{i}" for i in range(4)] * 2
    assert (s["next_launch_name"] == "cudaLaunchKernel").all()


def test_diff_mismatch_errors(sync4):
    three = T.load_trace(S.model_trace("cpu_flag", n_layers=3)[0])
    with pytest.raises(I.LayerMismatchError, match="4 layers.*3"):
        I.trace_diff(sync4, three)
    one_fwd = T.load_trace(S.model_trace("cpu_flag", n_forwards=1)[0])
    with pytest.raises(I.LayerMismatchError, match="forwards"):
        I.trace_diff(sync4, one_fwd)
    assert len(I.trace_diff(sync4, one_fwd, forward=0)) == 4
    with pytest.raises(I.LayerMismatchError, match="no layer"):
        I.trace_diff(sync4, sync4, layer_pattern=r"attn_\d+$")


def test_figures(sync4, flag4):
    fig = P.trace_diff_figure(I.trace_diff(sync4, flag4, names=("sync", "cpu_flag")))
    axes = [k for k in fig.layout if k.startswith(("xaxis", "yaxis"))]
    assert len(axes) == 6 and all(fig.layout[k].title.text for k in axes)
    f2 = P.hta_idle_figure(I.hta_idle_breakdown(sync4, kernel_wait_ns=700).streams)
    assert f2.layout.xaxis.title.text and f2.layout.yaxis.title.text
    assert [t.name for t in f2.data] == ["after sync", "host wait", "kernel wait", "other"]


def test_recorded_pair_sync_adds_idle_every_layer():
    a = os.path.join(TRACES, "qwen3-30b-a3b_sync_eager_M4096.json.gz")
    b = os.path.join(TRACES, "qwen3-30b-a3b_cpu_flag_eager_M4096.json.gz")
    if not (os.path.exists(a) and os.path.exists(b)):
        pytest.skip("recorded H200 traces not present")
    d = I.trace_diff(a, b, names=("sync", "cpu_flag"))
    assert d["layer_index"].nunique() == 8
    assert (d["added_idle_ns"] > 0).all()
    assert (d["n_syncs_a"] == 1).all() and (d["n_syncs_b"] == 0).all()
    assert (d["sync_to_launch_ns_a"] > 0).all()
