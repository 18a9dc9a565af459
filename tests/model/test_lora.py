"""Adapter pool, host-side batch metadata, device tensors, and clear errors for bad input."""
import pytest
import torch

from lora_moe_lab import runtime
from lora_moe_lab.config import LoRAConfig, MoEShape, check_dtype, get_shape
from lora_moe_lab.model.lora import AdapterPool, LoRABatchInfo, LoRABatchTensors, LoRAInfo, check_flag_against_device
from lora_moe_lab.model.lab import build_lab


@pytest.fixture
def pool():
    p = AdapterPool(get_shape("tiny"), LoRAConfig(max_loras=3, max_rank=8), num_layers=2)
    p.load("a", rank=4)
    p.load("b", rank=8, scaling=2.0)
    return p


def test_pool_zero_pads_ranks_and_folds_scaling(pool):
    w = pool.layers[0]
    s = pool.slot_of("a")
    assert w.gate_up_a[:, s, :, 4:].abs().sum() == 0 and w.gate_up_b[:, s, :, :, 4:].abs().sum() == 0
    assert (w.gate_up_a[:, s, :, :4] != 0).all() and (w.down_b[s, :, :, :4] != 0).all()  # real weights up to the rank
    q = AdapterPool(get_shape("tiny"), LoRAConfig(3, 8), num_layers=2)
    q.load("b", rank=8, scaling=1.0)
    sb = pool.slot_of("b")
    assert torch.allclose(pool.layers[1].down_b[sb], 2.0 * q.layers[1].down_b[0])  # same seed, scaled B
    assert torch.equal(pool.layers[1].down_a[sb], q.layers[1].down_a[0])


def test_pool_load_unload_in_place(pool):
    ptr = pool.layers[0].gate_up_a.data_ptr()
    s = pool.unload("a")
    assert pool.layers[0].gate_up_a[:, s].abs().sum() == 0 and pool.slot_names[s] is None
    assert pool.load("c", rank=2) == s and pool.layers[0].gate_up_a.data_ptr() == ptr


def test_batch_info_is_host_only(pool):
    b = LoRABatchInfo.build(pool, ["a", None, "a", None], [2, 3, 0, 1])
    assert b.req_slots == [0, -1, 0, -1] and b.seg_indptr == [0, 2, 5, 5, 6]
    assert b.adapter_enabled == [1, 0, 0] and b.lora_ids == [0, 1, -1] and b.has_active_lora is True
    assert LoRABatchInfo.build(pool, [None, None], [1, 1]).has_active_lora is False
    assert LoRABatchInfo.build(pool, ["b", None], [0, 3]).has_active_lora is False  # adapter with no tokens


def test_device_tensors_and_capture_buffers(pool):
    dev = runtime.default_device()
    b = LoRABatchInfo.build(pool, ["b", None, "a"], [2, 1, 3])
    t = LoRABatchTensors.from_batch(b, dev)
    assert t.token_lora_mapping.tolist() == [1, 1, -1, 0, 0, 0]
    assert t.seg_indptr.tolist() == b.seg_indptr and t.adapter_enabled.tolist() == [1, 1, 0]
    buf = LoRABatchTensors.empty(3, 6, 3, dev)
    ptr = buf.token_lora_mapping.data_ptr()
    LoRABatchTensors.from_batch(LoRABatchInfo.build(pool, [None, "a", None], [2, 1, 3]), dev, out=buf)
    assert buf.token_lora_mapping.data_ptr() == ptr and buf.token_lora_mapping.tolist() == [-1, -1, 0, -1, -1, -1]
    with pytest.raises(ValueError, match="static buffer"):
        LoRABatchTensors.from_batch(LoRABatchInfo.build(pool, [None], [6]), dev, out=buf)


def test_debug_cross_check_catches_a_wrong_false(pool):
    b = LoRABatchInfo.build(pool, ["a"], [3])
    t = LoRABatchTensors.from_batch(b, runtime.default_device())
    check_flag_against_device(LoRAInfo(pool.layers[0], t, 8, has_active_lora=True))
    with pytest.raises(AssertionError, match="silently dropped"):
        check_flag_against_device(LoRAInfo(pool.layers[0], t, 8, has_active_lora=False))
    assert LoRAInfo(pool.layers[0], t, 8).has_active_lora is True  # the safe default


def test_random_batch_fraction(pool):
    b = LoRABatchInfo.random(pool, 10, 4, 0.5, seed=1)
    assert sum(a is not None for a in b.adapters) == 5 and b.num_tokens == 40


# ---- bad input: each a clear error that names the problem ------------------------------------
BAD = [
    ("unknown preset", lambda p: get_shape("qwen9"), ValueError, "unknown preset"),
    ("negative size", lambda p: MoEShape("x", -1, 8, 4, 2, 1), ValueError, "hidden must be a positive"),
    ("top_k > experts", lambda p: MoEShape("x", 8, 8, 4, 5, 1), ValueError, "top_k=5 exceeds"),
    ("unknown dtype", lambda p: check_dtype("float8", "cpu"), ValueError, "unknown dtype"),
    ("unknown adapter", lambda p: LoRABatchInfo.build(p, ["zzz"], [1]), KeyError, "unknown adapter 'zzz'"),
    ("rank above max", lambda p: p.load("c", rank=9), ValueError, "above the pool's max rank 8"),
    ("rank zero", lambda p: p.load("c", rank=0), ValueError, "rank must be a positive int"),
    ("slot out of range", lambda p: p.load("c", rank=2, slot=7), IndexError, r"slot 7 out of range"),
    ("slot taken", lambda p: p.load("c", rank=2, slot=0), ValueError, "holds adapter 'a'"),
    ("duplicate name", lambda p: p.load("a", rank=2), ValueError, "already loaded"),
    ("pool full", lambda p: (p.load("c", rank=1), p.load("d", rank=1)), RuntimeError, "slots are in use"),
    ("length mismatch", lambda p: LoRABatchInfo.build(p, ["a"], [1, 2]), ValueError, "1 adapter entries but 2"),
    ("negative tokens", lambda p: LoRABatchInfo.build(p, ["a"], [-3]), ValueError, "non-negative ints"),
    ("empty batch", lambda p: LoRABatchInfo.build(p, [None], [0]), ValueError, "at least one token"),
    ("bad fraction", lambda p: LoRABatchInfo.random(p, 4, 1, 1.5), ValueError, "active_fraction"),
    ("unload unknown", lambda p: p.unload("nope"), KeyError, "unknown adapter 'nope'"),
]


@pytest.mark.parametrize("name,fn,exc,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input_named_errors(pool, name, fn, exc, msg):
    with pytest.raises(exc, match=msg):
        fn(pool)


def _lab():
    lab = build_lab("tiny", num_layers=1, backend="torch")
    lab.pool.load("a", rank=4)
    return lab


MODEL_BAD = [
    ("wrong hidden", lambda lab, b, t: lab.model(torch.randn(4, 7), b, t), ValueError, "hidden=64"),
    ("wrong dtype", lambda lab, b, t: lab.model(torch.randn(4, 64, dtype=torch.float64), b, t), TypeError, "dtype"),
    ("token mismatch", lambda lab, b, t: lab.model(lab.random_input(5), b, t), ValueError, "4 tokens but x has 5"),
    ("unknown guard", lambda lab, b, t: lab.model(lab.random_input(4), b, t, guard="maybe"), ValueError,
     "unknown guard"),
    ("unknown backend", lambda lab, b, t: build_lab("tiny", backend="cuda-magic"), ValueError, "unknown backend"),
    ("bad device", lambda lab, b, t: build_lab("tiny", device="tpu"), (ValueError, RuntimeError), "device"),
    ("bad token count", lambda lab, b, t: lab.random_input(0), ValueError, "positive int"),
]


@pytest.mark.parametrize("name,fn,exc,msg", MODEL_BAD, ids=[b[0] for b in MODEL_BAD])
def test_model_bad_input_named_errors(name, fn, exc, msg):
    lab = _lab()
    b, t = lab.make_batch(["a", None], [2, 2])
    with pytest.raises(exc, match=msg):
        fn(lab, b, t)


@pytest.mark.skipif(runtime.has_cuda(), reason="CPU-only check")
def test_cuda_requested_without_gpu_is_clear():
    with pytest.raises(ValueError, match="no CUDA GPU"):
        build_lab("tiny", device="cuda")


# ---- the batch's host metadata, field by field (LoRABatchInfo.build) ---------------------------------------
def test_build_fills_every_field_from_the_lists(pool):
    pool.load("c", rank=2)
    pool.unload("a")  # slot 0 empty, b in 1, c in 2
    b = LoRABatchInfo.build(pool, ["c", None, "b", "c"], [1, 4, 0, 2])
    assert (b.adapters, b.token_counts, b.req_slots, b.seg_indptr) == (["c", None, "b", "c"], [1, 4, 0, 2],
                                                                      [2, -1, 1, 2], [0, 1, 5, 5, 7])
    assert (b.adapter_enabled, b.lora_ids, b.lora_ranks) == ([0, 0, 1], [-1, 1, 2], [0, 8, 2])  # b has no tokens
    assert b.has_active_lora is True and b.num_tokens == 7 and b.num_active == 1 and b.pool_id == pool.pool_id
    assert b.slot_generations == tuple((s, pool.slot_names[s], pool.slot_generations[s]) for s in (1, 2))
    assert LoRABatchInfo.build(pool, [None], [3]).slot_generations == ()
    c = LoRABatchInfo.build(pool, ["c", None, "b", "c"], [1, 4, 0, 2], rows=2)  # compacted: the used adapter only
    assert (c.req_slots, c.adapter_enabled, c.lora_ids, c.lora_ranks) == ([0, -1, -1, 0], [1, 0], [2, -1], [2, 0])
    assert c.seg_indptr == b.seg_indptr and c.slot_generations == b.slot_generations and c.has_active_lora


def test_build_refuses_each_bad_list_by_name(pool):
    bad = [(([], []), "a batch needs at least one request"),
           ((["a"], []), "1 adapter entries but 0 token counts: one each per request"),
           ((["a", None], [1]), "2 adapter entries but 1 token counts: one each per request"),
           (([None], [True]), "token counts must be non-negative ints, got True"),
           (([None], [1.0]), "token counts must be non-negative ints, got 1.0"),
           (([None, None], [2, -1]), "token counts must be non-negative ints, got -1"),
           (([None, None], [0, 0]), "a batch needs at least one token"),
           (([None, None], [1, 2**31]), "token_counts=2147483648 (request 1) is past int32 (2147483647): the "
                                        "batch's offsets are int32 on the device"),
           (([None, None], [2**31 - 1, 1]), "token_counts sum to tokens=2147483648, past int32 (2147483647): the "
                                            "batch's offsets are int32 on the device; split it into smaller batches")]
    for (adapters, counts), what in bad:
        with pytest.raises(ValueError) as e:
            LoRABatchInfo.build(pool, adapters, counts)
        assert str(e.value) == what, (adapters, counts)
    assert LoRABatchInfo.build(pool, [None, None], [2**31 - 2, 1]).num_tokens == 2**31 - 1  # int32's largest
    assert LoRABatchInfo.build(pool, [None, "a"], [2**31 - 1, 0]).num_tokens == 2**31 - 1
    with pytest.raises(ValueError, match=r"rows must be an int in \[1, max_loras=3\], got 4"):
        LoRABatchInfo.build(pool, ["a"], [1], rows=4)
