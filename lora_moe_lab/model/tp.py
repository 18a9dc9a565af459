"""Tensor parallelism on `torch.distributed`: one process per GPU, launched by `torchrun`.

    group = init_tp()                       # reads RANK, WORLD_SIZE, LOCAL_RANK (env:// rendezvous)
    lab = build_decoder_lab("qwen3-30b-a3b", tp=group)
    ...
    group.destroy()

How the decoder splits (model/decoder.py): attention is column-parallel over heads (each rank
holds a contiguous block of query heads and the KV heads they read) and o_proj is row-parallel;
the MoE splits every expert's intermediate dimension. Each rank then holds a partial sum of the
attention output and of the MoE output, and one all-reduce per block adds the partial sums.

NCCL's all-reduce is NOT a host-device sync: it is enqueued on the rank's stream like a kernel.
It is a rank-rank sync on the GPU: every rank's stream waits there for the slowest rank, so a
host stall on one rank (a guard's `.item()`) delays all of them.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from .. import runtime
from ..config import MoEShape


@dataclass
class TPGroup:
    """This process's place in the tensor-parallel group."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    backend: str = "none"  # "nccl", "gloo", or "none" for a single process

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum `t` over the ranks, in place; returns `t`. A no-op for a single process."""
        if self.size == 1:
            return t
        try:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)  # on the GPU stream: the host does not wait
        except Exception as e:  # gloo raises here; NCCL errors surface from its watchdog
            raise RuntimeError(f"tp rank {self.rank}/{self.size}: all_reduce failed: {e}") from e
        return t

    def all_reduce_min(self, n: int) -> int:
        """The least of a host int over the ranks (build time only: it reads the result back, a sync). Alone (one
        process, or one rank emulated on its own GPU) it is `n`."""
        if self.size == 1 or not dist.is_initialized():
            return n
        t = torch.tensor([n], dtype=torch.int64, device=self.device if self.backend == "nccl" else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    def destroy(self) -> None:
        if self.size > 1 and dist.is_initialized():
            dist.destroy_process_group()
        self.size = 1


def single(device: torch.device | str = "cpu") -> TPGroup:
    """The group of one process (no torch.distributed at all)."""
    return TPGroup(device=torch.device(device))


def _env_int(name: str) -> int:
    v = os.environ.get(name)
    if v is None:
        raise RuntimeError(f"{name} is not set: launch with torchrun (e.g. torchrun --nproc-per-node 2 script.py)")
    try:
        return int(v)
    except ValueError:
        raise RuntimeError(f"{name}={v!r} is not an integer") from None


def check_world(world_size: int, local_world_size: int, device_type: str, num_gpus: int,
                nccl_available: bool) -> str:
    """The distributed backend for this launch, or a named error. Pure: tests pass fake facts."""
    if world_size < 1:
        raise ValueError(f"WORLD_SIZE must be >= 1, got {world_size}")
    if device_type == "cuda":
        if local_world_size > num_gpus:
            raise ValueError(f"{local_world_size} ranks on this host but only {num_gpus} GPU(s): "
                             f"one rank per GPU (lower --nproc-per-node)")
        if not nccl_available:
            raise RuntimeError("this torch build has no NCCL backend (torch.distributed.is_nccl_available() "
                               "is False): a GPU run needs NCCL")
        return "nccl"
    return "gloo"


def init_tp(device: str = "auto", timeout_s: float = 300.0) -> TPGroup:
    """Join the group torchrun set up. `timeout_s` bounds the rendezvous and every collective,
    so a rank that died makes the others fail with an error instead of hanging forever."""
    rank, size, local = _env_int("RANK"), _env_int("WORLD_SIZE"), _env_int("LOCAL_RANK")
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", size))
    dev = runtime.resolve_device(device)
    num_gpus = torch.cuda.device_count() if dev.type == "cuda" else 0
    backend = check_world(size, local_size, dev.type, num_gpus, dist.is_nccl_available())
    if dev.type == "cuda":
        dev = torch.device("cuda", local)
        torch.cuda.set_device(dev)  # NCCL uses the current device of each process
    group = TPGroup(rank, size, local, dev, backend)
    if size == 1:
        return group
    try:
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=size,
                                timeout=timedelta(seconds=timeout_s))
    except Exception as e:
        raise RuntimeError(f"tp rank {rank}/{size}: init_process_group({backend!r}) failed "
                           f"(timeout {timeout_s:.0f} s): {e}") from e
    return group


def tp_shape(shape: MoEShape, size: int) -> MoEShape:
    """The shape one rank of `size` holds, or a named error when something does not split."""
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"tp size must be a positive int, got {size!r}")
    if size == 1:
        return shape
    for field in ("num_heads", "num_kv_heads", "intermediate"):
        v = getattr(shape, field)
        if v % size:
            raise ValueError(f"shape {shape.name!r}: {field}={v} is not divisible by the tp size {size}")
    return shape.with_(name=f"{shape.name}-tp{size}", intermediate=shape.intermediate // size,
                       num_heads=shape.num_heads // size, num_kv_heads=shape.num_kv_heads // size)


# --- one rank of a larger group, on one GPU ------------------------------------------------------
@dataclass(frozen=True)
class AllReduceCost:
    """The time of one all-reduce of `nbytes` over `size` ranks, from a measured bus bandwidth.

    nccl-tests' convention: a ring all-reduce sends and receives 2 (n - 1) / n of the buffer over
    each GPU's links, so time = latency + nbytes * 2 (n - 1) / n / bus bandwidth. The bus bandwidth
    measured at one size of group is carried to another: on an NVSwitch host every GPU has the same
    links to the switch whatever the group's size (an assumption at a size never measured: NCCL may
    pick another algorithm there)."""

    bus_gbps: float  # GB/s (1e9 bytes per second) over each GPU's links
    latency_us: float = 0.0
    source: str = ""  # what it was measured from

    def __post_init__(self):
        if not (self.bus_gbps > 0 and self.latency_us >= 0):
            raise ValueError(f"AllReduceCost needs bus_gbps > 0 and latency_us >= 0, got {self}")

    def us(self, nbytes: int, size: int) -> float:
        if size < 2:
            return 0.0
        return self.latency_us + nbytes * 2 * (size - 1) / size / (self.bus_gbps * 1e3)  # GB/s = 1e3 bytes/us


@dataclass
class EmulatedTPGroup(TPGroup):
    """Rank 0 of a group of `size`, alone on one GPU: build_decoder_lab(tp=...) gives it one rank's
    shapes (a 1/size share of heads and expert intermediate), and every all-reduce becomes a GPU
    spin of the measured time for its bytes (runtime.GpuSpin), enqueued on the stream where NCCL's
    kernel would run. The sums are not computed (the values stay one rank's partial sums: for
    timing only). What it cannot show: another rank's host stall arriving late at a collective."""

    cost: AllReduceCost | None = None
    collectives: int = 0  # all-reduces issued
    collective_us: float = 0.0  # their emulated time

    def __post_init__(self):
        if self.cost is None:
            raise ValueError("EmulatedTPGroup needs cost=AllReduceCost(...)")
        self.backend = "emulated"
        self._spin = runtime.GpuSpin(self.device.type == "cuda")

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        us = self.cost.us(t.numel() * t.element_size(), self.size)
        self._spin.us(us)
        self.collectives += 1
        self.collective_us += us
        return t

    def destroy(self) -> None:
        pass


def emulated(size: int, cost: AllReduceCost, device: torch.device | str = "auto") -> EmulatedTPGroup:
    """One rank of a TP group of `size`, emulated on this process's device."""
    if not isinstance(size, int) or size < 2:
        raise ValueError(f"an emulated TP group needs size >= 2, got {size!r}")
    return EmulatedTPGroup(rank=0, size=size, local_rank=0, device=runtime.resolve_device(device), cost=cost)
