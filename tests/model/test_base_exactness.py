"""Requests without an adapter stay exact when other requests of the batch use adapters.

A request's rows must not depend on its neighbours' adapters: its output, bit for bit
(torch.equal), is the output of the same request in a model with NO LoRA at all, where no LoRA
hook runs for the batch. The LoRA paths may only add into the rows of their own slot's pairs:
the Triton kernel masks its stores (a base request's pairs are in no slot's alignment); the torch
backend adds an exact +0.0 to pair 0, where its padding rows point, which changes no value
(at most -0.0 to +0.0, and torch.equal counts -0.0 == +0.0). Pair 0 is a base request here.
"""
import pytest
import torch

from lora_moe_lab import runtime
from lora_moe_lab.model import moe
from lora_moe_lab.model.decoder import build_decoder_lab
from lora_moe_lab.model.guards import guard_names
from lora_moe_lab.model.lab import build_lab

ADAPTERS = [None, "a", "b", None, "a"]  # requests 0 and 3 use no adapter; request 0 owns pair 0
TOKENS = [3, 2, 4, 3, 2]


def _lab(kind, backend, device=None, load=True):
    # the Triton backend on the GPU where there is one (the interpreter only exists on CPU-only machines)
    device = device or ("cuda" if backend == "triton" and runtime.has_cuda() else "cpu")
    build = build_lab if kind == "moe" else build_decoder_lab
    lab = build("tiny", num_layers=2, max_loras=3, max_rank=8, dtype="float32", device=device,
                backend=backend, seed=3)
    if load:
        lab.pool.load("a", rank=8)
        lab.pool.load("b", rank=4, scaling=2.0)
    return lab


def _base_rows(y):
    """The rows of the requests without an adapter."""
    bounds = [0]
    for c in TOKENS:
        bounds.append(bounds[-1] + c)
    return torch.cat([y[bounds[i]:bounds[i + 1]] for i, a in enumerate(ADAPTERS) if a is None])


@pytest.fixture
def hook_calls(monkeypatch):
    """How many times a LoRA hook prepared its alignment (0: no LoRA work ran for the batch)."""
    calls = []
    prepare = moe.LoRAHook.prepare
    monkeypatch.setattr(moe.LoRAHook, "prepare", lambda self, ids: (calls.append(1), prepare(self, ids))[1])
    return calls


@pytest.mark.parametrize("kind", ["moe", "decoder"])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_base_requests_bit_identical_to_no_lora(kind, backend, hook_calls):
    lab = _lab(kind, backend)
    x = lab.random_input(sum(TOKENS), seed=5)
    with torch.no_grad():
        # "no LoRA at all", twice: the same lab with no adapter in the batch (the guard launches
        # nothing), and a lab of the same seed with no adapter loaded (rank 0: nothing either)
        b0, t0 = lab.make_batch([None] * len(TOKENS), TOKENS)
        want = lab.model(x, b0, t0, guard="cpu_flag")
        if backend == "torch":  # the same base path on both backends; the interpreter is slow
            bare = _lab(kind, backend, load=False)
            b_bare, t_bare = bare.make_batch([None] * len(TOKENS), TOKENS)
            assert torch.equal(bare.model(x, b_bare, t_bare, guard="launch_always"), want)
        assert not hook_calls  # the references ran no LoRA hook
        batch, tensors = lab.make_batch(ADAPTERS, TOKENS)
        # every guard launches the same LoRA work for a mixed batch (tests/model/test_moe.py checks
        # they agree); under the slow interpreter one guard is enough
        for g in guard_names() if backend == "torch" else ["launch_always"]:
            y = lab.model(x, batch, tensors, guard=g)
            assert hook_calls, g  # the mixed batch did run the LoRA work
            assert torch.equal(_base_rows(y), _base_rows(want)), (kind, backend, g)
            assert not torch.equal(y, want)  # and the adapter rows did change
            hook_calls.clear()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy: overflow, inf * 0
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_overflowing_adapter_does_not_touch_base_rows(backend):
    """An adapter whose delta overflows to inf makes its own rows NaN, and only those. The padding
    rows of its alignment compute the same inf; multiplied by a 0 mask that was NaN, which the
    torch backend used to index_add_ into pair 0: a base request's row."""
    lab = _lab("moe", backend)
    s = lab.pool.slot_of("a")
    for w in lab.pool.layers:  # 1e20 * 1e20 overflows fp32 (max 3.4e38)
        for t in (w.gate_up_a[:, s], w.gate_up_b[:, s], w.down_a[s], w.down_b[s]):
            t.mul_(1e20)
    x = lab.random_input(sum(TOKENS), seed=5)
    with torch.no_grad():
        want = lab.model(x, *lab.make_batch([None] * len(TOKENS), TOKENS), guard="cpu_flag")
        y = lab.model(x, *lab.make_batch(ADAPTERS, TOKENS), guard="launch_always")
    assert torch.isnan(y).any()  # the broken adapter's rows
    assert torch.equal(_base_rows(y), _base_rows(want))


@pytest.mark.skipif(not runtime.has_cuda(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("kind", ["moe", "decoder"])
def test_base_requests_exact_under_graph_replay(kind):
    from lora_moe_lab.model.graphs import CapturedForward

    lab = _lab(kind, "triton", device="cuda")
    x = lab.random_input(sum(TOKENS), seed=5)
    with torch.no_grad():
        b0, t0 = lab.make_batch([None] * len(TOKENS), TOKENS)
        want = lab.model(x, b0, t0, guard="cpu_flag").clone()  # eager, no LoRA hook
        g = CapturedForward(lab, TOKENS)  # the graph always holds the LoRA kernels
        y = g.replay(x, ADAPTERS).clone()
        torch.cuda.synchronize()
    assert torch.equal(_base_rows(y), _base_rows(want))
    assert not torch.equal(y, want)
