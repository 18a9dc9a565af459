"""Host/device queue model: hand-checked timelines, sync drains, graph mode, fit/validate/extrapolate."""
import itertools

import numpy as np
import pandas as pd
import pytest

from lora_moe_lab import sim
from lora_moe_lab.model.guards import guard_names
from lora_moe_lab.sim import CostModel, Op, simulate


def _gpu(tl):
    return tl[tl.lane == "gpu"].reset_index(drop=True)


def test_device_bound_two_kernels():
    # host issues A (5 us) then B (5 us); each runs 10 us: B waits for A, the host is ahead
    r = simulate([Op("A", host_us=5, device_us=10), Op("B", host_us=5, device_us=10)], timeline=True)
    g = _gpu(r.timeline)
    assert list(zip(g.start_ns, g.end_ns)) == [(5000, 15000), (15000, 25000)]
    assert (r.forward_us, r.host_end_us, r.device_busy_us, r.device_idle_us) == (25, 10, 20, 5)
    assert (r.syncs, r.device_ops) == (0, 2)


def test_host_bound_kernels_wait_for_their_launch():
    r = simulate([Op("A", host_us=10, device_us=2), Op("B", host_us=10, device_us=2)], timeline=True)
    g = _gpu(r.timeline)
    assert list(zip(g.start_ns, g.end_ns)) == [(10000, 12000), (20000, 22000)]
    assert r.forward_us == 22 and r.device_idle_us == 18


def test_sync_drains_the_queue_and_device_idles_for_the_next_issue():
    ops = [Op("A", host_us=1, device_us=20), Op("A.item", "sync", host_us=3), Op("B", host_us=4, device_us=5)]
    r = simulate(ops, timeline=True)
    tl = r.timeline
    h = tl[tl.lane == "host"].set_index("name")
    # the host blocks from the end of A's launch until the device drained (21 us), plus 3 us overhead
    assert (h.loc["A.item", "start_ns"], h.loc["A.item", "end_ns"]) == (1000, 24000)
    assert h.loc["A.item", "category"] == "sync"
    g = _gpu(tl)
    assert list(zip(g.name, g.start_ns, g.end_ns)) == [("A", 1000, 21000), ("B", 28000, 33000)]
    # device idle after the sync = sync overhead + the host issue of the next op
    assert r.sync_stall_us == 3 + 4 and r.host_blocked_us == 20
    assert (r.forward_us, r.syncs) == (33, 1)
    # without overhead the gap is exactly the next op's issue cost
    r0 = simulate([Op("A", host_us=1, device_us=20), Op("s", "sync"), Op("B", host_us=4, device_us=5)])
    assert r0.sync_stall_us == 4 and r0.forward_us == 21 + 4 + 5


def test_collective_waits_for_the_slowest_rank():
    ops = [Op("A", host_us=1, device_us=10), Op("ar", "collective", host_us=1, device_us=5, wait_us=2)]
    g = _gpu(simulate(ops, timeline=True).timeline)
    assert list(zip(g.start_ns, g.end_ns)) == [(1000, 11000), (11000, 18000)]
    assert g.category.tolist() == ["kernel", "collective"]


def test_op_validation():
    with pytest.raises(ValueError, match="kind"):
        Op("x", "teleport")
    with pytest.raises(ValueError, match="host_us"):
        Op("x", host_us=-1)


def test_timeline_schema_and_ordering():
    r = sim.simulate_forward("qwen3-30b-a3b", 128, "sync", layers=3, active=0.5, timeline=True)
    tl = r.timeline
    assert list(tl.columns) == sim.TIMELINE_COLUMNS
    assert set(tl.lane) == {"host", "gpu"} and tl.start_ns.dtype == np.int64
    assert (tl.end_ns >= tl.start_ns).all()
    g = _gpu(tl)
    assert (g.start_ns.to_numpy()[1:] >= g.end_ns.to_numpy()[:-1]).all()  # in-order, no overlap
    assert (tl.category == "sync").sum() == 3 and r.syncs == 3
    assert r.forward_us * 1000 == pytest.approx(max(tl.end_ns.max(), 0), abs=1)


def test_graph_mode_is_one_launch_plus_device_work():
    p = CostModel(launch_us=50.0, graph_launch_us=40.0)
    ops = sim.forward_ops("tiny", 8, "sync", layers=2, mode="graph", params=p, active=0.0)
    r = simulate(ops)
    dev = sum(o.device_us for o in ops)
    assert r.syncs == 0 and r.forward_us == pytest.approx(40.0 + dev)
    assert [o.kind for o in ops].count("host") == 1
    # graph records the LoRA kernels whatever the guard: same work for every guard
    for g in guard_names():
        assert sim.forward_us("tiny", 8, g, layers=2, mode="graph", params=p) == pytest.approx(r.forward_us)
    # eager with a 50 us launch is host bound: forward = all host issue time + the last kernel
    eo = sim.forward_ops("tiny", 8, "cpu_flag", layers=2, params=p)
    e = simulate(eo)
    assert e.forward_us == pytest.approx(sum(o.host_us for o in eo) + eo[-1].device_us, rel=1e-12)
    assert sum(o.host_us for o in eo) == 50.0 * 2 * sum(sim.DEFAULT_LAUNCHES[n] for n in
                                                        ("rmsnorm", "router_gemm", "softmax_topk", "align",
                                                         "gate_up_gemm", "silu_mul", "down_gemm", "topk_sum",
                                                         "residual_add"))


def test_guards_differ_as_designed():
    kw = dict(layers=4, params=CostModel())
    for a in (0.0, 0.5):
        s = sim.simulate_forward("qwen3-30b-a3b", 128, "sync", active=a, **kw)
        c = sim.simulate_forward("qwen3-30b-a3b", 128, "cpu_flag", active=a, **kw)
        assert s.syncs == 4 and c.syncs == 0 and s.forward_us > c.forward_us and s.sync_stall_us > 0
    la = sim.simulate_forward("qwen3-30b-a3b", 128, "launch_always", active=0.0, **kw)
    c0 = sim.simulate_forward("qwen3-30b-a3b", 128, "cpu_flag", active=0.0, **kw)
    assert la.device_ops > c0.device_ops  # early-exit kernels are launched anyway


def test_fast_path_matches_the_engine():
    p = CostModel(skew_us=3.0, host_layer_us=4.0, triton_extra_us=6.0)
    for M, g, mode, coll in itertools.product([16, 4096], guard_names(), ["eager", "graph"], [False, True]):
        kw = dict(layers=3, mode=mode, params=p, active=0.5, collective=coll, tp=4)
        a = sim.simulate_forward("qwen3-30b-a3b-tp4", M, g, **kw).forward_us
        assert sim.forward_us("qwen3-30b-a3b-tp4", M, g, **kw) == pytest.approx(a, rel=1e-12)


@pytest.mark.parametrize("kw,match", [(dict(guard="often"), "unknown guard"), (dict(tokens=0), "tokens"),
                                      (dict(active=2.0), "active"), (dict(mode="warp"), "mode"),
                                      (dict(layers=0), "layers")])
def test_bad_arguments(kw, match):
    args = dict(shape="tiny", tokens=8, guard="sync")
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        sim.simulate_forward(args.pop("shape"), args.pop("tokens"), args.pop("guard"), **args)


TRUTH = CostModel(launch_us=7.0, sync_us=22.0, graph_launch_us=30.0, kernel_us=2.5, tflops=350.0, tbps=3.2)


def _synthetic_sweep(params, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for L, M, g, a, mode in itertools.product([2, 4], [16, 1024, 16384, 65536], guard_names(), [0.0, 0.5],
                                              ["eager", "graph"]):
        t = sim.forward_us("qwen3-30b-a3b", M, g, layers=L, mode=mode, params=params, active=a, rank=16)
        rows.append(dict(preset="qwen3-30b-a3b", layers=L, tokens=M, guard=g, active=a, rank=16, mode=mode,
                         dtype="bfloat16", median_us=t * float(np.exp(noise * rng.standard_normal())), error=None))
    return pd.DataFrame(rows)


def test_fit_recovers_known_parameters():
    r = sim.fit(_synthetic_sweep(TRUTH))
    assert r.rows == 96 and r.rms_log_error < 1e-4
    for p in sim.FIT_PARAMS:
        assert getattr(r.params, p) == pytest.approx(getattr(TRUTH, p), rel=1e-2), p


def test_fit_is_robust_to_noise_and_validate_reports_per_guard():
    df = _synthetic_sweep(TRUTH, noise=0.03, seed=1)
    r = sim.fit(df)
    assert r.rms_log_error < 0.05
    # well-constrained by these rows; sync_us is not (2-4 syncs hide in 3 % noise on ms forwards)
    for p in ("launch_us", "tbps", "tflops"):
        assert getattr(r.params, p) == pytest.approx(getattr(TRUTH, p), rel=0.15), p
    v = sim.validate(df, r.params)
    s = v.summary
    assert set(s.guard) == set(guard_names()) and set(s["mode"]) == {"eager", "graph"}
    assert list(s.columns) == ["guard", "mode", "n", "passed", "mean_abs_err_pct", "max_abs_err_pct", "ok"]
    assert s["ok"].all() and (s["n"] == 16).all() and v.ok and len(v.points) == len(df)
    bad = sim.validate(df, TRUTH.with_(launch_us=30.0))
    assert not bad.summary["ok"].all() and len(bad.misses)


def test_fit_skips_errored_rows_and_unseen_parameters():
    df = _synthetic_sweep(TRUTH)
    df = df[df["mode"] == "eager"].copy()
    df.loc[df.index[:3], "error"] = "OutOfMemoryError"
    r = sim.fit(df)
    assert r.rows == len(df) - 3 and "graph_launch_us" not in r.fitted
    assert r.params.graph_launch_us == CostModel().graph_launch_us
    with pytest.raises(ValueError, match="unknown cost-model"):
        sim.fit(df, params=["warp_factor"])


def test_fit_takes_starting_values_from_trace_tables():
    runtime = pd.DataFrame(dict(name=["cudaLaunchKernel"] * 4 + ["cudaGraphLaunch"],
                                start_ns=[0, 6000, 12000, 500_000, 600_000],
                                end_ns=[2000, 8000, 14000, 502_000, 612_000]))
    kernels = pd.DataFrame(dict(name=["k"] * 10, start_ns=np.arange(10) * 10_000,
                                end_ns=np.arange(10) * 10_000 + 1000 * np.arange(1, 11)))
    r = sim.fit(kernels=kernels, runtime=runtime)
    # launch spacing 6 us (the 488 us pause is not a launch cost); graph launch call 12 us
    assert r.params.launch_us == pytest.approx(6.0) and r.params.graph_launch_us == pytest.approx(12.0)
    assert r.params.kernel_us == pytest.approx(1.9) and r.rows == 0


def test_fit_from_traces_recovers_forward_times():
    traces = []
    for M, g, mode in itertools.product([16, 4096], guard_names(), ["eager", "graph"]):
        r = sim.simulate_forward("qwen3-30b-a3b", M, g, layers=2, mode=mode, params=TRUTH, active=0.5,
                                 timeline=True)
        traces.append(sim.to_trace_tables(r.timeline, labels=dict(
            preset="qwen3-30b-a3b", num_layers=2, guard=g, mode=mode, M=M, adapters=["a0", None], max_rank=16,
            dtype="bfloat16")))
    rows = sim.trace_rows(traces)
    assert len(rows) == 12 and (rows.kernels_per_forward == rows.model_kernels).all()
    assert (rows.loc[(rows.guard == "sync") & (rows["mode"] == "eager"), "syncs_per_forward"] == 2).all()
    f = sim.fit(traces=traces)
    assert "trace:launch" in f.sources and f.rows == 12 and f.rms_log_error < 0.02
    assert sim.validate(rows, f.params).ok
    with pytest.raises(ValueError, match="lacks labels"):
        sim.trace_rows([sim.to_trace_tables(r.timeline)])


def test_extrapolate_and_compare_with_production():
    ex = sim.extrapolate(CostModel(), chunks=(8192, 16384))
    assert len(ex) == 2 * 3
    s = ex[ex.guard == "sync"]
    assert (s.syncs_per_forward == 48).all() and (ex[ex.guard != "sync"].syncs_per_forward == 0).all()
    assert (ex.chunks_per_batch.tolist() == [32] * 3 + [16] * 3)
    assert (ex.loc[ex.guard == "cpu_flag", "stall_ms_per_forward"] == 0).all()
    assert (s.stall_ms_per_forward > 0).all() and (s.sync_stall_ms > 0).all()
    c = sim.compare_production(ex)
    assert set(c.metric) == set(sim.PRODUCTION) and len(c) == 10
    assert sim.PRODUCTION["stall_us_per_sync"] == pytest.approx(100e3 / 260)
    sp = c[(c.tokens == 8192) & (c.metric == "stall_us_per_sync")].iloc[0].predicted
    assert sp == pytest.approx(1000 * s.stall_ms_per_forward.iloc[0] / 48)
    row = c[(c.tokens == 8192) & (c.metric == "input_throughput_gain_pct")].iloc[0]
    assert row.production == 14.4 and row.predicted > 0
    # the two production figures are one fact seen twice: gain g <-> TTFT change 1/(1+g) - 1
    t = c[(c.tokens == 8192) & (c.metric == "ttft_change_pct")].iloc[0].predicted
    assert t == pytest.approx(100 * (1 / (1 + row.predicted / 100) - 1))
    # more syncs per layer cost more stall
    ex5 = sim.extrapolate(CostModel(), chunks=(8192,), guards=("sync", "cpu_flag"), syncs_per_layer=5)
    assert ex5.loc[ex5.guard == "sync", "syncs_per_forward"].item() == 240
    assert ex5.loc[ex5.guard == "sync", "stall_ms_per_forward"].item() > s.stall_ms_per_forward.iloc[0]


def test_what_if_curves():
    w = sim.what_if(CostModel(), vary="launch_us", values=[2, 20], layers=4, tokens=128)
    assert len(w) == 6
    f = w.set_index(["value", "guard"])["forward_ms"]
    assert f[(20.0, "sync")] > f[(2.0, "sync")]
    w = sim.what_if(CostModel(), vary="tokens", values=[16, 4096], layers=2)
    assert set(w.tokens) == {16, 4096}
    with pytest.raises(ValueError, match="cannot vary"):
        sim.what_if(vary="colour", values=[1])


def test_predict_reads_bench_csv_schema(tmp_path):
    from lora_moe_lab.instruments.recorders.bench import COLUMNS

    df = _synthetic_sweep(TRUTH).head(6)
    full = pd.DataFrame({c: df[c] if c in df else "" for c in COLUMNS})
    path = tmp_path / "s.csv"
    full.to_csv(path, index=False)
    p = sim.predict(pd.read_csv(path), TRUTH)
    assert np.allclose(p.predicted_us, p.median_us) and np.allclose(p.error_pct, 0, atol=1e-9)


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_trace_analyses_read_a_simulated_forward(mode):
    from lora_moe_lab.instruments.analysers import trace

    r = sim.simulate_forward("qwen3-30b-a3b", 128, "sync", layers=3, active=0.5, mode=mode, timeline=True)
    t = r.tables(preset="qwen3-30b-a3b")
    assert t.labels["preset"] == "qwen3-30b-a3b"
    assert list(t.kernels.columns) == trace.KERNEL_COLUMNS and list(t.runtime.columns) == trace.RUNTIME_COLUMNS
    m = trace.forward_metrics(t).iloc[0]
    assert m.n_syncs == r.syncs == (3 if mode == "eager" else 0)
    assert m.n_kernels == r.device_ops
    assert m.busy_ns == pytest.approx(r.device_busy_us * 1000, abs=r.device_ops)
    assert m.idle_after_sync_ns == pytest.approx(r.sync_stall_us * 1000, abs=3)
    assert m.gpu_end_ns == round(r.forward_us * 1000)
    if mode == "eager":
        assert len(trace.layer_breakdown(t)) == 3
        assert (t.kernels.launch_name == "cudaLaunchKernel").all()
    else:
        assert (t.kernels.launch_name == "cudaGraphLaunch").all() and m.idle_ns == 0
    assert trace.queue_depth(t)["depth"].max() >= 1


def test_sync_us_to_match_production_stall():
    p = CostModel()
    s = sim.sync_us_to_match(p, target_us_per_sync=300.0, layers=4, tokens=4096)
    ts = sim.forward_us("qwen3-30b-a3b-tp4", 4096, "sync", layers=4, tp=4, collective=True, active=0.5,
                        params=p.with_(sync_us=s))
    tc = sim.forward_us("qwen3-30b-a3b-tp4", 4096, "cpu_flag", layers=4, tp=4, collective=True, active=0.5, params=p)
    assert (ts - tc) / 4 == pytest.approx(300.0, rel=1e-6)
    assert sim.sync_us_to_match(p, target_us_per_sync=0.0, layers=2) == 0.0


from hypothesis import given, settings, strategies as st  # noqa: E402

_cost = st.tuples(st.sampled_from(["kernel", "kernel", "kernel", "sync", "collective", "host"]),
                  st.integers(1, 5), st.floats(0, 50), st.floats(0, 50), st.floats(0, 10))


@settings(max_examples=80, deadline=None)
@given(st.lists(_cost, min_size=1, max_size=12), st.integers(1, 3), st.floats(0, 30))
def test_fast_run_formula_matches_the_engine_and_invariants_hold(costs, L, host0):
    rows = []
    for kind, n, c, d, w in costs:
        n = n if kind == "kernel" else 1
        rows.append(("op", kind, "kernel", n, c, 0.0 if kind in ("sync", "host") else d,
                     w if kind == "collective" else 0.0))
    ops = [Op("g", "host", host0)] if host0 > 0 else []
    for _ in range(L):
        for name, kind, cat, n, c, d, w in rows:
            ops += [Op(name, kind, c, d, w)] * n
    r = simulate(ops, timeline=True)
    fast, syncs = sim.cost._fast_forward_us(rows, L, host0)
    assert fast == pytest.approx(r.forward_us, rel=1e-9, abs=1e-9) and syncs == r.syncs
    # invariants: device ops in order without overlap; the forward covers all host and device work
    g = r.timeline[r.timeline.lane == "gpu"]
    assert (g.start_ns.to_numpy()[1:] >= g.end_ns.to_numpy()[:-1] - 1).all()
    assert r.forward_us + 1e-9 >= max(r.device_busy_us, sum(o.host_us for o in ops if o.kind != "sync"))
    assert r.device_idle_us >= -1e-9 and r.sync_stall_us >= -1e-9 and r.host_blocked_us >= -1e-9


def test_scale_model_report_in_one_call():
    df = _synthetic_sweep(TRUTH).query("layers == 2 and tokens in (16, 16384)")
    r = sim.scale_model_report(df, chunks=(8192,))
    assert set(r) == {"fit", "params", "predictions", "validation", "extrapolation", "comparison",
                      "sync_us_to_match"}
    assert r["validation"]["ok"].all() and len(r["predictions"]) == len(df)
    assert r["sync_us_to_match"] > 0 and set(r["comparison"].metric) == set(sim.PRODUCTION)
