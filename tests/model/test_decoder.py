"""The decoder (attention + MoE with LoRA) against float64 references, the three guards'
equivalence, and the guard-site count that reproduces production's 260 syncs per forward."""

import pytest
import torch
from helpers import fp32_tol, rel_err

from lora_moe_lab.model.decoder import GuardSites, build_decoder_lab, sites_per_layer
from lora_moe_lab.model.guards import count_guard_syncs, guard_names
from lora_moe_lab.model.spec import DECODER_LAYER_STEPS, GUARD_SITE_POINTS, MOE_LAYER_STEPS
from lora_moe_lab.model.tp import single
from lora_moe_lab.ops import reference as ref


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny shapes gain nothing from intra-op threads, and on a loaded 2-core machine the
    threads' spin-waits make each op ~100x slower."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _lab(**kw):
    lab = build_decoder_lab("tiny", max_loras=3, max_rank=8, backend="torch", dtype="float32", device="cpu", **kw)
    lab.pool.load("r2", rank=2)
    lab.pool.load("r8", rank=8, scaling=0.5)
    return lab


def _ref_forward(lab, x, batch, tensors):
    """The whole decoder in float64, the experts pinned to the model's own routing."""
    h = x
    for i, layer in enumerate(lab.model.layers):
        lora = dict(weights=lab.pool.layers[i], token_slot=tensors.token_lora_mapping,
                    lora_ids=tensors.lora_ids, adapter_enabled=tensors.adapter_enabled)
        h = ref.ref_decoder_layer(h, layer, batch.token_counts, lora, lab.model.routing_log[i][1])
    return h


@pytest.mark.parametrize("counts", [[3, 5, 0, 2], [4, 4, 4], [1], [7, 1]])
@pytest.mark.parametrize("mode", ["none", "some"])
def test_decoder_matches_reference_and_guards_agree(counts, mode):
    lab = _lab(num_layers=2, seed=len(counts), guard_sites=2.5)
    # "some": a fixed mix with requests WITHOUT an adapter beside ones with (the rows that must
    # equal a model with no LoRA), "none": no request uses one
    adapters = (["r2", None, "r8", None] if mode == "some" else [None] * 4)[:len(counts)]
    if mode == "some" and len(counts) == 1:
        adapters = ["r8"]
    batch, tensors = lab.make_batch(adapters, counts)
    x = lab.random_input(batch.num_tokens, seed=3)
    outs = {}
    for g in guard_names():
        lab.model.routing_log = []
        with count_guard_syncs() as c:
            outs[g] = lab.model(x, batch, tensors, guard=g)
        assert c.count == (5 if g == "sync" else 0)  # 2.5 sites a layer over 2 layers
    assert all(torch.equal(outs["cpu_flag"], o) for o in outs.values())
    assert outs["cpu_flag"].shape == (batch.num_tokens, lab.shape.hidden)
    assert rel_err(outs["cpu_flag"], _ref_forward(lab, x, batch, tensors)) < fp32_tol("cpu")


def test_attention_matches_reference_on_fresh_input():
    lab = _lab(num_layers=1)
    attn, backend = lab.model.layers[0].attn, lab.model.backend
    from lora_moe_lab.model.attention import positions, rope_cos_sin
    for counts in ([5, 2, 6], [3, 3], [0, 4, 0, 1]):
        M = sum(counts)
        x = torch.randn(M, lab.shape.hidden, generator=torch.Generator().manual_seed(M))
        pos = positions(torch.tensor([0] + counts, dtype=torch.int32).cumsum(0), M)
        assert pos.tolist() == [p for c in counts for p in range(c)]
        rope = rope_cos_sin(pos, attn.D, attn.theta)
        assert rel_err(attn(x, counts, rope, backend), ref.ref_attention(x, attn, counts)) < fp32_tol("cpu")


def test_requests_are_independent_sequences():
    # a request's output does not depend on the requests batched with it
    lab = _lab(num_layers=2)
    x = lab.random_input(9)
    b, t = lab.make_batch(["r2", None], [4, 5])
    b1, t1 = lab.make_batch(["r2"], [4])
    assert rel_err(lab.model(x, b, t)[:4], lab.model(x[:4], b1, t1)) < fp32_tol("cpu")


def test_guard_sites_match_production_count():
    per_layer = sites_per_layer(260 / 48, 48)
    assert sum(per_layer) == 260 and set(per_layer) == {5, 6}
    assert sites_per_layer(1.0, 3) == [1, 1, 1] and sites_per_layer(2.5, 2) == [2, 3]
    lab = _lab(num_layers=48, guard_sites=260 / 48)
    batch, tensors = lab.make_batch(["r2", None], [2, 1])
    with count_guard_syncs() as c:
        lab.model(lab.random_input(3), batch, tensors, guard="sync")
    assert c.count == 260


def test_sites_are_dealt_to_the_call_points_in_turn():
    counts = lambda n: list(GuardSites(None, None, n).count.values())  # noqa: E731
    assert list(GUARD_SITE_POINTS) == ["qkv_proj", "o_proj", "moe_gate_up", "moe_down"]
    assert counts(1) == [1, 0, 0, 0] and counts(5) == [2, 1, 1, 1] and counts(6) == [2, 2, 1, 1]
    steps = [s.name for s in DECODER_LAYER_STEPS]
    assert steps[-len(MOE_LAYER_STEPS):] == [s.name for s in MOE_LAYER_STEPS]
    assert set(GUARD_SITE_POINTS.values()) <= set(steps)


def test_single_process_group_is_the_default_and_bad_sites_are_named():
    a, b = _lab(num_layers=2), _lab(num_layers=2, tp=single("cpu"))
    batch, tensors = a.make_batch(["r8", None], [3, 2])
    x = a.random_input(5)
    assert torch.equal(a.model(x, batch, tensors), b.model(x, *b.make_batch(["r8", None], [3, 2])))
    with pytest.raises(ValueError, match="guard_sites must be >= 1"):
        build_decoder_lab("tiny", guard_sites=0.5)
