"""Random MoE-LoRA cases and the check of a GEMM with its LoRA delta inside against float64, shared by the kernel
tests (tests/kernels/: the packed and wide builds, the decode path) and the tried builds' tests
(studies/kernels/tried/). Imported as `from lora_gemm_cases import ...`: tests/ is on the path (conftest.py)."""
import torch
from helpers import rel_err

from lora_moe_lab import runtime
from lora_moe_lab.kernels.align import moe_align
from lora_moe_lab.kernels.fused_moe import moe_gemm
from lora_moe_lab.ops.reference import ref_moe_gemm, tolerance
from lora_moe_lab.ops.reference_rows import ref_lora_delta_rows

DEV = runtime.default_device()
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEV.type == "cuda" else [])
I32 = dict(dtype=torch.int32)

# the fused GEMM + LoRA builds' shared cases (packed, epilogue, folded): M, K, N, E, top_k, S, L, R, P, extra
FUSED_CASES = [
    (5, 40, 24, 6, 3, 4, 3, 16, 2, dict(lora_ids=[2, -1, 0], enabled=[1, 1, 0])),  # gate_up; a tile straddles slices
    (6, 33, 17, 4, 2, 3, 2, 5, 1, dict(gather=False, with_rw=True)),  # down: routed weights, odd K/N
    (3, 32, 32, 5, 2, 2, 2, 24, 2, {}),  # gate_up, every tile inside one slice
]


def make_case(seed, M, K, N, E, top_k, S, L, R, P, *, dtype=torch.float32, gather=True, with_rw=False,
              mapping=None, lora_ids=None, enabled=None, dead_experts=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:top_k] for _ in range(M)]).int()
    if dead_experts:  # some pairs routed nowhere (expert -1)
        ids.view(-1)[torch.randperm(M * top_k, generator=g)[:dead_experts]] = -1
    rnd = lambda *s, std=1.0: (torch.randn(*s, generator=g) * std).to(dtype)  # noqa: E731
    c = dict(x=rnd(M if gather else M * top_k, K), a=rnd(P, S, E, R, K, std=K ** -0.5),
             b=rnd(P, S, E, N, R, std=R ** -0.5), ids=ids, gather=gather,
             mapping=(torch.tensor(mapping, **I32) if mapping is not None
                      else torch.randint(-1, L, (M,), generator=g, **I32)),
             lora_ids=(torch.tensor(lora_ids, **I32) if lora_ids is not None
                       else torch.randperm(S, generator=g)[:L].int()),
             enabled=torch.tensor(enabled, **I32) if enabled is not None else torch.ones(L, **I32),
             rw=torch.rand(M, top_k, generator=g).add_(0.1) if with_rw else None,
             out0=rnd(M * top_k, P * N))
    return c


# The plain GEMM of a case on a tile, once per process: the variants of one case on one tile (many of the random
# tests' builds share the default tile) compare their rows against the same plain GEMM, computed once, NaN-poisoned.
_PLAIN = {}


def _key(*parts):
    return tuple((p.dtype, tuple(p.shape), p.detach().cpu().contiguous().flatten().view(torch.uint8).numpy().tobytes())
                 if isinstance(p, torch.Tensor) else repr(p)
                 for p in parts)


def plain_gemm(d, w, al, top_k, gather, cfg, key):
    if key not in _PLAIN:
        base = torch.full((d["ids"].numel(), w.shape[1]), float("nan"), dtype=w.dtype, device=DEV)
        moe_gemm(d["x"], w, al, top_k, base, routed_weights=d["rw"], gather=gather, config=cfg)
        _PLAIN[key] = base
    return _PLAIN[key].clone()


def run_fused(c, dtype, E, top_k, P, N, *, impl, bm=16, order=False, shrink_out=None):
    """The GEMM with its delta `impl` (`moe_gemm_lora`'s arguments) on case c, checked (`check_against_float64`);
    order: the alignment ordered by LoRA row; shrink_out: (alignment) -> the build's NaN-poisoned intermediate
    (a row the shrink skips must never reach the output), or None. Returns the exit codes."""
    d = {k: (v.to(DEV) if isinstance(v, torch.Tensor) else v) for k, v in c.items()}
    g = torch.Generator().manual_seed(7)
    w = (torch.randn(E, P * N, c["x"].shape[1], generator=g) * c["x"].shape[1] ** -0.5).to(dtype)
    al = moe_align(d["ids"], E, bm, order_by=d["mapping"] if order else None)  # order: pairs by LoRA row in a group
    cfg = getattr(impl, "keywords", {}).get("config")  # the plain GEMM on the same tile: the same sums
    base = plain_gemm(d, w.to(DEV), al, top_k, c["gather"], cfg,
                      _key(c["x"], c["ids"], c["rw"], c["mapping"] if order else None, w, bm, top_k, c["gather"], cfg))
    out = torch.full_like(base, float("nan"))
    kw = {} if shrink_out is None else dict(shrink_out=shrink_out(al))
    res = impl(d["x"], w.to(DEV), al, top_k, out, d["a"], d["b"], d["mapping"], d["lora_ids"], d["enabled"],
               routed_weights=d["rw"], gather=c["gather"], **kw)
    assert res is out
    return check_against_float64(c, w, top_k, out, base, dtype)


def check_against_float64(c, w, top_k, out, base, dtype, unwritten="a row of out was not written"):
    """out (the GEMM with its delta) against float64 within the dtype's tolerance, every row written, and the rows
    of pairs without a live adapter bit for bit `base` (the plain GEMM on the same tile); returns the exit codes."""
    out, base = out.cpu(), base.cpu()
    # the LoRA reference's b is (P, S, E, N, r): the kernel's B of slice p covers columns [p*N, (p+1)*N)
    delta, codes = ref_lora_delta_rows(c["x"], c["a"], c["b"], c["ids"], c["mapping"], c["lora_ids"], c["enabled"],
                                       routed_weights=c["rw"], gather=c["gather"])
    ref = ref_moe_gemm(c["x"], w, c["ids"], top_k, c["rw"], gather=c["gather"]) + delta
    assert torch.isfinite(out).all(), unwritten
    err = rel_err(out, ref)
    assert err < tolerance(dtype, DEV), f"rel err {err:.3g} ({dtype})"
    off = codes != 0
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    assert torch.equal(out[off].view(bits), base[off].view(bits)), "a pair without adapter differs from the plain GEMM"
    return codes
