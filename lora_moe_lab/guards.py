"""The three guard strategies for a MoE layer's LoRA work.

    sync          the old guard: reduce on the device, then `.item()` - a host-device sync in
                  EVERY layer. The host stops issuing work until the GPU has drained its queue.
    cpu_flag      the fix: read `has_active_lora`, a Python bool computed when the batch was built.
    launch_always no host check at all: launch the kernels and let each program exit early on the
                  GPU when its slot is unused or disabled.

All three give identical outputs. Under capture mode every guard records the LoRA work
unconditionally: the host cannot know the adapters of the batches the graph will replay.
"""
from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass

from . import runtime
from .lora import LoRAInfo, check_flag_against_device, device_any_enabled

GUARDS = ("sync", "cpu_flag", "launch_always")


@dataclass
class SyncEvent:
    guard: str
    site: str  # file:line of the host-device sync


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


def _record(guard: str) -> None:
    f = sys._getframe(1)
    ev = SyncEvent(guard, f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}")
    _total["syncs"] += 1
    for c in _collectors:
        c.append(ev)


class Guard:
    name = "base"

    def active(self, info: LoRAInfo) -> bool:  # pragma: no cover - interface
        raise NotImplementedError

    def should_launch(self, info: LoRAInfo) -> bool:
        """Launch the LoRA kernels of this layer? Rank 0 is a host fact: nothing to launch."""
        if info.max_lora_rank == 0:
            return False
        if runtime.in_capture_mode():
            return True  # record unconditionally; the kernels' early exit decides at replay
        return self.active(info)

    def __repr__(self):
        return f"<guard {self.name}>"


class SyncGuard(Guard):
    name = "sync"

    def active(self, info: LoRAInfo) -> bool:
        flag = device_any_enabled(info.batch)  # a reduction on the device: cheap, asynchronous
        _record(self.name)
        return bool(flag.item())  # HOST-DEVICE SYNC: the host waits until the GPU queue drains


class CpuFlagGuard(Guard):
    name = "cpu_flag"

    def active(self, info: LoRAInfo) -> bool:
        if info.debug_check:
            check_flag_against_device(info)  # syncs; debug only
        return info.has_active_lora  # a Python bool: no device involved


class LaunchAlwaysGuard(Guard):
    name = "launch_always"

    def active(self, info: LoRAInfo) -> bool:
        return True


_BY_NAME = {g.name: g for g in (SyncGuard, CpuFlagGuard, LaunchAlwaysGuard)}


def get_guard(guard: "str | Guard") -> Guard:
    if isinstance(guard, Guard):
        return guard
    if guard not in _BY_NAME:
        raise ValueError(f"unknown guard {guard!r}; choose one of {list(GUARDS)}")
    return _BY_NAME[guard]()
