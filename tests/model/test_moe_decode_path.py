"""The MoE layer's LoRA path, as its plan says (kernels/plan.py; model/moe.py: LoRAHook): at decode sizes the deltas
run straight from topk_ids and the per-token row mapping (no alignment), above the bound over the per-adapter
alignment; where the plan folds an op, its delta runs inside the base GEMM: the packed build (the packed shrink, then
the adapters' columns as extra K iterations) or the wide one (those columns in the GEMM's own x and w). All give the
float64 model's output; the choice reads static shapes only. Each test plans from its own table (`_use`)."""
import pytest
import torch
from helpers import covering, fp32_tol, rel_err

from lora_moe_lab.kernels import configs, plan
from lora_moe_lab.kernels.paths.packed import packed_b
from lora_moe_lab.kernels.paths.wide import wide_w
from lora_moe_lab.model.lab import build_lab
from lora_moe_lab.model.moe import LoRAHook
from lora_moe_lab.ops import reference as ref


def _lab(device):
    lab = build_lab("tiny", num_layers=2, max_loras=3, max_rank=8, device=str(device), backend="triton", seed=4)
    lab.pool.load("r3", rank=3)
    lab.pool.load("r8", rank=8, scaling=0.5)
    return lab


ALL = frozenset(2 ** i for i in range(15))
WGS = dict(slot_window=1, both_slices=True, row_ptrs=True, sub_m=64, max_regs=128, slot_order=True)


def _entries(op, folds, build="packed", **kw):
    """Every bucket of `op`: folded with `build` where `folds`, else separate (gate_up's wide build with the
    slot-ordered W1S shrink, as the H200's plan has it)."""
    if not folds:
        return plan.entries()
    if build == "wide" and op == "gate_up":
        kw.setdefault("wide_shrink", WGS)
    return plan.entries(build, **kw)


def _use(monkeypatch, bound=0, gate_up=None, down=None, shapes=None):
    """Every plan of the test reads a table: the default's, with this decode bound and these entries per op."""
    base = plan.table_for()
    t = base.but(decode_max_pairs=bound, ops={"gate_up": gate_up or plan.entries(), "down": down or plan.entries()},
                 shapes=shapes or {})
    monkeypatch.setattr(plan, "table_for", lambda device=None: t)
    return t


@pytest.mark.parametrize("bound,folded,build", covering([
    (0, ()), (10 ** 6, ()),  # 0: always aligned; huge: always the decode path
    (0, ("gate_up", "down")), (0, ("gate_up",)), (0, ("down",)), (10 ** 6, ("down",)), (10 ** 6, ("gate_up",))],
    ["packed", "wide"], splice=(0,)))
def test_both_paths_match_the_reference(bound, folded, build, device, monkeypatch):
    if build == "wide" and not folded:
        pytest.skip("the fold's build matters only where an op folds")
    _use(monkeypatch, bound, **{op: _entries(op, op in folded, build) for op in ("gate_up", "down")})
    lab = _lab(device)
    batch, tensors = lab.make_batch(["r3", None, "r8"], [2, 1, 3])
    x = lab.random_input(batch.num_tokens, seed=1)
    lab.model.routing_log = []
    y = lab.model(x, batch, tensors, guard="launch_always")
    _check_model(lab, x, y, tensors, device)


def test_hook_takes_the_decode_path_from_static_shapes(device):
    """Up to the plan's decode bound of (token, k) pairs a separate delta runs without alignment, above it over the
    per-adapter alignment; the first hook's entry folds before the bound decides (the tiny model at M >= 128)."""
    lab = _lab(device)
    k = lab.shape.top_k
    bound = plan.table_for().decode_max_pairs
    for M, decode in ((bound // k, True), (bound // k + 1, False)):
        batch, tensors = lab.make_batch(["r3"], [M])
        hook = LoRAHook(lab.model.lora_info(0, batch, tensors), lab.model.backend, lab.shape.num_experts)
        with pytest.raises(RuntimeError, match="ask the plan first"):
            hook.prepare(torch.zeros(M, k, dtype=torch.int32, device=device))
        assert all(p.in_gemm for p in hook.plans(M, lab.shape, device))  # the first hook's: its entries fold here
        # a later hook's plan: the decode bound decides
        assert {p.path for p in hook.plans(M, lab.shape, device, first=False)} == {"decode" if decode else "separate"}
        ids = torch.zeros(M, k, dtype=torch.int32, device=device)
        hook.prepare(ids)
        assert (hook.align is None) == decode and (hook.topk_ids is ids) == decode  # decode: no alignment


@pytest.mark.parametrize("per_slot", [True, False])
def test_folding_orders_the_alignment_by_lora_row(per_slot, device, monkeypatch):
    """Where the first hook folds an op with one expand dot per slot (the plan's per_slot), the layer orders its
    alignment by LoRA row and the result still matches the reference; one dot over every slot, or nothing folded:
    it does not."""
    lab = _lab(device)
    batch, tensors = lab.make_batch(["r3", None, "r8"], [2, 1, 3])
    M = batch.num_tokens
    hook = LoRAHook(lab.model.lora_info(0, batch, tensors), lab.model.backend, lab.shape.num_experts)
    assert not any(p.order_by_row or p.in_gemm for p in hook.plans(M, lab.shape, device))  # nothing folds this small
    _use(monkeypatch, 0, down=_entries("down", True, per_slot=per_slot))
    hook = LoRAHook(lab.model.lora_info(0, batch, tensors), lab.model.backend, lab.shape.num_experts)
    p13, p2 = hook.plans(M, lab.shape, device)
    assert p2.path == "packed" and p2.order_by_row == per_slot and not p13.order_by_row
    x = lab.random_input(M, seed=2)
    seen, align = [], lab.model.backend.align  # the layer's own alignment passes order_by; a hook's does not

    def spy(*a, **kw):
        if "order_by" in kw:
            seen.append(kw["order_by"])
        return align(*a, **kw)

    monkeypatch.setattr(type(lab.model.backend), "align", staticmethod(spy))  # model.backend: a new instance
    lab.model.routing_log = []
    y = lab.model(x, batch, tensors, guard="launch_always")
    assert len(seen) == 2 and all((o is tensors.token_lora_mapping) == per_slot for o in seen)
    _check_model(lab, x, y, tensors, device)


def _spy(monkeypatch, module, name) -> list:
    """Each launch of `module`'s kernel `name` as (grid, keywords), recorded before it launches."""
    kernel, seen = getattr(module, name), []

    class Spy:
        def __getitem__(self, grid):
            return lambda *a, **kw: (seen.append((grid, kw)), kernel[grid](*a, **kw))[1]

    monkeypatch.setattr(module, name, Spy())
    return seen


def test_packed_layer_takes_the_shrink_and_expand_tables(device, monkeypatch):
    """Where the plan gives the packed build options (here one slot per shrink dot, both slices per program; two
    slots per expand dot) and the layer shape's entry a tile (the down GEMM on a persistent grid of 2 programs per
    SM), the packed layer's shrink and expand run with them and the forward still matches the reference."""
    from lora_moe_lab.config import get_shape
    from lora_moe_lab.kernels import fused_moe, fused_moe_lora_packed
    sh = get_shape("tiny")
    opts = dict(per_slot=True, shrink=dict(slot_window=1, both_slices=True, row_ptrs=True), expand=dict(depth=32))
    tile = {b: dict(expand=plan.Options.of(dict(tile=dict(persistent=2)))) for b in ALL}
    _use(monkeypatch, 0, gate_up=_entries("gate_up", True, **opts), down=_entries("down", True, **opts),
         shapes={(sh.hidden, sh.intermediate): {"down": tile}})
    lab = _lab(device)
    batch, tensors = lab.make_batch(["r3", None, "r8"], [2, 1, 3])
    x = lab.random_input(batch.num_tokens, seed=4)
    shrinks = _spy(monkeypatch, fused_moe_lora_packed, "packed_shrink_kernel")
    gemms = _spy(monkeypatch, fused_moe, "fused_moe_kernel")
    lab.model.routing_log = []
    y = lab.model(x, batch, tensors, guard="launch_always")
    # two layers, gate_up then down: one slot per dot, both of gate_up's slices in one program
    assert [(kw["SLOT_W"], kw["P_ALL"]) for _, kw in shrinks] == [(1, 2), (1, 1)] * 2
    packed = [kw for _, kw in gemms if kw.get("PACKED")]
    assert len(packed) == 4 and all(kw["EXPAND_K"] == 32 for kw in packed)
    # the down GEMMs (every second packed launch) on the shape's persistent tile, gate_up's on the table's
    assert [kw["PERSIST"] for kw in packed] == [False, True, False, True]
    _check_model(lab, x, y, tensors, device)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the host-sync check needs a CUDA device")
@pytest.mark.parametrize("guard", ["cpu_flag", "launch_always"])
@pytest.mark.parametrize("build", ["packed", "wide"])
def test_folded_down_path_has_no_host_sync(guard, build, monkeypatch):
    """A plan that folds the down GEMM at every M (the tiny model takes it; the Triton alignment ordered by LoRA
    row, the packed shrink, the GEMM with the adapters' columns): it must stay as sync-free as the separate deltas.
    Checked region over a whole forward; with the wide builds, gate_up folded too (its wide build where the GPU's
    tile steps evenly over the tiny K)."""
    from lora_moe_lab.instruments.recorders.syncs import checked_region
    _use(monkeypatch, 0, gate_up=_entries("gate_up", build == "wide", build, per_slot=True),
         down=_entries("down", True, build, per_slot=True))
    lab = _lab(torch.device("cuda"))
    batch, tensors = lab.make_batch(["r3", None, "r8"], [40, 7, 33])
    x = lab.random_input(batch.num_tokens, seed=3)
    lab.model(x, batch, tensors, guard=guard)  # compile outside the region
    torch.cuda.synchronize()
    with checked_region():
        lab.model(x, batch, tensors, guard=guard)
    torch.cuda.synchronize()


def test_packed_b_follows_every_load_in_place(device):
    """The packed fold's B (kernels/paths/packed.py: `packed_b`) is built once and rewritten in place by every load and
    unload, so a CUDA graph captured over it sees the new adapter, as it does the stacks."""
    from lora_moe_lab.kernels.fused_moe_lora_packed import pack_lora_b
    lab = _lab(device)
    w = lab.pool.layers[0]
    before = {op: packed_b(w, op) for op in ("gate_up", "down")}
    lab.pool.unload(lab.pool.slot_names[0])
    lab.pool.load("fresh", rank=4, seed=11)
    for op, t in before.items():
        assert packed_b(w, op) is t  # the same buffer
        b = w.gate_up_b if op == "gate_up" else w.down_b[None]
        assert torch.equal(t, pack_lora_b(b))


@pytest.mark.parametrize("op", ["gate_up", "down"])
def test_wide_weights_follow_every_load_in_place(op, device):
    """The wide builds' weights (kernels/paths/wide.py: `wide_w`: the layer's w13 or w2, then the op's B_packed) are
    built once per weight and their adapter columns rewritten in place by every load and unload, as packed_b is."""
    from lora_moe_lab.kernels.fused_moe_lora_packed import pack_lora_b
    lab = _lab(device)
    w, lay = lab.pool.layers[0], lab.model.layers[0]
    base = lay.w13 if op == "gate_up" else lay.w2
    t = wide_w(w, op, base)
    K = base.shape[2]
    assert torch.equal(t[..., :K], base)
    lab.pool.unload(lab.pool.slot_names[0])
    lab.pool.load("fresh", rank=4, seed=11)
    assert wide_w(w, op, base) is t  # the same buffer
    assert torch.equal(t[..., :K], base) and torch.equal(t[..., K:], pack_lora_b(
        w.gate_up_b if op == "gate_up" else w.down_b[None]))


@pytest.mark.parametrize("op", ["gate_up", "down"])
def test_the_layer_holds_its_weights_in_the_wide_build(op, device, monkeypatch):
    """On the Triton backend the model's weights live in the pool's wide builds (model/moe.py: hold_weights):
    the layer's w13 or w2 is the view [..., :K] of the op's wide tensor (the weights once, not beside a copy), equal
    bit for bit to the same seed's weights on the torch backend. A pool swapped in (another max rank) holds them in
    its own, the old one's freed, and the forward with both ops wide matches the float64 reference."""
    import gc
    import weakref

    from lora_moe_lab.config import LoRAConfig
    from lora_moe_lab.model.lora import AdapterPool

    _use(monkeypatch, 0, **{o: _entries(o, True, "wide") for o in ("gate_up", "down")})
    name = "w13" if op == "gate_up" else "w2"
    want = getattr(build_lab("tiny", num_layers=2, max_loras=3, max_rank=8, device=str(device), backend="torch",
                             seed=4).model.layers[0], name)
    lab = _lab(device)

    def held(pool):
        base, ww = getattr(lab.model.layers[0], name), pool.layers[0].derived[("wide", op)][0]
        assert base.data_ptr() == ww.data_ptr() and base.stride() == ww.stride() and torch.equal(base, want)
        return ww.shape[2] - base.shape[2]

    c8 = held(lab.pool)
    old = weakref.ref(lab.pool.layers[0].derived[("wide", op)][0])
    gc.disable()  # freed by reference counting alone: no cycle keeps a swapped-out pool's memory until a gc pass
    try:
        lab.pool = lab.model.pool = AdapterPool(lab.shape, LoRAConfig(3, 32), dtype=lab.dtype, device=lab.device)
        assert old() is None
    finally:
        gc.enable()
    assert held(lab.pool) == c8 * configs.block_r(32) // configs.block_r(8)  # C: slots x BLOCK_R
    lab.pool.load("r3", rank=3)
    lab.pool.load("r8", rank=8, scaling=0.5)
    _, (x, y, batch, tensors) = _spied_forward(lab, monkeypatch, True)
    _check_model(lab, x, y, tensors, device)


@pytest.mark.parametrize("enabled", [True, False])
def test_layer_takes_the_wide_down_build(enabled, device, monkeypatch):
    """Where the plan's down entry is wide, the layer's down GEMM is `moe_gemm_lora_wide` on the first I columns of
    a wider act buffer (one call per layer), and the forward matches the reference, with adapters live and with
    every adapter disabled."""
    _use(monkeypatch, 0, down=_entries("down", True, "wide"))
    lab = _lab(device)
    calls, (x, y, batch, tensors) = _spied_forward(lab, monkeypatch, enabled)
    S, R = lab.pool.layers[0].down_a.shape[0], lab.pool.layers[0].down_a.shape[2]
    assert [c[0] for c in calls] == [4 * configs.block_r(R)] * 2 and S == 3  # C = S rounded up to a power of 2 x BR
    _check_model(lab, x, y, tensors, device)


@pytest.mark.parametrize("enabled", [True, False])
def test_layer_takes_the_wide_down_window(enabled, device, monkeypatch):
    """Where the plan's wide down entry takes the window and the tile reads w through TMA, the layer's wide down
    GEMM walks a window of two slots' columns (`window=2 * BLOCK_R`), and the forward matches the reference, live
    and disabled. The tile: one with TMA weights and a BLOCK_K dividing K and the window, as the H200's tables have."""
    from lora_moe_lab.kernels import fused_moe

    _use(monkeypatch, 0, down=_entries("down", True, "wide", window=True))
    tile = configs.GemmConfig(32, 32, 4, 4, 2, w_desc=True)
    monkeypatch.setattr(configs, "gemm_config", lambda *a, **k: tile)  # the plan's choice and the GEMM's agree
    monkeypatch.setattr(fused_moe, "gemm_config", lambda *a, **k: tile)
    lab = _lab(device)
    backend = type(lab.model.backend)
    windows, wide = [], backend.moe_gemm_lora_wide
    monkeypatch.setattr(backend, "moe_gemm_lora_wide", staticmethod(
        lambda *a, **kw: (windows.append(kw.get("window", 0)), wide(*a, **kw))[1]))
    _, (x, y, batch, tensors) = _spied_forward(lab, monkeypatch, enabled)
    R = lab.pool.layers[0].down_a.shape[2]
    assert windows == [2 * configs.block_r(R)] * 2  # C = 4 slots x BLOCK_R: half of it per tile
    _check_model(lab, x, y, tensors, device)


@pytest.mark.parametrize("copy", [False, True])
@pytest.mark.parametrize("enabled", [True, False])
def test_layer_takes_the_wide_gate_up_build(enabled, copy, device, monkeypatch):
    """Where the plan's gate_up entry is wide, the layer's gate_up GEMM is `moe_gemm_lora_wide` per block on x
    written by the layer's norm into the first K columns of a buffer top_k * C wider (no copy), and the forward
    matches the reference, live and disabled. copy: a layer handed a plain x copies it into such a buffer (the same
    result). A second hook: the packed build instead (the wide build writes into the layer's buffers)."""
    _use(monkeypatch, 0, gate_up=_entries("gate_up", True, "wide"))
    lab = _lab(device)
    if copy:  # the norm writes a plain x: the layer copies it
        monkeypatch.setattr(type(lab.model.layers[0]), "norm",
                            lambda self, h, hooks, b: b.rmsnorm(h, self.norm_w, self.eps))
    calls, (x, y, batch, tensors) = _spied_forward(lab, monkeypatch, enabled)
    a = lab.pool.layers[0].gate_up_a
    C = 2 * 4 * configs.block_r(a.shape[3])  # 2 slices x S = 3 rounded up to 4 x BLOCK_R
    hook = LoRAHook(lab.model.lora_info(0, batch, tensors), lab.model.backend, 8)
    p13 = hook.plans(6, lab.shape, device)[0]
    assert hook.plans(6, lab.shape, device, alone=False)[0].path == "packed"
    if p13.path != "wide":
        pytest.skip("the GPU's tile does not step evenly over this K: the layer keeps the packed build")
    assert p13.columns == 2 * C and calls == [(2 * C, True, True)] * 2  # top_k = 2 tails per token row
    _check_model(lab, x, y, tensors, device)


def _spied_forward(lab, monkeypatch, enabled):
    """The lab's forward on a small batch (every adapter disabled unless `enabled`), each `moe_gemm_lora_wide` call
    logged as (the columns past K in the rows it reads, gather, per_block): (calls, (x, y, batch, tensors))."""
    backend = type(lab.model.backend)
    calls, wide = [], backend.moe_gemm_lora_wide

    def spy(x, *a, **kw):
        calls.append((x.stride(0) - x.shape[1], kw.get("gather", False), kw.get("per_block", False)))
        return wide(x, *a, **kw)

    monkeypatch.setattr(backend, "moe_gemm_lora_wide", staticmethod(spy))
    batch, tensors = lab.make_batch(["r3", None, "r8"], [2, 1, 3])
    if not enabled:
        tensors.adapter_enabled.zero_()
    x = lab.random_input(batch.num_tokens, seed=5)
    lab.model.routing_log = []
    return calls, (x, lab.model(x, batch, tensors, guard="launch_always"), batch, tensors)


def _check_model(lab, x, y, tensors, device):
    """The forward y of the two-layer lab on x (its routing logged) against the float64 reference model."""
    lora = [dict(weights=lab.pool.layers[i], token_slot=tensors.token_lora_mapping.cpu(),
                 lora_ids=tensors.lora_ids.cpu(), adapter_enabled=tensors.adapter_enabled.cpu()) for i in range(2)]
    want = ref.ref_model(x, lab.model, lora, routing=lab.model.routing_log)
    lab.model.routing_log = None
    assert rel_err(y, want) < fp32_tol(device)


def test_the_host_decides_whether_the_deltas_read_own_ranks(device):
    """`LoRAInfo.read_own_ranks` comes from the batch's host rank list: True where some adapter sits below the pool's
    padded rank, False where every one is at it (nothing to skip: the unmasked build) and for a batch whose ranks
    are unset (lora_studies' padded arm); the forward gives the reference either way."""
    import dataclasses

    from lora_moe_lab.model.lora import LoRABatchTensors

    lab = _lab(device)  # max rank 8: adapters of rank 3 and 8
    mixed, tensors = lab.make_batch(["r3", None, "r8"], [2, 1, 3])
    full, _ = lab.make_batch(["r8", None, "r8"], [2, 1, 3])
    unset = dataclasses.replace(mixed, lora_ranks=[0] * len(mixed.lora_ranks))
    assert [lab.model.lora_info(0, b, tensors).read_own_ranks for b in (mixed, full, unset)] == [True, False, False]
    x = lab.random_input(mixed.num_tokens, seed=3)
    for b in (mixed, unset):
        lab.model.routing_log = []
        y = lab.model(x, b, LoRABatchTensors.from_batch(b, lab.device), guard="launch_always")
        _check_model(lab, x, y, LoRABatchTensors.from_batch(b, lab.device), device)
