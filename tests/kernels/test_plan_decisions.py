"""The LoRA paths' launch decisions on the host (kernels/plan.py), one rule at a time, from static shapes only.

The tile and block rules the plan asks (configs.moe_block_m, lora_block_m, lora_down_config, gemm_config) are
replaced by spies that return their own arguments, so each test sees what the plan asked and what it did with the
answer; the table is a stand-in with one entry per op (plan.table_for). No kernel runs: this is the decision alone.
"""
from types import SimpleNamespace

import pytest

from lora_moe_lab.config import get_shape
from lora_moe_lab.kernels import configs, plan
from lora_moe_lab.kernels.paths.wide import wide_columns

SHAPE = get_shape("tiny")  # hidden 64, intermediate 32, 8 experts, top_k 2
K_OF = {"gate_up": SHAPE.hidden, "down": SHAPE.intermediate}
N_OF = {"gate_up": 2 * SHAPE.intermediate, "down": SHAPE.hidden}
DIMS = plan.LoRADims(slots=3, rank=16, rows=2)
BOUND = 8  # the stand-in table's decode bound, in (token, k) pairs


@pytest.fixture
def rules(monkeypatch):
    """Spies for the block and tile rules; `tile` is the base GEMM's tile the plan reads (block_k, w_desc)."""
    tile = SimpleNamespace(block_k=16, w_desc=True)
    monkeypatch.setattr(configs, "moe_block_m", lambda *a: ("bm",) + a)
    monkeypatch.setattr(configs, "lora_block_m", lambda *a: ("lbm",) + a)
    monkeypatch.setattr(configs, "lora_down_config", lambda *a: ("down_cfg",) + a)
    asked = []

    def gemm_config(*a):
        asked.append(a)
        return tile

    monkeypatch.setattr(configs, "gemm_config", gemm_config)
    return SimpleNamespace(tile=tile, asked=asked)


def _table(monkeypatch, gate_up=None, down=None, **shapes):
    """The stand-in table: these entries at every bucket (None: separate), the decode bound BOUND. Returns the list
    of the devices the plan asks it for."""
    e = {"gate_up": gate_up or plan.Entry(), "down": down or plan.Entry()}
    t = plan.table_for().but(decode_max_pairs=BOUND, ops={op: dict.fromkeys(plan.BUCKETS, e[op]) for op in e},
                             shapes=shapes)
    asked_for = []  # the devices the plan asked the table of

    def table_for(device=None):
        asked_for.append(device)
        return t

    monkeypatch.setattr(plan, "table_for", table_for)
    return asked_for


def _bm(M):
    return ("bm", M, SHAPE.top_k, SHAPE.num_experts, SHAPE.hidden, SHAPE.intermediate)


@pytest.mark.parametrize("M,k,E,bm", [(16, 1, 1, 16), (17, 1, 1, 32), (64, 1, 1, 32), (65, 1, 1, 64),
                                      (32, 2, 4, 16), (33, 2, 4, 32), (128, 2, 4, 32), (129, 2, 4, 64)])
def test_torch_block_m_steps_at_16_and_64_pairs_per_expert(M, k, E, bm):
    assert plan.torch_block_m(M, k, E) == bm


def test_wide_columns_lay_each_slice_and_the_slots_rounded_up():
    assert configs.block_r(16) == 16 and configs.block_r(40) == 64
    assert wide_columns("gate_up", plan.LoRADims(3, 16, 3)) == 2 * 4 * 16  # two slices, 3 slots -> 4
    assert wide_columns("down", plan.LoRADims(3, 16, 3)) == 4 * 16
    assert wide_columns("down", plan.LoRADims(5, 40, 2)) == 8 * 64


def test_no_lora_work_plans_the_base_alignment_only(rules, monkeypatch):
    _table(monkeypatch, gate_up=plan.Entry("packed"), down=plan.Entry("wide"))
    for op in plan.OPS:
        assert plan.plan(op, 64, SHAPE) == plan.LoRAPlan(op, "none", _bm(64))
        assert plan.plan(op, 64, SHAPE, backend="torch") == plan.LoRAPlan(op, "none", plan.torch_block_m(64, 2, 8))


def test_the_torch_backend_is_always_separate_on_its_own_blocks(rules, monkeypatch):
    _table(monkeypatch, gate_up=plan.Entry("packed"), down=plan.Entry("wide"))
    for M in (1, 200):
        bm = plan.torch_block_m(M, SHAPE.top_k, SHAPE.num_experts)
        for op in plan.OPS:
            assert plan.plan(op, M, SHAPE, lora=DIMS, backend="torch") == plan.LoRAPlan(op, "separate", bm,
                                                                                      lora_block_m=bm)


@pytest.mark.parametrize("op", plan.OPS)
def test_decode_up_to_the_bound_of_pairs_then_separate(rules, monkeypatch, op):
    _table(monkeypatch, **{op: plan.Entry("separate", decided_by=("rec",))})
    M = BOUND // SHAPE.top_k
    assert plan.plan(op, M, SHAPE, lora=DIMS) == plan.LoRAPlan(op, "decode", _bm(M))
    p = plan.plan(op, M + 1, SHAPE, lora=DIMS)
    lbm = ("lbm", M + 1, SHAPE.top_k, SHAPE.num_experts, DIMS.rows)
    cfg = ("down_cfg", M + 1, SHAPE.top_k, SHAPE.num_experts, DIMS.rows, lbm, N_OF[op], K_OF[op])
    assert p == plan.LoRAPlan(op, "separate", _bm(M + 1), lora_block_m=lbm, config=cfg if op == "down" else None,
                              decided_by=("rec",))


@pytest.mark.parametrize("op", plan.OPS)
def test_packed_entry_folds_in_the_first_hook_only(rules, monkeypatch, op):
    e = plan.Entry("packed", per_slot=True, shrink=plan.Options.of({"a": 1}), expand=plan.Options.of({"b": 2}),
                   decided_by=("rec",))
    _table(monkeypatch, **{op: e})
    for M in (1, 100):  # a fold wins over the decode bound
        assert plan.plan(op, M, SHAPE, lora=DIMS) == plan.LoRAPlan(
            op, "packed", _bm(M), True, shrink=e.shrink, expand=e.expand, decided_by=("rec",))
    later = plan.plan(op, 100, SHAPE, lora=DIMS, first=False)  # a later hook: separate, not decided by the fold
    assert later.path == "separate" and later.decided_by == () and not later.in_gemm
    assert plan.plan(op, 1, SHAPE, lora=DIMS, first=False).path == "decode"


def test_wide_gate_up_carries_top_k_tails_and_its_own_shrink(rules, monkeypatch):
    own = plan.Options.of({"w": 1})
    e = plan.Entry("wide", per_slot=True, shrink=plan.Options.of({"s": 1}), wide_shrink=own, decided_by=("r",))
    _table(monkeypatch, gate_up=e)
    C = wide_columns("gate_up", DIMS)
    p = plan.plan("gate_up", 100, SHAPE, lora=DIMS)
    assert p == plan.LoRAPlan("gate_up", "wide", _bm(100), True, shrink=own, columns=SHAPE.top_k * C,
                              decided_by=("r",)) and p.in_gemm
    assert rules.asked == [(100, _bm(100), N_OF["gate_up"], K_OF["gate_up"], SHAPE.num_experts)]
    _table(monkeypatch, gate_up=plan.Entry("wide", shrink=plan.Options.of({"s": 1})))  # no shrink of its own
    assert plan.plan("gate_up", 100, SHAPE, lora=DIMS).shrink == plan.Options.of({"s": 1})


def test_wide_runs_packed_beside_another_hook_or_on_an_uneven_k_step(rules, monkeypatch):
    e = plan.Entry("wide", per_slot=True, shrink=plan.Options.of({"s": 1}), decided_by=("r",))
    _table(monkeypatch, gate_up=e, down=e)
    for op in plan.OPS:
        p = plan.plan(op, 100, SHAPE, lora=DIMS, alone=False)
        assert p == plan.LoRAPlan(op, "packed", _bm(100), True, shrink=e.shrink, decided_by=("r",)), op
    rules.tile.block_k = 48  # hidden 64 is not a multiple: gate_up's row pointers would jump mid-step
    assert plan.plan("gate_up", 100, SHAPE, lora=DIMS).path == "packed"
    assert plan.plan("down", 100, SHAPE, lora=DIMS).path == "wide"  # down's tails are past K, not between steps
    rules.tile.block_k = 32  # 64 % 32 == 0
    assert plan.plan("gate_up", 100, SHAPE, lora=DIMS).path == "wide"


def test_wide_down_window_two_slots_where_the_tile_allows(rules, monkeypatch):
    br = configs.block_r(DIMS.rank)  # 16; three slots -> 4 slot columns: C = 64, the window 32
    e = plan.Entry("wide", per_slot=True, shrink=plan.Options.of({"s": 1}), window=True, decided_by=("r",))
    asked_for = _table(monkeypatch, down=e)
    p = plan.plan("down", 100, SHAPE, "the device", lora=DIMS)
    assert p == plan.LoRAPlan("down", "wide", _bm(100), True, shrink=e.shrink, window=2 * br,
                              columns=wide_columns("down", DIMS), decided_by=("r",))
    assert asked_for == ["the device"]  # the device's own table
    assert type(p.window) is int and type(p.columns) is int  # a kernel's constexpr: 32, not 32.0
    rules.tile.block_k = 32  # the window is one tile step: still taken
    assert plan.plan("down", 100, SHAPE, lora=DIMS).window == 2 * br
    rules.tile.block_k = 16
    assert rules.asked[-1] == (100, _bm(100), N_OF["down"], K_OF["down"], SHAPE.num_experts)
    for change, why in ((dict(w_desc=False), "no TMA"), (dict(block_k=64), "window 32 not a tile step"),
                        (dict(block_k=24), "K 32 not a tile step")):
        for k, v in change.items():
            setattr(rules.tile, k, v)
        assert plan.plan("down", 100, SHAPE, lora=DIMS).window == 0, why
        rules.tile.w_desc, rules.tile.block_k = True, 16
    assert plan.plan("down", 100, SHAPE, lora=plan.LoRADims(2, 16, 2)).window == 0  # two slots: the window is all C
    assert plan.plan("down", 100, SHAPE, lora=plan.LoRADims(1, 16, 1)).window == 0
    _table(monkeypatch, down=plan.Entry("wide"))  # the entry does not take the window
    assert plan.plan("down", 100, SHAPE, lora=DIMS).window == 0


def test_a_layer_shapes_entry_overrides_the_bucket(rules, monkeypatch):
    """The entry is looked up at the M's token bucket for this layer's (hidden, intermediate)."""
    shapes = {(SHAPE.hidden, SHAPE.intermediate): {"down": {128: {"path": "packed"}}}}
    t = plan.table_for().but(decode_max_pairs=BOUND, ops={op: dict.fromkeys(plan.BUCKETS, plan.Entry())
                                                          for op in plan.OPS}, shapes=shapes)
    monkeypatch.setattr(plan, "table_for", lambda device=None: t)
    assert [plan.plan("down", M, SHAPE, lora=DIMS).path for M in (64, 65, 128, 129)] == [
        "separate", "packed", "packed", "separate"]
    assert plan.plan("gate_up", 100, SHAPE, lora=DIMS).path == "separate"
