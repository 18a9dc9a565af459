"""The build sized to the card (model/sizing.py): its byte counts against a real build, its choices against a
stated capacity (a fake card, no GPU needed), and its errors before anything is allocated."""
import pytest
import torch

from lora_moe_lab import runtime
from lora_moe_lab.config import LoRAConfig, get_shape
from lora_moe_lab.model import lab as lab_mod
from lora_moe_lab.model import sizing
from lora_moe_lab.model.decoder import build_decoder_lab
from lora_moe_lab.model.lab import build_lab
from lora_moe_lab.model.tp import tp_shape

GIB = 2 ** 30
QWEN = get_shape("qwen3-30b-a3b")


def held_bytes(lab) -> int:
    """Every distinct storage the model and its pool hold, counted once."""
    ts = list(lab.model.parameters()) + list(lab.model.buffers())
    for lw in lab.pool.layers:
        ts += [lw.gate_up_a, lw.gate_up_b, lw.down_a, lw.down_b, *(v[0] for v in lw.derived.values())]
    seen = {}
    for t in ts:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("decoder", [False, True])
def test_the_bytes_counted_are_the_bytes_a_build_holds(backend, decoder):
    # 3 slots (padded to 4 in the packed layout) at rank 8 (BLOCK_R 16): the paddings are counted too
    build = build_decoder_lab if decoder else build_lab
    lab = build("tiny", num_layers=3, max_loras=3, max_rank=8, dtype="float32", device="cpu", backend=backend)
    per = sizing.layer_bytes(lab.shape, LoRAConfig(3, 8), torch.float32, backend, decoder=decoder)
    assert held_bytes(lab) == 3 * per


def cap(gib: float) -> tuple[int, int]:
    return int(gib * GIB), int(gib * GIB)


def plan(gib, requested=None, decoder=True, shape=QWEN, tokens=sizing.FIT_TOKENS):
    return sizing.fit_layers(shape, LoRAConfig(4, 16), "bfloat16", "triton", decoder=decoder, requested=requested,
                             tokens=tokens, capacity=cap(gib))


def test_the_preset_count_where_it_fits_and_the_most_that_fit_below():
    per = plan(139).per_layer_bytes
    assert plan(139).num_layers == 48 and not plan(139).reduced  # an H200
    assert plan(78.6).num_layers == 48  # an H100's usable memory holds the whole decoder
    for gib in (20, 22, 40, 44, 70):  # 24 GB, A100-40GB, L40S 48 GB cards and between
        p = plan(gib)
        assert p.reduced and p.num_layers < 48
        assert p.need_bytes() <= gib * GIB < p.need_bytes(p.num_layers + 1)  # the most that fit, not one more
        assert p.per_layer_bytes == per  # every layer keeps its shapes
    assert [plan(g).num_layers for g in (20, 30, 44, 60)] == sorted(plan(g).num_layers for g in (20, 30, 44, 60))
    assert plan(22, shape=tp_shape(QWEN, 4)).num_layers > plan(22).num_layers  # a TP=4 rank's layers are smaller
    assert "of its 48 layers fit" in plan(22).describe()
    assert plan(22).meta()["layers"] == plan(22).num_layers and plan(22).meta()["layers_reduced"]


def test_an_explicit_count_that_cannot_fit_is_a_named_error():
    assert plan(22, requested=4).num_layers == 4  # fits: taken as asked
    fits = plan(22).num_layers
    with pytest.raises(sizing.BuildTooLargeError) as e:
        plan(22, requested=48)
    msg = str(e.value)
    assert "num_layers=48" in msg and "22.0 GiB is usable" in msg and f"num_layers={fits} fits" in msg
    with pytest.raises(sizing.BuildTooLargeError, match="not even one layer fits.*'tiny'"):
        plan(2)  # a cap below what one layer needs
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="num_layers"):
            plan(80, requested=bad)
    with pytest.raises(ValueError, match="tokens"):
        plan(80, tokens=0)


def test_the_check_comes_before_any_allocation(monkeypatch):
    # a CPU stands in for a 2 GiB card: the refusal comes before the pool or the model allocates a byte
    real = sizing.fit_layers
    monkeypatch.setattr(lab_mod, "fit_layers", lambda *a, **kw: real(*a, **dict(kw, capacity=cap(2))))

    def no_alloc(*a, **kw):
        raise AssertionError("allocated before the size check")

    monkeypatch.setattr(lab_mod, "AdapterPool", no_alloc)
    monkeypatch.setattr(lab_mod, "MiniMoEModel", no_alloc)
    with pytest.raises(sizing.BuildTooLargeError):
        build_lab("qwen3-30b-a3b", num_layers=48, dtype="bfloat16", device="cpu")
    with pytest.raises(sizing.BuildTooLargeError):
        build_lab("qwen3-30b-a3b", dtype="bfloat16", device="cpu")  # not one layer fits in 2 GiB


def test_a_reduced_build_says_so_in_one_line(monkeypatch, capsys):
    real = sizing.fit_layers
    small = sizing.fit_layers(get_shape("tiny"), LoRAConfig(4, 16), torch.float32, "torch", decoder=False,
                              requested=1, tokens=64, device="cpu")  # no capacity: the bytes alone
    # a fake card that holds 1 of the preset's 2 tiny layers beside the headroom
    gib = (small.fixed_bytes + sizing.RESERVE_BYTES + small.per_layer_bytes + 1) / GIB
    monkeypatch.setattr(lab_mod, "fit_layers", lambda *a, **kw: real(*a, **dict(kw, capacity=cap(gib))))
    lab = build_lab("tiny", dtype="float32", device="cpu", fit_tokens=64)
    assert lab.shape.num_layers == 1 and len(lab.model.layers) == 1 and lab.sizing.reduced
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("[sizing] tiny: 1 of its 2 layers fit"), out


def test_a_device_or_cap_that_does_not_exist_is_named(monkeypatch):
    with pytest.raises(ValueError, match="cuda:9|no CUDA GPU"):
        runtime.resolve_device("cuda:9")
    for bad, why in (("abc", "a number"), ("-3", "positive"), ("0", "positive"), ("nan", "positive")):
        monkeypatch.setenv(runtime.GPU_GIB_ENV, bad)
        with pytest.raises(runtime.GpuMemoryCapError, match=why):
            runtime.gpu_memory_cap_gib()
    monkeypatch.setenv(runtime.GPU_GIB_ENV, "24")
    assert runtime.gpu_memory_cap_gib() == 24.0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: the allocator's own count")
def test_on_a_gpu_the_count_is_what_the_allocator_holds():
    # qwen3 shapes, 2 layers, bf16, Triton (the wide build): what the allocator holds after the build
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    lab = build_lab("qwen3-30b-a3b", num_layers=2, dtype="bfloat16", device="cuda")
    held = torch.cuda.memory_allocated() - before
    per = sizing.layer_bytes(lab.shape, LoRAConfig(4, 16), torch.bfloat16, "triton", decoder=False)
    assert abs(held - 2 * per) <= 2 * 2 ** 20, (held, 2 * per)  # the allocator's rounding of a few tensors
    p = sizing.plan_build("qwen3-30b-a3b", decoder=True, device="cuda")
    assert p.capacity_bytes is not None and p.need_bytes() <= p.capacity_bytes
