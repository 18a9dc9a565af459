"""The chunked-prefill driver at tiny shapes: the plan, adapter modes, the metrics, that a whole
cpu_flag prefill never syncs (and a sync one does), interleaving, the summary and the CLI."""
import json

import pandas as pd
import pytest

from lora_moe_lab.instruments.recorders import prefill as P
from lora_moe_lab.instruments.recorders.syncs import HostSyncError, checked_region
from lora_moe_lab.model.moe import MoELayer
from helpers import audit_forwards, syncs_beyond_guards


@pytest.fixture(scope="module")
def lab():
    # auto: the torch backend in fp32 on CPU; Triton in bf16 on a GPU, where checked_region also
    # turns on torch's sync debug mode
    lab = P.build("tiny", 2, max_loras=4, max_rank=8, dtype="auto", device="auto", backend="auto",
                  seed=0, guard_sites=1.0)
    P.load_adapters(lab, 2, 8)
    return lab


def test_plan_holds_whole_requests():
    p = P.make_plan(10, 16, 64)
    assert p.requests_per_chunk == 4 and [len(c) for c in p.chunks] == [4, 4, 2] and p.total_tokens == 160
    with pytest.raises(P.ChunkSizeError, match="not a multiple of input_len=16"):
        P.make_plan(10, 16, 40)
    for bad in (0, -16):
        with pytest.raises(P.ChunkSizeError, match="positive"):
            P.make_plan(10, 16, bad)


def test_adapter_modes():
    assert P.request_adapters(4, "none", ["a0"]) == [None] * 4
    mix = P.request_adapters(8, "mix", ["a0", "a1"])
    assert mix == ["a0", None, "a1", None, "a0", None, "a1", None]
    with pytest.raises(P.AdapterModeError, match="unknown adapter mode 'some'"):
        P.request_adapters(4, "some", ["a0"])


def test_unknown_adapter_is_named(lab):
    with pytest.raises(KeyError, match="unknown adapter 'zz'"):
        P.PrefillDriver(lab, P.make_plan(2, 8, 16), ["zz", None])


@pytest.mark.parametrize("mode", P.ADAPTER_MODES)
def test_metrics(lab, mode):
    d = P.PrefillDriver(lab, P.make_plan(6, 4, 8), P.request_adapters(6, mode, ["a0", "a1"]))
    r = {g: d.run(g) for g in ("sync", "cpu_flag", "launch_always")}
    assert r["sync"]["syncs_per_forward"] == lab.shape.num_layers  # one guard site per layer
    assert r["cpu_flag"]["syncs_per_forward"] == 0 == r["launch_always"]["syncs_per_forward"]
    for x in r.values():
        assert x["forwards"] == 3 and x["prefill_ms"] > 0
        assert x["input_tok_per_s"] == pytest.approx(24 / (x["prefill_ms"] * 1e-3))
        assert 0 < x["ttft_p50_ms"] <= x["ttft_p99_ms"] <= x["prefill_ms"]
    assert P.NO_IDLE.keys() == d.profile("sync").keys()  # CPU: no trace, NaN idle


def test_whole_prefill_is_sync_free_with_cpu_flag(lab, monkeypatch):
    """Batch building, chunking and every forward inside one checked region. On CPU the region
    checks the guard counter; on a GPU torch's sync debug mode too. The same test with the sync
    guard must fail, or the region would prove nothing. Then every forward of the prefill is audited
    (the audit's CPU count sees any call that would sync on a GPU, not only the guards'): nothing
    beyond the sync guard's one `.item()` per layer; a `.item()` planted in the forward is caught."""
    d = P.PrefillDriver(lab, P.make_plan(4, 8, 16), P.request_adapters(4, "mix", ["a0"]))
    for g in ("cpu_flag", "launch_always"):
        with checked_region():
            clock = d.issue(g)
        assert len(clock.read_ms()) == 2
    with pytest.raises(HostSyncError):
        with checked_region():
            d.issue("sync")
    layers = lab.shape.num_layers
    for g, guard_syncs in (("cpu_flag", 0), ("launch_always", 0), ("sync", layers)):
        with monkeypatch.context() as m:
            reports = audit_forwards(m, lab.model)
            d.issue(g)
        assert len(reports) == 2 and syncs_beyond_guards(reports, guard_syncs) == [], g
    # the negative control: a hidden sync in the MoE layer's routing fails the same check
    route = MoELayer.route

    def route_and_read(self, *a, **k):
        topk_w, topk_ids = route(self, *a, **k)
        topk_ids.sum().item()
        return topk_w, topk_ids

    monkeypatch.setattr(MoELayer, "route", route_and_read)
    reports = audit_forwards(monkeypatch, lab.model)
    d.issue("cpu_flag")
    assert len(syncs_beyond_guards(reports, 0)) == 2 * layers


def test_measure_interleaves_and_summarizes(lab):
    plan = P.make_plan(2, 4, 8)  # one chunk per prefill: fast
    drivers = {m: P.PrefillDriver(lab, plan, P.request_adapters(2, m, ["a0"])) for m in P.ADAPTER_MODES}
    key = dict(preset="tiny", layers=2, tp=1, requests=2, input_len=4, chunk=8, guard_sites=1.0)
    guards = ["sync", "cpu_flag", "launch_always"]
    rows = P.measure(drivers, guards, 3, key=key, progress=False)
    df = pd.DataFrame(rows)
    assert len(df) == 3 * 2 * 3
    first = df[df["order"] == 0].groupby("rep")["guard"].first().tolist()
    assert first == guards  # repetition r starts with guard r (rotated order)
    s = P.summarize(df)
    assert len(s) == 6
    fx = s[s["guard"] == "cpu_flag"]
    assert (fx["fix_throughput_gain_pct"] == 0).all() and (fx["fix_ttft_change_pct"] == 0).all()
    assert (s["input_tok_per_s_lo"] <= s["input_tok_per_s"]).all()
    assert (s["input_tok_per_s"] <= s["input_tok_per_s_hi"]).all()
    assert (s.loc[s["guard"] == "sync", "syncs_per_forward"] == 2).all()


def test_cli_writes_csv_meta_and_summary(tmp_path, capsys):
    out = tmp_path / "p.csv"
    argv = ["--preset", "tiny", "--layers", "1", "--requests", "2", "--input-len", "4", "--chunk", "4", "8",
            "--guards", "sync", "cpu_flag", "--reps", "2", "--device", "cpu", "--out", str(out), "--no-progress"]
    assert P.main(argv) == 0
    df = pd.read_csv(out)
    assert list(df.columns) == P.TABLE_COLUMNS and len(df) == 2 * 2 * 2 * 2  # chunks x modes x guards x reps
    assert df["timer"].eq("wall").all() and df["gpu_idle_ms"].isna().all()
    meta = json.loads(out.with_suffix(".meta.json").read_text())
    assert {"gpu", "torch", "commit", "date", "params"} <= set(meta) and meta["params"]["chunk"] == [4, 8]
    assert len(pd.read_csv(out.with_suffix(".summary.csv"))) == 8
    assert "fix_throughput_gain_pct" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        P.main(argv + ["--chunk", "6"])
    assert "not a multiple" in capsys.readouterr().err


def test_paired_changes_have_the_right_sign_and_size():
    """cpu_flag 25 % faster in throughput and 20 % lower TTFT than sync in every repetition: the
    summary must say +25 % and -20 % on the sync rows (and the interval must sit on them)."""
    key = dict(preset="tiny", layers=2, tp=1, requests=4, input_len=8, chunk=16, guard_sites=1.0, adapters="none")
    rows = []
    for r in range(5):
        base = 1000.0 + 10 * r  # a drift shared by the repetition: pairing removes it
        for g, tps, ttft in (("sync", base, 10.0 + r), ("cpu_flag", 1.25 * base, 0.8 * (10.0 + r))):
            rows.append({**key, "guard": g, "rep": r, "order": 0, "prefill_ms": 1.0, "input_tok_per_s": tps,
                         "ttft_mean_ms": ttft, "ttft_p50_ms": ttft, "ttft_p99_ms": ttft, "forwards": 2,
                         "forward_median_ms": 1.0, "syncs_per_forward": 2.0 if g == "sync" else 0.0,
                         "gpu_idle_ms": float("nan"), "gpu_idle_after_sync_ms": float("nan"),
                         "gpu_busy_ms": float("nan"), "gpu_span_ms": float("nan"), "timer": "wall"})
    s = P.summarize(pd.DataFrame(rows)).set_index("guard")
    assert s.loc["sync", "fix_throughput_gain_pct"] == pytest.approx(25.0)
    assert s.loc["sync", "fix_ttft_change_pct"] == pytest.approx(-20.0)
    assert s.loc["sync", "fix_throughput_gain_pct_lo"] == pytest.approx(25.0)
    assert s.loc["sync", "fix_ttft_change_pct_hi"] == pytest.approx(-20.0)


# --- engine costs (issue: production's regime) ---------------------------------------------------
def test_engine_costs_named_errors():
    assert P.EngineCosts().off and not P.EngineCosts(overlap_ms=1).off
    for kw in ({"host_us_per_layer": -1}, {"host_us_per_forward": float("nan")}, {"overlap_ms": 1e9},
               {"overlap_ms": True}, {"host_us_per_layer": "5"}):
        with pytest.raises(P.EngineCostError, match=next(iter(kw))):
            P.EngineCosts(**kw)


def test_engine_costs_cost_host_time_and_are_recorded(lab, monkeypatch):
    plan = P.make_plan(4, 8, 16)
    base = P.PrefillDriver(lab, plan, [None] * 4)
    slow = P.PrefillDriver(lab, plan, [None] * 4, costs=P.EngineCosts(2000.0, 3000.0, 2.0))
    base.warmup("sync")
    r0 = min((base.run("sync") for _ in range(3)), key=lambda r: r["prefill_ms"])  # the least noisy
    spun = []  # every host spin asked for (us): the costs are spent where the driver says, not timed here
    host_spin = P.runtime.host_spin

    def spin(us):
        spun.append(us)
        host_spin(us)

    monkeypatch.setattr(P.runtime, "host_spin", spin)
    r1 = slow.run("sync")
    # 2 forwards x (2 layers x 2 ms + 3 ms of host work) = 14 ms of host work, each layer's 2 ms spread over its four
    # call points; on a CPU the earlier batch's 2 ms per forward is host time too (runtime.GpuSpin)
    host_ms = 2 * (2 * 2.0 + 3.0)
    assert sorted(set(spun)) == ([500.0, 3000.0] if slow.cuda else [500.0, 2000.0, 3000.0])
    assert sum(spun) / 1e3 == host_ms + (0 if slow.cuda else 4.0)
    if slow.cuda:
        # On a GPU the kernels launched before each host stretch run WHILE the host works, so the forward takes at
        # least the host work and never less than without it (a lower bound the host work itself enforces)
        assert r1["prefill_ms"] >= max(host_ms, r0["prefill_ms"]) * 0.95
    assert r1["other_batch_ms"] == 4.0 and r1["input_tok_per_s_net"] > r1["input_tok_per_s"]
    assert r1["first_blocked_ms"] >= 0 and r1["later_blocked_median_us"] >= 0  # perf_counter per .item()
    assert lab.model.host_us_per_layer == 2000.0
    base.run("sync")  # a driver without costs sets the hook back to 0
    assert lab.model.host_us_per_layer == 0.0
    rows = P.measure({"none": slow}, ["sync", "cpu_flag"], 2, key=dict(preset="tiny", layers=2, tp=1, requests=4,
                     input_len=8, chunk=16, guard_sites=1.0), progress=False)
    assert {r["overlap_ms"] for r in rows} == {2.0} and {r["host_us_per_layer"] for r in rows} == {2000.0}


def test_summary_drops_drift_and_uses_valid_intervals():
    import numpy as np

    rng = np.random.default_rng(0)
    key = dict(preset="tiny", layers=2, tp=1, requests=4, input_len=8, chunk=16, guard_sites=1.0, adapters="none")
    rows = []
    for r in range(14):
        drift = 1.5 if r < 2 else 1.0  # two slow repetitions at the start
        for g, t in (("sync", 110.0), ("cpu_flag", 100.0)):
            ms = t * drift + rng.normal(0, 0.3)
            rows.append({**key, "guard": g, "rep": r, "prefill_ms": ms, "input_tok_per_s": 32 / (ms * 1e-3),
                         "ttft_mean_ms": ms / 2, "ttft_p99_ms": ms, "forward_median_ms": ms / 2, "syncs_per_forward": 2,
                         "gpu_idle_ms": float("nan"), "gpu_idle_after_sync_ms": float("nan")})
    s = P.summarize(pd.DataFrame(rows)).set_index("guard")
    assert (s["warmup_dropped"] == 2).all() and (s["reps"] == 12).all() and s["stable"].all()
    assert "bootstrap" in s.loc["sync", "ci_method"] and "order-statistic" in s.loc["sync", "ci_method"]
    lo, est, hi = s.loc["sync", ["fix_throughput_gain_pct_lo", "fix_throughput_gain_pct", "fix_throughput_gain_pct_hi"]]
    assert lo <= est <= hi and 9 < est < 11  # 110 / 100 - 1, the drifting pair left out
    few = P.summarize(pd.DataFrame([r for r in rows if r["rep"] < 5]))
    assert "a spread, not an interval" in few["ci_method"].iloc[0]
