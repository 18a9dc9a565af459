"""analysers/floors.py: the roofline floor of a base MoE GEMM from its shapes, what a goal demands of it, the
ceilings read from the recordings (named errors where they are missing), and the down delta's candidates."""
import json

import pandas as pd
import pytest

from lora_moe_lab.config import get_shape
from lora_moe_lab.instruments.analysers import base_gemm
from lora_moe_lab.instruments.analysers import floors as fl
from lora_moe_lab.ui.kernel_plots import floors_figure

C = dict(copy_gbps=4000.0, matmul_tflops=800.0)


def test_gemm_floor_counts_bytes_and_flops_by_hand():
    sh = get_shape("qwen3-30b-a3b")
    E, k, H, I = sh.num_experts, sh.top_k, sh.hidden, sh.intermediate
    M = 1024  # every expert is hit: (1 - 8/128)^1024 is ~1e-29
    f = fl.gemm_floor("qwen3-30b-a3b", "gate_up", M, C)
    assert f["bytes"] == pytest.approx(2 * (E * 2 * I * H + M * H + M * k * 2 * I))
    assert f["flops"] == 2.0 * M * k * 2 * I * H
    assert f["bytes_us"] == pytest.approx(f["bytes"] / 4000e9 * 1e6)
    assert f["bound"] == "bytes" and f["floor_us"] == f["bytes_us"]
    d = fl.gemm_floor("qwen3-30b-a3b", "down", 16384, C)  # down reads one activation row per pair
    assert d["bytes"] == pytest.approx(2 * (E * H * I + 16384 * k * I + 16384 * k * H))
    assert d["bound"] == "flops" and d["floor_us"] == pytest.approx(d["flops"] / 800e12 * 1e6)
    with pytest.raises(ValueError, match="op must be 'gate_up' or 'down'"):  # checked before any shape is read
        fl.gemm_floor("qwen3-30b-a3b", "up", 1024, C)


def test_experts_hit_at_one_token_is_top_k():
    assert fl.experts_hit(1, 128, 8) == pytest.approx(8.0)
    assert fl.experts_hit(4096, 128, 8) == pytest.approx(128.0)


def test_goal_floors_demand_scales_with_the_goal():
    peers = pd.DataFrame([dict(preset="qwen3-30b-a3b", op="gate_up", M=1024, run="r", table_us=250.0, vllm_us=230.0,
                               direct=0.92), dict(preset="qwen3-30b-a3b", op="down", M=16, run="r", table_us=60.0,
                                                  vllm_us=70.0, direct=1.1)])
    g = fl.goal_floors(peers, C)
    assert list(g.M) == [1024]  # M < 1024 is left out
    r = g.iloc[0]
    assert r.goal_of_floor == pytest.approx(r.floor_us / (230.0 / 1.15))
    assert r.ours_of_floor == pytest.approx(r.floor_us / 250.0) and r.vllm_of_floor < r.goal_of_floor


def test_ceilings_name_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="studies/kernels/record_expand.py"):
        fl.ceilings(("nope",), tmp_path)
    (tmp_path / "old_kernels_expand.meta.json").write_text(json.dumps(dict(copy_gbps=4000.0)))
    with pytest.raises(ValueError, match="no matmul_tflops"):
        fl.ceilings(("old",), tmp_path)


def test_the_committed_recordings_read():
    c = fl.ceilings()
    assert 3500 < c["copy_gbps"] < 4800 and 600 < c["matmul_tflops"] < 1000  # an H200's copy and bf16 product
    g = fl.goal_floors(base_gemm.peer_sessions()[-1], c)
    assert len(g) == 16 and (g.ours_of_floor < 1.0).all() and (g.vllm_of_floor < 1.0).all()  # none below its floor
    d = fl.down_candidates()
    assert set(d.session) == set(fl.DOWN_SESSIONS) and (d[d.table.astype(bool)].over_table == 1.0).all()
    n = fl.down_counters()
    assert (n.arm == "table").sum() == 4 and n.dram_bytes_over_floor.between(0.8, 1.1).all()
    o = fl.occupancy_test(n)  # each counted point has all three builds, one row each
    assert len(o) == 4 and not o.isna().any().any()
    assert (o.achieved_occupancy_pct_narrow > o.achieved_occupancy_pct_table).all()  # what the hypothesis bought
    fig = floors_figure(g)
    assert len(fig.data) == 3 and fig.layout.xaxis.title.text and fig.layout.yaxis.title.text


def test_the_balance_round_backs_the_down_config(monkeypatch):
    # round 2 of the down delta (down_s3, down_s4: paired): the split items and the wide tile lose at every point in
    # both sessions; BLOCK_N 64 beats the table's tile only at qwen3 M = 4096, and lora_down_config takes it there only
    from lora_moe_lab.kernels import configs

    monkeypatch.setattr(configs.runtime, "interpreter", lambda: False)  # the GPU's configs
    b = fl.down_balance()
    assert set(b.session) == set(fl.BALANCE_SESSIONS) and b.stable.all()
    cand = b[~b.table.astype(bool)]
    narrow = cand.config.str.contains("/bn64/")
    assert (cand[~narrow].over_table_lo > 1.0).all()
    wins = cand[narrow & (cand.over_table_hi < 0.99)]
    assert set(zip(wins.preset, wins.M)) == {("qwen3-30b-a3b", 4096)} and len(wins) == len(fl.BALANCE_SESSIONS)
    for preset in ("qwen3-30b-a3b", "qwen3-30b-a3b-tp4"):
        sh = get_shape(preset)
        for M in (1024, 2048, 4096, 8192):
            bm = configs.lora_block_m(M, sh.top_k, sh.num_experts, 4)
            c = configs.lora_down_config(M, sh.top_k, sh.num_experts, 4, bm, sh.hidden, sh.intermediate)
            assert c.block_n == (64 if (preset, M) == ("qwen3-30b-a3b", 4096) else 128), (preset, M)
    n = fl.down_counters(fl.BALANCE_NCU_RUN)
    assert n.sm_busy_avg_over_max.between(0.8, 1.0).all()


def test_lora_floor_counts_the_adapters_bytes_and_flops_by_hand():
    sh = get_shape("qwen3-30b-a3b")
    E, k, H, I, R, S = sh.num_experts, sh.top_k, sh.hidden, sh.intermediate, 32, 4
    M = 4096  # every (adapter, expert) is hit; gate_up's GEMM is FLOP-bound, down's byte-bound at these ceilings
    f = fl.lora_floor("qwen3-30b-a3b", M, C, R, S)
    P = M * k
    a13, b13, a2, b2 = S * E * 2 * R * H * 2, S * E * 2 * I * R * 2, S * E * R * I * 2, S * E * H * R * 2
    assert f["weights_us"] == pytest.approx((a13 + b13 + a2 + b2) / 4000e9 * 1e6)
    shrink13 = max((a13 + M * H * 2 + P * 2 * R * 2) / 4000e9, 2 * P * H * 2 * R / 800e12) * 1e6
    assert f["gate_up_shrink_us"] == pytest.approx(shrink13)
    g = fl.gemm_floor("qwen3-30b-a3b", "gate_up", M, C)
    assert g["bound"] == "flops" and f["gate_up_expand_us"] == pytest.approx(2 * P * R * 2 * I / 800e12 * 1e6)
    d = fl.gemm_floor("qwen3-30b-a3b", "down", M, C)
    assert d["bound"] == "bytes" and f["down_expand_us"] == pytest.approx((b2 + P * R * 2) / 4000e9 * 1e6)
    assert f["added_us"] == pytest.approx(sum(v for n, v in f.items() if n.endswith(("_shrink_us", "_expand_us"))))
    with pytest.raises(ValueError, match="rank and slots must be positive"):
        fl.lora_floor("qwen3-30b-a3b", M, C, 0, S)


def test_the_share_goals_at_1024_ask_for_less_than_the_adapters_own_bytes():
    s = fl.share_floors()
    assert set(s.session) == {n for n, _ in base_gemm.COMMITTED_LAYER}
    small, large = s[s.M == 1024], s[s.M >= 4096]
    # at M = 1024 the goal leaves LoRA less time than its floor on both presets; from 4096 it needs 31-66 % of it
    assert (small.goal_of_floor > 1.2).all() and (large.goal_of_floor < 0.7).all()
    assert (s.added_over_floor > 1.0).all() and (s.floor_share_pct > s.weights_share_pct).all()
    assert s[s.M < 1024].goal_pct.isna().all()
    with pytest.raises(FileNotFoundError, match="studies/kernels/record_fold.py"):
        fl.share_floors((("nope", "picked"),), C)


def test_part_of_names_the_layers_kernels():
    assert fl.part_of("fused_moe_kernel", 0) == "GEMM gate_up" and fl.part_of("fused_moe_kernel", 1) == "GEMM down"
    assert fl.part_of("fused_moe_kernel") == "GEMMs"  # parts_s1: the launches summed
    assert fl.part_of("packed_shrink_kernel", 1) == "LoRA shrink" and fl.part_of("_align_scatter_kernel") == "alignment"
    assert fl.part_of("void at::native::reduce_kernel<128, 4, at::native::ReduceOp<c10::BFloat16, sum>") == \
        "top-k sum (torch)"
    assert fl.part_of("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8") == "router (fp32, torch)"
    assert fl.part_of("void at::native::vectorized_elementwise_kernel<4, FillFunctor<int>>") == "other"


def test_layer_parts_group_and_subtract(tmp_path):
    rows = [("base", "fused_moe_kernel", 0, 100.0), ("base", "fused_moe_kernel", 1, 50.0),
            ("picked_all", "fused_moe_kernel", 0, 110.0), ("picked_all", "fused_moe_kernel", 1, 70.0),
            ("picked_all", "packed_shrink_kernel", 0, 20.0), ("picked_all", "packed_shrink_kernel", 1, 5.0),
            ("base", "<busy>", 0, 150.0), ("picked_all", "<busy>", 0, 205.0)]
    pd.DataFrame([dict(section="parts", preset="p", M=8, arm=a, kernel=k, occurrence=o, calls=1.0, us=u, forwards=5)
                  for a, k, o, u in rows]).to_csv(tmp_path / "x_kernels_parts.csv", index=False)
    p = fl.layer_parts(("x",), tmp_path).set_index("part")
    assert p.loc["GEMM down", "added_us"] == 20.0 and p.loc["LoRA shrink", "lora_us"] == 25.0
    assert p.loc["LoRA shrink", "base_us"] == 0.0 and p.loc["<busy>", "added_us"] == 55.0
    with pytest.raises(FileNotFoundError, match="studies/kernels/record_parts.py"):
        fl.layer_parts(("nope",), tmp_path)


def test_the_profiled_parts_agree_with_the_live_layer():
    """The layer's added time summed over the profiled kernels is the live paired figure (lay_s7, lay_s8) within
    5 %, in both sessions; the base layer's GEMMs are under 70 % of it from M = 4096 (80 % at 1024); and at TP=4,
    M >= 4096, the base GEMM's down grows by more than twice what LoRA's bytes and FLOPs need (`down_expand_us`)."""
    p, s = fl.layer_parts(), fl.share_floors(base_gemm.PARTS_LAYER)  # the live layer at the parts' tables
    live = s.groupby(["preset", "M"]).added_us.mean()
    busy = p[p.part == "<busy>"].set_index(["session", "preset", "M"])
    for (sess, preset, M), r in busy.iterrows():
        assert abs(r.added_us / live[(preset, M)] - 1) < 0.05, (sess, preset, M)
        gemm = p[(p.session == sess) & (p.preset == preset) & (p.M == M) & p.part.str.startswith("GEMM")].base_us
        assert gemm.sum() < (0.7 if M >= 4096 else 0.8) * r.base_us
    down = p[(p.session == "parts_s2") & (p.part == "GEMM down") & (p.preset == "qwen3-30b-a3b-tp4") & (p.M >= 4096)]
    floor = s.groupby(["preset", "M"]).down_expand_us.first()
    assert all(r.added_us > 2 * floor[(r.preset, r.M)] for r in down.itertuples())


def test_the_share_against_a_lean_base_is_larger():
    """The base layer's torch parts at their floors: the router's floor counts x and its weights by hand, and the
    share against that leaner base is above the measured one at every point (from a third of the base layer's
    kernel time at qwen3 M >= 4096 and half at TP=4)."""
    f = fl.torch_part_floors("qwen3-30b-a3b", 1024, C)
    assert f["router (fp32, torch)"] == pytest.approx(max((2 * (1024 * 2048 + 128 * 2048) + 4 * 1024 * 128) / 4000e9,
                                                          2 * 1024 * 2048 * 128 / 800e12) * 1e6)
    assert f["top-k sum (torch)"] == pytest.approx(2 * (8192 * 2048 + 1024 * 2048) / 4000e9 * 1e6)
    lb = fl.lean_base_shares()
    assert len(lb) == 8 and (lb.lean_share_pct > lb.share_pct).all() and (lb.torch_floors_us < lb.torch_parts_us).all()
    big = lb[lb.M >= 4096]
    assert (big[big.preset == "qwen3-30b-a3b"].torch_parts_pct > 30).all()
    assert (big[big.preset == "qwen3-30b-a3b-tp4"].torch_parts_pct > 45).all()
