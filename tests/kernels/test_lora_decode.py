"""The decode-path LoRA delta (kernels/lora_decode.py: no alignment) against float64.

Interpreter on CPU (fp32 < 1e-5, fp16 < 2e-2; tiny shapes), unchanged on CUDA (bf16 added). Rows of
pairs that must exit are NaN-poisoned and compared bit for bit; live rows start random (the kernel
adds into them) and must come back finite and equal to base + delta.
"""
import pytest
import torch
from helpers import covering, rel_err
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lora_gemm_cases import I32, make_case

from lora_moe_lab import runtime
from lora_moe_lab.config import get_shape
from lora_moe_lab.kernels import plan
from lora_moe_lab.kernels.align import moe_align
from lora_moe_lab.kernels.configs import DecodeConfig
from lora_moe_lab.kernels.fused_moe_lora import lora_delta
from lora_moe_lab.kernels.lora_decode import DECODE_EXIT_CODES, decode_launch_plan, lora_delta_decode
from lora_moe_lab.ops.reference import tolerance
from lora_moe_lab.ops.reference_rows import ref_lora_delta_rows

DEV = runtime.default_device()
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEV.type == "cuda" else [])


def run_case(c, dtype, *, live_pairs=None, config=None, exit_codes=False):
    d = {k: (v.to(DEV) if isinstance(v, torch.Tensor) else v) for k, v in c.items()}
    ref, codes = ref_lora_delta_rows(c["x"], c["a"], c["b"], c["ids"], c["mapping"], c["lora_ids"], c["enabled"],
                                     routed_weights=c["rw"], gather=c["gather"], num_live_pairs=live_pairs)
    live = codes == 0
    out0 = c["out0"].clone()
    out0[~live] = float("nan")  # poison: a pair that exits must not be touched at all
    out = out0.to(DEV, copy=True)
    ex = torch.full(codes.shape, -7, device=DEV, **I32) if exit_codes else None
    cnt = None if live_pairs is None else torch.tensor([live_pairs], device=DEV, **I32)
    res = lora_delta_decode(d["x"], d["a"], d["b"], d["ids"], d["mapping"], d["lora_ids"], d["enabled"], out,
                            routed_weights=d["rw"], gather=c["gather"], num_live_pairs=cnt, exit_codes=ex,
                            config=config)
    assert res is out
    out = out.cpu()
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    assert torch.equal(out[~live].view(bits), out0[~live].view(bits)), "an exiting pair's row was written"
    if live.any():
        assert torch.isfinite(out[live]).all()
        err = rel_err(out[live].double() - out0[live].double(), ref[live])
        assert err < tolerance(dtype, DEV), f"rel err {err:.3g} ({dtype})"
    if exit_codes:
        assert torch.equal(ex.cpu(), codes)
    return out, codes


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [
    # M, K, N, E, top_k, S, L, R, P, extra
    (1, 64, 32, 8, 2, 1, 1, 16, 2, dict(mapping=[0])),  # one token, gate_up
    (5, 40, 24, 6, 3, 4, 4, 8, 2, {}),  # odd K, rows = a permutation of the slots
    (7, 48, 72, 5, 2, 3, 2, 20, 1, dict(gather=False, with_rw=True)),  # down: M*top_k rows, routed weights
    (6, 33, 17, 4, 2, 4, 3, 5, 2, dict(lora_ids=[3, -1, 1], enabled=[1, 1, 0])),  # empty + disabled rows
    (4, 32, 40, 8, 4, 2, 2, 16, 1, dict(gather=False, with_rw=True, dead_experts=5)),  # expert -1
])
def test_decode_matches_reference(case, dtype):
    M, K, N, E, top_k, S, L, R, P, extra = case
    run_case(make_case(M * 13 + N, M, K, N, E, top_k, S, L, R, P, dtype=dtype, **extra), dtype)


def test_exit_map_every_code_and_live_count():
    # 8 tokens x 2: row -1, a row with no adapter, a disabled row, an expert -1, pairs past the live count
    c = make_case(3, 8, 32, 24, 6, 2, 3, 3, 8, 2, mapping=[0, -1, 1, 2, 0, 2, 0, 2],
                  lora_ids=[2, -1, 0], enabled=[1, 1, 0], dead_experts=0)
    c["ids"][4, 1] = -1
    _, codes = run_case(c, torch.float32, live_pairs=13, exit_codes=True)
    assert set(codes.tolist()) == set(DECODE_EXIT_CODES) == {0, 1, 2, 3, 4, 5}


def test_all_disabled_and_empty_leave_out_untouched():
    c = make_case(4, 6, 32, 24, 5, 2, 2, 2, 8, 2, enabled=[0, 0])
    _, codes = run_case(c, torch.float32)
    assert (codes == 2).sum() + (codes == 5).sum() == codes.numel()
    c["enabled"] = torch.ones(2, **I32)
    d = {k: (v.to(DEV) if isinstance(v, torch.Tensor) else v) for k, v in c.items()}
    out = c["out0"].to(DEV, copy=True)
    lora_delta_decode(d["x"], d["a"], d["b"], d["ids"], d["mapping"], d["lora_ids"], d["enabled"], out, empty=True)
    assert torch.equal(out.cpu(), c["out0"])  # the timing reference: same grid, body compiled out


@pytest.mark.parametrize("gather,kernel,R", covering([True, False], ["decode", "aligned"], [64, 20]))
def test_own_ranks_read_only_each_adapters_rows(gather, kernel, R):
    """With lora_ranks (the batch's rank per row) a program of the decode kernel, or a work item of the aligned one,
    reads only its adapter's rank of the stacks. On stacks zero-padded past each slot's rank (as the pool keeps
    them) that is the padded launch bit for bit; on full stacks it is the reference of A and B cut at those ranks,
    so the lanes past them were not read; 0 reads the padded R. Where R is a multiple of 16 (every pool's) a rank is
    read rounded up to 16, so the masks cover whole 16-lane vectors and the loads stay wide."""
    P = 2 if gather else 1
    c = make_case(11, 6, 40, 24, 6, 2, 3, 3, R, P, gather=gather, with_rw=not gather)
    cut = {0: 3, 1: 16, 2: 19}  # slot -> its adapter's rank
    read = {s: min(-(-r // 16) * 16, R) if R % 16 == 0 else r for s, r in cut.items()}  # the rows a program reads

    def cut_at(ranks):
        a, b = c["a"].clone(), c["b"].clone()
        for s, r in ranks.items():
            a[:, s, :, r:] = 0
            b[:, s, :, :, r:] = 0
        return a, b
    a, b = cut_at(cut)
    ranks = torch.tensor([cut[s] for s in c["lora_ids"].tolist()], **I32)

    al = moe_align(c["ids"].to(DEV), 6, 16, c["mapping"].to(DEV), 3)

    def launch(a_, b_, rk):
        out = c["out0"].to(DEV, copy=True)
        kw = dict(routed_weights=None if c["rw"] is None else c["rw"].to(DEV), gather=gather,
                  lora_ranks=None if rk is None else rk.to(DEV))
        if kernel == "decode":
            lora_delta_decode(c["x"].to(DEV), a_.to(DEV), b_.to(DEV), c["ids"].to(DEV), c["mapping"].to(DEV),
                              c["lora_ids"].to(DEV), c["enabled"].to(DEV), out, **kw)
        else:
            lora_delta(c["x"].to(DEV), a_.to(DEV), b_.to(DEV), al, c["lora_ids"].to(DEV), c["enabled"].to(DEV), 2,
                       out, **kw)
        return out.cpu()

    padded = launch(a, b, None)
    assert torch.equal(launch(a, b, ranks), padded) and torch.equal(launch(a, b, torch.zeros_like(ranks)), padded)
    own = launch(c["a"], c["b"], ranks)  # full stacks: only the first `rank` rows of each adapter may be read
    ref, codes = ref_lora_delta_rows(c["x"], *cut_at(read), c["ids"], c["mapping"], c["lora_ids"], c["enabled"],
                                     routed_weights=c["rw"], gather=gather)
    live = codes == 0
    assert live.any() and rel_err(own[live].double() - c["out0"][live].double(), ref[live]) < tolerance(
        torch.float32, DEV)
    assert not torch.allclose(own, launch(c["a"], c["b"], None))  # the full stacks' delta differs


@pytest.mark.parametrize("config", [DecodeConfig(16, 16, 1, 4), DecodeConfig(16, 64, 5, 4), DecodeConfig(32, 16, 9, 4)])
def test_other_tiles_and_splits(config):
    c = make_case(9, 3, 72, 56, 6, 2, 3, 3, 24, 2)
    run_case(c, torch.float32, config=config)
    plan = decode_launch_plan(6, 2, 56, 72, 24, config)
    assert plan["programs"] == 6 * 2 * plan["split_n"] and plan["alignment_kernels"] == 0
    assert (plan["split_n"] - 1) * plan["n_per_split"] < 56 <= plan["split_n"] * plan["n_per_split"]


def test_decode_equals_aligned_path():
    """The same delta through the alignment + fused kernel (rows decoupled from slots there too)."""
    c = make_case(5, 7, 40, 24, 6, 2, 3, 2, 8, 2, lora_ids=[2, 0], enabled=[1, 1])
    out, _ = run_case(c, torch.float32)
    al = moe_align(c["ids"].to(DEV), 6, 16, c["mapping"].to(DEV), 2)
    out2 = torch.where(torch.isnan(out), out, c["out0"]).to(DEV)  # the same starting rows
    lora_delta(c["x"].to(DEV), c["a"].to(DEV), c["b"].to(DEV), al, c["lora_ids"].to(DEV), c["enabled"].to(DEV), 2, out2)
    # exact under the interpreter; on a GPU both paths use tf32 dots with other tiles, so they agree to
    # the fp32-on-GPU tolerance of docs/design.md (each is checked against float64 elsewhere)
    assert rel_err(out2.cpu().nan_to_num(), out.nan_to_num()) < tolerance(torch.float32, DEV)


@settings(max_examples=40 if DEV.type == "cpu" else 15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_decode_random(data):
    d = data.draw
    E, S = d(st.integers(1, 6), label="E"), d(st.integers(1, 4), label="S")
    top_k, L = d(st.integers(1, min(E, 4)), label="top_k"), d(st.integers(1, S), label="L")
    M, R, P = d(st.integers(1, 6), label="M"), d(st.integers(1, 40), label="R"), d(st.sampled_from([1, 2]), label="P")
    K, N = d(st.integers(1, 70), label="K"), d(st.integers(1, 70), label="N")
    gather = d(st.booleans(), label="gather")
    dtype = d(st.sampled_from(DTYPES), label="dtype")
    c = make_case(d(st.integers(0, 2 ** 30), label="seed"), M, K, N, E, top_k, S, L, R, P, dtype=dtype,
                  gather=gather, with_rw=d(st.booleans(), label="rw"),
                  lora_ids=d(st.lists(st.integers(-1, S - 1), min_size=L, max_size=L), label="lora_ids"),
                  enabled=d(st.lists(st.sampled_from([0, 1, 1]), min_size=L, max_size=L), label="enabled"),
                  dead_experts=d(st.integers(0, M * top_k), label="dead"))
    live = d(st.one_of(st.none(), st.integers(0, M * top_k)), label="live_pairs")
    run_case(c, dtype, live_pairs=live, exit_codes=d(st.booleans(), label="exit"))


def test_validation_errors():
    c = make_case(1, 2, 16, 16, 4, 2, 2, 2, 4, 2)
    args = [c[k].to(DEV) for k in ("x", "a", "b", "ids", "mapping", "lora_ids", "enabled", "out0")]

    def call(i=None, v=None, **kw):
        a = list(args)
        if i is not None:
            a[i] = v
        lora_delta_decode(*a, **kw)

    with pytest.raises(TypeError, match="topk_ids must have dtype int32"):
        call(3, args[3].long())
    with pytest.raises(ValueError, match="token_lora_mapping must be"):
        call(4, torch.zeros(3, device=DEV, **I32))
    with pytest.raises(ValueError, match=r"must both be \(L,\) with 1 <= L <= S=2"):
        call(5, torch.zeros(3, device=DEV, **I32))
    with pytest.raises(ValueError, match="out must be"):
        call(7, torch.zeros(4, 16, device=DEV))
    with pytest.raises(ValueError, match="x must be"):
        call(gather=False)
    with pytest.raises(ValueError, match="num_live_pairs must be"):
        call(num_live_pairs=torch.zeros(2, device=DEV, **I32))


def test_path_choice_is_static():
    """The plan takes the decode path up to its table's bound of (token, k) pairs, from static shapes only."""
    sh = get_shape("qwen3-30b-a3b")
    bound = plan.table_for().decode_max_pairs
    dims = plan.LoRADims(slots=4, rank=16, rows=4)
    for M, path in ((1, "decode"), (bound // 8, "decode"), (bound // 8 + 1, "separate")):
        assert {plan.plan(op, M, sh, lora=dims).path for op in plan.OPS} == {path}, M
