"""Identity and parameters are checked where they enter the library.

* A batch records the pool that built it and the generation of every slot its requests use: an eager
  forward of a batch from another pool, or of a batch whose adapter was unloaded (or replaced in the same
  slot) since it was built, raises a named error instead of silently applying another adapter's weights.
  The check is host-only (plain ints, no `.item()`), and it is skipped under capture mode (a captured graph
  reads the slot buffers by address and is meant to follow reloaded weights).
* Bad parameters (NaN/inf/bool scaling, bool token counts and fractions, an int dtype, an unknown device,
  guard or preset, non-finite guard_sites ...) raise a ValueError that names the parameter and the value.
"""
import math

import pytest
import torch

from lora_moe_lab import runtime
from lora_moe_lab.config import LoRAConfig, get_shape, parse_dtype
from lora_moe_lab.model.decoder import build_decoder_lab
from lora_moe_lab.model.lab import build_lab
from lora_moe_lab.model.lora import AdapterPool, ForeignBatchError, LoRABatchInfo, LoRABatchTensors, StaleBatchError


def _lab(**kw):
    return build_lab("tiny", num_layers=1, max_loras=3, max_rank=8, dtype="float32", device="cpu", backend="torch",
                     **kw)


@pytest.fixture
def pool():
    return AdapterPool(get_shape("tiny"), LoRAConfig(max_loras=3, max_rank=8), num_layers=1)


# --- pool.load: every bad parameter is named, and a refused load leaves the pool as it was ----------------------
BAD_LOADS = [
    (dict(scaling=math.nan), "scaling"),
    (dict(scaling=math.inf), "scaling"),
    (dict(scaling=-math.inf), "scaling"),
    (dict(scaling=True), "scaling"),
    (dict(scaling="2"), "scaling"),
    (dict(scaling=torch.tensor(2.0)), "scaling"),
    (dict(rank=-1), "rank"),
    (dict(rank=0), "rank"),
    (dict(rank=9), "rank 9 is above the pool's max rank 8"),
    (dict(rank=True), "rank"),
    (dict(rank=4.0), "rank"),
    (dict(seed=True), "seed"),
    (dict(seed=1.5), "seed"),
    (dict(slot=True), "slot"),
    (dict(slot=7), "slot 7"),
    (dict(slot=-1), "slot -1"),
]


@pytest.mark.parametrize("kw,msg", BAD_LOADS, ids=lambda v: repr(v)[:30] if isinstance(v, dict) else None)
def test_load_names_bad_parameter(pool, kw, msg):
    before = [t.clone() for t in (pool.layers[0].gate_up_b, pool.layers[0].down_b)]
    with pytest.raises((ValueError, IndexError), match=msg):
        pool.load("a", **{"rank": 4, **kw})
    assert pool.slot_names == [None, None, None] and pool.slot_generations == [0, 0, 0]
    assert all(torch.equal(a, b) for a, b in zip(before, (pool.layers[0].gate_up_b, pool.layers[0].down_b)))


@pytest.mark.parametrize("name", ["", None, 3])
def test_load_names_bad_adapter_name(pool, name):
    with pytest.raises(ValueError, match="adapter name"):
        pool.load(name, rank=4)


def test_load_twice_is_named(pool):
    pool.load("a", rank=4)
    with pytest.raises(ValueError, match="'a' is already loaded in slot 0"):
        pool.load("a", rank=4)


def test_finite_scaling_gives_finite_weights(pool):
    pool.load("a", rank=4, scaling=-0.5)  # a negative (finite) scaling is a valid LoRA scaling
    assert all(torch.isfinite(t).all() for t in (pool.layers[0].gate_up_b, pool.layers[0].down_b))


# --- batch identity: the pool that built it, and the generation of each slot it uses ------------------------------
def test_batch_records_pool_and_generations():
    lab = _lab()
    lab.pool.load("a", rank=4)
    lab.pool.load("b", rank=8)
    batch, tensors = lab.make_batch(["b", None, "a", "b"], [1, 2, 1, 1])
    assert batch.pool_id == lab.pool.pool_id
    assert batch.slot_generations == ((0, "a", 1), (1, "b", 1))
    assert tensors.built_from == (lab.pool.pool_id, batch.slot_generations)
    lab.pool.unload("a")
    lab.pool.load("a", rank=4)
    assert lab.pool.slot_generations == [3, 1, 0]


def test_batch_from_another_lab_is_refused():
    one, two = _lab(), _lab(seed=1)
    one.pool.load("a", rank=4)
    two.pool.load("x", rank=4)
    two.pool.load("a", rank=8)  # the same name, another slot: the first lab's batch would use slot 0 = "x"
    batch, tensors = one.make_batch(["a", None], [2, 2])
    x = two.random_input(4)
    with pytest.raises(ForeignBatchError, match=f"pool {one.pool.pool_id}.*pool {two.pool.pool_id}"):
        two.model(x, batch, tensors)
    b2, t2 = two.make_batch(["a", None], [2, 2])
    with pytest.raises(ForeignBatchError, match="batch tensors"):  # this lab's batch, the other lab's tensors
        two.model(x, b2, tensors)
    two.model(x, b2, t2)  # its own batch runs


def test_batch_without_adapters_from_another_lab_is_refused_too():
    one, two = _lab(), _lab()
    batch, tensors = one.make_batch([None, None], [1, 1])
    with pytest.raises(ForeignBatchError):
        two.model(two.random_input(2), batch, tensors)


@pytest.mark.parametrize("change", ["replace", "unload", "reload_same_name"])
@pytest.mark.parametrize("kind", ["moe", "decoder"])
def test_stale_batch_after_slot_reuse_is_refused(change, kind):
    build = build_lab if kind == "moe" else build_decoder_lab
    lab = build("tiny", num_layers=1, max_loras=2, max_rank=8, dtype="float32", device="cpu", backend="torch")
    lab.pool.load("a", rank=8)
    batch, tensors = lab.make_batch(["a", None], [2, 2])
    x = lab.random_input(4)
    lab.model(x, batch, tensors)
    lab.pool.unload("a")
    if change == "replace":
        assert lab.pool.load("b", rank=8) == 0  # the same slot
    elif change == "reload_same_name":
        lab.pool.load("a", rank=8, seed=123)  # same name, other weights
    with pytest.raises(StaleBatchError, match="adapter 'a' in slot 0"):
        lab.model(x, batch, tensors)
    fresh = lab.make_batch(["b" if change == "replace" else ("a" if change != "unload" else None), None], [2, 2])
    lab.model(x, *fresh)  # a batch built now runs


def test_stale_check_ignores_slots_the_batch_does_not_use():
    lab = _lab()
    lab.pool.load("a", rank=4)
    lab.pool.load("b", rank=4)
    batch, tensors = lab.make_batch(["a", None], [1, 1])
    lab.pool.unload("b")
    lab.pool.load("c", rank=4)  # slot 1: this batch's requests do not use it
    x = lab.random_input(2, seed=int(torch.randint(0, 2**31, ()).item()))
    y = lab.model(x, batch, tensors)  # runs, and applies adapter a as a batch built now does
    assert torch.equal(y, lab.model(x, *lab.make_batch(["a", None], [1, 1])))
    assert not torch.equal(y, lab.model(x, *lab.make_batch([None, None], [1, 1])))  # a is applied


def test_stale_check_is_skipped_under_capture_mode():
    """A captured graph replays on the slot buffers it was captured with, reloaded weights included."""
    lab = _lab()
    lab.pool.load("a", rank=4)
    batch, tensors = lab.make_batch(["a", None], [2, 2])
    lab.pool.unload("a")
    lab.pool.load("b", rank=4)  # slot 0 again, with other weights
    x = lab.random_input(4, seed=int(torch.randint(0, 2**31, ()).item()))
    with pytest.raises(StaleBatchError):  # eager: refused
        lab.model(x, batch, tensors)
    with runtime.capture_mode():
        y = lab.model(x, batch, tensors)
    # the slot's current weights (b's) are applied, as a graph replaying on the slot buffers would
    with runtime.capture_mode():
        assert torch.equal(y, lab.model(x, *lab.make_batch(["b", None], [2, 2])))
    assert not torch.equal(y, lab.model(x, *lab.make_batch([None, None], [2, 2])))


def test_identity_check_is_host_only(monkeypatch):
    """The check reads plain ints: no tensor is read on the host (no .item(), .tolist(), bool())."""
    lab = _lab()
    lab.pool.load("a", rank=4)
    batch, tensors = lab.make_batch(["a", None], [2, 2])

    def no_read(*a, **k):
        raise AssertionError("the identity check read a device value")

    for name in ("item", "tolist", "__bool__", "cpu"):
        monkeypatch.setattr(torch.Tensor, name, no_read)
    lab.pool.check_batch(batch, tensors)
    lab.pool.unload("a")
    with pytest.raises(StaleBatchError):
        lab.pool.check_batch(batch, tensors)


# --- bools and other bad numbers where ints and fractions enter -----------------------------------------------------
@pytest.mark.parametrize("n", [True, False, 0, -2, 2.0, "4"])
def test_random_input_names_num_tokens(n):
    with pytest.raises(ValueError, match="num_tokens"):
        _lab().random_input(n)


def test_random_input_names_seed():
    with pytest.raises(ValueError, match="seed"):
        _lab().random_input(4, seed=True)


@pytest.mark.parametrize("frac", [True, False, math.nan, 1.5, -0.1, "0.5", None])
def test_random_batch_names_active_fraction(frac):
    lab = _lab()
    lab.pool.load("a", rank=4)
    with pytest.raises(ValueError, match="active_fraction"):
        LoRABatchInfo.random(lab.pool, 4, 2, frac)


@pytest.mark.parametrize("kw,name", [(dict(num_requests=True), "num_requests"), (dict(num_requests=0), "num_requests"),
                                     (dict(tokens_per_request=True), "tokens_per_request"),
                                     (dict(tokens_per_request=-1), "tokens_per_request")])
def test_random_batch_names_counts(kw, name):
    lab = _lab()
    args = {"num_requests": 4, "tokens_per_request": 2, **kw}
    with pytest.raises(ValueError, match=name):
        LoRABatchInfo.random(lab.pool, args["num_requests"], args["tokens_per_request"], 0.0)


def test_token_counts_refuse_bools():
    lab = _lab()
    with pytest.raises(ValueError, match="token counts"):
        lab.make_batch([None, None], [True, 2])


# --- the lab builders: dtype, device, preset, num_layers, pool geometry, guard_sites -------------------------------
BAD_BUILDS = [
    (dict(dtype=torch.int32), "dtype"),
    (dict(dtype=torch.bool), "dtype"),
    (dict(dtype=torch.complex64), "dtype"),
    (dict(dtype="int8"), "dtype"),
    (dict(dtype=None), "dtype"),
    (dict(device="foo"), "device 'foo'"),
    (dict(device="tpu"), "device 'tpu'"),
    (dict(device=3), "device 3"),
    (dict(preset="qwen9"), "preset 'qwen9'"),
    (dict(preset=["tiny"]), "preset"),
    (dict(num_layers=0), "num_layers"),
    (dict(num_layers=True), "num_layers"),
    (dict(num_layers=1.5), "num_layers"),
    (dict(max_loras=True), "max_loras"),
    (dict(max_loras=0), "max_loras"),
    (dict(max_rank=True), "max_rank"),
    (dict(max_rank=2.0), "max_rank"),
    (dict(backend="cuda"), "backend 'cuda'"),
    (dict(seed=True), "seed"),
    (dict(seed="0"), "seed"),
]


@pytest.mark.parametrize("builder", [build_lab, build_decoder_lab], ids=["moe", "decoder"])
@pytest.mark.parametrize("kw,msg", BAD_BUILDS, ids=lambda v: repr(v)[:34] if isinstance(v, dict) else None)
def test_builders_name_bad_parameter(builder, kw, msg):
    args = {"preset": "tiny", "num_layers": 1, "device": "cpu", "backend": "torch", **kw}
    with pytest.raises(ValueError, match=msg):
        builder(**args)


@pytest.mark.parametrize("sites", [math.nan, math.inf, 0, -1, 0.5, True, "2", None])
def test_guard_sites_named(sites):
    with pytest.raises(ValueError, match="guard_sites"):
        build_decoder_lab("tiny", num_layers=1, device="cpu", backend="torch", guard_sites=sites)


@pytest.mark.parametrize("device", ["foo", "cuda:x", "", 3.0, ["cpu"]])
def test_resolve_device_names_bad_device(device):
    with pytest.raises(ValueError, match="device"):
        runtime.resolve_device(device)


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint8, "float8", 16])
def test_parse_dtype_refuses_non_float(dtype):
    with pytest.raises(ValueError, match="dtype"):
        parse_dtype(dtype)


@pytest.mark.parametrize("dtype,want", [("float16", torch.float16), ("bfloat16", torch.bfloat16),
                                        ("float32", torch.float32), ("float64", torch.float64),
                                        (torch.float64, torch.float64), ("auto", torch.float32)])  # auto on a CPU: fp32
def test_builder_takes_float_dtypes(dtype, want):
    lab = build_lab("tiny", num_layers=1, device="cpu", backend="torch", dtype=dtype)
    lab.pool.load("a", rank=4)
    assert lab.dtype == lab.model.dtype == want
    assert {p.dtype for p in lab.model.parameters()} == {want}
    lw = lab.pool.layers[0]
    assert {t.dtype for t in (lw.gate_up_a, lw.gate_up_b, lw.down_a, lw.down_b)} == {want}
    assert lab.random_input(3).dtype == want


@pytest.mark.parametrize("guard", ["sometimes", ["sync"], None, 3])
def test_forward_names_bad_guard(guard):
    lab = _lab()
    batch, tensors = lab.make_batch([None], [2])
    with pytest.raises(ValueError, match="guard"):
        lab.model(lab.random_input(2), batch, tensors, guard=guard)


def test_pool_constructor_names_bad_parameters():
    with pytest.raises(ValueError, match="num_layers"):
        AdapterPool(get_shape("tiny"), num_layers=True)
    with pytest.raises(ValueError, match="dtype"):
        AdapterPool(get_shape("tiny"), dtype=torch.int32)
    with pytest.raises(ValueError, match="device 'foo'"):
        AdapterPool(get_shape("tiny"), device="foo")


def test_tensors_from_batch_are_tagged_and_empty_buffers_are_not():
    lab = _lab()
    lab.pool.load("a", rank=4)
    b, _ = lab.make_batch(["a"], [3])
    buf = LoRABatchTensors.empty(1, 3, lab.pool.max_loras, "cpu")
    assert buf.built_from is None
    LoRABatchTensors.from_batch(b, "cpu", out=buf)
    assert buf.built_from == (lab.pool.pool_id, b.slot_generations)
