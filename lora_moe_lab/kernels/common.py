"""What every Triton launcher shares: input checks that name the problem (from static metadata
only: never a device read), integer helpers, shared-memory budgeting and the SM count.

No host syncs here: nothing reads device data back (no .item(), .tolist(), bool(tensor),
nonzero); grid sizes come from static shapes only, so every launch can be captured in a CUDA graph.
"""
from __future__ import annotations

import torch

from .. import runtime
from ..config import check_dtype
from .align import Alignment, padded_size

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


_SMEM_BUDGET = 160 * 1024  # bytes of pipelined tiles per program; leaves room on Hopper (227 KB)
# The base GEMM keeps nothing else in shared memory, so it may use nearly all of Hopper's 227 KB per
# block: BLOCK 128 x 256 x 64 in bf16 is 48 KB a stage, and 4 stages (the tuned tile) need 192 KB.
BASE_SMEM_BUDGET = 220 * 1024


def stages_for(num_stages: int, tile_bytes_per_stage: int, budget: int = _SMEM_BUDGET) -> int:
    """Fewer pipeline stages when the tiles are large (fp32, big blocks), so shared memory fits."""
    return max(1, min(num_stages, budget // max(1, tile_bytes_per_stage)))


_SMS: dict = {}


def occupancy(kernel, num_warps: int, device: torch.device, cap: int) -> int:
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


def num_sms(device: torch.device) -> int:
    """Multiprocessors of the device (a host-side property query, no sync). Under the interpreter a
    small number, so that the tests run the persistent loop with several items per program."""
    if device.type != "cuda":
        return 2
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SMS:
        _SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SMS[idx]

def check_tensor(name: str, t, ndim: int | None = None, dtypes=None, device: torch.device | None = None,
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


def rows_out(op: str, out, like: torch.Tensor, shape: tuple) -> torch.Tensor:
    """An elementwise launcher's output: a new (shape) tensor of like's dtype and device, or `out` checked to be one
    with unit column stride (any row stride: e.g. the first columns of a wider buffer). ValueError naming `op`."""
    if out is None:
        return like.new_empty(shape)
    if (tuple(out.shape) != tuple(shape) or out.dtype != like.dtype or out.device != like.device
            or out.stride(1) != 1):
        raise ValueError(f"{op}: out must be {like.dtype} {tuple(shape)} on {like.device} with unit column stride, "
                         f"got {out.dtype} {tuple(out.shape)} strides {out.stride()} on {out.device}")
    return out


def check_compute_dtype(x: torch.Tensor) -> None:
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"x must be float32, float16 or bfloat16, got {str(x.dtype).replace('torch.', '')}")
    if x.device.type == "cpu" and not runtime.interpreter():
        raise ValueError("CPU tensors need the Triton interpreter (TRITON_INTERPRET=1, set by importing "
                         "lora_moe_lab first on a machine without a GPU); use the torch backend or CUDA tensors")
    check_dtype(x.dtype, x.device, backend="triton")  # bf16 under the interpreter -> ValueError


def check_alignment(align: Alignment, num_pairs: int, num_experts: int, num_slots: int | None,
                     device: torch.device, what: str) -> int:
    if not isinstance(align, Alignment):
        raise TypeError(f"align must be an Alignment (kernels.align.moe_align), got {type(align).__name__}")
    st, ei, nt, bm = align
    check_tensor("align.sorted_token_ids", st, 2, (torch.int32,), device)
    check_tensor("align.expert_ids", ei, 2, (torch.int32,), device)
    check_tensor("align.num_tokens_post_padded", nt, 1, (torch.int32,), device)
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


def num_pairs_of(x: torch.Tensor, top_k: int, gather: bool, out: torch.Tensor) -> int:
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k <= 0:
        raise ValueError(f"top_k must be a positive int, got {top_k!r}")
    num_pairs = x.shape[0] * top_k if gather else x.shape[0]
    if not gather and x.shape[0] % top_k:
        raise ValueError(f"gather=False: x must have M*top_k rows, got {x.shape[0]} rows with top_k={top_k}")
    if out.shape[0] != num_pairs:
        raise ValueError(f"out must have M*top_k={num_pairs} rows, got shape {tuple(out.shape)}")
    return num_pairs


def check_routed_weights(rw, num_pairs: int, top_k: int, device) -> None:
    if rw is None:
        return
    check_tensor("routed_weights", rw, 2, (torch.float32,), device)
    if rw.shape != (num_pairs // top_k, top_k):
        raise ValueError(f"routed_weights must be (M, top_k)=({num_pairs // top_k}, {top_k}), got {tuple(rw.shape)}")


def reg_cap(max_regs: int) -> dict:
    """A register cap per thread for ptxas (`maxnreg`) as a launch option, only where one is set and a GPU
    compiles: registers decide how many programs fit on an SM (65536 per SM: 128 per thread for two programs
    of 8 warps, or four of 4). Above what the kernel needs it changes nothing; below, ptxas spills."""
    return {"maxnreg": max_regs} if max_regs and not runtime.interpreter() else {}
