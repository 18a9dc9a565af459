"""One rank of a larger TP group on one device: its shapes, and each all-reduce a spin of its time."""
import math

import pytest
import torch

from lora_moe_lab.model import tp as TP
from lora_moe_lab.model.decoder import build_decoder_lab


def test_allreduce_cost_follows_the_ring_convention():
    c = TP.AllReduceCost(bus_gbps=250.0, latency_us=10.0)
    nbytes = 64 * 2**20
    assert c.us(nbytes, 1) == 0.0  # one rank: no collective
    assert math.isclose(c.us(nbytes, 2), 10.0 + nbytes / 250e3)  # 2 (n-1)/n = 1
    assert math.isclose(c.us(nbytes, 4) - 10.0, 1.5 * (c.us(nbytes, 2) - 10.0))  # 2 (n-1)/n = 3/2


@pytest.mark.parametrize("kw", [dict(bus_gbps=0.0), dict(bus_gbps=-1.0), dict(bus_gbps=100.0, latency_us=-1.0)])
def test_allreduce_cost_rejects_bad_numbers(kw):
    with pytest.raises(ValueError, match="bus_gbps"):
        TP.AllReduceCost(**kw)


def test_emulated_group_counts_and_keeps_values():
    g = TP.emulated(4, TP.AllReduceCost(bus_gbps=1e6), device="cpu")
    t = torch.randn(8, 16)
    before = t.clone()
    assert g.all_reduce(t) is t and torch.equal(t, before)  # timing only: the sum is not computed
    assert g.collectives == 1 and g.backend == "emulated"
    assert math.isclose(g.collective_us, g.cost.us(t.numel() * 4, 4))
    g.destroy()  # nothing to tear down
    with pytest.raises(ValueError, match="size >= 2"):
        TP.emulated(1, g.cost)
    with pytest.raises(ValueError, match="cost="):
        TP.EmulatedTPGroup(size=2)


def test_emulated_decoder_holds_one_ranks_shapes_and_issues_two_collectives_per_layer():
    g = TP.emulated(2, TP.AllReduceCost(bus_gbps=1e6), device="cpu")
    lab = build_decoder_lab("tiny", num_layers=2, tp=g, dtype="float32", device="cpu", backend="torch")
    assert lab.shape.intermediate == 16 and lab.shape.num_heads == 2  # tiny: 32 and 4, halved
    lab.model.tp.collectives = 0
    from lora_moe_lab.instruments.recorders import prefill as P

    d = P.PrefillDriver(lab, P.make_plan(2, 8, 8), [None, None])
    d.run("cpu_flag")
    assert g.collectives == 2 * 2 * 2  # 2 forwards x 2 layers x (attention + MoE)
