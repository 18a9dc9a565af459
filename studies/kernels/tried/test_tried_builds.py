"""The tried builds of the base GEMM with the LoRA delta inside (studies/kernels/tried/: the layer's plan takes
none), against float64: in its epilogue (fused_moe_lora_epilogue.py), folded into its K loop after a shrink
kernel (fused_moe_lora_folded.py, the rows build), and the packed build with the options no plan takes
(packed_switches.py): out = base (+ delta for pairs of tokens with a live adapter) (* routed weight).

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
from lora_moe_lab.kernels.fused_moe_lora_packed import moe_gemm_lora_packed
from studies.kernels.tried.fused_moe_lora_epilogue import LAST_EPILOGUE_LAUNCH, moe_gemm_lora
from studies.kernels.tried.fused_moe_lora_folded import LAST_FOLDED_LAUNCH, moe_gemm_lora_folded
from studies.kernels.tried.fused_moe_switches import LAST_SWITCHES_LAUNCH
from studies.kernels.tried.packed_switches import LAST_PACKED_LAUNCH, moe_gemm_lora_packed_switches

IMPLS = {"epilogue": moe_gemm_lora, "folded": moe_gemm_lora_folded,  # folded: pointer loads in the expand
         "folded_desc": functools.partial(moe_gemm_lora_folded, fold_desc=True),  # t and B through TMA if allowed
         "folded_early": functools.partial(moe_gemm_lora_folded, config=GemmConfig(32, 32, 4, 4, 1, early_loads=True))}


def folded_t(c, P, dtype):
    """The folded build's intermediate t (EM, P, BLOCK_R), NaN-poisoned: a row the shrink skips (padding, pairs
    without a live adapter) must never reach the output."""
    return lambda al: torch.full((al.sorted_token_ids.shape[1], P, block_r(c["a"].shape[3])), float("nan"),
                                 dtype=dtype, device=DEV)


def run_tried(c, dtype, E, top_k, P, N, bm=16, impl=moe_gemm_lora, order=False):
    folded = getattr(impl, "func", impl) is moe_gemm_lora_folded
    return run_fused(c, dtype, E, top_k, P, N, bm=bm, impl=impl, order=order,
                     shrink_out=folded_t(c, P, dtype) if folded else None)


@pytest.mark.parametrize("case,dtype,impl", covering(FUSED_CASES, DTYPES, IMPLS))
def test_fused_epilogue_matches_reference(case, dtype, impl):
    M, K, N, E, top_k, S, L, R, P, extra = case
    codes = run_tried(make_case(M * 7 + N, M, K, N, E, top_k, S, L, R, P, dtype=dtype, **extra), dtype, E, top_k, P,
                      N, impl=IMPLS[impl])
    assert (codes == 0).any() and (codes != 0).any()  # both kinds of row were checked


@pytest.mark.parametrize("impl", IMPLS)
def test_fused_epilogue_nothing_live_is_the_plain_gemm(impl):
    c = make_case(3, 4, 32, 16, 4, 2, 2, 2, 8, 2, mapping=[0, -1, 1, 1], enabled=[0, 0])
    codes = run_tried(c, torch.float32, 4, 2, 2, 16, impl=IMPLS[impl])
    assert (codes != 0).all()
    last = LAST_EPILOGUE_LAUNCH["lora_columns"] if impl == "epilogue" else LAST_FOLDED_LAUNCH["shrink_columns"]
    if impl != "epilogue":
        assert LAST_FOLDED_LAUNCH["fold_desc"] == (impl == "folded_desc")  # R=8 bf16/fp32 rows: TMA-able
    assert last == 2 * 16  # L_POW2 * BLOCK_R


FOLD_VARIANTS = {"desc": dict(fold_desc=True), "ptr": dict(fold_desc=False),
                 "rows_ordered": dict(shrink_per_row=True), "rows_unordered": dict(shrink_per_row=True),
                 # the layer's build with the epilogue's gathers (LoRA rows, routed weights) before the K loop
                 "rows_early": dict(shrink_per_row=True, config=GemmConfig(32, 32, 4, 4, 1, early_loads=True))}


@pytest.mark.parametrize("bm,variant", covering([16, 32, 64], FOLD_VARIANTS))
def test_folded_random_blocks_and_ranks(bm, variant):
    """The folded path on fresh random cases per BLOCK_M: many LoRA rows per block, a rank below BLOCK_R,
    rows without adapter, a disabled row and an empty slot, gate_up and down."""
    for seed in range(3):
        g = torch.Generator().manual_seed(100 * bm + seed)
        M, K, N = (int(v) for v in torch.randint(12, 40, (3,), generator=g))
        P, gather = (2, True) if seed % 2 == 0 else (1, False)
        c = make_case(bm + seed, M, K + 8, N + 8, 5, 3, 4, 4, 5 + seed * 7, P, gather=gather, with_rw=not gather,
                      lora_ids=[0, 3, -1, 1], enabled=[1, 1, 1, 0])
        codes = run_tried(c, torch.float32, 5, 3, P, N + 8, bm=bm, order=variant in ("rows_ordered", "rows_early"),
                          impl=functools.partial(moe_gemm_lora_folded, **FOLD_VARIANTS[variant]))
        assert (codes == 0).any()


@pytest.mark.parametrize("impl", IMPLS)
def test_fused_epilogue_errors(impl):
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


@pytest.mark.skipif(DEV.type != "cuda", reason="counts device syncs: a CPU tensor's .item() is none")
@pytest.mark.parametrize("variant", FOLD_VARIANTS)
def test_folded_path_has_no_host_sync(variant, sync_check):
    """The folded path (its alignment included) decides nothing on the host from device values: it is
    launched the same under CUDA-graph capture."""
    c = make_case(5, 9, 40, 24, 6, 3, 4, 3, 16, 2)
    d = {k: (v.to(DEV) if isinstance(v, torch.Tensor) else v) for k, v in c.items()}
    w = torch.randn(6, 48, 40, device=DEV) * 40 ** -0.5
    out = torch.empty(27, 48, device=DEV)
    with sync_check():
        al = moe_align(d["ids"], 6, 16, order_by=d["mapping"] if variant == "rows_ordered" else None)
        moe_gemm_lora_folded(d["x"], w, al, 3, out, d["a"], d["b"], d["mapping"], d["lora_ids"], d["enabled"],
                             **FOLD_VARIANTS[variant])


# The packed build with the options no plan takes (packed_switches.py, fused_moe_switches.py): the expand as guarded
# steps without a loop, its L2 prefetch (inline PTX: the interpreter runs without it, the GPU differential with it),
# u by pointer loads beside B's TMA copy, the first step's operands before the K loop; the shrink's cache hints.
SWITCH_VARIANTS = {"unroll_all": dict(expand=dict(unroll=True, prefetch=True)),
                   "depth2_u_ptr_ordered": dict(per_slot=True, expand=dict(depth=32, u_ptr=True)),
                   "early_persist": dict(per_slot=True, expand=dict(early=True),
                                         config=GemmConfig(16, 32, 4, 4, 2, persistent=2, sub_m=16)),
                   "early_d2": dict(expand=dict(early=True, depth=32)),
                   "unroll_persist": dict(per_slot=True, expand=dict(unroll=True),
                                          config=GemmConfig(16, 32, 4, 4, 2, persistent=2, flatten=True, sub_m=16)),
                   "win1_both_x_keep": dict(shrink=dict(slot_window=1, both_slices=True, row_ptrs=True, x_keep=True))}
SWITCH_ORDERED = ("depth2_u_ptr_ordered", "early_persist")


def _packed_u(c, P, dtype):
    S, R = c["a"].shape[1], c["a"].shape[3]
    return lambda al: torch.full((al.sorted_token_ids.shape[1], P, pow2(S) * block_r(R)), float("nan"), dtype=dtype,
                                 device=DEV)


@pytest.mark.parametrize("variant", SWITCH_VARIANTS)
@pytest.mark.parametrize("bm", [16, pytest.param(32, marks=pytest.mark.slow)])
def test_packed_switches_random_blocks_and_ranks(bm, variant):
    """The tried packed builds on fresh random cases: many slots per block, a rank below BLOCK_R, rows without
    adapter, a disabled row and an empty slot, gate_up and down, slices that split a tile."""
    for seed in range(2):
        g = torch.Generator().manual_seed(100 * bm + seed + 7)
        M, K, N = (int(v) for v in torch.randint(12, 40, (3,), generator=g))
        P, gather = (2, True) if seed % 2 == 0 else (1, False)
        c = make_case(bm + seed, M, K + 8, N + 8, 5, 3, 4, 4, 5 + seed * 7, P, gather=gather, with_rw=not gather,
                      lora_ids=[0, 3, -1, 1], enabled=[1, 1, 1, 0])
        impl = functools.partial(moe_gemm_lora_packed_switches, **SWITCH_VARIANTS[variant])
        codes = run_fused(c, torch.float32, 5, 3, P, N + 8, bm=bm, impl=impl, order=variant in SWITCH_ORDERED,
                          shrink_out=_packed_u(c, P, torch.float32))
        assert (codes == 0).any()


def test_packed_switches_off_are_the_library_build_bit_for_bit():
    """With no tried option set, the study's copies compute what the library's packed build computes, bit for bit
    (the same kernels but for the switches that left the library)."""
    c = make_case(5, 19, 40, 24, 5, 3, 4, 4, 13, 2, lora_ids=[0, 3, -1, 1], enabled=[1, 1, 1, 0])
    d = {k: (v.to(DEV) if isinstance(v, torch.Tensor) else v) for k, v in c.items()}
    w = torch.randn(5, 48, 40, generator=torch.Generator().manual_seed(3)).to(DEV)
    al = moe_align(d["ids"], 5, 16, order_by=d["mapping"])
    outs = []
    for impl in (moe_gemm_lora_packed, moe_gemm_lora_packed_switches):
        out = torch.full((19 * 3, 48), float("nan"), device=DEV)
        impl(d["x"], w, al, 3, out, d["a"], d["b"], d["mapping"], d["lora_ids"], d["enabled"], per_slot=True,
             shrink=dict(slot_window=1, both_slices=True))
        outs.append(out)
    assert torch.equal(outs[0], outs[1]) and not outs[0].isnan().any()
    assert LAST_PACKED_LAUNCH["expand_k"] == 16 and LAST_SWITCHES_LAUNCH["PACKED"]


def test_packed_switches_early_and_unroll_exclude_each_other():
    c = make_case(1, 2, 16, 8, 4, 2, 2, 2, 4, 2)
    x, a, b, ids, m, lid, en = (c[k].to(DEV) for k in ("x", "a", "b", "ids", "mapping", "lora_ids", "enabled"))
    with pytest.raises(ValueError, match="`early` and `unroll` exclude each other"):
        moe_gemm_lora_packed_switches(x, torch.randn(4, 16, 16, device=DEV), moe_align(ids, 4, 16), 2,
                                      torch.empty(4, 16, device=DEV), a, b, m, lid, en,
                                      expand=dict(early=True, unroll=True))
