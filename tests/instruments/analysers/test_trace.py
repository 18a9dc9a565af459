"""Trace parsing at ns precision, GPU idle-gap causes, per-forward/per-layer figures, queue depth,
Perfetto export; synthetic traces (tests/fixtures/synth_traces.py) on CPU, recorded GPU traces
(data/traces/*.json.gz, when present) in test_recorded_traces."""
import glob
import gzip
import importlib.util
import json
import os

import pandas as pd
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lora_moe_lab.instruments.analysers import trace as T
from lora_moe_lab.instruments.recorders.profiling import profile_forwards

HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
FIX = os.path.join(HERE, "fixtures")
ROOT = os.path.dirname(HERE)
_spec = importlib.util.spec_from_file_location("synth_traces", os.path.join(FIX, "synth_traces.py"))
S = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(S)
B = S.BASE_NS


# --- numbers -------------------------------------------------------------------------------
@pytest.mark.parametrize("value,ns", [
    (1000.001, 1000001), ("1000.001", 1000001), (1000, 1000000), (0.5, 500), ("0", 0),
    ("8878094115914.390", 8878094115914390), ("5095161153357.415", 5095161153357415),
    ("1e-3", 1), ("1.5E2", 150000), ("-2.25", -2250),
    ("0.0015", 2), ("0.0025", 2), ("0.00251", 3), ("7.0004999", 7000),  # below 1 ns: half-even
])
def test_to_ns_exact(value, ns):
    assert T.to_ns(value) == ns


def test_float_arithmetic_would_drift():
    """Why the parser reads decimal text: the naive conversion is a nanosecond off here."""
    assert round(float(S.BASE_TEXT) * 1000) != S.BASE_NS
    doc = json.loads('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, '
                     f'"tid": 7, "ts": {S.BASE_TEXT}, "dur": 0.001, "args": {{}}}}]}}',
                     parse_float=T.RawFloat)
    t = T.load_trace(doc)
    assert t.kernels["start_ns"].tolist() == [S.BASE_NS] and t.kernels["dur_ns"].tolist() == [1]


def test_fmt_roundtrip():
    for ns in (0, 1, 999, 1000, 1001, S.BASE_NS, -1, -1500):
        assert T.to_ns(T.fmt_us(ns)) == ns
    with pytest.raises(TypeError):
        T.to_ns(True)
    with pytest.raises(ValueError):
        T.to_ns("nan")


# --- the hand-made trace ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def hand():
    return T.load_trace(os.path.join(FIX, "hand.json.gz"))


def test_fixtures_match_generator(tmp_path):
    """The committed fixtures are exactly what the generator writes (regenerate with
    `python tests/fixtures/synth_traces.py`)."""
    for p in S.write_fixtures(str(tmp_path)):
        name = os.path.basename(p)
        with open(p, "rb") as a, open(os.path.join(FIX, name), "rb") as b:
            assert a.read() == b.read(), name


def test_hand_tables(hand):
    k = hand.kernels
    assert list(k["name"]) == ["K1", "K2", "Memcpy DtoH (Device -> Pinned)", "K3", "K4",
                               "K1", "K2", "K3", "K4"]
    assert list(k["start_ns"] - B) == [6000, 16500, 21700, 55000, 84003,
                                       206000, 216500, 255000, 284003]
    assert list(k["dur_ns"]) == [10000, 5000, 1001, 20000, 1001, 10000, 5000, 20000, 1001]
    assert list(k["forward"]) == [0, 0, 0, 0, 0, 1, 1, 1, 1]
    # K1 has no 'correlation' arg: linked to its launch through the ac2g flow events
    assert k.loc[0, "launch_name"] == "cudaLaunchKernel" and k.loc[0, "launch_start_ns"] == B + 2000
    assert k.loc[0, "launch_end_ns"] == B + 5001
    assert k.loc[3, "launch_name"] == "cuLaunchKernel"  # driver API (Triton's launches)
    assert list(hand.memcpys["direction"]) == ["DtoH"] and list(hand.memcpys["bytes"]) == [4]
    # one sync: the runtime call and its cuda_sync record are merged, not counted twice
    s = hand.syncs
    assert len(s) == 1 and s.loc[0, "name"] == "cudaStreamSynchronize"
    assert s.loc[0, "kind"] == "Stream Sync" and s.loc[0, "forward"] == 0
    assert (s.loc[0, "start_ns"] - B, s.loc[0, "dur_ns"]) == (12000, 11500)
    assert list(hand.forwards["start_ns"] - B) == [0, 200000]
    assert len(hand.annotations) == 6 and len(hand.gpu_annotations) == 1 and len(hand.cpu_ops) == 1
    assert int(hand.runtime["is_sync"].sum()) == 1


def test_hand_gaps(hand):
    g = T.idle_gaps(hand)
    got = [(r.forward, r.start_ns - B, r.dur_ns, r.category, r.layer) for r in g.itertuples()]
    assert got == [
        (0, 16000, 500, "kernel_to_kernel", "moe_layer_0"),
        (0, 21500, 200, "kernel_to_kernel", "moe_layer_0"),
        (0, 22701, 32299, "after_sync", "moe_layer_1"),  # the host was blocked in the sync
        (0, 75000, 9003, "host_launch_wait", "moe_layer_1"),
        (1, 216000, 500, "kernel_to_kernel", "moe_layer_0"),
        (1, 221500, 33500, "host_launch_wait", "moe_layer_1"),  # same gap, no sync: host wait
        (1, 275000, 9003, "host_launch_wait", "moe_layer_1"),
    ]
    assert g.loc[2, "sync_name"] == "cudaStreamSynchronize" and g.loc[2, "sync_end_ns"] == B + 23500
    # a tighter slack does not change it (the sync ended inside the gap)
    assert list(T.idle_gaps(hand, sync_slack_ns=0)["category"]) == list(g["category"])


def test_hand_forward_metrics(hand):
    m = T.forward_metrics(hand).set_index("forward")
    assert list(m["gpu_span_ns"]) == [79004, 79004]
    assert list(m["busy_ns"]) == [37002, 36001]
    assert list(m["idle_ns"]) == [42002, 43003]
    assert list(m["idle_after_sync_ns"]) == [32299, 0]
    assert list(m["idle_host_launch_wait_ns"]) == [9003, 42503]
    assert list(m["idle_kernel_to_kernel_ns"]) == [700, 500]
    assert list(m["n_syncs"]) == [1, 0] and list(m["sync_ns"]) == [11500, 0]
    assert list(m["n_gpu_ops"]) == [5, 4] and list(m["n_kernels"]) == [4, 4]
    assert (m["busy_ns"] + m["idle_ns"] == m["gpu_span_ns"]).all()
    sp = T.syncs_per_forward(hand)
    assert list(sp["n_syncs"]) == [1, 0] and sp.loc[0, "names"] == "cudaStreamSynchronizex1"


def test_hand_layers(hand):
    lb = T.layer_breakdown(hand)
    assert list(zip(lb["forward"], lb["layer"])) == [(0, "moe_layer_0"), (0, "moe_layer_1"),
                                                     (1, "moe_layer_0"), (1, "moe_layer_1")]
    assert list(lb["n_syncs"]) == [1, 0, 0, 0]
    assert list(lb["idle_after_sync_ns"]) == [0, 32299, 0, 0]
    assert list(lb["n_gpu_ops"]) == [3, 2, 2, 2]
    assert list(lb["busy_ns"]) == [16001, 21001, 15000, 21001]
    assert list(lb["layer_index"]) == [0, 1, 0, 1]


def test_hand_queue_depth(hand):
    q = T.queue_depth(hand)
    f0 = q[q["forward"] == 0]
    assert list(zip(f0["time_ns"] - B, f0["depth"])) == [
        (5001, 1), (9000, 2), (12000, 3), (16000, 2), (21500, 1), (22701, 0),
        (54000, 1), (75000, 0), (83000, 1), (85004, 0)]
    assert q["depth"].min() == 0


# --- the simulated model traces --------------------------------------------------------------
def _check_against(doc, expected, **kw):
    t = T.load_trace(doc)
    m = T.forward_metrics(t, **kw).set_index("forward")
    for e in expected:
        row = m.loc[e["forward"]]
        for c, v in e["idle"].items():
            assert row[f"idle_{c}_ns"] == v, (e["forward"], c)
        assert row["n_syncs"] == e["n_syncs"] and row["n_gpu_ops"] == e["n_gpu_ops"]
        assert row["gpu_span_ns"] == e["gpu_span"]
    q = T.queue_depth(t)
    assert int(q["depth"].max()) == max(e["max_queue_depth"] for e in expected)
    return t, m


@pytest.mark.parametrize("guard", ["sync", "cpu_flag"])
@pytest.mark.parametrize("kernel_ns", [7_007, 2_003])  # GPU-bound / launch-bound
def test_model_trace(guard, kernel_ns):
    doc, exp = S.model_trace(guard, n_forwards=3, n_layers=5, kernel_ns=kernel_ns)
    t, m = _check_against(doc, exp)
    assert (m["n_syncs"] == (5 if guard == "sync" else 0)).all()
    assert ((m["idle_after_sync_ns"] > 0) == (guard == "sync")).all()
    if kernel_ns == 2_003:
        assert (m["idle_host_launch_wait_ns"] > 0).all()
    lb = T.layer_breakdown(t)
    assert len(lb) == 15 and (lb["n_syncs"] == (1 if guard == "sync" else 0)).all()


def test_sync_sources():
    """Syncs come from runtime calls, cuda_sync records, or both (merged)."""
    doc, exp = S.model_trace("sync", sync_records=False)
    _check_against(doc, exp)
    doc, exp = S.model_trace("sync")
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("name") != "cudaStreamSynchronize"]
    t, _ = _check_against(doc, exp)
    assert set(t.syncs["source"]) == {"cuda_sync"}
    # a device-side wait between streams is not a host sync
    doc, _ = S.model_trace("cpu_flag", n_forwards=1)
    ev = dict(doc["traceEvents"][-1], cat="cuda_sync", name="Stream Wait Event",
              args={"cuda_sync_kind": "Stream Wait Event"})
    doc["traceEvents"].append(ev)
    assert len(T.load_trace(doc).syncs) == 0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(guard=st.sampled_from(["sync", "cpu_flag"]), n_layers=st.integers(1, 4),
       kpl=st.integers(1, 4), launch=st.integers(1_000, 9_999), kernel=st.integers(500, 20_000),
       gap=st.integers(0, 5_000), k2k=st.integers(0, 2_000))
def test_model_trace_property(guard, n_layers, kpl, launch, kernel, gap, k2k):
    doc, exp = S.model_trace(guard, n_forwards=2, n_layers=n_layers, kernels_per_layer=kpl,
                             launch_ns=launch, kernel_ns=kernel, host_gap_ns=gap, k2k_ns=k2k)
    _check_against(doc, exp)


def test_no_forward_annotations_falls_back():
    doc, _ = S.model_trace("sync", n_forwards=2)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("name") != "forward"]
    t = T.load_trace(doc)  # no forward/step ranges: the whole trace is one forward
    assert len(t.forwards) == 1 and t.forwards.loc[0, "name"] == "<trace>"
    m = T.forward_metrics(t)
    assert m.loc[0, "n_syncs"] == 8 and m.loc[0, "n_gpu_ops"] == 56
    doc2, _ = S.model_trace("sync", n_forwards=2)
    for e in doc2["traceEvents"]:
        if e.get("name") == "forward":
            e["name"] = "ProfilerStep#7"
    assert len(T.load_trace(doc2).forwards) == 2


# --- export ----------------------------------------------------------------------------------
def test_export_roundtrip_exact(hand, tmp_path):
    out = T.export_perfetto(hand, tmp_path / "all.json")
    back = T.load_trace(str(out))
    for name in ("kernels", "runtime", "syncs", "annotations"):
        a, b = getattr(hand, name), getattr(back, name)
        assert a[["start_ns", "end_ns"]].equals(b[["start_ns", "end_ns"]]), name
    assert json.loads(out.read_text())["deviceProperties"][0]["name"] == "Synthetic GPU"


def test_export_trim_to_forwards(tmp_path):
    doc, exp = S.model_trace("sync", n_forwards=4, n_layers=8)
    t = T.load_trace(doc)
    out = T.export_perfetto(t, tmp_path / "two.json.gz", forwards=2, labels={"guard": "sync"})
    with gzip.open(out, "rt") as f:
        raw = json.load(f)
    assert raw["labels"] == {"guard": "sync"}
    assert any(e["ph"] == "M" for e in raw["traceEvents"])
    back = T.load_trace(str(out))
    assert len(back.forwards) == 2 and back.labels == {"guard": "sync"}
    m0 = T.forward_metrics(t).iloc[:2].reset_index(drop=True)
    m1 = T.forward_metrics(back)
    assert m0.equals(m1)
    assert out.stat().st_size < 1_000_000
    # a window in ns, and the size warning
    lo = int(t.forwards.loc[1, "start_ns"])
    hi = int(t.forwards.loc[1, "end_ns"])
    w = T.load_trace(T.trim_doc(t, window=(lo, hi)))
    assert len(w.forwards) == 1
    with pytest.warns(UserWarning, match="bytes"):
        T.export_perfetto(t, tmp_path / "big.json", max_bytes=10)
    with pytest.raises(ValueError):
        T.export_perfetto(t, tmp_path / "none.json", forwards=[99])


def test_flow_events_kept_in_pairs(hand, tmp_path):
    out = T.export_perfetto(hand, tmp_path / "f.json", forwards=[1])
    evs = json.loads(out.read_text())["traceEvents"]
    flows = [e for e in evs if e["ph"] in ("s", "f")]
    assert len(flows) == 2 and {e["id"] for e in flows} == {7}


# --- recording (CPU here; the GPU script uses the same call) ---------------------------------
def _toy_model(x, layers=3):
    with torch.profiler.record_function("forward"):
        for i in range(layers):
            with torch.profiler.record_function(f"moe_layer_{i}"):
                x = torch.relu(x @ x.T)[:, : x.shape[1]]
    return x


@pytest.mark.parametrize("suffix", [".json.gz", ".json"])
def test_profile_forwards(tmp_path, suffix):
    x = torch.randn(16, 16)
    t = profile_forwards(lambda: _toy_model(x), n_warmup=1, n_active=3,
                         path=tmp_path / f"toy{suffix}", labels={"what": "toy"})
    assert os.path.exists(t.path) and t.path.endswith(suffix)
    assert len(t.forwards) == 3 and set(t.forwards["name"]) == {"forward"}
    assert t.labels == {"what": "toy"}
    names = set(t.annotations["name"])
    assert {"moe_layer_0", "moe_layer_2", T.FORWARD_WRAPPER} <= names
    m = T.forward_metrics(t)
    assert len(m) == 3 and (m["host_ns"] > 0).all()
    if not torch.cuda.is_available():
        assert (m["n_gpu_ops"] == 0).all() and (m["idle_ns"] == 0).all()
    assert len(T.layer_breakdown(t)) == 9
    t2 = profile_forwards(lambda: x @ x, n_warmup=0, n_active=2, keep_forwards=1)
    assert len(t2.forwards) == 1 and t2.forwards.loc[0, "name"] == T.FORWARD_WRAPPER


# --- recorded GPU traces (data/traces/, written by studies/traces/record.py) --------------------
RECORDED = sorted(glob.glob(os.path.join(ROOT, "data", "traces", "*.json.gz")))


@pytest.mark.parametrize("path", RECORDED or [None], ids=[os.path.basename(p) for p in RECORDED] or ["none"])
def test_recorded_traces(path):
    if path is None:
        pytest.skip("no recorded traces in data/traces/ (run studies/traces/record.py on a GPU)")
    assert os.path.getsize(path) < 1_000_000
    meta_path = path[: -len(".json.gz")] + ".meta.json"
    with open(meta_path) as f:
        meta = json.load(f)
    for key in ("gpu", "torch", "triton", "commit", "date"):
        assert meta.get(key), key
    params = meta["params"]
    t = T.load_trace(path)
    m = T.forward_metrics(t)
    assert len(m) >= 1 and (m["n_gpu_ops"] > 0).all()
    expected_syncs = params["num_layers"] if params["guard"] == "sync" and params["mode"] == "eager" else 0
    assert (m["n_syncs"] == expected_syncs).all(), m[["forward", "n_syncs"]]
    if params["guard"] == "sync" and params["mode"] == "eager":
        assert (m["idle_after_sync_ns"] > 0).all()
    else:
        assert (m["idle_after_sync_ns"] == 0).all()


# --- plots -----------------------------------------------------------------------------------
def _n_bars(fig):
    return sum(len(tr.x) for tr in fig.data if tr.x is not None)


def test_timeline_small(hand):
    from lora_moe_lab.ui import plots

    fig = plots.timeline(hand)
    names = {tr.name for tr in fig.data}
    assert {"launch call", "host sync (blocked)", "sync returns", "GPU kernel", "GPU memcpy",
            "idle: after_sync", "idle: host_launch_wait", "idle: kernel_to_kernel"} <= names
    lanes = set(fig.layout.yaxis.categoryarray)
    assert {"host: runtime", "GPU 0 stream 7", "GPU idle", "host: forward"} <= lanes
    gpu = [tr for tr in fig.data if tr.name == "GPU kernel"][0]
    assert len(gpu.x) == 8 and "K1" in list(gpu.customdata[:, 0])
    f1 = plots.timeline(hand, forward=1)
    assert "host sync (blocked)" not in {tr.name for tr in f1.data}  # forward 1 has no sync
    fig.to_json()  # serialisable


def test_timeline_big_is_bounded():
    from lora_moe_lab.ui import plots

    doc, _ = S.model_trace("sync", n_forwards=3, n_layers=48, kernels_per_layer=20)
    t = T.load_trace(doc)
    assert len(t.kernels) > 2500
    fig = plots.timeline(t, max_events=20_000)  # everything
    assert _n_bars(fig) > 5000 and len(fig.data) <= 15
    fig = plots.timeline(t, max_events=2000)  # too many: windowed to the first forward ...
    assert len(fig.data) <= 15 and _n_bars(fig) <= 2200
    assert fig.layout.title.text.endswith("forward 0")
    fig = plots.timeline(t, forward=1, max_events=300)  # ... and merged into buckets
    assert _n_bars(fig) <= 400
    assert any("ops (merged)" in str(c) for tr in fig.data if tr.customdata is not None
               for c in tr.customdata[:, 0])


def test_idle_breakdown_and_queue_plot(hand):
    from lora_moe_lab.ui import plots

    m = T.forward_metrics(hand)
    fig = plots.idle_breakdown(m)
    assert [tr.name for tr in fig.data] == ["busy", "idle: after_sync", "idle: host_launch_wait",
                                            "idle: kernel_to_kernel", "idle: other"]
    assert list(fig.data[1].y) == [32.299, 0.0]
    rows = []
    for guard in ("sync", "cpu_flag"):
        doc, _ = S.model_trace(guard, n_forwards=2)
        rows.append({"guard": guard, "M": 16, **T.summarize(T.load_trace(doc))})
    fig = plots.idle_breakdown(pd.DataFrame(rows))
    assert list(fig.data[0].x) == ["sync / 16", "cpu_flag / 16"]
    assert fig.data[1].y[0] > 0 and fig.data[1].y[1] == 0
    q = plots.queue_depth_plot(hand, forward=0)
    assert max(q.data[0].y) == 3


def test_export_drop_categories(hand, tmp_path):
    out = T.export_perfetto(hand, tmp_path / "d.json", drop_cats=["cpu_op"])
    back = T.load_trace(str(out))
    assert len(back.cpu_ops) == 0 and len(back.kernels) == len(hand.kernels)


def test_tables_to_doc_roundtrip(hand, tmp_path):
    """Tables made without a trace (e.g. a simulated timeline) export to a trace Perfetto opens."""
    bare = T.TraceTables(**{f: getattr(hand, f) for f in ("kernels", "runtime", "syncs", "memcpys",
                                                           "annotations", "gpu_annotations",
                                                           "cpu_ops", "forwards")},
                         doc={"labels": {"source": "test"}})
    out = T.export_perfetto(bare, tmp_path / "sim.json.gz")
    back = T.load_trace(str(out))
    assert back.labels == {"source": "test"}
    cols = ["name", "kind", "start_ns", "end_ns", "correlation", "launch_start_ns", "forward"]
    assert back.kernels[cols].equals(hand.kernels[cols])
    assert back.syncs[["name", "start_ns", "end_ns", "kind"]].equals(hand.syncs[["name", "start_ns", "end_ns", "kind"]])
    assert T.forward_metrics(back).equals(T.forward_metrics(hand))


def test_gpu_traces_script_smoke(tmp_path, capsys):
    """studies/traces/record.py end to end on the tiny preset (eager only without a GPU)."""
    pytest.importorskip("lora_moe_lab.model.lab")
    spec = importlib.util.spec_from_file_location("record_traces", os.path.join(ROOT, "studies", "traces", "record.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rc = mod.main(["--out", str(tmp_path), "--preset", "tiny", "--layers", "2", "--tokens", "4",
                   "--guards", "sync", "cpu_flag", "--modes", "eager", "--warmup", "1", "--active", "2",
                   "--dtype", "float32"])
    assert rc == 0
    summary = pd.read_csv(tmp_path / "traces_summary.csv")
    assert list(summary["guard"]) == ["sync", "cpu_flag"] and (summary["n_forwards"] == 2).all()
    assert list(summary["checked_region"]) == [summary["checked_region"][0], "pass"]
    assert summary["checked_region"][0].startswith("raised at guards.py")
    meta = json.loads((tmp_path / "tiny_sync_eager_M4.meta.json").read_text())
    assert {"gpu", "torch", "triton", "commit", "date", "params"} <= set(meta)
    assert meta["params"]["guard"] == "sync" and meta["params"]["num_layers"] == 2
    t = T.load_trace(tmp_path / "tiny_sync_eager_M4.json.gz")
    assert len(t.forwards) == 2 and t.labels["guard"] == "sync"
    assert "idle_sync_us" in capsys.readouterr().out


def test_graph_launch_shares_correlation():
    """A CUDA-graph replay: one cudaGraphLaunch, every kernel of the graph carries its correlation."""
    ev = [{"ph": "X", "cat": "user_annotation", "name": "profile_forward", "pid": 1, "tid": 1,
           "ts": 0, "dur": 100, "args": {}},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": 1, "tid": 1,
           "ts": 1, "dur": 9.5, "args": {"correlation": 77}}]
    for i, (s, d) in enumerate([(5, 10), (15.5, 3), (19, 1.25)]):
        ev.append({"ph": "X", "cat": "kernel", "name": f"g{i}", "pid": 0, "tid": 7, "ts": s,
                   "dur": d, "args": {"correlation": 77, "device": 0, "stream": 7}})
    t = T.load_trace({"traceEvents": ev})
    assert (t.kernels["launch_name"] == "cudaGraphLaunch").all()
    g = T.idle_gaps(t)
    assert list(g["dur_ns"]) == [500, 500] and set(g["category"]) == {"kernel_to_kernel"}
    q = T.queue_depth(t)
    assert q["depth"].max() == 3  # the whole graph is queued at once
    m = T.forward_metrics(t).iloc[0]
    assert m["gpu_span_ns"] == 15250 and m["busy_ns"] == 14250 and m["n_syncs"] == 0


def test_gpu_only_trace_is_one_forward():
    ev = [{"ph": "X", "cat": "kernel", "name": "a", "ts": 1, "dur": 1},
          {"ph": "X", "cat": "kernel", "name": "b", "ts": 5, "dur": 1.001}]
    m = T.forward_metrics(T.load_trace(ev)).iloc[0]
    assert (m["gpu_span_ns"], m["busy_ns"], m["idle_other_ns"]) == (5001, 2001, 3000)
