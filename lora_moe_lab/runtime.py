"""Device choice, capture mode, and CUDA-only helpers that are safe on a CPU-only machine.

Import order matters for the Triton interpreter: `@triton.jit` reads TRITON_INTERPRET when the
decorator runs, so this module (imported first by the package) sets it before any kernel module
is imported on a machine without a GPU.
"""
from __future__ import annotations

import contextlib
import functools
import os
import time
import threading

import torch

_HAS_CUDA = torch.cuda.is_available()
if not _HAS_CUDA and os.environ.get("TRITON_INTERPRET") is None:
    # No GPU: run Triton programs one by one on numpy. Must happen before kernels are decorated.
    os.environ["TRITON_INTERPRET"] = "1"

# The caching allocator keeps freed blocks for reuse only at their own size. A lab build frees each base weight as
# it moves into its wider LoRA build (model/moe.py: hold_weights), so on an 80 GB card the freed blocks pile
# up (11 GiB reserved but unallocated at 48 layers) until an allocation fails. Expandable segments map physical
# pages into one growing virtual range instead, and a freed range is reused at any size. The allocator reads this
# when CUDA starts (`is_available` above starts no allocator), so it is set here, before any allocation, unless
# the reader set an allocator configuration of their own; `allocator_settings()` reports what is in force.
ALLOC_ENV = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
if _HAS_CUDA and not any(os.environ.get(k) for k in ALLOC_ENV) and not torch.cuda.is_initialized():
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"


def has_cuda() -> bool:
    return _HAS_CUDA


@functools.cache
def interpreter() -> bool:
    """True when Triton kernels run under the CPU interpreter (no GPU, or forced by the user). Read once: Triton
    reads the variable when it decorates a kernel, so a later change moves no kernel, and every launch asks this
    (an environment lookup is a few microseconds of the host's launch time)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def default_device() -> torch.device:
    return torch.device("cuda") if _HAS_CUDA else torch.device("cpu")


def resolve_device(device: str | torch.device | None) -> torch.device:
    """'auto'/None -> CUDA when present else CPU; asking for CUDA without one is a clear error."""
    if device is None or (isinstance(device, str) and device == "auto"):
        return default_device()
    if not isinstance(device, (str, torch.device)):
        raise ValueError(f"device {device!r} is not a device name: use 'cuda', 'cuda:N', 'cpu' or 'auto'")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError):  # torch: "Expected one of cpu, cuda, ... device type at start of ..."
        raise ValueError(f"unknown device {device!r}: use 'cuda', 'cuda:N', 'cpu' or 'auto'") from None
    if dev.type == "cuda" and not _HAS_CUDA:
        raise ValueError(f"device {device!r} requested but this machine has no CUDA GPU")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"device {device!r} does not exist: this machine has {torch.cuda.device_count()} CUDA "
                         f"GPU(s), cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    if dev.type not in ("cuda", "cpu"):
        raise ValueError(f"unsupported device {device!r}: use 'cuda', 'cpu' or 'auto'")
    return dev


def resolve_backend(backend: str, device: torch.device | str | None = None) -> str:
    """'auto' -> 'triton' on a GPU, 'torch' on CPU (where Triton would run under the slow
    interpreter). The one place an 'auto' backend is decided."""
    if backend == "auto":
        return "triton" if resolve_device(device).type == "cuda" else "torch"
    if backend not in ("torch", "triton"):
        raise ValueError(f"unknown backend {backend!r}; choose 'torch', 'triton' or 'auto'")
    return backend


def resolve_dtype(dtype, device: torch.device | str | None = None):
    """'auto' -> bfloat16 on a GPU (what serving runs), float32 on CPU (the interpreter computes
    bf16 arithmetic wrongly). The one place an 'auto' dtype is decided; other values pass through."""
    if dtype == "auto":
        return "bfloat16" if resolve_device(device).type == "cuda" else "float32"
    return dtype


# --- the memory this process may use ----------------------------------------------------------
GPU_GIB_ENV = "LORA_MOE_LAB_GPU_GIB"  # a cap in GiB: stands in for a smaller card (per-process memory fraction)


class GpuMemoryCapError(ValueError):
    """A memory cap (LORA_MOE_LAB_GPU_GIB) that is not a number, not positive, or above the card."""


def gpu_memory_cap_gib() -> float | None:
    """The cap set in the environment, checked, or None."""
    v = os.environ.get(GPU_GIB_ENV, "").strip()
    if not v:
        return None
    try:
        gib = float(v)
    except ValueError:
        raise GpuMemoryCapError(f"{GPU_GIB_ENV}={v!r}: a number of GiB, e.g. 24") from None
    if not gib > 0 or gib != gib:
        raise GpuMemoryCapError(f"{GPU_GIB_ENV}={v!r}: a positive number of GiB")
    return gib


_CAPPED: set = set()


def gpu_capacity(device: torch.device | str | None = None) -> tuple[int, int]:
    """(usable, total) bytes of the GPU for this process: the driver's free memory plus what the caching
    allocator holds unused, and with LORA_MOE_LAB_GPU_GIB set, at most that cap less what is allocated (the cap is
    applied once, as torch's per-process memory fraction, so an allocation past it fails as on a smaller card).
    `total` is the card's, or the cap. Starts CUDA's context; allocates nothing."""
    dev = resolve_device(device if device is not None else "cuda")
    if dev.type != "cuda":
        raise ValueError(f"gpu_capacity: {dev} is not a CUDA device")
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    free, total = torch.cuda.mem_get_info(idx)
    reserved, allocated = torch.cuda.memory_reserved(idx), torch.cuda.memory_allocated(idx)
    usable = free + reserved - allocated
    cap = gpu_memory_cap_gib()
    if cap is not None:
        cap_b = int(cap * 2 ** 30)
        if cap_b > total:
            raise GpuMemoryCapError(f"{GPU_GIB_ENV}={cap:g} is above this card's {total / 2 ** 30:.1f} GiB")
        if idx not in _CAPPED:
            torch.cuda.set_per_process_memory_fraction(cap_b / total, idx)
            _CAPPED.add(idx)
        usable, total = min(usable, cap_b - allocated), cap_b
    return max(0, usable), total


def allocator_settings() -> str:
    """The allocator configuration in force for this process (the environment it started with)."""
    return next((f"{k}={os.environ[k]}" for k in ALLOC_ENV if os.environ.get(k)), "torch's defaults")


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for the GPU. This IS a host-device sync point; a no-op on CPU."""
    if _HAS_CUDA and (device is None or torch.device(device).type == "cuda"):
        torch.cuda.synchronize()


@contextlib.contextmanager
def sync_debug_mode(mode: str = "error"):
    """torch.cuda.set_sync_debug_mode where CUDA exists ('warn' or 'error'); nothing on CPU."""
    if not _HAS_CUDA:
        yield False
        return
    prev = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode(mode)
    try:
        yield True
    finally:
        torch.cuda.set_sync_debug_mode(prev)


# --- capture mode -------------------------------------------------------------------------
# While a CUDA graph is being recorded the host cannot know which adapters the *future* batches
# will use, so every guard records the LoRA kernels unconditionally (their early exit decides
# on the GPU at replay time). The flag is thread-local, like torch's own capture state.
_state = threading.local()


def in_capture_mode() -> bool:
    return getattr(_state, "capture", False)


def stream_capturing() -> bool:
    """True while torch records a CUDA graph on the current stream (a host-side query of the stream's
    capture status: no device sync); always False without CUDA."""
    return _HAS_CUDA and torch.cuda.is_current_stream_capturing()


@contextlib.contextmanager
def capture_mode(enabled: bool = True):
    prev = in_capture_mode()
    _state.capture = enabled
    try:
        yield
    finally:
        _state.capture = prev


def host_spin(us: float) -> None:
    """Keep the host busy for `us` microseconds (a busy-wait, not a sleep: an engine's Python and
    scheduling work occupies the issuing thread the same way, and a sleep would let the OS take
    the core and return late). It launches nothing and never touches the device."""
    if us <= 0:
        return
    end = time.perf_counter_ns() + int(us * 1e3)
    while time.perf_counter_ns() < end:
        pass


class GpuSpin:
    """A GPU kernel that runs for a given time and does nothing else: a stand-in for device work
    that is not ours (an earlier batch's kernels, an all-reduce replaced by its measured time).
    torch.cuda._sleep spins for a number of SM clock cycles; cycles per microsecond are measured
    once, with events, at the clock the GPU runs now (under a power cap the SM clock drops a few
    per cent later, and the spin lengthens with it). One thread block: it occupies one SM, and the
    stream's next kernel waits for it, as it waits for an NCCL kernel. On a CPU, where every op
    runs before it returns, the same time is spent on the host (host_spin)."""

    def __init__(self, cuda: bool | None = None):
        self.cuda = has_cuda() if cuda is None else cuda
        self.cycles_per_us = None
        if self.cuda:
            torch.cuda._sleep(1000)  # load the kernel
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            n = 20_000_000
            synchronize()
            a.record()
            torch.cuda._sleep(n)
            b.record()
            b.synchronize()
            self.cycles_per_us = n / (a.elapsed_time(b) * 1e3)

    def us(self, us: float) -> None:
        if us <= 0:
            return
        if self.cuda:
            torch.cuda._sleep(int(us * self.cycles_per_us))
        else:
            host_spin(us)

    def __call__(self, ms: float) -> None:
        self.us(ms * 1e3)
