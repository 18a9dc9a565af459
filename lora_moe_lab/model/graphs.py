"""CUDA-graph capture of a whole forward, replay with adapters switched in place, and an honest
account of why a host sync inside capture fails.

A CUDA graph records kernel launches once and replays them with one host call. Everything the
graph reads must live at fixed addresses (static buffers), and nothing may ask the host a
question during capture: a `.item()` needs the GPU to *run* the reduction now, but a capturing
stream does not run anything - CUDA answers "operation not permitted when stream is capturing".
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import runtime
from .guards import get_guard
from .lora import LoRABatchInfo, LoRABatchTensors


def _need_cuda():
    if not runtime.has_cuda():
        raise RuntimeError("CUDA graphs need a CUDA GPU; this machine has none (the notebooks show recorded data)")


def capture(fn, warmup: int = 2, pool=None, launch_all: bool = True):
    """Capture `fn()` into a CUDA graph; returns (graph, output). THE capture recipe of this lab.

    Warm-up runs on a side stream first (torch's recipe): the first calls compile Triton kernels
    and allocate memory, neither of which may happen inside capture. Everything runs under
    `capture_mode()`, so every guard records the LoRA kernels unconditionally and none syncs;
    `launch_all=False` leaves the host's decision to `fn` (a no-LoRA graph: `cpu_flag` on a batch
    without adapters records no LoRA kernel). `pool`: a graph memory pool shared with other graphs
    (torch.cuda.graph_pool_handle()). Keep the output: it holds the graph's output memory alive; and keep
    `fn`: the tensors it closes over are read at their capture-time addresses by every replay."""
    _need_cuda()
    with runtime.capture_mode(launch_all):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(max(warmup, 1)):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out = fn()
    return graph, out


class CapturedForward:
    """A forward of `lab.model` captured for a fixed batch geometry (requests x tokens each).

    `replay(x, adapters)` writes the new input and the new batch metadata into the graph's static
    buffers, then replays. The adapter set may change freely between replays (none -> some -> all):
    the graph always contains the LoRA kernels, and their early exit skips unused slots on the GPU.
    """

    def __init__(self, lab, token_counts: list[int], guard: str = "cpu_flag", warmup: int = 2):
        _need_cuda()
        self.lab, self.token_counts, self.guard = lab, list(token_counts), get_guard(guard)
        R, M, S = len(token_counts), sum(token_counts), lab.pool.max_loras
        self.x = torch.zeros(M, lab.shape.hidden, dtype=lab.dtype, device=lab.device)
        self.tensors = LoRABatchTensors.empty(R, M, S, lab.device)
        self.batch = LoRABatchInfo.build(lab.pool, [None] * R, self.token_counts)
        LoRABatchTensors.from_batch(self.batch, lab.device, out=self.tensors)
        self.graph, self.y = capture(lambda: lab.model(self.x, self.batch, self.tensors, guard=self.guard), warmup)

    def load_batch(self, x: torch.Tensor, adapters: list) -> None:
        if len(adapters) != len(self.token_counts):
            raise ValueError(f"this graph was captured for {len(self.token_counts)} requests, got {len(adapters)}")
        batch = LoRABatchInfo.build(self.lab.pool, adapters, self.token_counts)
        LoRABatchTensors.from_batch(batch, self.lab.device, out=self.tensors)  # in place, no sync
        self.x.copy_(x)

    def replay(self, x: torch.Tensor | None = None, adapters: list | None = None) -> torch.Tensor:
        """Replay; a new input and/or adapter list is written into the static buffers first
        (whatever is not given keeps its last value)."""
        if adapters is not None:
            self.load_batch(self.x if x is None else x, adapters)
        elif x is not None:
            self.x.copy_(x)
        self.graph.replay()
        return self.y


@dataclass
class CaptureFailure:
    outer: str  # what propagates out of `torch.cuda.graph(...)`
    inner: str  # the first error inside capture: the actual cause

    def __str__(self):
        return f"capture failed: {self.outer.splitlines()[0]}\n  inner cause: {self.inner.splitlines()[0]}"


def inner_cause(exc: BaseException) -> str:
    """Walk __context__/__cause__ to the first error: torch's graph context manager reports a
    generic 'operation failed due to a previous error during capture' on exit, hiding the cause."""
    seen, chain = set(), []
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        chain.append(e)
        e = e.__cause__ or e.__context__
    for e in reversed(chain):  # the oldest error is the cause
        if "capturing" in str(e) or "not permitted" in str(e):
            return str(e)
    return str(chain[-1])


def try_capture(lab, token_counts: list[int], guard: str, *, use_capture_mode: bool) -> CaptureFailure | None:
    """Capture one forward; returns the failure (outer + inner cause) instead of raising.

    With use_capture_mode=False the `sync` guard runs its `.item()` inside the capture and fails.
    """
    _need_cuda()
    M, R = sum(token_counts), len(token_counts)
    # Inputs from a CPU generator: a capture that fails midway can leave the default CUDA
    # generator in capture state ("Offset increment outside graph capture") for later random calls.
    x = torch.randn(M, lab.shape.hidden, generator=torch.Generator().manual_seed(0)).to(lab.device, lab.dtype)
    names = sorted(lab.pool.loaded())
    batch, tensors = lab.make_batch([names[0] if names else None] + [None] * (R - 1), token_counts)
    lab.model(x, batch, tensors, guard=guard)  # eager warm-up (may sync: not capturing yet)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    try:
        with runtime.capture_mode(use_capture_mode):
            with torch.cuda.graph(g):
                lab.model(x, batch, tensors, guard=guard)
    except Exception as e:  # noqa: BLE001 - reported, not swallowed
        torch.cuda.synchronize()
        return CaptureFailure(outer=str(e), inner=inner_cause(e))
    return None


class GraphForward:
    """Any callable captured once and replayed (benchmarks time `replay`)."""

    def __init__(self, fn, warmup: int = 2):
        self.graph, self.out = capture(fn, warmup)
        # The graph holds raw device addresses, not tensors: every tensor `fn` closes over (a batch's
        # metadata, a hook's LoRAInfo) must outlive the graph. Keep `fn`, or the caching allocator hands
        # that memory to the next allocation and the replay reads whatever lands there.
        self.fn = fn
        torch.cuda.synchronize()

    def replay(self):
        self.graph.replay()
        return self.out
