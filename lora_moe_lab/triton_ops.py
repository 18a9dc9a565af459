"""Triton backend: launchers for the base fused-MoE GEMM and the fused MoE-LoRA delta.

Same signatures as `torch_ops` (the MoE layer calls either). What lives here:
  * input validation with errors that name the problem - shapes, dtypes, devices, contiguity and
    mismatched E / S / r are checked from static metadata only;
  * the launch-config table (block sizes keyed on M and N/K; one config under the interpreter);
  * `warmup(shape, dtype, ...)`: compiles every config the table can pick, so a CUDA-graph capture
    never compiles.

No host syncs here: nothing reads device data back (no .item(), .tolist(), bool(tensor), nonzero);
grid sizes come from static shapes only, so every launch can be captured in a CUDA graph and a
program that has no work decides so itself, on the GPU (early exit).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import runtime  # noqa: F401  (first: TRITON_INTERPRET before the kernels are decorated)
from .config import MoEShape, check_dtype, get_shape
from .kernels.align import Alignment, moe_align, padded_size
from .kernels.fused_moe import fused_moe_kernel
from .kernels.fused_moe_lora import fused_moe_lora_kernel

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# --------------------------------------------------------------------------------------------
# Launch configs
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GemmConfig:
    """Base grouped GEMM tile: BLOCK_M comes from the alignment (see `moe_block_m`)."""

    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3


@dataclass(frozen=True)
class LoRAKernelConfig:
    """Fused LoRA tile: BLOCK_M comes from the alignment (see `lora_block_m`); split_n programs share
    the N columns of one block (more work items at small M)."""

    block_n: int
    block_k: int
    split_n: int = 1
    num_warps: int = 4
    num_stages: int = 3
    programs_per_sm: int = 4  # persistent grid: programs = min(work items bound, SMs * this)


_INTERP_GEMM = GemmConfig(block_n=32, block_k=32, group_m=4, num_warps=4, num_stages=1)
_INTERP_LORA = LoRAKernelConfig(block_n=32, block_k=32, split_n=1, num_warps=4, num_stages=1)


def token_bucket(num_tokens: int) -> int:
    """Configs are keyed on M rounded up to a power of two (capped at 16384), so that `warmup` over
    the powers of two covers every M."""
    b = 1
    while b < num_tokens and b < 16384:
        b *= 2
    return b


def moe_block_m(num_tokens: int, top_k: int, num_experts: int) -> int:
    """BLOCK_M for the base GEMM's alignment: about the mean number of pairs per expert."""
    if runtime.interpreter():
        return 16
    avg = token_bucket(num_tokens) * top_k / num_experts
    if avg <= 16:
        return 16
    if avg <= 48:
        return 32
    if avg <= 192:
        return 64
    return 128


def lora_block_m(num_tokens: int, top_k: int, num_experts: int, num_slots: int) -> int:
    """BLOCK_M for the per-adapter alignment: mean pairs per (slot, expert) if the tokens spread
    over all slots."""
    if runtime.interpreter():
        return 16
    avg = token_bucket(num_tokens) * top_k / (num_experts * num_slots)
    if avg <= 24:
        return 16
    if avg <= 48:
        return 32
    return 64


def block_m(num_tokens: int, top_k: int, num_experts: int) -> int:
    """The BLOCK_M the MoE layer aligns with (one alignment size for the base GEMM and LoRA)."""
    return moe_block_m(num_tokens, top_k, num_experts)


def gemm_config(num_tokens: int, block_m: int, N: int, K: int) -> GemmConfig:
    if runtime.interpreter():
        return _INTERP_GEMM
    if block_m <= 16:
        return GemmConfig(block_n=64, block_k=128, group_m=1, num_warps=4, num_stages=4)
    if block_m <= 32:
        return GemmConfig(block_n=64, block_k=128, group_m=4, num_warps=4, num_stages=4)
    if block_m <= 64:
        return GemmConfig(block_n=128, block_k=64, group_m=8, num_warps=4, num_stages=4)
    return GemmConfig(block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=4)


_NUM_SMS_GUESS = 132  # H100/H200; only used to size split_n, a static function of the shape


def lora_config(num_tokens: int, top_k: int, num_experts: int, num_slots: int, block_m: int,
                N: int, K: int) -> LoRAKernelConfig:
    """Tile of the fused LoRA kernel (values from the H200 sweep of scripts/gpu_kernels.py)."""
    if runtime.interpreter():
        return _INTERP_LORA
    # Rough count of busy blocks, from shapes only: at most one per pair, and about one per
    # (slot, expert) group while the groups are smaller than a block.
    busy = max(1, min(token_bucket(num_tokens) * top_k, num_experts * num_slots))
    block_n = 64
    n_tiles = triton_cdiv(N, block_n)
    # Split N until about two work items per SM exist; past a few dozen blocks, keep >= 256
    # columns per item (the shrink is recomputed per item).
    split = max(1, min(n_tiles, (2 * _NUM_SMS_GUESS + busy - 1) // busy))
    if busy >= 64:
        split = max(1, min(split, N // 256))
    if block_m >= 64:
        return LoRAKernelConfig(block_n=64, block_k=64, split_n=split, num_warps=4, num_stages=3)
    # bm16/32: (64, 128) beat (128, 64) at M = 16..1024 except qwen3 M=1024 (-5%) in the H200 sweep
    # of data/kernels (persistent grid: 4 programs/SM fit with these tiles, 3 with the other).
    return LoRAKernelConfig(block_n=block_n, block_k=128, split_n=split, num_warps=4, num_stages=3)


def triton_cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def triton_pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


_SMEM_BUDGET = 160 * 1024  # bytes of pipelined tiles per program; leaves room on Hopper (227 KB)


def _stages(num_stages: int, tile_bytes_per_stage: int) -> int:
    """Fewer pipeline stages when the tiles are large (fp32, big blocks), so shared memory fits."""
    return max(1, min(num_stages, _SMEM_BUDGET // max(1, tile_bytes_per_stage)))


_SMS: dict = {}
_OCCUPANCY: dict = {}  # compiled-kernel key -> programs of it that fit on one SM at once
LAST_LORA_LAUNCH: dict = {}  # grid and tiles of the last lora_delta launch (benchmarks, notebooks)


def _occupancy(kernel, num_warps: int, device: torch.device, cap: int) -> int:
    """Programs per SM from the compiled kernel's shared memory and registers (host metadata)."""
    try:
        props = torch.cuda.get_device_properties(device)
        smem_sm = getattr(props, "shared_memory_per_multiprocessor", 233472)
        regs_sm = getattr(props, "regs_per_multiprocessor", 65536)
        shared = int(kernel.metadata.shared)
        n_regs = int(getattr(kernel, "n_regs", 0) or 0)
        by_smem = smem_sm // (shared + 1024) if shared else cap
        by_regs = regs_sm // (max(n_regs, 1) * 32 * num_warps) if n_regs else cap
        return max(1, min(cap, by_smem, by_regs, 64 // num_warps))
    except Exception:  # metadata layout differs between Triton versions: fall back to the cap
        return cap


def _num_sms(device: torch.device) -> int:
    """Multiprocessors of the device (a host-side property query, no sync). Under the interpreter a
    small number, so that the tests run the persistent loop with several items per program."""
    if device.type != "cuda":
        return 2
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SMS:
        _SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SMS[idx]


def block_r(rank: int) -> int:
    """BLOCK_R: next power of two >= max(rank, 16)."""
    r = 16
    while r < rank:
        r *= 2
    return r


# --------------------------------------------------------------------------------------------
# Validation (static metadata only: never reads device data)
# --------------------------------------------------------------------------------------------
def _check(name: str, t, ndim: int | None = None, dtypes=None, device: torch.device | None = None,
           contiguous: bool = True) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must have dtype {names}, got {str(t.dtype).replace('torch.', '')}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device} but the other inputs are on {device}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (shape {tuple(t.shape)}, strides {t.stride()}); "
                         f"call .contiguous() first")


def _check_compute_dtype(x: torch.Tensor) -> None:
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"x must be float32, float16 or bfloat16, got {str(x.dtype).replace('torch.', '')}")
    if x.device.type == "cpu" and not runtime.interpreter():
        raise ValueError("CPU tensors need the Triton interpreter (TRITON_INTERPRET=1, set by importing "
                         "lora_moe_lab first on a machine without a GPU); use torch_ops or CUDA tensors")
    check_dtype(x.dtype, x.device, backend="triton")  # bf16 under the interpreter -> ValueError


def _check_alignment(align: Alignment, num_pairs: int, num_experts: int, num_slots: int | None,
                     device: torch.device, what: str) -> int:
    if not isinstance(align, Alignment):
        raise TypeError(f"align must be an Alignment (kernels.align.moe_align), got {type(align).__name__}")
    st, ei, nt, bm = align
    _check("align.sorted_token_ids", st, 2, (torch.int32,), device)
    _check("align.expert_ids", ei, 2, (torch.int32,), device)
    _check("align.num_tokens_post_padded", nt, 1, (torch.int32,), device)
    if not isinstance(bm, int) or bm < 16 or bm & (bm - 1):
        raise ValueError(f"align.block_m must be a power of two >= 16 for the Triton kernels, got {bm!r}")
    S = st.shape[0]
    if num_slots is not None and S != num_slots:
        raise ValueError(f"{what}: alignment has {S} slots but the LoRA weights have S={num_slots}")
    EM = padded_size(num_pairs, num_experts, bm)
    if st.shape[1] != EM:
        raise ValueError(f"{what}: align.sorted_token_ids has {st.shape[1]} columns, expected "
                         f"EM={EM} for {num_pairs} pairs, E={num_experts}, block_m={bm} (alignment built "
                         f"for another M, top_k or number of experts?)")
    if ei.shape != (S, EM // bm):
        raise ValueError(f"align.expert_ids must be ({S}, {EM // bm}), got {tuple(ei.shape)}")
    if nt.shape != (S,):
        raise ValueError(f"align.num_tokens_post_padded must be ({S},), got {tuple(nt.shape)}")
    return bm


def _pairs(x: torch.Tensor, top_k: int, gather: bool, out: torch.Tensor) -> int:
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k <= 0:
        raise ValueError(f"top_k must be a positive int, got {top_k!r}")
    num_pairs = x.shape[0] * top_k if gather else x.shape[0]
    if not gather and x.shape[0] % top_k:
        raise ValueError(f"gather=False: x must have M*top_k rows, got {x.shape[0]} rows with top_k={top_k}")
    if out.shape[0] != num_pairs:
        raise ValueError(f"out must have M*top_k={num_pairs} rows, got shape {tuple(out.shape)}")
    return num_pairs


def _check_rw(rw, num_pairs: int, top_k: int, device) -> None:
    if rw is None:
        return
    _check("routed_weights", rw, 2, (torch.float32,), device)
    if rw.shape != (num_pairs // top_k, top_k):
        raise ValueError(f"routed_weights must be (M, top_k)=({num_pairs // top_k}, {top_k}), got {tuple(rw.shape)}")


# --------------------------------------------------------------------------------------------
# Base grouped GEMM
# --------------------------------------------------------------------------------------------
def moe_gemm(x, w, align, top_k, out, *, routed_weights=None, gather=True, config: GemmConfig | None = None):
    """out[pair] = x[row] @ w[expert(pair)].T (* routed weight), row = pair // top_k if gather else pair.

    x: (M, K) or (M*top_k, K); w: (E, N, K); align: Alignment with S=1; out: (M*top_k, N), fully written.
    """
    _check("x", x, 2, _FLOAT_DTYPES)
    dev = x.device
    _check_compute_dtype(x)
    _check("w", w, 3, (x.dtype,), dev)
    _check("out", out, 2, (x.dtype,), dev)
    E, N, K = w.shape
    if x.shape[1] != K:
        raise ValueError(f"x has K={x.shape[1]} columns but w is (E, N, K)={tuple(w.shape)}")
    if out.shape[1] != N:
        raise ValueError(f"out must have N={N} columns (w is {tuple(w.shape)}), got shape {tuple(out.shape)}")
    num_pairs = _pairs(x, top_k, gather, out)
    bm = _check_alignment(align, num_pairs, E, None, dev, "moe_gemm")
    if align.sorted_token_ids.shape[0] != 1:
        raise ValueError(f"moe_gemm takes an alignment with one slot (S=1), got S={align.sorted_token_ids.shape[0]}")
    _check_rw(routed_weights, num_pairs, top_k, dev)
    M = num_pairs // top_k
    cfg = config or gemm_config(M, bm, N, K)
    nb = align.expert_ids.shape[1]
    # Blocks past num_tokens_post_padded only hold sentinels, and every busy block holds at least one
    # pair, so at most min(nb, num_pairs) blocks are busy: a static bound, no need to read ntpp.
    nb_launch = min(nb, num_pairs)
    grid = (nb_launch * triton_cdiv(N, cfg.block_n),)
    rw = routed_weights if routed_weights is not None else out  # dummy pointer, never read
    stages = _stages(cfg.num_stages, (bm * cfg.block_k + cfg.block_k * cfg.block_n) * x.element_size())
    fused_moe_kernel[grid](
        x, w, out, align.sorted_token_ids, align.expert_ids, align.num_tokens_post_padded, rw,
        N, K, num_pairs, nb_launch, top_k,
        x.stride(0), x.stride(1), w.stride(0), w.stride(1), w.stride(2), out.stride(0), out.stride(1),
        BLOCK_M=bm, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        GATHER=bool(gather), HAS_RW=routed_weights is not None,
        num_warps=cfg.num_warps, num_stages=stages,
    )
    return out


# --------------------------------------------------------------------------------------------
# Fused LoRA delta
# --------------------------------------------------------------------------------------------
def lora_delta(x, lora_a, lora_b, align, lora_ids, adapter_enabled, top_k, out, *, routed_weights=None,
               gather=True, exit_codes=None, config: LoRAKernelConfig | None = None):
    """ADD the LoRA delta into `out` in place (see torch_ops.lora_delta for the exact contract).

    lora_a (P, S, E, r, K), lora_b (P, S, E, N, r), out (M*top_k, P*N); align: per-adapter Alignment
    with S slots. exit_codes: optional int32 (S, EM // BM) that receives each program's exit code.
    """
    _check("x", x, 2, _FLOAT_DTYPES)
    dev = x.device
    _check_compute_dtype(x)
    _check("lora_a", lora_a, 5, (x.dtype,), dev)
    _check("lora_b", lora_b, 5, (x.dtype,), dev)
    _check("out", out, 2, (x.dtype,), dev)
    P, S, E, R, K = lora_a.shape
    if P not in (1, 2):
        raise ValueError(f"lora_a must have 1 or 2 slices (P), got shape {tuple(lora_a.shape)}")
    Pb, Sb, Eb, N, Rb = lora_b.shape
    for nm, a, b in (("slices P", P, Pb), ("slots S", S, Sb), ("experts E", E, Eb), ("rank r", R, Rb)):
        if a != b:
            raise ValueError(f"lora_a {tuple(lora_a.shape)} and lora_b {tuple(lora_b.shape)} disagree on {nm}: {a} vs {b}")
    if x.shape[1] != K:
        raise ValueError(f"x has K={x.shape[1]} columns but lora_a is (P, S, E, r, K)={tuple(lora_a.shape)}")
    if out.shape[1] != P * N:
        raise ValueError(f"out must have P*N={P}*{N}={P * N} columns, got shape {tuple(out.shape)}")
    num_pairs = _pairs(x, top_k, gather, out)
    bm = _check_alignment(align, num_pairs, E, S, dev, "lora_delta")
    for nm, t in (("lora_ids", lora_ids), ("adapter_enabled", adapter_enabled)):
        _check(nm, t, 1, (torch.int32,), dev)
        if t.shape != (S,):
            raise ValueError(f"{nm} must be (S,)=({S},), got {tuple(t.shape)}")
    _check_rw(routed_weights, num_pairs, top_k, dev)
    nb = align.expert_ids.shape[1]
    if exit_codes is not None:
        _check("exit_codes", exit_codes, 2, (torch.int32,), dev)
        if exit_codes.shape != (S, nb):
            raise ValueError(f"exit_codes must be (S, EM // block_m)=({S}, {nb}), got {tuple(exit_codes.shape)}")
    if R == 0:
        return out  # nothing to add; decided from the static shape
    plan = _lora_plan(dev, x.dtype, num_pairs, top_k, P, S, E, R, N, K, bm, nb, bool(gather),
                      routed_weights is not None, exit_codes is not None, config)
    cfg, split, br, stages, key, pps, grid = (plan[k] for k in ("cfg", "split", "br", "stages", "key", "pps", "grid"))
    n_per_split = plan["n_per_split"]
    rw = routed_weights if routed_weights is not None else out  # dummy pointers, never read
    ex = exit_codes if exit_codes is not None else align.expert_ids
    compiled = fused_moe_lora_kernel[grid](
        x, lora_a, lora_b, out, align.sorted_token_ids, align.expert_ids, align.num_tokens_post_padded,
        lora_ids, adapter_enabled, rw, ex,
        N, K, R, num_pairs, nb, top_k, n_per_split,
        x.stride(0), x.stride(1),
        *lora_a.stride(), *lora_b.stride(),
        out.stride(0), out.stride(1),
        align.sorted_token_ids.stride(0), align.expert_ids.stride(0),
        NUM_SLOTS=S, SLOTS_POW2=triton_pow2(S),
        P=P, BLOCK_M=bm, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, BLOCK_R=br, SPLIT_N=split,
        GATHER=bool(gather), HAS_RW=routed_weights is not None, WRITE_EXIT=exit_codes is not None,
        num_warps=cfg.num_warps, num_stages=stages,
    )
    if key not in _OCCUPANCY and dev.type == "cuda":
        _OCCUPANCY[key] = _occupancy(compiled, cfg.num_warps, dev, cfg.programs_per_sm)
    LAST_LORA_LAUNCH.update(grid=grid[0], programs_per_sm=pps, stages=stages, block_m=bm, config=cfg)
    return out


def _lora_plan(dev, dtype, num_pairs, top_k, P, S, E, R, N, K, bm, nb, gather, has_rw, write_exit, config):
    M = num_pairs // top_k
    cfg = config or lora_config(M, top_k, E, S, bm, N, K)
    n_tiles = triton_cdiv(N, cfg.block_n)
    split = max(1, min(cfg.split_n, n_tiles))
    n_per_split = triton_cdiv(n_tiles, split) * cfg.block_n
    # Persistent grid, from static shapes only: a few programs per SM, never more than the work
    # items there can be (busy blocks of a slot number at most num_pairs: each holds a pair).
    # Programs per SM: the config's cap, lowered to what fits on an SM at once (known after the first
    # compile of this variant; `warmup` makes that happen before any capture). All programs then run
    # in one wave: an all-disabled launch costs one round of metadata loads, and no program waits
    # for a slot while others hold several items.
    max_items = S * min(nb, num_pairs) * split
    br = block_r(R)
    elt = torch.empty(0, dtype=dtype).element_size()
    stages = _stages(cfg.num_stages, (bm * cfg.block_k + P * cfg.block_k * br) * elt)
    key = (dev, dtype, N, K, R, P, bm, cfg, split, stages, gather, has_rw, write_exit)
    pps = _OCCUPANCY.get(key, cfg.programs_per_sm)
    grid = (max(1, min(max_items, _num_sms(dev) * pps)),)
    return dict(cfg=cfg, split=split, n_per_split=n_per_split, br=br, stages=stages, key=key, pps=pps, grid=grid,
                max_items=max_items)


def lora_launch_plan(x, lora_a, lora_b, align, top_k, *, gather=True, routed_weights=None, exit_codes=False,
                     config: LoRAKernelConfig | None = None) -> dict:
    """What `lora_delta` launches for these inputs, from static shapes only (for notebooks/program maps).

    The grid is persistent: `programs` programs loop over work items (slot, token block, N share):
    at most `work_items_max` of them, the live slots' busy blocks; each program takes every
    `programs`-th item. `programs_per_sm` is the config's cap until the first launch of this
    variant has measured what fits on an SM (then that)."""
    P, S, E, R, K = lora_a.shape
    N = lora_b.shape[3]
    num_pairs = x.shape[0] * top_k if gather else x.shape[0]
    bm, nb = align.block_m, align.expert_ids.shape[1]
    p = _lora_plan(x.device, x.dtype, num_pairs, top_k, P, S, E, R, N, K, bm, nb, bool(gather),
                   routed_weights is not None, bool(exit_codes), config)
    c = p["cfg"]
    return dict(slots_S=S, experts_E=E, tokens_M=num_pairs // top_k, top_k=top_k, pairs=num_pairs, BLOCK_M=bm,
                EM=align.sorted_token_ids.shape[1], blocks_per_slot=nb, N=N, BLOCK_N=c.block_n, BLOCK_K=c.block_k,
                split_n=p["split"], rank_r=R, BLOCK_R=p["br"], num_warps=c.num_warps, num_stages=p["stages"],
                programs=p["grid"][0], programs_per_sm=p["pps"], work_items_max=p["max_items"], persistent=True)


# --------------------------------------------------------------------------------------------
# Warm-up: compile every config the table can pick, before any CUDA-graph capture
# --------------------------------------------------------------------------------------------
WARMUP_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def warmup(shape: MoEShape | str, dtype: torch.dtype | str = torch.bfloat16, *, max_loras: int = 4,
           max_rank: int = 16, device=None, num_tokens=WARMUP_TOKENS) -> int:
    """Compile the kernels for every (block_m, config) the tables pick for these token counts, at the
    shapes of one MoE layer (gate_up and down, base and LoRA, with and without routed weights).

    Each compile runs once on a tiny batch (one binary serves every M: the M-dependent integers are
    not specialised), so this is quick. Returns the number of distinct launches made.
    """
    shape = get_shape(shape)
    device = runtime.resolve_device(device)
    dtype = check_dtype(dtype, device, backend="triton")
    K, I, E, k = shape.hidden, shape.intermediate, shape.num_experts, shape.top_k
    S, R = max_loras, max_rank
    g = torch.Generator(device="cpu").manual_seed(0)

    def rnd(*size, scale=1.0):
        return (torch.randn(*size, generator=g) * scale).to(dtype).to(device)

    # Tiny inputs with the layer's K/N (so strides specialise as at run time); M = 1 token.
    x1 = rnd(1, K)
    ids = torch.randperm(E, generator=g)[:k].view(1, k).int().to(device)
    rw = torch.rand(1, k, generator=g).float().to(device)
    slot = torch.zeros(1, dtype=torch.int32, device=device)
    lora_ids = torch.arange(S, dtype=torch.int32, device=device)
    enabled = torch.ones(S, dtype=torch.int32, device=device)
    w13, w2 = rnd(E, 2 * I, K, scale=K ** -0.5), rnd(E, K, I, scale=I ** -0.5)
    a13, b13 = rnd(2, S, E, R, K), rnd(2, S, E, I, R)
    a2, b2 = rnd(1, S, E, R, I), rnd(1, S, E, K, R)
    h = rnd(k, I)
    seen = set()
    for M in num_tokens:
        bm_base = moe_block_m(M, k, E)
        bm_lora = lora_block_m(M, k, E, S)
        al = moe_align(ids, E, bm_base)
        jobs = [
            ("gemm13", gemm_config(M, bm_base, 2 * I, K), bm_base,
             lambda c, al=al: moe_gemm(x1, w13, al, k, torch.empty(k, 2 * I, dtype=dtype, device=device), config=c)),
            ("gemm2", gemm_config(M, bm_base, K, I), bm_base,
             lambda c, al=al: moe_gemm(h, w2, al, k, torch.empty(k, K, dtype=dtype, device=device),
                                       routed_weights=rw, gather=False, config=c)),
            ("gemm2nw", gemm_config(M, bm_base, K, I), bm_base,
             lambda c, al=al: moe_gemm(h, w2, al, k, torch.empty(k, K, dtype=dtype, device=device),
                                       gather=False, config=c)),
        ]
        for bm in (bm_lora, bm_base):  # the layer may align LoRA with either size
            al_l = moe_align(ids, E, bm, slot, S)
            jobs += [
                ("lora13", lora_config(M, k, E, S, bm, I, K), bm,
                 lambda c, al=al_l: lora_delta(x1, a13, b13, al, lora_ids, enabled, k,
                                               torch.zeros(k, 2 * I, dtype=dtype, device=device), config=c)),
                ("lora2", lora_config(M, k, E, S, bm, K, I), bm,
                 lambda c, al=al_l: lora_delta(h, a2, b2, al, lora_ids, enabled, k,
                                               torch.zeros(k, K, dtype=dtype, device=device),
                                               routed_weights=rw, gather=False, config=c)),
            ]
        for name, cfg, bm, fn in jobs:
            if (name, cfg, bm) not in seen:
                seen.add((name, cfg, bm))
                fn(cfg)
    runtime.synchronize(device)
    return len(seen)
