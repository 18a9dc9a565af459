"""The base layer's SiLU-and-mul and top-k sum (+ residual) Triton kernels vs the float64 references, on fresh random
inputs with poisoned outputs. Both compute in fp32 and round once, so each element is checked against that bound:
|got - want| <= (u + e) |want| + tiny, u the output dtype's unit roundoff, e the fp32 work's own error."""
import pytest
import torch
from helpers import rel_err

from lora_moe_lab import runtime
from lora_moe_lab.kernels.activation import silu_and_mul
from lora_moe_lab.kernels.moe_sum import moe_sum
from lora_moe_lab.kernels.router import route
from lora_moe_lab.ops import reference as ref, torch_backend

DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if runtime.has_cuda() else [])


def _rounded_once(got, want, dtype, e, scale=None):
    fi = torch.finfo(dtype)
    u = fi.eps / 2
    scale = want.abs() if scale is None else scale
    err = (got.cpu().double() - want).abs()
    assert (err <= (u + e) * want.abs() + e * scale + fi.smallest_normal * u).all(), float(err.max())


@pytest.mark.parametrize("rows,I,pad", [(7, 24, 0), (13, 100, 5), (3, 1100, 8)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_kernel_matches_reference(rows, I, pad, dtype, device):
    g = torch.Generator().manual_seed(rows * I)
    inter = (torch.randn(rows, 2 * I, generator=g) * 3).to(device, dtype)
    buf = torch.full((rows, I + pad), float("nan"), dtype=dtype, device=device)  # pad > 0: a wider row, as the
    out = buf[:, :I]  # wide down build's
    y = silu_and_mul(inter, out=out)
    assert y.data_ptr() == out.data_ptr() and not torch.isnan(out).any()
    assert torch.isnan(buf[:, I:]).all()  # nothing past the I columns
    # fp32 silu: exp(-g) = 2^(-g log2 e) carries |g| log2(e) roundings of the argument, then an add and a divide
    gate = inter[:, :I].cpu().double().abs()
    _rounded_once(y, ref.ref_silu_mul(inter), dtype, 2.0 ** -23 * (4 + 2 * gate))
    assert torch.equal(silu_and_mul(inter), y)  # a buffer of its own: the same values
    t = torch_backend.silu_and_mul(inter)  # the torch path (two kernels: rounded twice in 16 bits)
    assert rel_err(t, ref.ref_silu_mul(inter)) < ref.tolerance(dtype, device)


@pytest.mark.parametrize("M,k,K", [(1, 2, 64), (9, 8, 100), (5, 4, 1500)])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_moe_sum_kernel_matches_reference(M, k, K, residual, dtype, device):
    g = torch.Generator().manual_seed(M * k + K)
    y = torch.randn(M * k, K, generator=g).to(device, dtype)
    res = torch.randn(M, K + 3, generator=g).to(device, dtype)[:, :K] if residual else None  # a strided residual
    out = torch.full((M, K), float("nan"), dtype=dtype, device=device)
    got = moe_sum(y, k, res, out=out)
    assert got is out and not torch.isnan(out).any()
    want = ref.ref_moe_sum(y, k, res)
    terms = ref.ref_moe_sum(y.abs(), k, None if res is None else res.abs())  # the fp32 sum's error scales with these
    fp32 = (k + 1) * torch.finfo(torch.float32).eps / 2
    _rounded_once(got, want, dtype, fp32, scale=terms)
    t = torch_backend.moe_sum(y, k, res)  # the torch path: also fp32, rounded once
    _rounded_once(t, want, dtype, fp32, scale=terms)


def test_base_ops_bad_inputs_are_named(device):
    with pytest.raises(ValueError, match="inter must be"):
        silu_and_mul(torch.randn(3, 7, device=device))
    with pytest.raises(ValueError, match="out must be"):
        silu_and_mul(torch.randn(3, 8, device=device), out=torch.empty(3, 5, device=device))
    with pytest.raises(ValueError, match="y must be"):
        moe_sum(torch.randn(7, 8, device=device), 2)
    with pytest.raises(ValueError, match="residual must be"):
        moe_sum(torch.randn(6, 8, device=device), 2, torch.randn(3, 9, device=device))


@pytest.mark.skipif(not runtime.has_cuda(), reason="needs a CUDA GPU")
def test_base_layer_kernels_compile_in_warmup_and_capture_sync_free():
    """After `warmup` the router, SiLU-and-mul and top-k sum launches at the layer's shapes compile nothing, read
    nothing back to the host, and capture in a CUDA graph."""
    from lora_moe_lab.config import get_shape
    from lora_moe_lab.kernels import activation, moe_sum as moe_sum_mod, router
    from lora_moe_lab.ops import triton_backend

    shape, dev, bf = get_shape("tiny"), torch.device("cuda"), torch.bfloat16
    K, I, E, k = shape.hidden, shape.intermediate, shape.num_experts, shape.top_k
    triton_backend.warmup(shape, bf, max_loras=3, max_rank=16, device=dev)
    kernels = (router.router_kernel, activation.silu_and_mul_kernel, moe_sum_mod.moe_sum_kernel)

    def ncompiled():
        caches = [getattr(kn, "device_caches", None) for kn in kernels]
        return None if None in caches else sum(len(v[0]) for c in caches for v in c.values())

    before = ncompiled()
    w = torch.randn(E, K, device=dev).to(bf)
    for M in (1, 3, 37, 200, 5000):
        x, inter, y = (torch.randn(*s, device=dev).to(bf) for s in ((M, K), (M * k, 2 * I), (M * k, K)))
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with runtime.sync_debug_mode("error"):
            run = lambda: (route(x, w, k), silu_and_mul(inter), moe_sum(y, k, x))  # noqa: E731
            run()
            with torch.cuda.graph(g):
                run()
        g.replay()
        torch.cuda.synchronize()
    if before is not None:
        assert ncompiled() == before, "a launch compiled after warmup"
