"""The three guard strategies for a MoE layer's LoRA work.

    sync          the old guard: reduce on the device, then `.item()` - a host-device sync in
                  EVERY layer. The host stops issuing work until the GPU has drained its queue.
    cpu_flag      the fix: read `has_active_lora`, a Python bool computed when the batch was built.
    launch_always no host check at all: launch the kernels and let each program exit early on the
                  GPU when its slot is unused or disabled.

All three give identical outputs. Under capture mode every guard records the LoRA work
unconditionally: the host cannot know the adapters of the batches the graph will replay.

THE REGISTRY: a guard is a `Guard` subclass decorated with `@register_guard`. That is the only
edit a new guard needs: the benchmark CLI, the simulator (which reads `device_check` and
`decide`), the widgets and the plots (which read `color`) all list `guard_names()`.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass

from typing import ClassVar

from .. import runtime
from .lora import LoRAInfo, check_flag_against_device, device_any_enabled


@dataclass
class SyncEvent:
    guard: str
    site: str  # file:line of the host-device sync
    blocked_ns: int = -1  # host time blocked in the `.item()` (perf_counter, no profiler)


_collectors: list[list[SyncEvent]] = []
_total = {"syncs": 0}


@contextlib.contextmanager
def guard_sync_events():
    """Collect one SyncEvent per host-device sync the `sync` guard performs (works on CPU too, so
    a CPU run can say how many syncs a GPU run would have)."""
    events: list[SyncEvent] = []
    _collectors.append(events)
    try:
        yield events
    finally:
        _collectors.remove(events)


class _Count:
    def __init__(self, events):
        self.events = events

    @property
    def count(self) -> int:
        return len(self.events)


@contextlib.contextmanager
def count_guard_syncs():
    with guard_sync_events() as ev:
        yield _Count(ev)


def total_guard_syncs() -> int:
    return _total["syncs"]


def _record(guard: str, blocked_ns: int = -1) -> None:
    f = sys._getframe(1)
    ev = SyncEvent(guard, f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}", blocked_ns)
    _total["syncs"] += 1
    for c in _collectors:
        c.append(ev)


class Guard:
    """One guard strategy, described by two facts that the model and the simulator both read:

    device_check  each guard site asks the GPU (a reduction, then `.item()`: a host-device sync);
                  otherwise the answer comes from the host flag `has_active_lora` (free).
    decide(any_active) -> launch?  what the guard does with that answer, in eager mode.
    """

    name: ClassVar[str] = "base"
    color: ClassVar[str] = "#7f7f7f"  # one colour per guard in every figure
    device_check: ClassVar[bool] = False

    def decide(self, any_active: bool) -> bool:
        return any_active

    def active(self, info: LoRAInfo) -> bool:
        if self.device_check:
            flag = device_any_enabled(info.batch)  # a reduction on the device: cheap, asynchronous
            t0 = time.perf_counter_ns()
            any_active = bool(flag.item())  # HOST-DEVICE SYNC: the host waits until the GPU queue drains
            # the host time blocked: the GPU work queued ahead of the flag (the host's lead) plus a
            # device-to-host round trip. Measured without a profiler (a profiler slows the host).
            _record(self.name, time.perf_counter_ns() - t0)
        else:
            if info.debug_check:
                check_flag_against_device(info)  # syncs; debug only
            any_active = info.has_active_lora  # a Python bool: no device involved
        return self.decide(any_active)

    def should_launch(self, info: LoRAInfo) -> bool:
        """Launch the LoRA kernels of this layer? Rank 0 is a host fact: nothing to launch."""
        if info.max_lora_rank == 0:
            return False
        if runtime.in_capture_mode():
            return True  # record unconditionally; the kernels' early exit decides at replay
        return self.active(info)

    def __repr__(self):
        return f"<guard {self.name}>"


_REGISTRY: dict[str, type[Guard]] = {}


def register_guard(cls: type[Guard]) -> type[Guard]:
    """Class decorator: make a guard known everywhere (CLI choices, simulator, widgets, colours)."""
    if not (isinstance(cls, type) and issubclass(cls, Guard)) or cls.name in ("", "base"):
        raise TypeError(f"register_guard takes a Guard subclass with its own name, got {cls!r}")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"a guard named {cls.name!r} is already registered ({_REGISTRY[cls.name].__name__})")
    _REGISTRY[cls.name] = cls
    return cls


def unregister_guard(name: str) -> None:
    """Remove a registered guard (tests register temporary ones)."""
    _REGISTRY.pop(name, None)


def guard_names() -> tuple[str, ...]:
    """Every registered guard, in registration order."""
    return tuple(_REGISTRY)


def guard_color(name: str) -> str:
    cls = _REGISTRY.get(name)
    return cls.color if cls is not None else Guard.color


@register_guard
class SyncGuard(Guard):
    """The old guard: ask the GPU in every layer (a sync)."""
    name, color, device_check = "sync", "#d62728", True


@register_guard
class CpuFlagGuard(Guard):
    """The fix: the host flag, computed from Python lists when the batch was built."""
    name, color = "cpu_flag", "#2ca02c"


@register_guard
class LaunchAlwaysGuard(Guard):
    """No host check: always launch; the kernels exit early on the GPU."""
    name, color = "launch_always", "#1f77b4"

    def decide(self, any_active: bool) -> bool:
        return True


def get_guard(guard: "str | Guard") -> Guard:
    if isinstance(guard, Guard):
        return guard
    if not isinstance(guard, str) or guard not in _REGISTRY:
        raise ValueError(f"unknown guard {guard!r}; choose one of {list(_REGISTRY)}")
    return _REGISTRY[guard]()
