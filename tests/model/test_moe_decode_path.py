"""The MoE layer's choice of LoRA path (model/moe.py: LoRAHook): at decode sizes the deltas run
straight from topk_ids and the per-token row mapping (no alignment), above the bound over the
per-adapter alignment; where the tables say so, a delta runs inside the base GEMM: in its epilogue
(kernels/fused_moe_lora_epilogue.py) or folded into its K loop (kernels/fused_moe_lora_folded.py).
All give the float64 model's output; the choice reads static shapes only."""
import pytest
import torch
from helpers import fp32_tol, rel_err

from lora_moe_lab.kernels import configs
from lora_moe_lab.model.lab import build_lab
from lora_moe_lab.model.moe import LoRAHook
from lora_moe_lab.ops import reference as ref


def _lab(device):
    lab = build_lab("tiny", num_layers=2, max_loras=3, max_rank=8, device=str(device), backend="triton", seed=4)
    lab.pool.load("r3", rank=3)
    lab.pool.load("r8", rank=8, scaling=0.5)
    return lab


ALL = frozenset(2 ** i for i in range(15))


def _set_build(monkeypatch, build):
    """configs' fold build: "rows", "packed", or "wide" (packed, both GEMMs' wide builds at every M)."""
    monkeypatch.setattr(configs, "FOLD_BUILD", "rows" if build == "rows" else "packed")
    monkeypatch.setattr(configs, "WIDE_DOWN_TOKENS", ALL if build == "wide" else frozenset())
    monkeypatch.setattr(configs, "WIDE_GATE_UP_TOKENS", ALL if build == "wide" else frozenset())


@pytest.mark.parametrize("bound,fused,folded", [
    (0, (), ()), (10 ** 6, (), ()),  # 0: always aligned; huge: always the decode path
    (0, ("gate_up",), ()), (10 ** 6, ("down",), ()), (0, ("gate_up", "down"), ()),  # the epilogue
    (0, (), ("gate_up", "down")), (0, ("gate_up",), ("down",)), (10 ** 6, ("down",), ("gate_up",))])  # folded
@pytest.mark.parametrize("build", ["packed", "rows", "wide"])
def test_both_paths_match_the_reference(bound, fused, folded, build, device, monkeypatch):
    if build in ("rows", "wide") and not folded:
        pytest.skip("the fold's build matters only where an op folds")
    _set_build(monkeypatch, build)
    monkeypatch.setattr(configs, "DECODE_MAX_PAIRS", bound)
    monkeypatch.setattr(configs, "FUSED_LORA_TOKENS",
                        {op: ALL if op in fused else frozenset() for op in ("gate_up", "down")})
    monkeypatch.setattr(configs, "FOLDED_LORA_TOKENS",
                        {op: ALL if op in folded else frozenset() for op in ("gate_up", "down")})
    lab = _lab(device)
    batch, tensors = lab.make_batch(["r3", None, "r8"], [2, 1, 3])
    x = lab.random_input(batch.num_tokens, seed=1)
    lab.model.routing_log = []
    y = lab.model(x, batch, tensors, guard="launch_always")
    _check_model(lab, x, y, tensors, device)


def test_hook_takes_the_decode_path_from_static_shapes(device):
    lab = _lab(device)
    k = lab.shape.top_k
    for M, decode in ((configs.DECODE_MAX_PAIRS // k, True), (configs.DECODE_MAX_PAIRS // k + 1, False)):
        batch, tensors = lab.make_batch(["r3"], [M])
        hook = LoRAHook(lab.model.lora_info(0, batch, tensors), lab.model.backend, lab.shape.num_experts)
        ids = torch.zeros(M, k, dtype=torch.int32, device=device)
        hook.prepare(ids)
        assert (hook.align is None) == decode and (hook.topk_ids is ids) == decode  # decode: no alignment


@pytest.mark.parametrize("by_row", [True, False])
@pytest.mark.parametrize("build,per_slot", [("rows", None), ("packed", True), ("packed", False)])
def test_folding_orders_the_alignment_by_lora_row(by_row, build, per_slot, device, monkeypatch):
    """Where the first hook folds an op, the layer orders its alignment by LoRA row (the rows build; the packed
    build at PACKED_PER_SLOT_TOKENS) and the result still matches the reference; with FOLDED_ORDER_BY_ROW off, or
    nothing folded, it does not."""
    monkeypatch.setattr(configs, "DECODE_MAX_PAIRS", 0)
    monkeypatch.setattr(configs, "FOLDED_ORDER_BY_ROW", by_row)
    monkeypatch.setattr(configs, "FOLD_BUILD", build)
    monkeypatch.setattr(configs, "PACKED_PER_SLOT_TOKENS", ALL if per_slot else frozenset())
    lab = _lab(device)
    batch, tensors = lab.make_batch(["r3", None, "r8"], [2, 1, 3])
    hook = LoRAHook(lab.model.lora_info(0, batch, tensors), lab.model.backend, lab.shape.num_experts)
    M, sh = batch.num_tokens, lab.shape
    assert hook.fold_order(M, sh.top_k, sh.hidden, sh.intermediate) is None  # the table folds nothing this small
    monkeypatch.setattr(configs, "FOLDED_LORA_TOKENS", {"gate_up": frozenset(), "down": ALL})
    order = hook.fold_order(M, sh.top_k, sh.hidden, sh.intermediate)
    folds = lab.model.backend.use_folded_lora("down", M, sh.top_k, sh.num_experts, sh.hidden, sh.intermediate)
    by_row = by_row and per_slot is not False  # the packed build orders only where it expands per slot
    assert (order is tensors.token_lora_mapping) == (folds and by_row)
    x = lab.random_input(M, seed=2)
    seen, align = [], lab.model.backend.align  # the layer's own alignment passes order_by; a hook's does not

    def spy(*a, **kw):
        if "order_by" in kw:
            seen.append(kw["order_by"])
        return align(*a, **kw)

    monkeypatch.setattr(type(lab.model.backend), "align", staticmethod(spy))  # model.backend: a new instance
    lab.model.routing_log = []
    y = lab.model(x, batch, tensors, guard="launch_always")
    assert len(seen) == 2 and all((o is tensors.token_lora_mapping) == (folds and by_row) for o in seen)
    _check_model(lab, x, y, tensors, device)


def test_packed_layer_takes_the_shrink_and_expand_tables(device, monkeypatch):
    """Where configs.PACKED_SHRINK_TOKENS, PACKED_EXPAND_TOKENS and PACKED_TILE_SHAPE_TOKENS name a bucket (and GEMM
    shape), the packed layer's shrink and expand run with those options (here one slot per shrink dot, both slices
    per program, x kept in L2; two slots per expand dot; the down GEMM on a persistent grid of 2 programs per SM) and
    the forward still matches the reference."""
    from lora_moe_lab.config import get_shape
    sh = get_shape("tiny")
    monkeypatch.setattr(configs, "PACKED_TILE_SHAPE_TOKENS",
                        {("down", sh.hidden, sh.intermediate): {b: dict(persistent=2) for b in ALL}})
    from lora_moe_lab.kernels.fused_moe_lora_packed import LAST_PACKED_LAUNCH
    monkeypatch.setattr(configs, "DECODE_MAX_PAIRS", 0)
    monkeypatch.setattr(configs, "FOLD_BUILD", "packed")
    monkeypatch.setattr(configs, "PACKED_PER_SLOT_TOKENS", ALL)
    monkeypatch.setattr(configs, "FOLDED_LORA_TOKENS", {"gate_up": ALL, "down": ALL})
    monkeypatch.setattr(configs, "PACKED_SHRINK_TOKENS", {b: dict(slot_window=1, both_slices=True, row_ptrs=True,
                                                                  x_keep=True) for b in ALL})
    monkeypatch.setattr(configs, "PACKED_EXPAND_TOKENS", {b: dict(depth=32) for b in ALL})
    lab = _lab(device)
    batch, tensors = lab.make_batch(["r3", None, "r8"], [2, 1, 3])
    x = lab.random_input(batch.num_tokens, seed=4)
    LAST_PACKED_LAUNCH.clear()
    lab.model.routing_log = []
    y = lab.model(x, batch, tensors, guard="launch_always")
    assert LAST_PACKED_LAUNCH["shrink_window"] == 1 and LAST_PACKED_LAUNCH["expand_k"] == 32
    assert LAST_PACKED_LAUNCH["tile"].persistent == 2  # the last packed launch: layer 2's down GEMM
    _check_model(lab, x, y, tensors, device)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the host-sync check needs a CUDA device")
@pytest.mark.parametrize("guard", ["cpu_flag", "launch_always"])
@pytest.mark.parametrize("build", ["packed", "rows", "wide"])
def test_folded_down_path_has_no_host_sync(guard, build, monkeypatch):
    """A table that folds the down GEMM (the committed one folds nothing since the sub-block base build) takes that
    path (the Triton alignment ordered by LoRA row, the per-row shrink, the folded GEMM): it must stay as sync-free
    as the separate deltas. Checked region over a whole forward, every M folded so the tiny model takes it; with
    the wide builds, gate_up folded too (its wide build where the GPU's tile steps evenly over the tiny K)."""
    from lora_moe_lab.instruments.recorders.syncs import checked_region
    _set_build(monkeypatch, build)
    monkeypatch.setattr(configs, "DECODE_MAX_PAIRS", 0)
    # the wide build: gate_up folds too, so its wide build (from the norm's wider buffer) runs in the region
    monkeypatch.setattr(configs, "FOLDED_LORA_TOKENS", {"gate_up": ALL if build == "wide" else frozenset(),
                                                        "down": ALL})
    lab = _lab(torch.device("cuda"))
    batch, tensors = lab.make_batch(["r3", None, "r8"], [40, 7, 33])
    x = lab.random_input(batch.num_tokens, seed=3)
    lab.model(x, batch, tensors, guard=guard)  # compile outside the region
    torch.cuda.synchronize()
    with checked_region():
        lab.model(x, batch, tensors, guard=guard)
    torch.cuda.synchronize()


def test_packed_b_follows_every_load_in_place(device):
    """The packed fold's B (`LayerLoRAWeights.packed_b`) is built once and rewritten in place by every load and
    unload, so a CUDA graph captured over it sees the new adapter, as it does the stacks."""
    from lora_moe_lab.kernels.fused_moe_lora_packed import pack_lora_b
    lab = _lab(device)
    w = lab.pool.layers[0]
    before = {op: w.packed_b(op) for op in ("gate_up", "down")}
    lab.pool.unload(lab.pool.slot_names[0])
    lab.pool.load("fresh", rank=4, seed=11)
    for op, t in before.items():
        assert w.packed_b(op) is t  # the same buffer
        b = w.gate_up_b if op == "gate_up" else w.down_b[None]
        assert torch.equal(t, pack_lora_b(b))


@pytest.mark.parametrize("op", ["gate_up", "down"])
def test_wide_weights_follow_every_load_in_place(op, device):
    """The wide builds' weights (`LayerLoRAWeights.wide_w`: the layer's w13 or w2, then the op's B_packed) are built
    once per weight and their adapter columns rewritten in place by every load and unload, as packed_b is."""
    from lora_moe_lab.kernels.fused_moe_lora_packed import pack_lora_b
    lab = _lab(device)
    w, lay = lab.pool.layers[0], lab.model.layers[0]
    base = lay.w13 if op == "gate_up" else lay.w2
    t = w.wide_w(op, base)
    K = base.shape[2]
    assert torch.equal(t[..., :K], base)
    lab.pool.unload(lab.pool.slot_names[0])
    lab.pool.load("fresh", rank=4, seed=11)
    assert w.wide_w(op, base) is t  # the same buffer
    assert torch.equal(t[..., :K], base) and torch.equal(t[..., K:], pack_lora_b(
        w.gate_up_b if op == "gate_up" else w.down_b[None]))


@pytest.mark.parametrize("enabled", [True, False])
def test_layer_takes_the_wide_down_build(enabled, device, monkeypatch):
    """Where configs.WIDE_DOWN_TOKENS names the bucket and down folds, the layer's down GEMM is `moe_gemm_lora_wide`
    on the first I columns of a wider act buffer (one call per layer), and the forward matches the reference, with
    adapters live and with every adapter disabled."""
    monkeypatch.setattr(configs, "DECODE_MAX_PAIRS", 0)
    _set_build(monkeypatch, "wide")
    monkeypatch.setattr(configs, "WIDE_GATE_UP_TOKENS", frozenset())
    monkeypatch.setattr(configs, "FOLDED_LORA_TOKENS", {"gate_up": frozenset(), "down": ALL})
    lab = _lab(device)
    calls, (x, y, batch, tensors) = _spied_forward(lab, monkeypatch, enabled)
    S, R = lab.pool.layers[0].down_a.shape[0], lab.pool.layers[0].down_a.shape[2]
    assert [c[0] for c in calls] == [4 * configs.block_r(R)] * 2 and S == 3  # C = S rounded up to a power of 2 x BR
    _check_model(lab, x, y, tensors, device)


@pytest.mark.parametrize("enabled", [True, False])
def test_layer_takes_the_wide_down_window(enabled, device, monkeypatch):
    """Where configs.WIDE_DOWN_WINDOW_TOKENS names the bucket and the tile reads w through TMA, the layer's wide down
    GEMM walks a window of two slots' columns (`window=2 * BLOCK_R`), and the forward matches the reference, live
    and disabled. The tile: one with TMA weights and a BLOCK_K dividing K and the window, as the H200's tables have."""
    from lora_moe_lab.kernels import fused_moe

    monkeypatch.setattr(configs, "DECODE_MAX_PAIRS", 0)
    _set_build(monkeypatch, "wide")
    monkeypatch.setattr(configs, "WIDE_GATE_UP_TOKENS", frozenset())
    monkeypatch.setattr(configs, "WIDE_DOWN_WINDOW_TOKENS", ALL)
    monkeypatch.setattr(configs, "FOLDED_LORA_TOKENS", {"gate_up": frozenset(), "down": ALL})
    tile = configs.GemmConfig(32, 32, 4, 4, 2, w_desc=True)
    monkeypatch.setattr(configs, "gemm_config", lambda *a, **k: tile)  # the layer's choice and the GEMM's agree
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
    """Where configs.WIDE_GATE_UP_TOKENS names the bucket and gate_up folds, the layer's gate_up GEMM is
    `moe_gemm_lora_wide` per block on x written by the layer's norm into the first K columns of a buffer top_k * C
    wider (no copy), and the forward matches the reference, live and disabled. copy: a layer handed a plain x copies
    it into such a buffer (the same result)."""
    monkeypatch.setattr(configs, "DECODE_MAX_PAIRS", 0)
    _set_build(monkeypatch, "wide")
    monkeypatch.setattr(configs, "WIDE_DOWN_TOKENS", frozenset())
    monkeypatch.setattr(configs, "FOLDED_LORA_TOKENS", {"gate_up": ALL, "down": frozenset()})
    lab = _lab(device)
    if copy:  # the norm writes a plain x: the layer copies it
        monkeypatch.setattr(type(lab.model.layers[0]), "norm",
                            lambda self, h, hooks, b: b.rmsnorm(h, self.norm_w, self.eps))
    calls, (x, y, batch, tensors) = _spied_forward(lab, monkeypatch, enabled)
    a = lab.pool.layers[0].gate_up_a
    C = 2 * 4 * configs.block_r(a.shape[3])  # 2 slices x S = 3 rounded up to 4 x BLOCK_R
    hook = LoRAHook(lab.model.lora_info(0, batch, tensors), lab.model.backend, 8)
    if hook.gate_up_columns(6, 2, 64, 32) == 0:
        pytest.skip("the GPU's tile does not step evenly over this K: the layer keeps the packed build")
    assert calls == [(2 * C, True, True)] * 2  # top_k = 2 tails per token row
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
