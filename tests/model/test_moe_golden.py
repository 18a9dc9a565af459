"""The MoE layer's outputs, bit for bit (torch.equal), as the committed fixture holds them (tests/fixtures/
moe_golden.py wrote it at b9ee0e6, before the kernel wing's restructuring): every LoRA path the plan has, forced
through its table (none, decode, separate, packed, packed per slot, wide, a mix) and as the default table plans it,
on the two presets shrunk, at three token counts, seeds 0-2, on the torch backend and on Triton under the
interpreter. `make test` runs one token of seed 0 per path (the fast set); the rest is marked slow. The fixture
also holds the paths each case's plan took: a case that stopped taking its path fails on that, not on its numbers.
The Triton cases hold the interpreter's sums: on a GPU (its own kernels, other summation orders) they skip. The torch
cases hold the sums of the fixture's CPU instruction set (`moe_golden.CPU_CAPABILITY`): on another (an AVX-512 GPU
host) each case still asserts the paths its plan takes, and skips the bits."""
import os
import sys

import pytest
import torch

from lora_moe_lab import runtime

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures"))
import moe_golden as golden  # noqa: E402

GOLD = golden.load()


def test_the_fixture_holds_every_case():
    assert sorted(GOLD) == sorted(c.key for c in golden.cases())
    assert sum(c.fast for c in golden.cases()) == 9  # the fast set: 7 Triton paths + torch's separate x 2 shapes


@pytest.mark.parametrize("case", [pytest.param(c, id=c.key, marks=() if c.fast else pytest.mark.slow)
                                  for c in golden.cases()])
def test_layer_output_is_bit_identical_to_the_fixture(case):
    if case.backend == "triton" and not runtime.interpreter():
        pytest.skip("the fixture holds the Triton interpreter's sums; a GPU's kernels sum in other orders")
    want = GOLD[case.key]
    assert golden.paths_taken(case) == tuple(want["paths"])
    if case.backend == "torch" and torch.backends.cpu.get_cpu_capability() != golden.CPU_CAPABILITY:
        pytest.skip(f"the fixture holds {golden.CPU_CAPABILITY} float32 sums; this CPU is "
                    f"{torch.backends.cpu.get_cpu_capability()} (other kernels, other summation orders)")
    got = golden.run_case(case)
    assert got.dtype == want["out"].dtype and got.shape == want["out"].shape
    assert torch.equal(got, want["out"]), f"{case.key}: max |diff| {(got - want['out']).abs().max().item():.3g}"
