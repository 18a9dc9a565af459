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
