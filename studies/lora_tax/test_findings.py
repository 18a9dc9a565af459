"""The lora_tax study's floor model and readers: the floor of mixed ranks is read_floors' own at one rank, the base
GEMM table is the committed recording read now, and the summary pools sessions and states the goals as its README
says (on a synthetic long table: the real one comes from the H200)."""
import io
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lora_moe_lab.instruments.analysers import schemas as S
from lora_moe_lab.instruments.recorders import tables
from studies.kernels import read_floors as RF
from studies.lora_tax import base_floor, floors, read

C = RF.ceilings()


@pytest.mark.parametrize("preset", ["qwen3-30b-a3b", "qwen3-30b-a3b-tp4"])
@pytest.mark.parametrize("M,rank", [(64, 16), (128, 32), (16384, 16), (16384, 64)])
def test_one_rank_spread_evenly_is_lora_floor(preset, M, rank):
    got = floors.layer_floor(preset, [(rank, M // 4)] * 4, C)
    want = RF.lora_floor(preset, M, C, rank, 4)
    assert all(math.isclose(got[k], want[k], rel_tol=1e-12) for k in want)


def test_each_adapter_at_its_own_rank_costs_less_than_padding_to_the_max():
    mixed = floors.layer_floor("qwen3-30b-a3b", [(8, 4096), (16, 4096), (32, 4096), (64, 4096)], C)["added_us"]
    padded = RF.lora_floor("qwen3-30b-a3b", 16384, C, 64, 4)["added_us"]
    r16 = RF.lora_floor("qwen3-30b-a3b", 16384, C, 16, 4)["added_us"]
    assert r16 < mixed < padded
    hot = floors.layer_floor("qwen3-30b-a3b", [(8, 1024), (16, 1024), (32, 2048), (64, 12288)], C)["added_us"]
    assert mixed < hot < padded
    assert floors.forward_floor_us("qwen3-30b-a3b", [(16, 4096)] * 4, C, 48) == pytest.approx(48 * r16)
    assert floors.floor_ratio(100.0, 25.0) == 0.8
    with pytest.raises(ValueError, match="tokens_by_adapter"):
        floors.layer_floor("qwen3-30b-a3b", [(0, 16)], C)


def test_the_base_gemm_table_is_the_committed_recording_read_now():
    written = S.read_csv(base_floor.OUT, "lora_tax_base_floor")
    now = base_floor.table()
    assert len(now) == 28 and set(now.M) == {1, 16, 128, 1024, 4096, 8192, 16384}
    as_written = pd.read_csv(io.StringIO(tables.csv_text(now, base_floor.COLUMNS, header=True)))
    pd.testing.assert_frame_equal(written, as_written)
    assert (now.of_floor_lo <= now.of_floor).all() and (now.of_floor <= now.of_floor_hi).all()
    big = now[now.M >= base_floor.GOAL_MIN_M]
    assert (big.goal_met == (big.of_floor >= base_floor.GOAL)).all() and now[now.M < 4096].goal_met.isna().all()
    # from M = 4096 the measured kernels are well inside the floor: no time below it there
    assert (big.of_floor_hi < 1.0).all()


def _synthetic(tmp_path):
    """A long table in the recorder's columns (made up here, for the reader alone)."""
    from studies.lora_tax.record import COLUMNS, INTERVAL

    rows = []
    cells = [("prefill", "16,16,16,16", "even", [(0.95, 0.94, 0.96), (0.93, 0.92, 0.94)], 0.97),
             ("prefill", "8,16,32,64", "r64_70pct", [(0.80, 0.79, 0.81), (0.82, 0.80, 0.83)], 0.90),
             ("decode", "8,16,32,64", "even", [(0.85, 0.84, 0.86), None], 0.90)]
    for regime, ranks, mix, per, fr in cells:
        for s, fig in zip(("s1", "s2"), per):
            r = {c: "" for c in COLUMNS}
            r.update(session=s, regime=regime, shape="qwen3-30b-a3b", tokens=16384 if regime == "prefill" else 64,
                     ranks=ranks, mix=mix, mode="graph", status="ok" if fig else "oom", n=12 if fig else 0,
                     t_lora_floor_ms=1.0, floor_ratio=fr + (0.002 if s == "s2" else 0.0), interval=INTERVAL)
            if fig:
                r.update(ratio=fig[0], lo=fig[1], hi=fig[2], off_ms=10.0, on_ms=10.0 / fig[0])
            rows.append(r)
    f = tmp_path / "lora_tax.csv"
    tables.append_rows(f, rows, COLUMNS, meta_path=tmp_path / "lora_tax.meta.json")
    return f


def test_the_reader_pools_sessions_and_states_the_goals(tmp_path):
    s = read.write(_synthetic(tmp_path)).set_index(["regime", "ranks", "mix"])
    assert list(S.read_csv(tmp_path / "summary.csv", "lora_tax_summary").columns) == read.COLUMNS
    r16 = s.loc[("prefill", "16,16,16,16", "even")]
    assert r16.sessions == 2 and r16.ratio == pytest.approx(0.94) and (r16.lo, r16.hi) == (0.92, 0.96)
    assert r16.floor_ratio == pytest.approx(0.971) and r16.agree
    assert r16.cost == pytest.approx(0.06) and r16.cost_over_floor == pytest.approx(0.06 / 0.029)
    assert not r16.floor_goal_met and r16.r16_goal_met and not r16.goal_met  # 2.07x its floor, >= 0.92
    hot = s.loc[("prefill", "8,16,32,64", "r64_70pct")]
    assert hot.ratio == pytest.approx(0.81) and (hot.lo, hot.hi) == (0.79, 0.83)
    assert hot.floor_goal_met == (0.19 <= 1.25 * (1 - 0.901)) and pd.isna(hot.r16_goal_met)
    dec = s.loc[("decode", "8,16,32,64", "even")]
    assert dec.sessions == 1 and dec.note == "s2: oom" and dec.ratio == 0.85  # the ok session alone
    assert dec.floor_goal_met == bool(0.15 <= 1.25 * 0.10) and dec.goal_met == dec.floor_goal_met


def test_a_cell_with_no_ok_session_has_no_figure(tmp_path):
    from studies.lora_tax.record import COLUMNS

    r = {c: "" for c in COLUMNS}
    r.update(session="s1", regime="decode", shape="tiny", tokens=8, ranks="16,16,16,16", mix="even", mode="eager",
             status="unstable", n=10, t_lora_floor_ms=0.5, floor_ratio=0.9, interval="x", off_ms=1.0, on_ms=1.1)
    f = tmp_path / "lora_tax.csv"
    tables.append_rows(f, [r], COLUMNS, meta_path=tmp_path / "lora_tax.meta.json")
    s = read.summarize(read.load(f))
    assert len(s) == 1 and s.sessions[0] == 0 and np.isnan(s.ratio[0]) and s.note[0] == "s1: unstable"
    assert pd.isna(s.goal_met[0])


def test_the_base_layer_parts_are_the_committed_parts_read_now():
    """data/lora_tax/base_layer.csv is base_layer.table() over the committed parts sessions; the old torch path's
    router sits at <= 6 % of its floor and its two-kernel SiLU at <= 30 % (a bf16 product, one pass each would do);
    the one-kernel parts (parts_s4) put the top-k sum at >= 90 % of its floor, qwen3's SiLU-and-mul too, and the
    three parts' share of qwen3's layer at <= 15 %; the new kernels' names land in the same parts."""
    from studies.lora_tax import base_layer

    got = base_layer.table(C)
    rec = S.read_csv(base_layer.OUT, "lora_tax_base_layer")
    assert len(got) == len(rec) and np.allclose(got.us, rec.us) and np.allclose(got.floor_us, rec.floor_us)
    old = got[(got.M >= 1024) & got.session.isin(["parts_s1", "parts_s2", "parts_s3"])]  # the torch parts' sessions
    assert (old[old.part == "router"].of_floor <= 0.06).all()
    assert (old[old.part == "SiLU and mul"].of_floor <= 0.30).all()
    new = got[(got.M >= 1024) & (got.session == "parts_s4")]  # the one-kernel parts (8745923)
    assert len(new) == 24 and (new[new.part == "top-k sum"].of_floor >= 0.9).all()
    q = new[new.preset == "qwen3-30b-a3b"]
    assert (q[q.part == "SiLU and mul"].of_floor >= 0.9).all() and (q.nongemm_pct <= 15).all()
    for preset, g in new.groupby("preset"):  # the three parts' share fell at every M
        assert g.nongemm_pct.max() < old[old.preset == preset].nongemm_pct.min()
    assert {RF.part_of(n) for n in ("router_kernel", "silu_and_mul_kernel", "moe_sum_kernel")} == \
        {"router", "SiLU and mul", "top-k sum"}


def test_own_rank_reads_padded_over_own_from_the_paired_repetitions(tmp_path):
    """own_rank.table: per block, each `<setting>_padded` arm against its setting's, paired by repetition (made-up
    repetitions here: padded 20 % slower, so the interval lies above 1); blocks without one give no row."""
    from studies.lora_tax import own_rank
    from studies.lora_tax.record import REPS_COLUMNS

    rng = np.random.default_rng(0)
    rows = []
    for mode, arms in (("graph", {"off": 1.0, "mixed_even": 1.5, "mixed_even_padded": 1.8}),
                       ("eager", {"off": 1.0, "r16": 1.2})):
        for arm, ms in arms.items():
            for rep in range(12):
                rows.append(dict(session="s2", regime="decode", shape="qwen3-30b-a3b", tokens=64, pool_max_rank=64,
                                 mode=mode, arm=arm, rep=rep, ranks="" if arm == "off" else "8,16,32,64",
                                 mix="none" if arm == "off" else "even", order=0,
                                 ms=ms * (1 + 0.01 * rng.standard_normal()), kept=rep >= 2))
    f = tmp_path / "lora_tax_reps.csv"
    tables.append_rows(f, rows, REPS_COLUMNS, meta_path=tmp_path / "lora_tax_reps.meta.json")
    t = own_rank.table(f)
    assert len(t) == 1 and t.setting[0] == "mixed_even" and t.n[0] == 10 and t["mode"][0] == "graph"
    assert t.speedup[0] == pytest.approx(1.2, rel=0.02) and 1.0 < t.lo[0] < t.speedup[0] < t.hi[0] and t.wins[0]
    assert t.ratio_own[0] == pytest.approx(1 / 1.5, rel=0.02) and t.ratio_padded[0] == pytest.approx(1 / 1.8, rel=0.02)


def test_the_counters_targets_run_and_name_each_launch(tmp_path, monkeypatch):
    """counters.run launches each target's own-rank and padded delta in the order targets.json names them (tiny, on
    this machine's device: the interpreter on a CPU; with a table whose every entry runs the separate delta), the
    own ranks' byte floor below the padded one's."""
    import json

    from lora_moe_lab.kernels import plan
    from studies.lora_tax import counters

    t = plan.table_for().but(decode_max_pairs=0, ops={"gate_up": plan.entries(), "down": plan.entries()}, shapes={})
    monkeypatch.setattr(plan, "table_for", lambda device=None: t)
    from lora_moe_lab import runtime

    counters.run(str(tmp_path), ((16, ("gate_up", "down"), ("tiny",)),), device=str(runtime.default_device()))
    tg = json.loads((tmp_path / "targets.json").read_text())
    assert [(x["op"], x["arm"]) for x in tg] == [("lora_gate_up", "own"), ("lora_gate_up", "padded"),
                                                 ("lora_down", "own"), ("lora_down", "padded")]
    assert all(x["kernel"] == "fused_moe_lora_kernel" and x["byte_floor"] < x["byte_floor_padded"] for x in tg)


def test_superseded_sessions_leave_the_pool_and_are_named(tmp_path):
    """A superseded.csv entry (session, cells glob, why) drops the session's matching cells from the pool, names them
    in `note`, and leaves the other sessions' figures; the committed entries each give a reason."""
    f = _synthetic(tmp_path)
    sup = pd.DataFrame([dict(session="s1", cells="prefill/*/*/*/graph", why="made up")])
    s = read.summarize(read.load(f), sup).set_index(["regime", "ranks", "mix"])
    r16 = s.loc[("prefill", "16,16,16,16", "even")]
    assert r16.sessions == 1 and r16.ratio == pytest.approx(0.93) and r16.note == "s1: superseded"
    assert s.loc[("decode", "8,16,32,64", "even")].sessions == 1  # not matched: decode
    committed = read.superseded()
    assert len(committed) and committed.why.str.len().min() > 20 and committed.session.str.fullmatch(r"s\d+").all()
    with pytest.raises(ValueError, match=r"sup\.csv: header: missing column.*why"):
        bad = tmp_path / "sup.csv"
        bad.write_text("session,cells\ns1,*\n")
        read.superseded(bad)


def test_the_host_study_counts_the_launches_each_path_adds(tmp_path):
    # studies/lora_tax/host.py on the tiny preset (launches stubbed) and the committed recording: the launches LoRA
    # adds per layer are the plan's, derived here from the paths alone: a kernel per op (its delta, or
    # a fused path's shrink), and the per-adapter alignment's 3 kernels where a separate delta runs
    import torch

    from lora_moe_lab.config import get_shape
    from lora_moe_lab.kernels import plan_table
    from lora_moe_lab.kernels.plan import LoRADims, plan
    from studies.lora_tax import host

    def added(shape, M):
        with plan_table.override(plan_table.load("NVIDIA_H200")):
            paths = [plan(op, M, get_shape(shape), torch.device("cpu"), lora=LoRADims(4, 16, 4)).path
                     for op in ("gate_up", "down")]
        # a launch per op (a delta, or the shrink of a fused path), plus the alignment once where a delta needs it
        return len(paths) + 3 * ("separate" in paths)

    host.main(["--out", str(tmp_path), "--shapes", "tiny", "--tokens", "4", "--layers", "2", "--reps", "10",
               "--inner", "1", "--warmup", "1"])
    got = pd.read_csv(tmp_path / "lora_tax_host.csv")  # no wall time is asserted: only what the run counted
    # on a GPU the study also issues the launches (its `issued` arm), counted the same way
    assert list(got.arm) == ["stubbed"] + (["issued"] if torch.cuda.is_available() else []), list(got.arm)
    stubbed = got[got.arm == "stubbed"].iloc[0]  # the launches the lab's Python makes: the plan's, on any machine
    assert stubbed.launches_on - stubbed.launches_off == added("tiny", 4), got
    host_csv = Path(__file__).resolve().parents[2] / "data" / "lora_tax" / "lora_tax_host.csv"  # the recording
    for _, r in pd.read_csv(host_csv).iterrows():
        assert r.launches_on - r.launches_off == added(r["shape"], r.tokens), (host_csv, r["shape"], r.tokens)
        assert r.lo <= r.ratio <= r.hi < 1
