"""The base GEMM with the LoRA delta inside, packed (kernels/fused_moe_lora_packed.py: the packed shrink, then the
base GEMM with the adapters' columns as extra K iterations), against float64: out = base (+ delta for pairs of
tokens with a live adapter) (* routed weight). The tried builds (epilogue, folded rows, the expand and shrink options
no plan takes) are tested beside their code in studies/kernels/tried/.

Interpreter on CPU (tiny shapes, fp32 < 1e-5, fp16 < 2e-2), unchanged on CUDA (bf16 added). `out`
starts NaN-poisoned (every row must be written); rows of pairs without a live adapter must equal
the plain base GEMM (`moe_gemm`, same tiles) bit for bit.
"""
import functools

import pytest
import torch
from helpers import covering
from lora_gemm_cases import FUSED_CASES, DEV, DTYPES, I32, make_case, run_fused

from lora_moe_lab.kernels.align import moe_align
from lora_moe_lab.kernels.common import pow2
from lora_moe_lab.kernels.configs import GemmConfig, block_r
from lora_moe_lab.kernels import fused_moe, fused_moe_lora_packed as fmp
from lora_moe_lab.kernels.fused_moe_lora_packed import lora_shrink_packed, moe_gemm_lora_packed

# packed: one expand dot over every slot's columns; per slot: one per slot in the block's range; on a persistent
# grid of sub-blocks (the plain GEMM's tile table applies to the packed GEMM as it is)
IMPLS = {"packed": moe_gemm_lora_packed, "packed_slot": functools.partial(moe_gemm_lora_packed, per_slot=True),
         "packed_persist": functools.partial(moe_gemm_lora_packed, config=GemmConfig(
             16, 32, 4, 4, 2, persistent=1, flatten=True, sub_m=16, early_loads=True))}


class LaunchSpy:
    """Stands in for a @triton.jit kernel of a module (monkeypatch): records each launch's grid and keywords, then
    launches the kernel."""

    def __init__(self, monkeypatch, module, name):
        self.kernel, self.launches = getattr(module, name), []
        monkeypatch.setattr(module, name, self)

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.launches.append((grid, kw))
            return self.kernel[grid](*args, **kw)
        return launch


def packed_u(c, P, dtype):
    """The packed build's u (EM, P, C), NaN-poisoned: every real row must be written."""
    S, R = c["a"].shape[1], c["a"].shape[3]
    return lambda al: torch.full((al.sorted_token_ids.shape[1], P, pow2(S) * block_r(R)), float("nan"), dtype=dtype,
                                 device=DEV)


def run_packed(c, dtype, E, top_k, P, N, bm=16, impl=moe_gemm_lora_packed, order=False):
    return run_fused(c, dtype, E, top_k, P, N, bm=bm, impl=impl, order=order, shrink_out=packed_u(c, P, dtype))


@pytest.mark.parametrize("case,dtype,impl", covering(FUSED_CASES, DTYPES, IMPLS))
def test_packed_matches_reference(case, dtype, impl):
    M, K, N, E, top_k, S, L, R, P, extra = case
    codes = run_packed(make_case(M * 7 + N, M, K, N, E, top_k, S, L, R, P, dtype=dtype, **extra), dtype, E, top_k, P,
                       N, impl=IMPLS[impl])
    assert (codes == 0).any() and (codes != 0).any()  # both kinds of row were checked


@pytest.mark.parametrize("impl", IMPLS)
def test_packed_nothing_live_is_the_plain_gemm(impl, monkeypatch):
    gemm = LaunchSpy(monkeypatch, fused_moe, "fused_moe_kernel")
    c = make_case(3, 4, 32, 16, 4, 2, 2, 2, 8, 2, mapping=[0, -1, 1, 1], enabled=[0, 0])
    codes = run_packed(c, torch.float32, 4, 2, 2, 16, impl=IMPLS[impl])
    assert (codes != 0).all()
    assert gemm.launches[-1][1]["PACK_C"] == 2 * 16  # S_POW2 * BLOCK_R


PACKED_VARIANTS = {"all": {}, "slot_ordered": dict(per_slot=True), "slot_unordered": dict(per_slot=True),
                   # the plain GEMM's tile table as it is: a persistent grid over sub-blocks, flattened loops
                   "persist_sub": dict(per_slot=True, config=GemmConfig(16, 32, 4, 4, 2, persistent=2, flatten=True,
                                                                         sub_m=16, early_loads=True)),
                   "sub": dict(config=GemmConfig(32, 16, 4, 4, 2, sub_m=16)),
                   # the shrink in programs of 16 rows: a program without live rows in a live block writes zeros
                   "shrink_sub": dict(shrink=dict(sub_m=16)),
                   # the shrink one slot (two slots) per dot, both slices from one x tile; on the ordered alignment
                   # (few slots per block) and on the plain one (every slot: every window computed)
                   "win1_both_ordered": dict(per_slot=True, shrink=dict(slot_window=1, both_slices=True)),
                   "win1_both": dict(shrink=dict(slot_window=1, both_slices=True, row_ptrs=True)),
                   "win2_sub": dict(shrink=dict(slot_window=2, sub_m=16, row_ptrs=True)),
                   # two slots of BLOCK_R 16 per dot: on the ordered alignment, and over both slices of a tile
                   # that splits them
                   "depth2_ordered": dict(per_slot=True, expand=dict(depth=32)),
                   "depth2": dict(expand=dict(depth=32)),
                   # the GEMM's tile through the expand option: the config's fields replaced (a flattened grid)
                   "tile_persist": dict(per_slot=True, config=GemmConfig(16, 32, 4, 4, 2),
                                        expand=dict(tile=dict(persistent=2, flatten=True)))}
ORDERED = ("slot_ordered", "win1_both_ordered", "depth2_ordered")


@pytest.mark.parametrize("bm,variant", covering([16, 32], PACKED_VARIANTS)  # 64: the GPU check and test-all
                         + [pytest.param(64, v, marks=pytest.mark.slow) for v in PACKED_VARIANTS])
def test_packed_random_blocks_and_ranks(bm, variant):
    """The packed path on fresh random cases per BLOCK_M: many slots per block, a rank below BLOCK_R, rows
    without adapter, a disabled row and an empty slot, gate_up and down, slices that split a tile."""
    for seed in range(3):
        g = torch.Generator().manual_seed(100 * bm + seed + 7)
        M, K, N = (int(v) for v in torch.randint(12, 40, (3,), generator=g))
        P, gather = (2, True) if seed % 2 == 0 else (1, False)
        c = make_case(bm + seed, M, K + 8, N + 8, 5, 3, 4, 4, 5 + seed * 7, P, gather=gather, with_rw=not gather,
                      lora_ids=[0, 3, -1, 1], enabled=[1, 1, 1, 0])
        codes = run_packed(c, torch.float32, 5, 3, P, N + 8, bm=bm, order=variant in ORDERED,
                           impl=functools.partial(moe_gemm_lora_packed, **PACKED_VARIANTS[variant]))
        assert (codes == 0).any()


def test_packed_unknown_expand_option_is_an_error():
    c = make_case(1, 2, 16, 8, 4, 2, 2, 2, 4, 2)
    x, a, b, ids, m, lid, en = (c[k].to(DEV) for k in ("x", "a", "b", "ids", "mapping", "lora_ids", "enabled"))
    with pytest.raises(ValueError, match="unknown expand options \\['unrol'\\]"):
        moe_gemm_lora_packed(x, torch.randn(4, 16, 16, device=DEV), moe_align(ids, 4, 16), 2,
                             torch.empty(4, 16, device=DEV), a, b, m, lid, en, expand=dict(unrol=True))
    with pytest.raises(ValueError, match="expand depth must be a power of two from BLOCK_R=16 to C=32, got 48"):
        moe_gemm_lora_packed(x, torch.randn(4, 16, 16, device=DEV), moe_align(ids, 4, 16), 2,
                             torch.empty(4, 16, device=DEV), a, b, m, lid, en, expand=dict(depth=48))
    with pytest.raises(ValueError, match="expand tile \\{'persist': 0\\} names a field GemmConfig does not have"):
        moe_gemm_lora_packed(x, torch.randn(4, 16, 16, device=DEV), moe_align(ids, 4, 16), 2,
                             torch.empty(4, 16, device=DEV), a, b, m, lid, en, expand=dict(tile=dict(persist=0)))
    for tried in ("unroll", "prefetch", "u_ptr", "early"):  # studies/kernels/tried/packed_switches.py's, no plan's
        with pytest.raises(ValueError, match=f"unknown expand options \\['{tried}'\\]"):
            moe_gemm_lora_packed(x, torch.randn(4, 16, 16, device=DEV), moe_align(ids, 4, 16), 2,
                                 torch.empty(4, 16, device=DEV), a, b, m, lid, en, expand={tried: True})


@pytest.mark.parametrize("impl", IMPLS)
def test_packed_errors(impl):
    moe_gemm_lora = IMPLS[impl]  # the checks are shared (check_lora_gemm_inputs): every build raises the same
    c = make_case(1, 2, 16, 8, 4, 2, 2, 2, 4, 2)
    x, a, b, ids = (c[k].to(DEV) for k in ("x", "a", "b", "ids"))
    w = torch.randn(4, 16, 16, device=DEV)
    al = moe_align(ids, 4, 16)
    out = torch.empty(4, 16, device=DEV)
    m, lid, en = (c[k].to(DEV) for k in ("mapping", "lora_ids", "enabled"))
    with pytest.raises(ValueError, match="must match w"):
        moe_gemm_lora(x, w, al, 2, out, a[:1], b, m, lid, en)
    with pytest.raises(ValueError, match="token_lora_mapping must be"):
        moe_gemm_lora(x, w, al, 2, out, a, b, torch.zeros(3, device=DEV, **I32), lid, en)
    with pytest.raises(TypeError, match="lora_ids must have dtype int32"):
        moe_gemm_lora(x, w, al, 2, out, a, b, m, lid.long(), en)


@pytest.mark.parametrize("variant", ["all", "persist_sub"])
def test_packed_live_adapters_but_no_live_pair_is_the_plain_gemm(variant):
    """Adapters live in the launch but no token uses one: every block's range is empty, and every row equals the
    plain GEMM's bit for bit."""
    c = make_case(3, 4, 32, 16, 4, 2, 2, 2, 8, 2, mapping=[-1, -1, -1, -1], enabled=[1, 1])
    codes = run_packed(c, torch.float32, 4, 2, 2, 16,
                       impl=functools.partial(moe_gemm_lora_packed, **PACKED_VARIANTS[variant]))
    assert (codes != 0).all()


def test_packed_shrink_with_nothing_live_writes_empty_ranges_only():
    """Every adapter disabled: every shrink program writes its block's empty range and ends before its block's
    metadata, so u stays as it was (the GEMM reads no column of it)."""
    c = make_case(5, 6, 32, 16, 4, 2, 2, 2, 8, 2, enabled=[0, 0])
    d = {k: (v.to(DEV) if isinstance(v, torch.Tensor) else v) for k, v in c.items()}
    al = moe_align(d["ids"], 4, 16)
    u = torch.full((al.sorted_token_ids.shape[1], 2, 2 * 16), float("nan"), device=DEV)
    blk = torch.full((al.expert_ids.shape[1], 2), -7, dtype=torch.int32, device=DEV)
    lora_shrink_packed(d["x"], d["a"], al, 2, d["mapping"], d["lora_ids"], d["enabled"], u, blk)
    launched = min(al.expert_ids.shape[1], d["ids"].numel())  # the shrink's grid (as moe_gemm's)
    assert torch.isnan(u).all() and (blk[:launched] == 0).all()


@pytest.mark.parametrize("bm", [32, 64])
def test_packed_shrink_sub_blocks_write_what_whole_blocks_write(bm, monkeypatch):
    """sub_m: each alignment block as several programs of 16 rows; the block ranges equal the whole-block shrink's,
    u has the same rows written (u starts NaN: every row the GEMM may read) with the same values (to fp32
    rounding: the interpreter's matmul may sum a 16-row tile in another order than a 32-row one)."""
    shrink = LaunchSpy(monkeypatch, fmp, "packed_shrink_kernel")
    c = make_case(bm, 40, 32, 16, 4, 3, 4, 4, 16, 2, lora_ids=[0, 3, -1, 1], enabled=[1, 1, 1, 0])
    d = {k: (v.to(DEV) if isinstance(v, torch.Tensor) else v) for k, v in c.items()}
    al = moe_align(d["ids"], 4, bm)
    got = []
    for sub in (0, 16):
        u = torch.full((al.sorted_token_ids.shape[1], 2, 4 * 16), float("nan"), device=DEV)
        blk = torch.full((al.expert_ids.shape[1], 2), -7, dtype=torch.int32, device=DEV)
        lora_shrink_packed(d["x"], d["a"], al, 3, d["mapping"], d["lora_ids"], d["enabled"], u, blk, sub_m=sub)
        got.append((u.cpu(), blk.cpu()))
    assert shrink.launches[-1][1]["BLOCK_M"] == 16
    assert torch.equal(got[0][1], got[1][1]) and (got[1][1] != -7).any()
    (u0, _), (u1, _) = got
    assert torch.equal(u0.isnan(), u1.isnan()) and (~u0.isnan()).any()
    torch.testing.assert_close(u1.nan_to_num(7.0), u0.nan_to_num(7.0), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="sub_m=24"):
        lora_shrink_packed(d["x"], d["a"], al, 3, d["mapping"], d["lora_ids"], d["enabled"], u, blk, sub_m=24)


@pytest.mark.parametrize("window,both,sub,fast", [(1, True, 0, False), (1, False, 16, True), (2, True, 16, False),
                                                  (4, True, 0, True), (1, True, 0, True)])
def test_packed_shrink_windows_write_what_one_dot_writes(window, both, sub, fast, monkeypatch):
    """slot_window / both_slices: u and the block ranges as the one-dot shrink's, on the ordered alignment and the
    plain one, with the pointer tiles rebuilt per step or not (u starts NaN: every row the GEMM may read is written;
    values to fp32 rounding)."""
    shrink = LaunchSpy(monkeypatch, fmp, "packed_shrink_kernel")
    c = make_case(11, 40, 32, 16, 4, 3, 4, 4, 16, 2, lora_ids=[0, 3, -1, 1], enabled=[1, 1, 1, 0])
    d = {k: (v.to(DEV) if isinstance(v, torch.Tensor) else v) for k, v in c.items()}
    for order in (None, d["mapping"]):
        al = moe_align(d["ids"], 4, 32, order_by=order)
        got = []
        for kw in ({}, dict(slot_window=window, both_slices=both, sub_m=sub, row_ptrs=fast)):
            u = torch.full((al.sorted_token_ids.shape[1], 2, 4 * 16), float("nan"), device=DEV)
            blk = torch.full((al.expert_ids.shape[1], 2), -7, dtype=torch.int32, device=DEV)
            lora_shrink_packed(d["x"], d["a"], al, 3, d["mapping"], d["lora_ids"], d["enabled"], u, blk, **kw)
            got.append((u.cpu(), blk.cpu()))
        grid, kw = shrink.launches[-1]
        assert kw["SLOT_W"] == window and kw["P_ALL"] == (2 if both else 1) and grid[1] == 2 // kw["P_ALL"]
        (u0, b0), (u1, b1) = got
        assert torch.equal(b0, b1) and (b1 != -7).any()
        assert torch.equal(u0.isnan(), u1.isnan()) and (~u0.isnan()).any()
        torch.testing.assert_close(u1.nan_to_num(7.0), u0.nan_to_num(7.0), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="slot_window=3"):
        lora_shrink_packed(d["x"], d["a"], al, 3, d["mapping"], d["lora_ids"], d["enabled"], u, blk, slot_window=3)
