"""tests/triton_interp.py (installed by the root conftest.py under the interpreter): the kernels give the same bits
with it as without it, leave triton.language as the interpreter itself leaves it (its nested calls of triton's
own jit functions patch triton.language.core and its tensor class and never restore them: that stays so), and
nested calls no longer re-patch it (nor is the numpy dtype table built at every op)."""
import pytest
import torch
import triton.language as tl
import triton_interp
from lora_gemm_cases import make_case

from lora_moe_lab import runtime
from lora_moe_lab.kernels.align import moe_align
from lora_moe_lab.kernels.configs import GemmConfig
from lora_moe_lab.kernels.fused_moe import moe_gemm
from lora_moe_lab.kernels.fused_moe_lora_packed import moe_gemm_lora_packed
from lora_moe_lab.kernels.lora_decode import lora_delta_decode

pytestmark = pytest.mark.skipif(not runtime.interpreter(), reason="the Triton interpreter only")


def _launches():
    """A persistent packed GEMM (nested jit calls several deep) and the decode delta, on NaN-poisoned outputs."""
    c = make_case(11, 9, 24, 20, 5, 3, 4, 4, 6, 2, lora_ids=[0, 3, -1, 1], enabled=[1, 1, 1, 0])
    g = torch.Generator().manual_seed(3)
    w = torch.randn(5, 40, 24, generator=g) * 24 ** -0.5
    al = moe_align(c["ids"], 5, 16)
    cfg = GemmConfig(16, 32, 4, 4, 2, persistent=2, flatten=True, sub_m=16, early_loads=True)
    base = torch.full((27, 40), float("nan"))
    moe_gemm(c["x"], w, al, 3, base, config=cfg)
    out = torch.full_like(base, float("nan"))
    moe_gemm_lora_packed(c["x"], w, al, 3, out, c["a"], c["b"], c["mapping"], c["lora_ids"], c["enabled"],
                         per_slot=True, config=cfg)
    dec = c["out0"].clone()
    lora_delta_decode(c["x"], c["a"], c["b"], c["ids"], c["mapping"], c["lora_ids"], c["enabled"], dec)
    return base, out, dec


_MODS = {"triton.language": tl, "triton.language.core": tl.core, "triton.language.math": tl.math,
         "tensor": tl.core.tensor}


def _lang_state():
    return {(name, k): v for name, mod in _MODS.items() for k, v in vars(mod).items()}


def _reset(state):
    """triton.language (its modules and tensor class) back to `state`."""
    for name, k in _lang_state().keys() - state.keys():
        delattr(_MODS[name], k)
    for (name, k), v in state.items():
        if vars(_MODS[name]).get(k, state) is not v:
            setattr(_MODS[name], k, v)


def _changed(before):
    now = _lang_state()
    return {k for k, v in now.items() if k not in before or before[k] is not v} | (before.keys() - now.keys())


def test_same_bits_with_and_without_the_shortcut(monkeypatch):
    from triton.runtime import interpreter as ti

    before = _lang_state()
    calls = []
    orig = triton_interp._ORIGINAL or ti._patch_lang
    triton_interp.uninstall()
    try:  # the interpreter as it is, each of its patches counted
        monkeypatch.setattr(ti, "_patch_lang", lambda fn: calls.append(fn) or orig(fn))
        slow = _launches()
        changed_slow, n_slow = _changed(before), len(calls)
        monkeypatch.undo()
        _reset(before)
        del calls[:]
        assert triton_interp.install()
        monkeypatch.setattr(triton_interp, "_ORIGINAL", lambda fn: calls.append(fn) or orig(fn))
        fast = _launches()
        changed_fast, n_fast = _changed(before), len(calls)
    finally:
        monkeypatch.undo()
        triton_interp.install()
    for f, s in zip(fast, slow):
        assert torch.isfinite(f).all() and torch.equal(f.view(torch.int32), s.view(torch.int32))
    assert changed_fast == changed_slow  # what the launches leave patched, the interpreter leaves patched too
    assert 0 < n_fast < n_slow / 10, (n_fast, n_slow)  # one patch per launch, not one per nested call
