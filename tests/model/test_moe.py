"""Foundation: alignment, torch backend ops and the whole model against float64 references, and
the three guards' equivalence on random batches."""
import random

import pytest
import torch
from helpers import fp32_tol, rel_err

from lora_moe_lab.model.guards import count_guard_syncs, guard_names
from lora_moe_lab.kernels.align import moe_align, padded_size
from lora_moe_lab.model.lab import build_lab
from lora_moe_lab.ops import reference as ref, torch_backend as torch_ops


@pytest.mark.parametrize("M,k,E,BM,S", [(1, 1, 4, 16, 1), (7, 2, 8, 4, 3), (33, 8, 16, 16, 2), (5, 3, 3, 2, 4)])
def test_alignment_groups_every_pair_once(M, k, E, BM, S):
    g = torch.Generator().manual_seed(M * 31 + k)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(M)]).int()
    slot = torch.randint(-1, S, (M,), generator=g)
    a = moe_align(ids, E, BM, slot, S)
    EM = padded_size(M * k, E, BM)
    assert a.sorted_token_ids.shape == (S, EM) and a.expert_ids.shape == (S, EM // BM)
    n = M * k
    for s in range(S):
        want = sorted(p for p in range(n) if slot[p // k] == s)
        row = a.sorted_token_ids[s]
        got = row[row < n].tolist()
        assert sorted(got) == want  # each pair of this slot exactly once, nothing else
        ntpp = int(a.num_tokens_post_padded[s])
        assert ntpp % BM == 0 and (row[ntpp:] == n).all()
        for b in range(EM // BM):
            blk = row[b * BM:(b + 1) * BM]
            e = int(a.expert_ids[s, b])
            if b * BM >= ntpp:
                assert e == -1
                continue
            real = blk[blk < n].long()
            # a block below the padded end belongs to one expert and holds at least one of its pairs
            # (each expert's group is padded by less than one block)
            assert e >= 0 and len(real) > 0 and (ids.flatten()[real] == e).all()


def _rand_case(M, k, E, N, K, S, r, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).to(dtype)
    w = torch.randn(E, N, K, generator=g).to(dtype)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(M)]).int()
    tw = torch.rand(M, k, generator=g) + 0.1
    a = torch.randn(2, S, E, r, K, generator=g).to(dtype)
    b = torch.randn(2, S, E, N, r, generator=g).to(dtype)
    slot = torch.randint(-1, S, (M,), generator=g).int()
    enabled = torch.randint(0, 2, (S,), generator=g).int()
    lora_ids = torch.where(torch.rand(S, generator=g) < 0.8, torch.arange(S), -1).int()
    return x, w, ids, tw, a, b, slot, enabled, lora_ids


@pytest.mark.parametrize("M,k,E", [(1, 1, 4), (9, 2, 8), (17, 4, 6)])
@pytest.mark.parametrize("gather", [True, False])
def test_torch_moe_gemm_matches_reference(M, k, E, gather):
    N, K = 24, 40
    x, w, ids, tw, *_ = _rand_case(M, k, E, N, K, 1, 4, seed=M + k)
    if not gather:
        x = torch.randn(M * k, K)
    out = torch.full((M * k, N), float("nan"))
    torch_ops.moe_gemm(x, w, moe_align(ids, E, 4), k, out, routed_weights=tw, gather=gather)
    assert rel_err(out, ref.ref_moe_gemm(x, w, ids, k, tw, gather)) < 1e-5


@pytest.mark.parametrize("M,k,E,S", [(1, 1, 4, 1), (11, 2, 8, 3), (20, 3, 5, 4)])
def test_torch_lora_delta_matches_reference(M, k, E, S):
    N, K, r = 24, 40, 8
    x, _, ids, tw, a, b, slot, enabled, lora_ids = _rand_case(M, k, E, N, K, S, r, seed=7 * M + S)
    base = torch.randn(M * k, 2 * N)
    out = base.clone()
    al = moe_align(ids, E, 4, slot, S)
    torch_ops.lora_delta(x, a, b, al, lora_ids, enabled, k, out)
    want = base.double() + ref.ref_lora_delta(x, a, b, ids, slot, lora_ids, enabled, k)
    assert rel_err(out, want) < 1e-5


def test_torch_lora_delta_compacted_rows():
    # 2 LoRA rows pointing at weight slots 2 and 0 of 3 (what a per_active_count graph launches)
    M, k, E, N, K, r = 9, 2, 5, 24, 40, 8
    x, _, ids, _, a, b, *_ = _rand_case(M, k, E, N, K, 3, r, seed=5)
    rows = torch.tensor([0, -1, 1, 1, 0, -1, 0, 1, 1], dtype=torch.int32)
    lora_ids, enabled = torch.tensor([2, 0], dtype=torch.int32), torch.tensor([1, 1], dtype=torch.int32)
    base = torch.randn(M * k, 2 * N)
    out = base.clone()
    torch_ops.lora_delta(x, a, b, moe_align(ids, E, 4, rows, 2), lora_ids, enabled, k, out)
    want = base.double() + ref.ref_lora_delta(x, a, b, ids, rows, lora_ids, enabled, k)
    assert rel_err(out, want) < 1e-5
    # the reference really reads slots 2 and 0: a delta from slots 0 and 1 differs
    other = ref.ref_lora_delta(x, a, b, ids, rows, torch.tensor([0, 1], dtype=torch.int32), enabled, k)
    assert rel_err(base.double() + other, want) > 1e-2


def _lora_ref_args(lab, tensors):
    return [dict(weights=lab.pool.layers[i], token_slot=tensors.token_lora_mapping.cpu(),
                 lora_ids=tensors.lora_ids.cpu(), adapter_enabled=tensors.adapter_enabled.cpu())
            for i in range(len(lab.model.layers))]


def _random_batch(lab, rng, mode):
    names = sorted(lab.pool.loaded())
    R = rng.randint(1, 6)
    adapters = {"none": lambda: None, "all": lambda: rng.choice(names),
                "some": lambda: rng.choice(names + [None])}[mode]
    return lab.make_batch([adapters() for _ in range(R)], [rng.randint(1, 5) for _ in range(R)])


@pytest.mark.parametrize("mode", ["none", "some", "all"])
@pytest.mark.parametrize("seed,backend", [(0, "torch"), (1, "torch"),
                                          pytest.param(2, "triton", marks=pytest.mark.slow)])  # the GPU check: native
def test_guards_identical_and_match_reference(mode, seed, backend, device):
    rng = random.Random(seed * 10 + len(mode))
    lab = build_lab("tiny", num_layers=2, max_loras=3, max_rank=8, device=str(device), backend=backend, seed=seed)
    lab.pool.load("r2", rank=2)  # ranks differ per slot (zero-padded to the pool max)
    lab.pool.load("r8", rank=8, scaling=0.5)
    lab.pool.load("r5", rank=5)
    batch, tensors = _random_batch(lab, rng, mode)
    assert batch.has_active_lora == (mode != "none" and any(a is not None for a in batch.adapters))
    x = lab.random_input(batch.num_tokens, seed=seed)
    outs = {}
    for g in guard_names():
        lab.model.routing_log = []
        with count_guard_syncs() as c:
            outs[g] = lab.model(x, batch, tensors, guard=g)
        assert c.count == (len(lab.model.layers) if g == "sync" else 0)
    assert torch.equal(outs["sync"], outs["cpu_flag"]) and torch.equal(outs["sync"], outs["launch_always"])
    want = ref.ref_model(x, lab.model, _lora_ref_args(lab, tensors), routing=lab.model.routing_log)
    assert rel_err(outs["cpu_flag"], want) < fp32_tol(device)
    lab.model.routing_log = None


def test_lora_changes_output_and_unload_restores_base():
    lab = build_lab("tiny", num_layers=2, backend="torch")
    x = lab.random_input(6)
    lab.pool.load("a", rank=4)
    b0, t0 = lab.make_batch([None, None], [3, 3])
    b1, t1 = lab.make_batch(["a", None], [3, 3])
    y0 = lab.model(x, b0, t0, guard="launch_always")
    y1 = lab.model(x, b1, t1, guard="launch_always")
    assert rel_err(y1[:3], y0[:3]) > 1e-2  # adapter rows change
    assert torch.equal(y1[3:], y0[3:])  # rows without adapter: bit-identical (the delta adds exact zeros)
    lab.pool.unload("a")
    lab.pool.load("b", rank=4)
    b2, t2 = lab.make_batch([None, None], [3, 3])
    assert torch.equal(lab.model(x, b2, t2, guard="launch_always"), y0)


def test_rank_zero_pool_launches_nothing():
    lab = build_lab("tiny", num_layers=2, backend="torch")
    b, t = lab.make_batch([None], [4])
    with count_guard_syncs() as c:
        lab.model(lab.random_input(4), b, t, guard="sync")
    assert c.count == 0  # max_lora_rank == 0 is a host fact: no guard, no launch


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_layer_adds_the_residual_in_its_top_k_sum(backend, device, monkeypatch):
    """forward(..., residual=h) is h + forward(...) (the model and the one-process decoder pass it: one kernel on
    the Triton backend instead of a sum and an add); the no-residual form still works. The router weight lives in
    the model dtype, through `.to()` and state_dict."""
    from lora_moe_lab.model.decoder import build_decoder_lab
    from lora_moe_lab.ops import get_backend

    lab = build_lab("tiny", num_layers=1, dtype="float32", device=str(device), backend=backend, seed=5)
    layer, be = lab.model.layers[0], get_backend(backend)
    h = lab.random_input(6, seed=1)
    x = layer.norm(h, [], be)
    y = layer(x, [], be)
    fused = layer(x, [], be, residual=h)
    assert fused.shape == y.shape == h.shape
    if backend == "torch":
        assert torch.equal(fused, h + y)  # fp32: the old sum-then-add, bit for bit
    else:
        assert rel_err(fused, h.double() + y.double()) < fp32_tol(device)
    calls = []
    for lab_ in (lab, build_decoder_lab("tiny", num_layers=1, dtype="float32", device="cpu", backend="torch")):
        b = lab_.model.backend
        spy = type(b).moe_sum
        monkeypatch.setattr(type(b), "moe_sum", staticmethod(lambda y, k, residual=None: (
            calls.append(residual is not None), spy(y, k, residual))[1]))
        lab_.model(lab_.random_input(4), *lab_.make_batch([None], [4]))
        monkeypatch.undo()
    assert calls == [True, True]  # the MoE model's layer and the decoder's MoE each passed their residual
    assert layer.router_w.dtype == torch.float32 and lab.model.state_dict()["layers.0.router_w"].dtype == torch.float32
    lab.model.to(torch.float16)
    assert layer.router_w.dtype == layer.w13.dtype == torch.float16
