"""Triton kernels (base fused-MoE GEMM, fused MoE-LoRA delta) against float64 references.

Runs under the Triton interpreter on CPU (fp32/fp16, tiny shapes) and, unchanged, on CUDA where
bf16 is added. Every check draws fresh random inputs (never zeros), poisons the outputs the kernel
must write (NaN) and checks that rows it must not touch stay bit-identical.
"""
import pytest
import torch
from helpers import fp32_tol, rel_err
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lora_moe_lab import runtime
from lora_moe_lab.config import get_shape
from lora_moe_lab.kernels import configs, fused_moe, fused_moe_lora, plan
from lora_moe_lab.ops import triton_backend
from lora_moe_lab.kernels.align import moe_align
from lora_moe_lab.ops.reference import ref_lora_delta, ref_moe_gemm
from lora_moe_lab.kernels.configs import GemmConfig, LoRAKernelConfig

DEV = runtime.default_device()
CUDA = DEV.type == "cuda"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if CUDA else [])
gpu_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
# Hypothesis: >= 150 examples under the interpreter (CI); fewer on a GPU, where each new shape compiles.
N_HYP = 20 if CUDA else 120


def tol(dtype):
    return fp32_tol(DEV) if dtype == torch.float32 else 2e-2


def routing(g, M, top_k, E):
    return torch.stack([torch.randperm(E, generator=g)[:top_k] for _ in range(M)]).int()


def randn(g, *size, std=1.0, dtype=torch.float32):
    return (torch.randn(*size, generator=g) * std).to(dtype).to(DEV)


# ------------------------------------------------------------------------------------------------
# base GEMM
# ------------------------------------------------------------------------------------------------
def check_moe_gemm(seed, M, K, N, E, top_k, gather, with_rw, dtype, bm=16, config=None):
    g = torch.Generator().manual_seed(seed)
    ids = routing(g, M, top_k, E)
    x = randn(g, M if gather else M * top_k, K, dtype=dtype)
    w = randn(g, E, N, K, std=K ** -0.5, dtype=dtype)
    rw = torch.rand(M, top_k, generator=g).add_(0.1).to(DEV) if with_rw else None
    out = torch.full((M * top_k, N), float("nan"), dtype=dtype, device=DEV)  # poison: all must be written
    align = moe_align(ids.to(DEV), E, bm)
    res = fused_moe.moe_gemm(x, w, align, top_k, out, routed_weights=rw, gather=gather, config=config)
    assert res is out
    assert torch.isfinite(out).all(), "moe_gemm left rows unwritten (NaN poison survived)"
    ref = ref_moe_gemm(x.cpu(), w.cpu(), ids, top_k, routed_weights=None if rw is None else rw.cpu(), gather=gather)
    err = rel_err(out, ref)
    assert err < tol(dtype), f"rel err {err:.3g} (dtype {dtype})"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,K,N,E,top_k,gather,with_rw", [
    (1, 64, 64, 8, 2, True, False),  # decode: one token
    (7, 64, 48, 8, 2, True, False),  # odd M, N not a multiple of BLOCK_N
    (5, 40, 64, 4, 1, False, True),  # top-1, K not a multiple of BLOCK_K, routed weights (down)
    (9, 32, 32, 8, 8, True, False),  # top-8 of 8
    (13, 48, 40, 6, 3, False, True),
])
def test_moe_gemm_matches_reference(M, K, N, E, top_k, gather, with_rw, dtype):
    check_moe_gemm(M * 100 + K + N, M, K, N, E, top_k, gather, with_rw, dtype)


def test_moe_gemm_block_sizes_and_grouping():
    # Other tiles than the table's: BLOCK_M 32, narrow N tiles, grouped program order.
    check_moe_gemm(3, 11, 48, 80, 5, 2, True, True, torch.float32, bm=32,
                   config=GemmConfig(block_n=16, block_k=16, group_m=2, num_warps=4, num_stages=1))


@pytest.mark.parametrize("w_desc", [False, True])
@pytest.mark.parametrize("M,K,N,E,top_k,gather,with_rw", [
    (9, 64, 64, 8, 2, True, False),  # EVEN_K and EVEN_N: no predicates on the loads
    (7, 40, 48, 8, 2, False, True),  # K, N past the last full tile: the descriptor zero-fills K, N spills over
    (5, 64, 40, 3, 2, True, True),  # the last expert's N spill reads past the end of w (zero-filled)
])
def test_moe_gemm_tma_and_even_tiles(M, K, N, E, top_k, gather, with_rw, w_desc):
    # The weight tile through a TMA descriptor (w viewed as (E * N, K)) and the unpredicated loads.
    check_moe_gemm(M * 31 + K + N, M, K, N, E, top_k, gather, with_rw, torch.float32,
                   config=GemmConfig(block_n=32, block_k=16, group_m=2, num_warps=4, num_stages=2, w_desc=w_desc))


@pytest.mark.parametrize("w_desc", [False, True])
@pytest.mark.parametrize("M,K,N,E,top_k,gather,with_rw", [(9, 64, 64, 8, 2, False, True),
                                                          (7, 40, 48, 8, 2, True, False)])
def test_moe_gemm_early_epilogue_loads(M, K, N, E, top_k, gather, with_rw, w_desc):
    # The routed weights gathered before the K loop (early_loads): the same result.
    check_moe_gemm(M * 23 + K + N, M, K, N, E, top_k, gather, with_rw, torch.float32,
                   config=GemmConfig(block_n=32, block_k=16, group_m=2, num_warps=4, num_stages=2, w_desc=w_desc,
                                     early_loads=True))


@pytest.mark.parametrize("flatten", [False, True])
@pytest.mark.parametrize("w_desc", [False, True])
@pytest.mark.parametrize("M,K,N,E,top_k,gather,with_rw,bm", [
    (9, 64, 64, 8, 2, True, False, 16),  # more tiles than programs: each program loops over several
    (7, 40, 48, 8, 2, False, True, 16),  # masked K and N
    (2, 32, 64, 4, 3, True, True, 32),  # 5 blocks launched, at most 4 busy (4 experts): the loop bound comes from ntpp
])
def test_moe_gemm_persistent_grid(M, K, N, E, top_k, gather, with_rw, bm, w_desc, flatten):
    # A static grid (num_sms * persistent programs; 2 SMs under the interpreter) looping over the tiles.
    check_moe_gemm(M * 17 + K + N, M, K, N, E, top_k, gather, with_rw, torch.float32, bm=bm,
                   config=GemmConfig(block_n=32, block_k=16, group_m=2, num_warps=4, num_stages=2, w_desc=w_desc,
                                     persistent=1, flatten=flatten))


@pytest.mark.parametrize("persistent,flatten", [(0, False), (1, False), (1, True)])
@pytest.mark.parametrize("M,K,N,E,top_k,gather,with_rw", [
    (9, 64, 64, 8, 2, True, False),  # experts with fewer pairs than a sub-block: sub-blocks of padding only
    (2, 40, 48, 4, 3, False, True),  # fewer pairs than alignment blocks, masked K and N, routed weights
    (40, 32, 32, 2, 2, True, True),  # 80 pairs on 2 experts: full and partial sub-blocks
])
def test_moe_gemm_sub_blocks_of_the_alignment(M, K, N, E, top_k, gather, with_rw, persistent, flatten):
    # sub_m: the kernel's tile takes 16 of the alignment's 64 rows, each sub-block its block's expert
    check_moe_gemm(M * 29 + K + N, M, K, N, E, top_k, gather, with_rw, torch.float32, bm=64,
                   config=GemmConfig(block_n=32, block_k=16, group_m=2, num_warps=4, num_stages=2, sub_m=16,
                                     persistent=persistent, flatten=flatten))


def test_moe_gemm_sub_m_must_divide_the_alignment():
    g = torch.Generator().manual_seed(5)
    ids = routing(g, 3, 2, 4).to(DEV)
    x, w = randn(g, 3, 32), randn(g, 4, 32, 32)
    out = torch.empty(6, 32, device=DEV)
    with pytest.raises(ValueError, match="sub_m=32 must divide the alignment's block_m=16"):
        fused_moe.moe_gemm(x, w, moe_align(ids, 4, 16), 2, out, config=GemmConfig(32, 16, sub_m=32))
    with pytest.raises(ValueError, match="power of two >= 16"):
        GemmConfig(32, 32, sub_m=24)


@gpu_only
def test_moe_gemm_persistent_is_bit_identical_to_a_program_per_tile():
    # Same tile, same K order: the persistent loop must give the same bits as one program per tile.
    g = torch.Generator().manual_seed(11)
    M, K, N, E, top_k = 300, 256, 512, 16, 4
    ids = routing(g, M, top_k, E).to(DEV)
    x, w = randn(g, M, K, dtype=torch.bfloat16), randn(g, E, N, K, std=K ** -0.5, dtype=torch.bfloat16)
    align = moe_align(ids, E, 64)
    for sub in (0, 32):  # and sub-blocks of 32 of the alignment's 64 rows
        outs = []
        for pers, flat in ((0, False), (1, False), (2, True)):
            out = torch.full((M * top_k, N), float("nan"), dtype=torch.bfloat16, device=DEV)
            fused_moe.moe_gemm(x, w, align, top_k, out, config=GemmConfig(128, 64, 8, 4, 3, w_desc=True,
                                                                            persistent=pers, flatten=flat, sub_m=sub))
            outs.append(out)
        assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2]), f"sub_m={sub}"


def test_moe_gemm_with_a_register_cap():
    """max_regs reaches ptxas as maxnreg on a GPU (nothing under the interpreter) and changes no result."""
    from lora_moe_lab import runtime
    from lora_moe_lab.kernels.common import reg_cap
    assert reg_cap(0) == {} and reg_cap(128) == ({} if runtime.interpreter() else {"maxnreg": 128})
    check_moe_gemm(5, 9, 64, 64, 8, 2, True, True, torch.float32,
                   config=GemmConfig(block_n=32, block_k=32, group_m=2, num_warps=4, num_stages=2, max_regs=128))


def test_tma_ok_needs_aligned_contiguous_rows():
    assert fused_moe.tma_ok(torch.zeros(2, 8, 16, device=DEV))
    assert not fused_moe.tma_ok(torch.zeros(2, 8, 16, device=DEV).transpose(1, 2))
    assert not fused_moe.tma_ok(torch.zeros(2, 8, 5, device=DEV))  # 20-byte rows


# ------------------------------------------------------------------------------------------------
# LoRA delta
# ------------------------------------------------------------------------------------------------
def make_lora_case(seed, M, K, N, E, top_k, S, R, P, *, ranks=None, token_slot=None, lora_ids=None,
                   enabled=None, gather=True, with_rw=False, dtype=torch.float32, bm=16, rows=None):
    # rows: L LoRA rows (token_slot holds rows, lora_ids[row] = weight slot); default L = S, row = slot
    L = S if rows is None else rows
    g = torch.Generator().manual_seed(seed)
    ids = routing(g, M, top_k, E)
    x = randn(g, M if gather else M * top_k, K, dtype=dtype)
    a = torch.randn(P, S, E, R, K, generator=g) * K ** -0.5
    b = torch.randn(P, S, E, N, R, generator=g) * R ** -0.5
    ranks = ranks if ranks is not None else [R] * S
    for s, r in enumerate(ranks):  # per-slot ranks, zero-padded to R
        a[:, s, :, r:] = 0
        b[:, s, :, :, r:] = 0
    a, b = a.to(dtype).to(DEV), b.to(dtype).to(DEV)
    if token_slot is None:
        token_slot = torch.randint(-1, L, (M,), generator=g)
    token_slot = torch.as_tensor(token_slot, dtype=torch.int32)
    lora_ids = torch.as_tensor(lora_ids if lora_ids is not None else list(range(L)), dtype=torch.int32)
    enabled = torch.as_tensor(enabled if enabled is not None else [1] * L, dtype=torch.int32)
    rw = torch.rand(M, top_k, generator=g).add_(0.1).to(DEV) if with_rw else None
    out0 = randn(g, M * top_k, P * N, dtype=dtype)
    align = moe_align(ids.to(DEV), E, bm, token_slot.to(DEV), L)
    return dict(x=x, a=a, b=b, ids=ids, token_slot=token_slot, lora_ids=lora_ids, enabled=enabled, rw=rw,
                out0=out0, align=align, top_k=top_k, gather=gather)


def run_lora_case(c, config=None, exit_codes=None):
    out = c["out0"].clone()
    res = fused_moe_lora.lora_delta(c["x"], c["a"], c["b"], c["align"], c["lora_ids"].to(DEV), c["enabled"].to(DEV),
                                c["top_k"], out, routed_weights=c["rw"], gather=c["gather"],
                                exit_codes=exit_codes, config=config)
    assert res is out
    return out


def check_lora_case(c, dtype, config=None):
    out = run_lora_case(c, config)
    ref = ref_lora_delta(c["x"].cpu(), c["a"].cpu(), c["b"].cpu(), c["ids"], c["token_slot"], c["lora_ids"],
                         c["enabled"], c["top_k"], routed_weights=None if c["rw"] is None else c["rw"].cpu(),
                         gather=c["gather"])
    k = c["top_k"]
    slot = c["token_slot"].long().repeat_interleave(k)
    sc = slot.clamp(min=0)
    live = (slot >= 0) & (c["lora_ids"].long()[sc] >= 0) & (c["enabled"].long()[sc] != 0)
    out_c, out0 = out.cpu(), c["out0"].cpu()
    # Inactive pairs: untouched, bit for bit (a kernel that adds +0.0 or rewrites them fails here).
    assert torch.equal(out_c[~live].view(torch.int16 if dtype != torch.float32 else torch.int32),
                       out0[~live].view(torch.int16 if dtype != torch.float32 else torch.int32))
    if live.any():
        got = out_c[live].double() - out0[live].double()
        err = rel_err(got, ref[live])
        assert err < tol(dtype), f"rel err {err:.3g} (dtype {dtype})"
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [
    # M, K, N, E, top_k, S, R, P, extra
    (1, 64, 32, 8, 2, 1, 16, 2, {}),  # decode, gate_up (two slices)
    (7, 64, 32, 8, 2, 3, 8, 2, dict(ranks=[8, 4, 1])),  # odd M, per-slot ranks zero-padded
    (9, 48, 40, 8, 8, 2, 20, 2, dict(ranks=[20, 13])),  # top-8, BLOCK_R 32 with rank 20
    (6, 40, 64, 5, 1, 4, 16, 1, dict(gather=False, with_rw=True)),  # down: per-pair rows, routed weights
    (11, 32, 48, 6, 3, 4, 16, 2, dict(enabled=[1, 0, 1, 0], lora_ids=[0, 1, -1, 3])),  # disabled + empty slots
    (5, 32, 32, 4, 2, 2, 16, 2, dict(token_slot=[-1, -1, -1, -1, -1])),  # no token has an adapter
    (8, 32, 32, 4, 2, 3, 16, 1, dict(enabled=[0, 0, 0], gather=False, with_rw=True)),  # all slots disabled
    # compacted rows (per_active_count graphs): 2 rows pointing at weight slots 3 and 1 of 4
    (9, 32, 32, 4, 2, 4, 16, 2, dict(rows=2, lora_ids=[3, 1])),
    (7, 40, 48, 5, 2, 4, 16, 1, dict(rows=3, lora_ids=[2, -1, 0], enabled=[1, 1, 0], gather=False, with_rw=True)),
])
def test_lora_delta_matches_reference(case, dtype):
    M, K, N, E, top_k, S, R, P, extra = case
    c = make_lora_case(M * 31 + N, M, K, N, E, top_k, S, R, P, dtype=dtype, **extra)
    check_lora_case(c, dtype)


def test_lora_delta_all_disabled_is_a_no_op():
    c = make_lora_case(5, 9, 32, 32, 4, 2, 3, 16, 2, enabled=[0, 0, 0])
    out = run_lora_case(c)
    assert torch.equal(out.cpu().view(torch.int32), c["out0"].cpu().view(torch.int32))


@pytest.mark.parametrize("config,bm", [
    (LoRAKernelConfig(block_n=16, block_k=16, split_n=3, num_warps=4, num_stages=1), 16),  # N split over 3 programs
    (LoRAKernelConfig(block_n=32, block_k=16, split_n=2, num_warps=4, num_stages=1), 32),  # BLOCK_M 32
    (LoRAKernelConfig(block_n=16, block_k=64, split_n=8, num_warps=4, num_stages=1), 16),  # split > N tiles
])
def test_lora_delta_other_tiles(config, bm):
    c = make_lora_case(11, 10, 72, 56, 6, 2, 3, 24, 2, ranks=[24, 3, 17], bm=bm)
    check_lora_case(c, torch.float32, config=config)


@pytest.mark.parametrize("P,split,prefetch,xs", [(2, 3, 1, 0), (1, 1, 2, 0), (2, 1, 2, 0), (1, 3, 0, 3), (2, 1, 0, 2)])
def test_lora_delta_prefetching_expand(P, split, prefetch, xs):
    # The hand-pipelined expand loop (prefetch) and Triton's (expand_stages xs): N = 56 in BLOCK_N 16 tiles,
    # split 3 -> shares of 32 columns, the last one partly and the third program's share wholly past N (masked
    # prefetch, no store).
    cfg = LoRAKernelConfig(block_n=16, block_k=16, split_n=split, num_warps=4, num_stages=1, prefetch=prefetch,
                           expand_stages=xs)
    c = make_lora_case(13 + P, 10, 72, 56, 6, 2, 3, 24, P, ranks=[24, 3, 17], gather=P == 2, with_rw=P == 1)
    check_lora_case(c, torch.float32, config=cfg)


def expected_exit_codes(align, lora_ids, enabled):
    st, ei, ntpp, bm = (t.cpu() if isinstance(t, torch.Tensor) else t for t in align)
    S, nb = ei.shape
    want = torch.empty(S, nb, dtype=torch.int32)
    for s in range(S):
        for b in range(nb):
            if lora_ids[s] == -1:
                want[s, b] = 1
            elif enabled[s] == 0:
                want[s, b] = 2
            elif b * bm >= ntpp[s]:
                want[s, b] = 3
            elif ei[s, b] == -1:
                want[s, b] = 4
            else:
                want[s, b] = 0
    return want


def test_exit_codes_match_host_computation():
    c = make_lora_case(21, 12, 32, 32, 4, 2, 4, 16, 2, lora_ids=[0, -1, 2, 3], enabled=[1, 1, 0, 1],
                       token_slot=[0, 1, 2, 3, 0, 1, 2, 3, 0, 0, 3, -1])
    # Force code 4: mark the first busy block of slot 3 as having no expert (its rows must stay untouched).
    st, ei, ntpp, bm = c["align"]
    ei[3, 0] = -1
    dead_pairs = st[3, :bm].cpu()
    dead_pairs = dead_pairs[dead_pairs < 12 * 2].long()
    assert len(dead_pairs) > 0
    codes = torch.full(ei.shape, -7, dtype=torch.int32, device=DEV)
    out = run_lora_case(c, exit_codes=codes)
    want = expected_exit_codes(c["align"], c["lora_ids"], c["enabled"])
    assert torch.equal(codes.cpu(), want)
    assert set(want.flatten().tolist()) == {0, 1, 2, 3, 4}
    assert torch.equal(out.cpu()[dead_pairs].view(torch.int32), c["out0"].cpu()[dead_pairs].view(torch.int32))


# ------------------------------------------------------------------------------------------------
# hypothesis: random tiny cases for both ops
# ------------------------------------------------------------------------------------------------
HYP = settings(max_examples=N_HYP, deadline=None, derandomize=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _draw_routing(data, max_experts: int):
    """E experts, top_k of them per token, M tokens: the routing every random kernel case draws."""
    E = data.draw(st.integers(1, max_experts), label="E")
    return E, data.draw(st.integers(1, min(E, 8)), label="top_k"), data.draw(st.integers(1, 12), label="M")


def _draw_launch(data, configs):
    """One launch's gather, routed weight, BLOCK_M, dtype and tile config."""
    return (data.draw(st.booleans(), label="gather"), data.draw(st.booleans(), label="rw"),
            data.draw(st.sampled_from([16, 32]), label="bm"), data.draw(st.sampled_from(DTYPES), label="dtype"),
            data.draw(st.sampled_from(configs), label="config"))


@pytest.mark.slow
@HYP
@given(data=st.data())
def test_moe_gemm_random(data):
    E, top_k, M = _draw_routing(data, 9)
    K = data.draw(st.integers(1, 80), label="K")
    N = data.draw(st.integers(1, 70), label="N")
    gather, with_rw, bm, dtype, cfg = _draw_launch(data, [None, GemmConfig(16, 16, 2, 4, 1),
                                                          GemmConfig(16, 16, 2, 4, 1, w_desc=True),
                                                          GemmConfig(16, 16, 2, 4, 1, w_desc=True, persistent=1,
                                                                     flatten=True)])
    check_moe_gemm(data.draw(st.integers(0, 2 ** 30), label="seed"), M, K, N, E, top_k, gather, with_rw,
                   dtype, bm=bm, config=cfg)


@pytest.mark.slow
@settings(HYP, max_examples=N_HYP + (20 if not CUDA else 0))
@given(data=st.data())
def test_lora_delta_random(data):
    E, top_k, M = _draw_routing(data, 8)
    S = data.draw(st.integers(1, 4), label="S")
    R = data.draw(st.integers(1, 40), label="R")
    P = data.draw(st.sampled_from([1, 2]), label="P")
    K = data.draw(st.integers(1, 72), label="K")
    N = data.draw(st.integers(1, 72), label="N")
    ranks = data.draw(st.lists(st.integers(1, R), min_size=S, max_size=S), label="ranks")
    token_slot = data.draw(st.lists(st.integers(-1, S - 1), min_size=M, max_size=M), label="token_slot")
    lora_ids = [s if keep else -1 for s, keep in
                enumerate(data.draw(st.lists(st.booleans(), min_size=S, max_size=S), label="loaded"))]
    enabled = data.draw(st.lists(st.sampled_from([0, 1, 1]), min_size=S, max_size=S), label="enabled")
    gather, with_rw, bm, dtype, cfg = _draw_launch(
        data, [None, LoRAKernelConfig(16, 16, 2, 4, 1), LoRAKernelConfig(32, 32, 5, 4, 1)])
    c = make_lora_case(data.draw(st.integers(0, 2 ** 30), label="seed"), M, K, N, E, top_k, S, R, P,
                       ranks=ranks, token_slot=token_slot, lora_ids=lora_ids, enabled=enabled, gather=gather,
                       with_rw=with_rw, dtype=dtype, bm=bm)
    check_lora_case(c, dtype, config=cfg)


# ------------------------------------------------------------------------------------------------
# validation: clear, named errors from static metadata
# ------------------------------------------------------------------------------------------------
def _gemm_args(dtype=torch.float32):
    c = make_lora_case(1, 4, 32, 32, 4, 2, 2, 16, 2, dtype=dtype)
    w = randn(torch.Generator().manual_seed(2), 4, 32, 32, dtype=dtype)
    align1 = moe_align(c["ids"].to(DEV), 4, 16)
    out = torch.empty(8, 32, dtype=dtype, device=DEV)
    return c, w, align1, out


def test_moe_gemm_validation_errors():
    c, w, al, out = _gemm_args()
    x = c["x"]
    with pytest.raises(ValueError, match="x must have 2 dims"):
        fused_moe.moe_gemm(x[None], w, al, 2, out)
    with pytest.raises(TypeError, match="w must have dtype float32, got float16"):
        fused_moe.moe_gemm(x, w.half(), al, 2, out)
    with pytest.raises(ValueError, match="contiguous"):
        fused_moe.moe_gemm(x, w.transpose(1, 2), al, 2, out)
    with pytest.raises(ValueError, match="x has K=64 columns"):
        fused_moe.moe_gemm(torch.cat([x, x], 1), w, al, 2, out)
    with pytest.raises(ValueError, match="out must have M\\*top_k=8 rows"):
        fused_moe.moe_gemm(x, w, al, 2, out[:7])
    with pytest.raises(ValueError, match="one slot"):
        fused_moe.moe_gemm(x, w, c["align"], 2, out)
    with pytest.raises(ValueError, match="EM="):  # alignment built for 4 tokens, used with 16
        fused_moe.moe_gemm(torch.cat([x] * 4), w, al, 2, torch.empty(32, 32, device=DEV))
    with pytest.raises(ValueError, match="routed_weights must be"):
        fused_moe.moe_gemm(x, w, al, 2, out, routed_weights=torch.ones(4, 3, device=DEV))
    with pytest.raises(ValueError, match="on meta but the other inputs"):
        fused_moe.moe_gemm(x, w.to("meta"), al, 2, out)


def test_lora_delta_validation_errors():
    c, *_ = _gemm_args()
    x, a, b, al, out = c["x"], c["a"], c["b"], c["align"], c["out0"].clone()
    ids, en = c["lora_ids"].to(DEV), c["enabled"].to(DEV)
    call = fused_moe_lora.lora_delta
    with pytest.raises(ValueError, match="disagree on experts E"):
        call(x, a, b[:, :, :3].contiguous(), al, ids, en, 2, out)
    with pytest.raises(ValueError, match="disagree on rank r"):
        call(x, a, b[..., :8].contiguous(), al, ids, en, 2, out)
    with pytest.raises(ValueError, match="disagree on slots S"):
        call(x, a, b[:, :1].contiguous(), al, ids, en, 2, out)
    with pytest.raises(ValueError, match="alignment has 2 LoRA rows; it needs 1 to S=1"):
        call(x, a[:, :1].contiguous(), b[:, :1].contiguous(), al, ids[:1], en[:1], 2, out)
    with pytest.raises(ValueError, match="lora_b must be contiguous"):
        call(x, a, b.transpose(3, 4).contiguous().transpose(3, 4), al, ids, en, 2, out)
    with pytest.raises(TypeError, match="lora_ids must have dtype int32, got int64"):
        call(x, a, b, al, ids.long(), en, 2, out)
    with pytest.raises(ValueError, match="adapter_enabled must be"):
        call(x, a, b, al, ids, en[:1], 2, out)
    with pytest.raises(ValueError, match="out must have P\\*N"):
        call(x, a, b, al, ids, en, 2, out[:, :32].contiguous())
    with pytest.raises(ValueError, match="exit_codes must be"):
        call(x, a, b, al, ids, en, 2, out, exit_codes=torch.zeros(2, 3, dtype=torch.int32, device=DEV))
    with pytest.raises(TypeError, match="x must have dtype"):
        call(x.double(), a, b, al, ids, en, 2, out)
    with pytest.raises(ValueError, match="1 or 2 slices"):
        call(x, a.repeat(2, 1, 1, 1, 1), b.repeat(2, 1, 1, 1, 1), al, ids, en, 2, out)


@pytest.mark.skipif(CUDA, reason="interpreter only")
def test_bf16_under_interpreter_is_a_clear_error():
    c, w, al, out = _gemm_args()
    with pytest.raises(ValueError, match="bfloat16 under the Triton interpreter"):
        fused_moe.moe_gemm(c["x"].bfloat16(), w.bfloat16(), al, 2, out.bfloat16())
    with pytest.raises(ValueError, match="bfloat16 under the Triton interpreter"):
        fused_moe_lora.lora_delta(c["x"].bfloat16(), c["a"].bfloat16(), c["b"].bfloat16(), c["align"],
                              c["lora_ids"], c["enabled"], 2, c["out0"].bfloat16())


def test_config_table_and_block_sizes():
    assert configs.block_r(1) == 16 and configs.block_r(16) == 16 and configs.block_r(17) == 32
    assert configs.block_r(64) == 64
    assert [configs.token_bucket(m) for m in (1, 3, 16, 17, 20000)] == [1, 4, 16, 32, 16384]
    for M in (1, 3, 100, 16384):
        bm = configs.moe_block_m(M, 8, 128)
        assert bm >= 16 and bm & (bm - 1) == 0
        cfg = configs.lora_config(M, 8, 128, 4, bm, 768, 2048)
        assert cfg.split_n >= 1 and cfg.block_n >= 16


def test_contradictory_configs_are_named_errors():
    with pytest.raises(ValueError, match="set persistent >= 1"):
        GemmConfig(32, 32, flatten=True)
    with pytest.raises(ValueError, match="programs per SM"):
        GemmConfig(32, 32, persistent=-1)
    with pytest.raises(ValueError, match="set one of them to 0"):
        LoRAKernelConfig(block_n=32, block_k=32, prefetch=2, expand_stages=3)


def test_launch_plan_matches_the_launch(monkeypatch):
    c = make_lora_case(3, 9, 32, 48, 6, 2, 3, 16, 2)
    plan = fused_moe_lora.lora_launch_plan(c["x"], c["a"], c["b"], c["align"], c["top_k"])
    kernel, grids = fused_moe_lora.fused_moe_lora_kernel, []

    class Spy:  # the launch's own grid, recorded as it launches
        def __getitem__(self, grid):
            grids.append(grid)
            return kernel[grid]

    monkeypatch.setattr(fused_moe_lora, "fused_moe_lora_kernel", Spy())
    run_lora_case(c)
    assert [g[0] for g in grids] == [plan["programs"]]
    assert 1 <= plan["programs"] <= plan["work_items_max"] and plan["BLOCK_R"] == 16 and plan["persistent"]


def test_warmup_aligns_folded_ops_as_the_layer_does(monkeypatch):
    """Where the plan folds an op on the alignment ordered by LoRA row, the layer aligns so; warm-up must compile
    that alignment (on CUDA its own Triton kernels) and run the folded GEMM on it, not on the plain one."""
    seen = []
    align = triton_backend.moe_align

    def spy(*a, **kw):
        seen.append(kw.get("order_by") is not None)
        return align(*a, **kw)

    monkeypatch.setattr(triton_backend, "moe_align", spy)
    base = plan.table_for()
    down = {**plan.entries(), **plan.entries("packed", buckets=(1,), per_slot=True)}  # the packed build, ordered
    with plan.override(base.but(ops={"gate_up": plan.entries(), "down": down}, shapes={})):
        triton_backend.warmup("tiny", torch.float32, max_loras=2, max_rank=8, device=DEV, num_tokens=(1, 2))
    assert seen.count(True) == 1  # M=1 folds the down GEMM; M=2 (bucket 2) folds nothing
    seen.clear()
    down = {**plan.entries(), **plan.entries("packed", buckets=(1,))}  # one dot over every slot: not ordered
    with plan.override(base.but(ops={"gate_up": plan.entries(), "down": down}, shapes={})):
        triton_backend.warmup("tiny", torch.float32, max_loras=2, max_rank=8, device=DEV, num_tokens=(1,))
    assert not any(seen)


QWEN3, TP4 = get_shape("qwen3-30b-a3b"), get_shape("qwen3-30b-a3b-tp4")
DIMS = plan.LoRADims(slots=4, rank=16, rows=4)


def _plan(op, M, shape, **kw):
    return plan.plan(op, M, shape, lora=DIMS, **kw)


def test_fold_table_per_gemm_shape():
    """The H200 plan (the default elsewhere) folds qwen3-30b-a3b's gate_up at M >= 4096 by its shape's entry, with
    its wide build per block and the slot-ordered W1S shrink, not at 2048, and not its TP=4 shape (the layer lost
    there); the W1S shrink is the packed shrink's at M >= 8192 only (a second hook: the packed build)."""
    for M in (4096, 8192, 16384):
        p = _plan("gate_up", M, QWEN3)
        assert p.path == "wide" and p.order_by_row and p.shrink_options == plan.table_for().options[
            "W1S_slot_order"].dict()
        assert p.columns == QWEN3.top_k * 2 * 4 * 16  # top_k tails of 2 slices x 4 slots x BLOCK_R
        assert "wg_s4" in p.decided_by  # the recordings that decided it travel with the entry
        assert _plan("gate_up", M, TP4).path == "separate"
        packed = _plan("gate_up", M, QWEN3, alone=False)
        w1s = plan.table_for().options["W1S"].dict()
        assert packed.path == "packed" and packed.shrink_options == (w1s if M >= 8192 else {})
    assert _plan("gate_up", 2048, QWEN3).path == "separate"
    for M, path in ((16, "decode"), (128, "packed"), (1024, "packed"), (2048, "separate")):
        assert {_plan("gate_up", M, sh).path for sh in (QWEN3, TP4)} == {path}, M
    assert {_plan("down", M, QWEN3).path for M in (128, 256, 1024, 2048, 4096, 8192, 16384)} == {"wide"}
    assert _plan("down", 512, QWEN3).path == "packed" and _plan("down", 64, QWEN3).path == "separate"
    assert _plan("down", 16384, QWEN3).columns == 4 * 16  # C: 4 slots x BLOCK_R past I in each pair's row
    # a later hook never fuses, and the torch backend has no fused path
    assert _plan("down", 8192, QWEN3, first=False).path == "separate"
    assert _plan("down", 8192, QWEN3, backend="torch").path == "separate"
    assert plan.plan("down", 8192, QWEN3).path == "none"  # no LoRA: the base GEMM's alignment only


def test_packed_tile_per_gemm_shape():
    """The TP=4 shape's entry gives the packed GEMM a program per tile at down (N = 2048, K = 192) of M = 1024 only
    (where down falls back from its wide build to the packed one: a second hook): not at 4096, not at qwen3's down
    (K = 768), and the bucket's expand options stay beside it."""
    ppt = dict(persistent=0, flatten=False)
    assert _plan("down", 1024, TP4, alone=False).expand_options == dict(tile=ppt)
    assert "tile" not in _plan("down", 4096, TP4, alone=False).expand_options
    assert _plan("down", 1024, QWEN3, alone=False).expand_options == {}
    assert _plan("down", 4096, QWEN3, alone=False).expand_options == dict(depth=64)


def test_plan_tables_are_well_formed_and_named_per_gpu():
    """Every lora_plan file reads and checks (every op lists every token bucket); the default follows the H200's,
    so the CPU and the interpreter take the H200's choices."""
    files = sorted(plan.TABLE_DIR.glob("lora_plan_*.json"))
    h100 = "NVIDIA H100 80GB HBM3"  # the tuner's plan
    assert {f.name for f in files} == {plan.file_name("NVIDIA H200"), plan.file_name(h100), plan.DEFAULT_FILE}
    h200, default = plan.load("NVIDIA H200"), plan.load(None)
    assert default.ops == h200.ops and default.shapes == h200.shapes and default.gpu == "default"
    assert plan.load("Some Other GPU").ops == h200.ops
    for t in (h200, plan.load(h100)):
        for op in plan.OPS:
            assert set(t.ops[op]) == set(plan.BUCKETS)
            assert all(e.decided_by and e.why for e in t.ops[op].values()), op


@pytest.mark.parametrize("change,match", [
    (dict(decode={}), "decode.max_pairs must be"),
    (dict(ops={"gate_up": {}}), "ops must be exactly"),
    (dict(ops={"gate_up": {"1": {"path": "folded"}}, "down": {}}), "path must be one of"),
    (dict(ops={"gate_up": {"3": {"path": "separate"}}, "down": {}}), "bucket '3' is not a token bucket"),
    (dict(ops={"gate_up": {"1": {"path": "separate"}}, "down": {}}), "gate_up lacks the buckets"),
    (dict(ops={"gate_up": {"1": {"path": "separate", "per_slot": True}}, "down": {}}), "takes no fold options"),
    (dict(ops={"gate_up": {"1": {"path": "wide", "window": True}}, "down": {}}), "window is the down GEMM"),
    (dict(ops={"gate_up": {"1": {"path": "packed", "shrink": "W9"}}, "down": {}}), "names option set 'W9'"),
    (dict(ops={"gate_up": {"1": {"path": "packed", "tiles": {}}}, "down": {}}), "an entry holds only"),
    (dict(shapes={"2048x768": {}}), "must be named H<hidden>_I<intermediate>"),
])
def test_malformed_plans_are_named_errors(change, match):
    import json
    raw = json.loads((plan.TABLE_DIR / plan.file_name("NVIDIA H200")).read_text())
    raw.update(change)
    with pytest.raises(ValueError, match=match):
        plan.check_table(raw, "p.json")


def test_warmup_runs_every_config():
    n = triton_backend.warmup("tiny", torch.float32, max_loras=2, max_rank=8, device=DEV, num_tokens=(1, 2))
    if runtime.interpreter():  # one config per kernel there: 3 base GEMMs, 2 aligned LoRA, 2 decode launches, the
        assert n == 12  # router with and without the skew bias, SiLU-and-mul, the top-k sum with and without residual
    else:
        assert n >= 12


# ------------------------------------------------------------------------------------------------
# GPU only: no host syncs, capture after warm-up
# ------------------------------------------------------------------------------------------------
@gpu_only
def test_launchers_do_not_sync_and_capture_after_warmup():
    from lora_moe_lab.config import get_shape
    shape = get_shape("tiny")
    triton_backend.warmup(shape, torch.bfloat16, max_loras=3, max_rank=16, device=DEV)
    kernels = (fused_moe.fused_moe_kernel, fused_moe_lora.fused_moe_lora_kernel)

    def ncompiled():
        n = 0
        for k in kernels:
            caches = getattr(k, "device_caches", None)
            if caches is None:
                return None
            n += sum(len(v[0]) for v in caches.values())
        return n

    before = ncompiled()
    for M in (1, 3, 37, 200):
        c = make_lora_case(M, M, shape.hidden, shape.intermediate, shape.num_experts, shape.top_k, 3, 16, 2,
                           dtype=torch.bfloat16, bm=configs.moe_block_m(M, shape.top_k, shape.num_experts))
        out = c["out0"].clone()
        ids, en = c["lora_ids"].to(DEV), c["enabled"].to(DEV)
        topk, tslot = c["ids"].to(DEV), c["token_slot"].to(DEV)
        g = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with runtime.sync_debug_mode("error"):
            moe_align(topk, shape.num_experts, c["align"].block_m, tslot, 3)  # the alignment too
            fused_moe_lora.lora_delta(c["x"], c["a"], c["b"], c["align"], ids, en, c["top_k"], out)
            with torch.cuda.graph(g):
                fused_moe_lora.lora_delta(c["x"], c["a"], c["b"], c["align"], ids, en, c["top_k"], out)
        g.replay()
        torch.cuda.synchronize()
    if before is not None:
        assert ncompiled() == before, "a launch compiled after warmup"


# ------------------------------------------------------------------------------------------------
# Triton alignment: same blocks as the torch alignment (order inside a block may differ on a GPU)
# ------------------------------------------------------------------------------------------------
def alignment_groups(a):
    """Per slot, the sorted (expert, pair id) entries: equal for two alignments with the same groups,
    whatever the order of pairs inside a group (the Triton version orders them by atomics)."""
    S, EM = a.sorted_token_ids.shape
    st = a.sorted_token_ids.cpu().long()
    expert = a.expert_ids.cpu().long().repeat_interleave(a.block_m, dim=1)  # expert of every position
    return ((expert + 1) * (st.max() + 1) + st).sort(dim=1).values


def assert_same_alignment(a, b):
    assert torch.equal(a.expert_ids.cpu(), b.expert_ids.cpu())
    assert torch.equal(a.num_tokens_post_padded.cpu(), b.num_tokens_post_padded.cpu())
    assert torch.equal(alignment_groups(a), alignment_groups(b))


def test_alignment_comparison_ignores_order_inside_groups_only():
    g = torch.Generator().manual_seed(7)
    ids = routing(g, 40, 4, 3)  # ~53 pairs per expert: groups span several blocks of 16
    a = moe_align(ids, 3, 16)
    st = a.sorted_token_ids.clone()
    ntpp = int(a.num_tokens_post_padded[0])
    perm = st.clone()
    for e in range(3):  # shuffle each expert's group (pairs and padding) as the atomics may
        pos = (a.expert_ids[0].repeat_interleave(16) == e).nonzero().flatten()
        perm[0, pos] = st[0, pos[torch.randperm(len(pos), generator=g)]]
    assert_same_alignment(a, a._replace(sorted_token_ids=perm))
    bad = st.clone()  # move one pair to another expert's group: must be caught
    i = 0
    j = int((a.expert_ids[0].repeat_interleave(16)[:ntpp] != a.expert_ids[0, 0]).nonzero()[0])
    bad[0, i], bad[0, j] = st[0, j], st[0, i]
    with pytest.raises(AssertionError):
        assert_same_alignment(a, a._replace(sorted_token_ids=bad))


def test_alignment_ordered_by_lora_row_keeps_the_blocks():
    """The torch alignment with order_by: same blocks, pairs by (LoRA row, token) inside a group (a stable
    sort; the Triton one orders by row only: test_triton_alignment_ordered_by_lora_row)."""
    from lora_moe_lab.kernels.align import moe_align_torch
    g = torch.Generator().manual_seed(11)
    ids = routing(g, 60, 5, 3)
    rows = torch.randint(-1, 4, (60,), generator=g, dtype=torch.int32)
    a, b = moe_align(ids.to(DEV), 5, 16), moe_align_torch(ids.to(DEV), 5, 16, order_by=rows.to(DEV))
    assert_same_alignment(a, b)  # same padding, expert ids and groups: only the order inside a group moves
    st, ex = b.sorted_token_ids[0].cpu(), b.expert_ids[0].cpu().repeat_interleave(16)
    for e in range(5):
        pairs = st[(ex == e) & (st < 180)]
        key = rows[pairs // 3].long() * 1000 + pairs  # by row, then token order within a row
        assert torch.equal(key, key.sort().values), f"expert {e}: not ordered by (LoRA row, pair)"
    with pytest.raises(ValueError, match="order_by must be an int32"):
        moe_align(ids.to(DEV), 5, 16, order_by=rows.long().to(DEV))


@settings(HYP, max_examples=20 if not CUDA else 10)
@given(data=st.data())
def test_triton_alignment_ordered_by_lora_row(data):
    """The Triton alignment with order_by: the torch one's blocks, padding, expert ids and groups, and inside
    each (slot, expert) group the pairs by LoRA row (-1 first); rows past ORDER_KEYS - 2 share the last run."""
    from lora_moe_lab.kernels.align import ORDER_KEYS, moe_align_torch, moe_align_triton
    E = data.draw(st.integers(1, 24), label="E")
    k = data.draw(st.integers(1, min(E, 8)), label="top_k")
    M = data.draw(st.integers(1, 40), label="M")
    S = data.draw(st.integers(1, 3), label="S")
    L = data.draw(st.sampled_from([1, 4, ORDER_KEYS + 3]), label="lora rows")
    bm = data.draw(st.sampled_from([16, 32]), label="bm")
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 30), label="seed"))
    ids = routing(g, M, k, E).to(DEV)
    slot = torch.randint(-1, S, (M,), generator=g).int().to(DEV) if data.draw(st.booleans(), label="slots") else None
    rows = torch.randint(-1, L, (M,), generator=g, dtype=torch.int32).to(DEV)
    S_ = S if slot is not None else 1
    want = moe_align_torch(ids, E, bm, slot, S_, order_by=rows)
    got = moe_align_triton(ids, E, bm, slot, S_, order_by=rows)
    assert_same_alignment(want, got)
    key = (rows.cpu().long() + 1).clamp(max=ORDER_KEYS - 1)  # the Triton alignment's run per token
    for s_ in range(S_):
        st_, ex = got.sorted_token_ids[s_].cpu().long(), got.expert_ids[s_].cpu().repeat_interleave(bm)
        for e in range(E):
            pairs = st_[(ex == e) & (st_ < M * k)]
            kk = key[pairs // k]
            assert torch.equal(kk, kk.sort().values), f"slot {s_} expert {e}: pairs not ordered by LoRA row"
    with pytest.raises(ValueError, match="order_by must be an int32"):
        moe_align_triton(ids, E, bm, order_by=rows.long())


@settings(HYP, max_examples=30 if not CUDA else 10)
@given(data=st.data())
def test_triton_alignment_matches_torch(data):
    from lora_moe_lab.kernels.align import moe_align_torch, moe_align_triton
    E = data.draw(st.integers(1, 40), label="E")
    k = data.draw(st.integers(1, min(E, 8)), label="top_k")
    M = data.draw(st.integers(1, 40), label="M")
    S = data.draw(st.integers(1, 4), label="S")
    bm = data.draw(st.sampled_from([16, 32, 64]), label="bm")
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 30), label="seed"))
    ids = routing(g, M, k, E).to(DEV)
    slot = torch.randint(-1, S, (M,), generator=g).int().to(DEV) if data.draw(st.booleans(), label="slots") else None
    assert_same_alignment(moe_align_torch(ids, E, bm, slot, S if slot is not None else 1),
                          moe_align_triton(ids, E, bm, slot, S if slot is not None else 1))
