"""Skewed routing: skew 0 is the uniform router bit for bit; SERVING_SKEW concentrates the tokens
on about a quarter of qwen3-30b-a3b's 128 experts; a bad skew is a ValueError naming it."""
import math

import pytest
import torch

from lora_moe_lab.config import get_shape
from lora_moe_lab.model.decoder import build_decoder_lab
from lora_moe_lab.model.lab import build_lab
from lora_moe_lab.model.moe import SERVING_SKEW, MoELayer, expert_share, skew_bias


def _forward(lab, tokens=12):
    lab.pool.load("a", rank=4)
    batch, tensors = lab.make_batch(["a", None], [tokens // 2, tokens - tokens // 2])
    lab.model.routing_log = []
    y = lab.model(lab.random_input(tokens), batch, tensors, guard="cpu_flag")
    return y, torch.cat([ids for _, ids in lab.model.routing_log])


@pytest.mark.parametrize("build", [build_lab, build_decoder_lab])
def test_skew_zero_is_the_uniform_router(build):
    kw = dict(num_layers=2, backend="torch", dtype="float32", device="cpu")
    plain, zero, skewed = build("tiny", **kw), build("tiny", skew=0.0, **kw), build("tiny", skew=2.0, **kw)
    assert all(m.router_bias is None for m in zero.model.modules() if isinstance(m, MoELayer))
    y0, ids0 = _forward(plain)
    y1, ids1 = _forward(zero)
    assert torch.equal(y0, y1) and torch.equal(ids0, ids1)
    # skew changes the routing only: the same weights (the bias has its own generator), same state_dict
    sd0, sd2 = plain.model.state_dict(), skewed.model.state_dict()
    assert sd0.keys() == sd2.keys() and all(torch.equal(sd0[k], sd2[k]) for k in sd0)
    y2, ids2 = _forward(skewed)
    assert not torch.equal(ids0, ids2) and torch.isfinite(y2).all()


def test_bias_is_zipf_like_seeded_and_per_layer():
    b = skew_bias(8, 1.5, seed=7)
    assert torch.equal(b, skew_bias(8, 1.5, seed=7)) and not torch.equal(b, skew_bias(8, 1.5, seed=8))
    want = -1.5 * torch.log1p(torch.arange(8.0))
    assert torch.equal(b.sort(descending=True).values, want)  # one expert per rank
    lab = build_lab("tiny", num_layers=2, backend="torch", skew=1.0)
    b0, b1 = (m.router_bias for m in lab.model.layers)
    assert b0.dtype == torch.float32 and b0.device.type == lab.device.type and not torch.equal(b0, b1)


def test_serving_skew_hits_about_a_quarter_of_qwen_experts():
    # qwen3-30b-a3b's router (hidden 2048, 128 experts, top-8); a tiny expert width keeps it cheap
    shape = get_shape("qwen3-30b-a3b", num_layers=1).with_(intermediate=8)
    x = torch.randn(256, shape.hidden, generator=torch.Generator().manual_seed(1))
    share = {}
    for skew in (0.0, SERVING_SKEW, 2.0):
        layer = MoELayer(shape, torch.float32, "cpu", torch.Generator().manual_seed(0), skew=skew, skew_seed=0)
        _, ids = layer.route(x)
        share[skew] = (expert_share(ids, 128), expert_share(ids, 128, coverage=0.9))
    # uniform: every expert gets tokens, 90 % of them need most experts
    assert share[0.0][0] == 1.0 and share[0.0][1] > 0.75
    # SERVING_SKEW: about a quarter of the experts carry 90 % of the assignments
    assert 0.15 <= share[SERVING_SKEW][1] <= 0.3 and share[SERVING_SKEW][0] < 0.8
    assert share[2.0][0] < share[SERVING_SKEW][0] and share[2.0][1] < share[SERVING_SKEW][1]


def test_expert_share_counts():
    ids = torch.tensor([[0, 1], [0, 1], [0, 2], [0, 1]])
    assert expert_share(ids, 8) == 3 / 8
    assert expert_share(ids, 8, coverage=0.5) == 1 / 8  # expert 0 alone has half the assignments
    assert expert_share(ids, 8, coverage=0.9) == 3 / 8
    with pytest.raises(ValueError, match="coverage"):
        expert_share(ids, 8, coverage=0.0)


@pytest.mark.parametrize("bad", [-0.5, math.nan, math.inf, "1", True, None])
def test_bad_skew_is_a_named_error(bad):
    for build in (build_lab, build_decoder_lab):
        with pytest.raises(ValueError, match="skew must be a finite number >= 0"):
            build("tiny", backend="torch", device="cpu", skew=bad)
