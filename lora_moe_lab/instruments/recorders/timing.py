"""One device timer: CUDA events per repetition on a GPU, the wall clock on CPU.

    t = time_device(lambda: lab.model(x, batch, tensors, guard="sync"), warmup=3, reps=10)
    t.median_us, t.p10_us, t.p90_us, t.reps
    time_graph(fn)          # capture fn once (model.graphs.capture), time its replays
    time_graph(fn, repeat=32)            # 32 calls in one graph: per-call time of a short kernel
    time_interleaved({"a": f, "b": g})   # rotating order per repetition: honest ratios

Each repetition starts on an idle device with an empty queue (synchronize first), records a CUDA
event, calls fn, records a second event; the elapsed time between the two events is the sample.
So a sample covers the host issuing the work while the device runs it, and every host sync
inside it - the quantity this lab is about. After `warmup` untimed calls (Triton compiles then).
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import torch

from ... import runtime
from ...model.graphs import GraphForward


# ----------------------------------------------------------------------------------------------
@dataclass
class Timing:
    median_us: float
    p10_us: float
    p90_us: float
    mean_us: float
    reps: int
    timer: str  # "cuda_events" or "wall"
    wall_median_us: float  # host wall clock per rep (on a GPU: from issue to the end event's completion)
    samples_us: list[float] = field(default_factory=list, repr=False)

    def per_call(self, n: int) -> "Timing":
        """The same timing for one of the n calls that each repetition made."""
        return replace(self, median_us=self.median_us / n, p10_us=self.p10_us / n, p90_us=self.p90_us / n,
                       mean_us=self.mean_us / n, wall_median_us=self.wall_median_us / n,
                       samples_us=[s / n for s in self.samples_us])


def _quantile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default) without numpy."""
    s = sorted(xs)
    if len(s) == 1:
        return float(s[0])
    pos = q * (len(s) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(s) - 1)
    return float(s[lo] + (s[hi] - s[lo]) * (pos - lo))


def _summarise(samples: list[float], wall: list[float], timer: str) -> Timing:
    return Timing(statistics.median(samples), _quantile(samples, 0.1), _quantile(samples, 0.9),
                  statistics.fmean(samples), len(samples), timer, statistics.median(wall), list(samples))


def _check_counts(warmup: int, reps: int) -> None:
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    if not isinstance(reps, int) or reps <= 0:
        raise ValueError(f"reps must be a positive int, got {reps!r}")


def time_device(fn: Callable[[], object], warmup: int = 3, reps: int = 10, *, cuda: bool | None = None) -> Timing:
    """Time `fn()`: CUDA events per repetition on a GPU, perf_counter on CPU.

    Each repetition starts from an idle device (`synchronize` before it), so queued work of one
    repetition never overlaps the next and host launch costs show where they are exposed.
    """
    _check_counts(warmup, reps)
    cuda = runtime.has_cuda() if cuda is None else cuda
    for _ in range(warmup):
        fn()
    runtime.synchronize()
    samples, wall = [], []
    for _ in range(reps):
        dev_us, wall_us = time_once(fn, cuda)
        samples.append(dev_us)
        wall.append(wall_us)
    return _summarise(samples, wall, "cuda_events" if cuda else "wall")


def time_once(fn: Callable[[], object], cuda: bool | None = None) -> tuple[float, float]:
    """One repetition from an idle device: (device us, host wall us); the two agree on CPU."""
    cuda = runtime.has_cuda() if cuda is None else cuda
    if not cuda:
        t0 = time.perf_counter()
        fn()
        dt = (time.perf_counter() - t0) * 1e6
        return dt, dt
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()  # empty queue: nothing earlier runs inside this sample
    t0 = time.perf_counter()
    start.record()
    fn()
    end.record()
    end.synchronize()  # host waits for this rep's work; the next rep starts on an idle GPU
    return start.elapsed_time(end) * 1e3, (time.perf_counter() - t0) * 1e6  # ms -> us


def rotated(names: Sequence, r: int) -> list:
    """The order of repetition r in an interleaved measurement: `names` rotated by r, so every
    variant runs first, second, ... equally often and slow drifts land on all of them alike."""
    k = r % len(names)
    return list(names[k:]) + list(names[:k])


def time_interleaved(fns: dict[str, Callable[[], object]], reps: int = 10, *,
                     cuda: bool | None = None) -> dict[str, Timing]:
    """Time several callables in one loop (no warm-up: do it first): repetition r runs each once,
    in an order rotated by r, each from an idle device. Slow drifts of the host (clocks, other
    processes, the allocator) then land on all of them alike, so their ratios are honest."""
    _check_counts(0, reps)
    cuda = runtime.has_cuda() if cuda is None else cuda
    names = list(fns)
    got = {n: ([], []) for n in names}
    for r in range(reps):
        for n in rotated(names, r):
            dev_us, wall_us = time_once(fns[n], cuda)
            got[n][0].append(dev_us)
            got[n][1].append(wall_us)
    return {n: _summarise(s, w, "cuda_events" if cuda else "wall") for n, (s, w) in got.items()}


def time_graph(fn: Callable[[], object], warmup: int = 3, reps: int = 10, *, repeat: int = 1) -> Timing:
    """Capture `fn` `repeat` times back to back in one CUDA graph (model.graphs.capture), time the
    replays with `time_device` and return the time per call. A replay is one host launch (a few
    us) whatever it holds, so repeat > 1 spreads that over many calls of a short kernel."""
    if not isinstance(repeat, int) or repeat <= 0:
        raise ValueError(f"repeat must be a positive int, got {repeat!r}")

    def body():
        for _ in range(repeat):
            out = fn()
        return out

    g = GraphForward(body, warmup=warmup)
    try:
        return time_device(g.replay, warmup=warmup, reps=reps).per_call(repeat)
    finally:
        del g
