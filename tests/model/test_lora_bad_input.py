"""Bad adapters get named errors where they enter the pool, and leave it as it was.

* A rank above the pool's maximum: the adapter, its rank and the pool's max are named (`load`, `load_weights`).
* NaN or inf weights: given ones are refused before anything is written, naming the adapter, the tensor, the layer
  and the first bad element; weights that overflow the pool's dtype once the scaling is folded into B are refused
  after the write and the slot is zeroed again; so are finite weights whose delta overflows float16 (scaling 64).
* Token counts past int32 (the batch's device offsets) are named.
* A batch whose adapter was unloaded mid-run: the next eager forward of a batch built before raises StaleBatchError
  naming the adapter and the slot; a batch built after names the adapter and the slot it was unloaded from.
* A LoRAInfo asking for a rank above the slots' padded rank is refused (the kernels would read past A and B).
"""
import math

import pytest
import torch

from lora_moe_lab.config import LoRAConfig, get_shape
from lora_moe_lab.model.decoder import build_decoder_lab
from lora_moe_lab.model.lab import build_lab
from lora_moe_lab.model.lora import (LORA_TENSORS, AdapterNotLoadedError, AdapterPool, AdapterWeightsError,
                                     LoRABatchInfo, LoRABatchTensors, LoRAInfo, StaleBatchError)

SHAPE = get_shape("tiny")  # hidden 64, intermediate 32, 8 experts, 2 layers


def _pool(dtype=torch.float32, max_rank=8):
    return AdapterPool(SHAPE, LoRAConfig(max_loras=3, max_rank=max_rank), num_layers=2, dtype=dtype)


def _weights(rank=4, seed=0, L=2):
    g = torch.Generator().manual_seed(seed)
    E, K, I = SHAPE.num_experts, SHAPE.hidden, SHAPE.intermediate
    shapes = dict(gate_up_a=(L, 2, E, rank, K), gate_up_b=(L, 2, E, I, rank), down_a=(L, E, rank, I),
                  down_b=(L, E, K, rank))
    return {k: torch.randn(*s, generator=g) * 0.1 for k, s in shapes.items()}


def _state(pool):
    return ([t.clone() for w in pool.layers for t in (w.gate_up_a, w.gate_up_b, w.down_a, w.down_b)],
            list(pool.slot_names), list(pool.slot_generations))


def _unchanged(pool, before):
    tensors, names, gens = before
    now = _state(pool)
    assert now[1] == names and now[2] == gens
    assert all(torch.equal(a, b) for a, b in zip(tensors, now[0]))


# --- ranks above the pool's maximum --------------------------------------------------------------------------------
def test_rank_above_the_pool_max_names_adapter_rank_and_max():
    pool = _pool(max_rank=8)
    before = _state(pool)
    with pytest.raises(ValueError, match=r"adapter 'big': rank 16 is above the pool's max rank 8"):
        pool.load("big", rank=16)
    with pytest.raises(ValueError, match=r"adapter 'big2': rank 12 is above the pool's max rank 8"):
        pool.load_weights("big2", _weights(rank=12))
    _unchanged(pool, before)


# --- NaN and inf weights ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("tensor", LORA_TENSORS)
def test_non_finite_given_weights_are_refused_naming_the_first_bad_tensor(tensor, bad):
    pool = _pool()
    pool.load("ok", rank=4)
    before = _state(pool)
    w = _weights()
    w[tensor][1, 0, 3].view(-1)[2] = bad  # layer 1
    with pytest.raises(AdapterWeightsError) as e:
        pool.load_weights("poisoned", w)
    msg = str(e.value)
    assert "adapter 'poisoned'" in msg and f"{tensor} holds {bad}" in msg and "(layer 1)" in msg, msg
    assert f"{tensor}[1, 0, 3" in msg, msg
    _unchanged(pool, before)
    with pytest.raises(AdapterNotLoadedError, match="unknown adapter 'poisoned'"):
        pool.slot_of("poisoned")


def test_the_first_bad_tensor_is_named_when_several_are_bad():
    pool = _pool()
    w = _weights()
    w["down_a"][0, 0, 0, 0] = math.nan
    w["gate_up_b"][1, 1, 2, 3, 0] = math.inf
    with pytest.raises(AdapterWeightsError, match=r"gate_up_b holds inf at gate_up_b\[1, 1, 2, 3, 0\]"):
        pool.load_weights("x", w)


def test_weights_that_overflow_the_pool_dtype_after_scaling_are_refused_and_the_slot_left_empty():
    pool = _pool(dtype=torch.float16)
    pool.load("ok", rank=4)
    before = _state(pool)
    with pytest.raises(AdapterWeightsError, match=r"adapter 'loud' \(rank 4\): gate_up_b of layer 0 is not finite "
                                                  r"in torch.float16 after folding scaling=1e\+06"):
        pool.load("loud", rank=4, scaling=1e6)  # B ~ N(0, 1/4) * 1e6: past float16's 65504
    _unchanged(pool, before)
    with pytest.raises(AdapterWeightsError, match="adapter 'loud2'"):
        pool.load_weights("loud2", _weights(), scaling=1e6)
    _unchanged(pool, before)
    assert pool.load("fine", rank=4, scaling=2.0) == 1  # the slot refused is free


@pytest.mark.parametrize("change,msg", [
    (lambda w: w.pop("down_b"), r"missing \['down_b'\]"),
    (lambda w: w.update(extra=torch.zeros(1)), r"unexpected \['extra'\]"),
    (lambda w: w.update(down_a=torch.zeros(2, 8, 4, 31)), r"down_a has shape \(2, 8, 4, 31\), this pool needs "
                                                          r"\(2, 8, 4, 32\)"),
    (lambda w: w.update(gate_up_b=w["gate_up_b"].to(torch.int32)), "gate_up_b must be a floating-point tensor"),
    (lambda w: w.update(gate_up_a=w["gate_up_a"][:1]), "gate_up_a has shape"),
])
def test_malformed_weights_are_named(change, msg):
    pool = _pool()
    before = _state(pool)
    w = _weights()
    change(w)
    with pytest.raises(AdapterWeightsError, match=msg):
        pool.load_weights("m", w)
    _unchanged(pool, before)


def test_given_weights_load_as_the_random_ones_do():
    """load_weights of the tensors `load` drew (unpadded, scaling 1) fills the slot exactly as `load` did, with the
    scaling folded into B; a model runs on them."""
    src = _pool()
    s = src.load("a", rank=4, seed=3)
    w = {k: torch.stack([t[..., :4, :] if k.endswith("_a") else t[..., :4]
                         for t in (src._slot_tensors(lw, s)[LORA_TENSORS.index(k)] for lw in src.layers)])
         for k in LORA_TENSORS}
    dst = _pool()
    dst.load("first", rank=2)
    t = dst.load_weights("a", w, scaling=0.5)
    for lw_s, lw_d in zip(src.layers, dst.layers):
        a = src._slot_tensors(lw_s, s)
        b = dst._slot_tensors(lw_d, t)
        assert torch.equal(a[0], b[0]) and torch.equal(a[2], b[2])
        assert torch.allclose(0.5 * a[1], b[1]) and torch.allclose(0.5 * a[3], b[3])
    lab = build_lab("tiny", num_layers=2, max_loras=3, max_rank=8, dtype="float32", device="cpu", backend="torch")
    lab.pool.load_weights("given", w)
    y = lab.model(lab.random_input(4), *lab.make_batch(["given", None], [2, 2]))
    assert torch.isfinite(y).all()


# --- adapters unloaded mid-run ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["moe", "decoder"])
def test_an_adapter_unloaded_between_two_forwards_of_a_run_is_named(kind):
    """A run of several forwards (a chunked prefill: each chunk's batch built up front) whose adapter is unloaded
    after the first: the next forward of a batch built before raises, naming the adapter and its slot; a batch built
    after names the adapter and the slot it was unloaded from."""
    build = build_lab if kind == "moe" else build_decoder_lab
    lab = build("tiny", num_layers=2, max_loras=2, max_rank=8, dtype="float32", device="cpu", backend="torch")
    lab.pool.load("keep", rank=4)
    lab.pool.load("gone", rank=8)
    chunks = [lab.make_batch(["gone", "keep"], [2, 2]) for _ in range(3)]
    x = lab.random_input(4)
    lab.model(x, *chunks[0])
    lab.pool.unload("gone")
    with pytest.raises(StaleBatchError, match=r"built for adapter 'gone' in slot 1 .* is now empty"):
        lab.model(x, *chunks[1])
    with pytest.raises(AdapterNotLoadedError, match=r"unknown adapter 'gone': it was unloaded from slot 1") as e:
        lab.make_batch(["gone", "keep"], [2, 2])
    assert isinstance(e.value, KeyError) and not str(e.value).startswith('"')  # printed as written
    lab.model(x, *lab.make_batch(["keep", None], [2, 2]))  # the adapters still loaded keep running
    lab.pool.load("gone", rank=8)  # loaded again: known again
    lab.model(x, *lab.make_batch(["gone", "keep"], [2, 2]))


def test_a_never_loaded_adapter_is_named_without_an_unload_story():
    pool = _pool()
    with pytest.raises(AdapterNotLoadedError) as e:
        LoRABatchInfo.build(pool, ["nope"], [1])
    assert str(e.value) == "unknown adapter 'nope'; loaded adapters: []"


# --- LoRAInfo ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rank", [9, 64, -1, True, 4.0])
def test_lora_info_refuses_a_rank_past_the_slots(rank):
    pool = _pool(max_rank=8)
    pool.load("a", rank=8)
    t = LoRABatchTensors.from_batch(LoRABatchInfo.build(pool, ["a"], [2]), "cpu")
    with pytest.raises(ValueError, match=r"max_lora_rank must be an int in \[0, 8\]"):
        LoRAInfo(pool.layers[0], t, rank)
    assert LoRAInfo(pool.layers[0], t, 8).max_lora_rank == 8 and LoRAInfo(pool.layers[0], t, 0).max_lora_rank == 0


@pytest.mark.parametrize("how", ["load", "load_weights"])
def test_finite_weights_whose_delta_overflows_float16_are_refused_and_the_slot_left_empty(how):
    # float16 at scaling 64: every weight finite, but the delta's rows reach inf and then NaN in a forward
    pool = _pool(dtype=torch.float16)
    pool.load("ok", rank=4)
    before = _state(pool)
    with pytest.raises(AdapterWeightsError, match=r"adapter 'loud' \(rank 4\): at scaling=64 its .*delta.* in layer "
                                                  r"\d on unit-scale inputs, past torch.float16's largest finite "
                                                  r"value 65504.*slot 1 left empty"):
        if how == "load":
            pool.load("loud", rank=4, scaling=64.0)
        else:
            pool.load_weights("loud", {k: v * 10 for k, v in _weights().items()}, scaling=64.0)
    _unchanged(pool, before)
    assert pool.load("fine", rank=4, scaling=4.0) == 1  # a scaling whose rows stay finite loads; the slot was free


def test_the_overflow_probe_leaves_wide_dtypes_alone():
    assert _pool(dtype=torch.bfloat16).load("loud", rank=4, scaling=64.0) == 0  # bfloat16 holds it


@pytest.mark.parametrize("counts,what", [([2**31], r"token_counts=2147483648 \(request 0\) is past int32"),
                                         ([2**30, 2**30], r"token_counts sum to tokens=2147483648, past int32")])
def test_token_counts_past_int32_are_named(counts, what):
    pool = _pool()
    with pytest.raises(ValueError, match=what):
        LoRABatchInfo.build(pool, [None] * len(counts), counts)
