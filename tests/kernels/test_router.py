"""The router kernel (GEMM + softmax/top-k/renormalise epilogue) vs the float64 reference, on fresh random inputs
with poisoned outputs.

The selection is checked exactly, up to what fp32 rounding allows: the kernel's logit of (row, expert) differs from
the float64 one by at most gamma * (sum_i |x_i w_i| + |bias|), gamma = (K + 2) u / (1 - (K + 2) u), u = 2^-23 (the
K - 1 additions, the product where the inputs are fp32, the bias add; u = 2^-23 also covers an accumulator that
truncates). So the kernel may put expert a before expert b only where L_b - L_a <= bound_a + bound_b; every row whose
reference gap between its k-th and (k+1)-th expert is above that bound must get exactly the reference's experts.
"""
import pytest
import torch
from helpers import fp32_tol, rel_err

from lora_moe_lab import runtime
from lora_moe_lab.kernels.router import route
from lora_moe_lab.ops import reference as ref
from lora_moe_lab.ops.torch_backend import route as route_torch

DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if runtime.has_cuda() else [])


def _case(M, K, E, dtype, bias, seed, device, twins=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g)
    w = torch.randn(E, K, generator=g) * K ** -0.5
    w[E - 1] = w[3]  # an exact tie between experts 3 and E-1 in every row
    if twins:  # every expert has a twin: with an odd top_k each row's k-th and (k+1)-th tie exactly
        w[E // 2:] = w[:E // 2]
    b = -torch.log1p(torch.randperm(E, generator=g).float()) if bias else None
    return x.to(device, dtype), w.to(device, dtype), None if b is None else b.to(device)


def _bound(x, w, b):
    K = x.shape[1]
    u = 2.0 ** -23
    gamma = (K + 2) * u / (1 - (K + 2) * u)
    mag = x.double().abs().cpu() @ w.double().abs().cpu().T
    return gamma * (mag + (0 if b is None else b.double().abs().cpu()))


def check_selection(ids, x, w, b, top_k):
    """ids (M, top_k) against the float64 logits: distinct experts in range, ordered and chosen as the reference's
    up to the rounding bound, and exactly the reference's where its k-th / (k+1)-th gap is above the bound.
    Returns the number of rows exempted from exact equality (near-ties)."""
    L, B = ref.ref_router_logits(x, w, b), _bound(x, w, b)
    ids = ids.cpu().long()
    M, E = L.shape
    assert ids.min() >= 0 and ids.max() < E
    assert all(len(set(r.tolist())) == top_k for r in ids)  # distinct experts
    chosen = torch.zeros(M, E, dtype=torch.bool).scatter_(1, ids, True)
    Lc, Bc = L.gather(1, ids), B.gather(1, ids)
    # order: each chosen expert is not clearly below the next one
    assert (Lc[:, 1:] - Lc[:, :-1] <= Bc[:, 1:] + Bc[:, :-1]).all()
    # selection: no expert left out is clearly above a chosen one
    gap = (L[:, None, :] - Lc[:, :, None]) - (B[:, None, :] + Bc[:, :, None])  # (M, chosen, every expert)
    assert (gap.masked_fill(chosen[:, None, :], float("-inf")) <= 0).all()
    _, rid = torch.topk(L, top_k + 1, dim=1)  # the reference's order
    kth, nxt = rid[:, top_k - 1], rid[:, top_k]
    rows = torch.arange(M)
    near = L[rows, kth] - L[rows, nxt] <= B[rows, kth] + B[rows, nxt]
    want = torch.zeros(M, E, dtype=torch.bool).scatter_(1, rid[:, :top_k], True)
    assert torch.equal(chosen[~near], want[~near])  # the reference's experts, wherever it is clear
    return int(near.sum())


def check_weights(tw, ids, x, w, b, device):
    L = ref.ref_router_logits(x, w, b).gather(1, ids.cpu().long())
    want = torch.softmax(L, dim=1)  # softmax, top-k, renormalise = the softmax of the chosen logits
    assert rel_err(tw, want) < fp32_tol(device)
    assert (tw.cpu().double().sum(1) - 1).abs().max() < 1e-5


@pytest.mark.parametrize("M,K,E,top_k,bias,twins", [(37, 96, 60, 4, False, False), (20, 64, 128, 8, True, False),
                                                    (5, 200, 96, 6, True, False), (9, 80, 64, 5, False, True)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_router_kernel_matches_reference(M, K, E, top_k, bias, twins, dtype, device):
    x, w, b = _case(M, K, E, dtype, bias, seed=M * E + top_k, device=device, twins=twins)
    tw = torch.full((M, top_k), float("nan"), device=device)
    ids = torch.full((M, top_k), -7, dtype=torch.int32, device=device)
    got = route(x, w, top_k, b, out=(tw, ids))
    assert got[0] is tw and got[1] is ids and not torch.isnan(tw).any() and (ids >= 0).all()
    # an exact tie at the k-th place (every row with twins) is exempted from exact equality; a clear row is not
    near = check_selection(ids, x, w, b, top_k)
    assert near == M if twins else near <= M // 4  # random rows are rarely within rounding of a tie
    check_weights(tw, ids, x, w, b, device)
    # the torch backend's router (the reference path) meets the same rule
    tw_t, ids_t = route_torch(x, w, top_k, b)
    check_selection(ids_t, x, w, b, top_k)
    check_weights(tw_t, ids_t, x, w, b, device)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy: inf - inf in the NaN row
def test_exact_ties_pick_the_lowest_ids_and_nan_rows_stay_in_range(device):
    E, K, k = 64, 32, 5
    x = torch.randn(3, K, generator=torch.Generator().manual_seed(1))
    x[2] = float("nan")
    w = torch.ones(E, K) * 0.01  # every expert the same logit: the first k
    tw, ids = route(x.to(device), w.to(device), k)
    assert torch.equal(ids[:2].cpu(), torch.arange(k, dtype=torch.int32).expand(2, k))
    assert torch.allclose(tw[:2].cpu(), torch.full((2, k), 1 / k))
    assert torch.isnan(tw[2]).all() and len(set(ids[2].tolist())) == k and 0 <= int(ids[2].min()) < E


def test_router_bad_inputs_are_named(device):
    x = torch.randn(4, 16, device=device)
    with pytest.raises(ValueError, match="E must be in 1..256"):
        route(x, torch.randn(257, 16, device=device), 2)
    with pytest.raises(ValueError, match="top_k must be an int in 1..E=8"):
        route(x, torch.randn(8, 16, device=device), 9)
    with pytest.raises(TypeError, match="router_w must have dtype float32"):
        route(x, torch.randn(8, 16, device=device).half(), 2)
    with pytest.raises(ValueError, match="bias must be"):
        route(x, torch.randn(8, 16, device=device), 2, torch.zeros(7, device=device))
