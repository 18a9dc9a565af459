"""The replay engine (sim/replay.py) and its transformations, on synthetic traces with known answers
(tests/fixtures/synth_traces.py), plus one recorded H200 trace replayed within 2 %."""
import gzip
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from lora_moe_lab.instruments.analysers.trace import to_ns
from lora_moe_lab.sim import replay as R
from lora_moe_lab.sim import replay_transforms as X

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
from synth_traces import BASE_NS, HOST_PID, HOST_TID, _x, model_trace  # noqa: E402

RECORDED = ROOT / "data/production/signature_s1/traces/qwen3-30b-a3b_L48_tp1_C8192_gs5.41667_none_sync_rank0.json.gz"


def annotate(doc):
    """model_trace's sync forwards with a `lora_guard_sync` range per guard: from the end of the launch
    before the D2H copy to the end of the sync (so the guard's own host time is inside it)."""
    ev = doc["traceEvents"]
    rt = [e for e in ev if e.get("cat") == "cuda_runtime"]
    for i, e in enumerate(rt):
        if e["name"] == "cudaMemcpyAsync":
            k0, s = rt[i - 1], rt[i + 1]
            a = to_ns(k0["ts"]) + to_ns(k0["dur"]) - BASE_NS
            z = to_ns(s["ts"]) + to_ns(s["dur"]) - BASE_NS
            ev.append(_x("user_annotation", "lora_guard_sync", HOST_PID, HOST_TID, a, z - a))
    return doc


@pytest.fixture(scope="module")
def pair():
    s, _ = model_trace("sync", n_forwards=2)
    c, _ = model_trace("cpu_flag", n_forwards=2)
    return R.build_graph(annotate(s), forward=1), R.build_graph(c, forward=1), R.build_graph(s, forward=1)


def test_reproduces_synthetic_forwards(pair):
    for g in pair:
        assert R.replay(g).step_ns[0] == g.traced_ns
    gs, gc, _ = pair
    assert (gs.n_syncs == 4 and gc.n_syncs == 0 and len(gs.sites) == 4
            and gs.layers == [f"moe_layer_{i}" for i in range(4)])


def test_remove_syncs_gives_the_cpu_flag_forward(pair):
    gs, gc, plain = pair
    want = R.replay(gc, init="idle").step_ns[0]
    assert R.replay(X.remove_syncs(gs), init="idle").step_ns[0] == want  # through the guard ranges
    assert R.replay(X.remove_syncs(plain), init="idle").step_ns[0] == want  # without: the sync and its D2H copy
    assert X.remove_syncs(gs).n_syncs == 0 and X.remove_syncs(gs).n_kernels == gc.n_kernels


def test_add_syncs_restores_the_sync_forward(pair):
    gs, gc, _ = pair
    tpl = X.guard_template(gs)
    assert list(tpl.host["name"]) == ["cudaMemcpyAsync", "cudaStreamSynchronize"]
    back = X.add_syncs(X.remove_syncs(gs), tpl)
    assert R.replay(back, init="idle").step_ns[0] == R.replay(gs, init="idle").step_ns[0]
    # at explicit host calls: after each layer's first launch of the cpu_flag graph
    first = [int(np.nonzero(gc.host["layer"] == i)[0][1]) for i in range(4)]
    g2 = X.add_syncs(gc, tpl, sites=first)
    assert g2.n_syncs == 4 and R.replay(g2, init="idle").step_ns[0] > R.replay(gc, init="idle").step_ns[0]


def _chain(n=4, launch=10_000, kernel=2_000, host_gap=1_000):
    """A hand-made launch-bound trace: n launches of `launch` ns, `host_gap` apart, each kernel `kernel`
    ns long starting 1 µs after its launch returns: the forward is known in closed form."""
    from synth_traces import _Builder
    b = _Builder()
    t = 0
    for i in range(n):
        t += host_gap
        b.launch("cudaLaunchKernel", t, launch, "kernel", f"k{i}", t + launch + 1_000, kernel)
        t += launch
    b.annotation("moe_layer_0", 0, t + 10)
    b.annotation("forward", 0, t + 10)
    return b.doc()


def test_scale_host_on_a_launch_bound_chain():
    g = R.build_graph(_chain(), forward=0)
    # last kernel ends at 4 * (1000 + 10000) + 1000 + 2000
    assert g.traced_ns == 47_000 and R.replay(g).step_ns[0] == 47_000
    assert R.replay(X.scale_host(g, 2.0)).step_ns[0] == 47_000 + 4 * 1_000  # the gaps double
    assert R.replay(X.scale_host(g, 0.5, calls=True)).step_ns[0] == 4 * 500 + 4 * 5_000 + 3_000


def test_graph_launch_runs_the_layer_back_to_back():
    g = R.build_graph(_chain(), forward=0)
    out = X.graph_launch(g, launch_ns=5_000, k2k_ns=400)
    # one call (its gap: none) of 5 µs, the first kernel lat after, then 4 kernels 400 ns apart
    assert out.n_host == 1 and out.n_kernels == 4
    assert R.replay(out, init="idle").step_ns[0] == 5_000 + g.lat_ns + 4 * 2_000 + 3 * 400
    s, _ = model_trace("sync", n_forwards=1)
    with pytest.raises(R.GraphError, match="cannot contain a host sync"):
        X.graph_launch(R.build_graph(s, forward=0))


def test_early_exit_adds_k_launches_per_layer():
    g = R.build_graph(_chain(), forward=0)
    out = X.add_early_exit(g, k=3, d_us=1.5, launch_ns=10_000, host_ns=1_000)
    assert out.n_kernels == 7 and out.n_host == 7
    # launch-bound: three more launches of the chain's shape, each kernel 1.5 µs
    assert R.replay(out).step_ns[0] == 7 * 11_000 + 1_000 + 1_500


def test_collectives_and_tiling(pair):
    g = R.build_graph(_chain(), forward=0)
    with pytest.raises(R.GraphError, match="no collectives"):
        X.scale_collectives(g, 2.0)
    k = dict(g.kern)
    k["nccl"] = np.array([False, False, False, True])
    gn = g.replace(kern=k)
    assert R.replay(X.scale_collectives(gn, ns=12_000)).step_ns[0] == 47_000 + 10_000
    gs, _, _ = pair
    t = X.tile_layers(gs, 3)
    assert t.n_syncs == 12 and len(t.layers) == 12 and len(t.sites) == 12
    assert R.replay(X.remove_syncs(t)).n_kernels == 3 * R.replay(X.remove_syncs(gs)).n_kernels


def test_named_errors(tmp_path, pair):
    with pytest.raises(R.UnknownTransformationError, match="known: add_early_exit"):
        X.apply(pair[0], "remove_the_bugs")
    empty = tmp_path / "e.json"
    empty.write_text("")
    with pytest.raises(R.EmptyTraceError):
        R.build_graph(empty)
    (tmp_path / "n.json").write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(R.EmptyTraceError):
        R.build_graph(tmp_path / "n.json")
    doc, _ = model_trace("sync", n_forwards=1)
    text = json.dumps(doc, default=float)
    (tmp_path / "t.json").write_text(text[: len(text) // 2])
    with pytest.raises(R.TruncatedTraceError, match="truncated"):
        R.build_graph(tmp_path / "t.json")
    with gzip.open(tmp_path / "t.json.gz", "wt") as f:
        f.write(text)
    (tmp_path / "c.json.gz").write_bytes((tmp_path / "t.json.gz").read_bytes()[:200])
    with pytest.raises(R.TruncatedTraceError):
        R.build_graph(tmp_path / "c.json.gz")
    cpu_only = {"traceEvents": [e for e in doc["traceEvents"] if e.get("cat") not in ("kernel", "gpu_memcpy")]}
    with pytest.raises(R.NoKernelsError, match="ProfilerActivity.CUDA"):
        R.build_graph(cpu_only)
    old = {"traceEvents": [{"ph": "X", "cat": "Kernel", "name": "k", "ts": 1, "dur": 1}]}
    with pytest.raises(R.TraceFormatError, match="older torch"):
        R.build_graph(old)
    with pytest.raises(R.TraceFormatError, match="traceEvents"):
        R.build_graph({"events": []})
    with pytest.raises(R.NoForwardError, match="has 1"):
        R.build_graph(doc, forward=3)


def test_recorded_trace_within_2_percent_and_three_steps_back_to_back():
    g = R.build_graph(RECORDED, forward=1)
    assert g.n_syncs == 260 and g.n_host + g.n_kernels > 6000
    r = R.replay(g)
    assert abs(r.step_ns[0] / g.traced_ns - 1) < 0.02
    r3 = R.replay(g, steps=3, init="idle")  # three 48-layer forwards, ~20 000 events
    assert len(r3.step_ns) == 3 and len(r3.h_end) == 3 * g.n_host and len(r3.k_end) == 3 * g.n_kernels
    assert (np.diff(r3.step_gpu_end) > 0).all()  # each step ends after the one before
    assert abs(np.median(r3.step_ns[1:]) / g.traced_ns - 1) < 0.05  # back to back, from idle: the same steady forward
