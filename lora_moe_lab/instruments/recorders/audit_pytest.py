"""A pytest plugin: a sync budget per test, for any project's CI (registered as a `pytest11` entry
point when lora_moe_lab is installed; without installing, `pytest -p lora_moe_lab.instruments.recorders.audit_pytest`).

    @pytest.mark.sync_budget(max_syncs=0, allow=["modeling_qwen3_moe.py:forward"])
    def test_forward_is_sync_free(model, ids):
        model(ids)                       # fails on a sync outside forward, or on an allow entry that matched none

    def test_two_syncs_at_most(sync_budget, model, ids):
        with sync_budget(max_syncs=2):   # the fixture: only the block is counted
            model(ids)

`allow` names sites as vLLM's sync check does (`gpu_sync_allowed()` sites): "file.py:LINE" or
"file.py:function" (also "file.py:Class.method"), the file's base name. `max_syncs` is the number of
syncs allowed *outside* those sites (default 0): `max_syncs=0, allow=[...]` means only the allowed
sites sync. A test fails with
  * SyncBudgetExceeded: more syncs outside the allowlist than `max_syncs` (each site listed);
  * StaleAllowEntry: an allow entry that matched no sync (the sync it was written for moved or went);
  * BudgetSpecError (a ValueError, at the marker or the fixture call): a negative or non-int budget, an
    entry that is not a site, an unknown keyword.

What counts: on a machine with CUDA, torch's sync debug mode (every sync torch itself makes: not an
explicit synchronize, allocator growth or a pageable upload), each sited by the sync audit running
beside it. On a CPU-only machine, the sync audit: the calls that WOULD sync on a GPU (instruments/
recorders/audit.py). Either way a site is the innermost frame outside torch, installed packages
included, so one allowlist serves both. `device="cpu"` forces the CPU count on a GPU machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections import Counter

import pytest
import torch

from . import sync_check as _sc
from . import syncs

__all__ = ["SyncBudgetError", "SyncBudgetExceeded", "StaleAllowEntry", "BudgetSpecError", "budget", "Budget"]

MARKER = ("sync_budget(max_syncs=0, allow=[], device=None): fail the test when its call makes more host-device "
          "syncs outside the `allow` sites ('file.py:LINE' or 'file.py:function') than max_syncs, or an allow "
          "entry matched nothing (lora_moe_lab.instruments.recorders.audit_pytest)")


class SyncBudgetError(AssertionError):
    """A test's syncs broke its budget (a test failure, not an error)."""


class SyncBudgetExceeded(SyncBudgetError):
    """More syncs outside the allowlist than the budget. `sites`: {site: count} of those syncs."""


class StaleAllowEntry(SyncBudgetError):
    """Allow entries that matched no sync. `entries`: the entries."""


class BudgetSpecError(ValueError):
    """A sync budget that is not one: a negative budget, a malformed allow entry, an unknown keyword."""


@dataclasses.dataclass
class Budget:
    """What a budget saw (complete when its block exits): every sync as (site, function), how many each
    allow entry let through, the syncs outside the allowlist, and what counted them."""

    max_syncs: int
    allow: list
    counted_by: str = ""
    syncs: list = dataclasses.field(default_factory=list)  # (site, function)
    allowed: Counter = dataclasses.field(default_factory=Counter)
    outside: Counter = dataclasses.field(default_factory=Counter)


def _spec(max_syncs=0, allow=(), device=None, **extra) -> tuple[int, list, str | None]:
    if extra:
        raise BudgetSpecError(f"sync_budget takes max_syncs, allow and device; unknown: {sorted(extra)}")
    if isinstance(max_syncs, bool) or not isinstance(max_syncs, int) or max_syncs < 0:
        raise BudgetSpecError(f"sync_budget max_syncs must be an int >= 0, got {max_syncs!r}")
    if device not in (None, "cpu", "cuda"):
        raise BudgetSpecError(f"sync_budget device must be 'cpu', 'cuda' or None (auto), got {device!r}")
    try:
        entries = _sc._parse_allow(allow)
    except (_sc.AllowlistError, TypeError) as e:
        raise BudgetSpecError(f"sync_budget allow: {e}") from None
    return max_syncs, entries, device


def _matches(e, site: str, function: str) -> bool:
    file, _, line = site.rpartition(":")
    if os.path.basename(file) != e.file:
        return False
    if e.line is not None:
        return line == str(e.line)
    names = {function, function.rsplit(".", 1)[-1]} if function else _sc._functions_at(f"{e.file}:{line}")
    return e.func in names


@contextlib.contextmanager
def budget(max_syncs=0, allow=(), device=None):
    """Count the block's syncs against the budget (see the module doc); raise on exit when broken."""
    n, entries, device = _spec(max_syncs, allow, device)
    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    b = Budget(n, [e.text for e in entries])
    from .audit import audit
    from .audit_watch import DEBUG_MODE_KINDS

    if dev == "cuda":  # the count is torch's: the audit's events of the kinds its debug mode reports
        b.counted_by = "torch's sync debug mode (CUDA), sited by the sync audit"
    else:
        b.counted_by = "the sync audit (CPU: the calls that would sync on a GPU)"
    with audit(device=dev) as rep:
        yield b
    b.syncs = [(e.site, e.function) for e in rep.events if dev == "cpu" or e.kind in DEBUG_MODE_KINDS]
    for site, fn in b.syncs:
        hits = [e for e in entries if _matches(e, site, fn)]
        for e in hits:
            b.allowed[e.text] += 1
        if not hits:
            b.outside[site] += 1
    over = sum(b.outside.values())
    if over > n:
        listed = ", ".join(f"{s} x{k}" for s, k in b.outside.most_common())
        err = SyncBudgetExceeded(f"{over} host-device sync(s) outside the allowlist, budget {n}: {listed} "
                                 f"(counted by {b.counted_by})")
        err.sites = dict(b.outside)
        raise err
    stale = [e.text for e in entries if not b.allowed[e.text]]
    if stale:
        err = StaleAllowEntry(f"allow entr{'y' if len(stale) == 1 else 'ies'} {stale} matched no sync "
                              f"(counted by {b.counted_by}): remove it, or point it at the site the sync moved to")
        err.entries = stale
        raise err


# --- the plugin ---------------------------------------------------------------------------------------
def pytest_configure(config):
    config.addinivalue_line("markers", MARKER)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    m = item.get_closest_marker("sync_budget")
    if m is None:
        return (yield)
    if m.args:
        raise BudgetSpecError(f"{item.nodeid}: sync_budget takes keywords only (max_syncs=, allow=), got {m.args}")
    with budget(**m.kwargs):
        return (yield)


@pytest.fixture
def sync_budget():
    """`with sync_budget(max_syncs=0, allow=[...]):` the block's syncs against a budget (see audit_pytest)."""
    return budget


syncs.tool_file(__file__)
