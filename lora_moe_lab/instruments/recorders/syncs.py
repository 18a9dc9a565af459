"""Count and locate host-device synchronizations in any PyTorch code, or forbid them.

A host-device sync is a point where the CPU thread stops issuing work and waits for the GPU
(`.item()`, `.cpu()`, `.tolist()`, `torch.nonzero`, `cudaStreamSynchronize`, ...). While the host
waits, the GPU drains its launch queue; when the host resumes, the GPU sits idle until the next
kernel arrives. One such bubble per MoE layer is the lesson of this lab.

    with count_syncs() as rep:             # count + name the call sites (file:line)
        y = model(x)
    print(rep.summary())

    with checked_region():                 # raise HostSyncError at the first sync ...
        y = model(x)
        with allow_sync():                 # ... except where a sync is intended
            n = int(counts.sum().item())

What can be seen where:
  * CUDA: torch.cuda.set_sync_debug_mode("warn"/"error") makes torch report every sync it
    performs itself (`.item()`, device-to-host copies, nonzero, ...). It does not report an
    explicit `torch.cuda.synchronize()`; `count_syncs(profiler=True)` adds the profiler's
    `cudaStreamSynchronize` / `cudaDeviceSynchronize` / synchronous `cudaMemcpy` runtime calls,
    which do include it.
  * CPU-only torch: there is no device, so no device sync can be observed. What is reported is the
    library's own guard syncs (`lora_moe_lab.model.guards` records one per `.item()` the `sync` guard
    performs): the number of syncs the same code would do on a GPU.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
import sysconfig
import threading
import warnings
from collections import Counter

import torch

from ... import runtime

try:  # the library's guard counter (optional: the tools work on any code without it)
    from ...model.guards import guard_sync_events as _guard_sync_events
except Exception:  # pragma: no cover - guards.py missing or broken
    _guard_sync_events = None

__all__ = ["SyncRecord", "SyncReport", "HostSyncError", "count_syncs", "checked_region", "no_syncs",
           "allow_sync", "user_site", "user_frame", "frame_function", "tool_file"]

# The message torch uses in sync debug mode (warning in "warn", RuntimeError in "error").
_TORCH_SYNC_MSG = "synchronizing CUDA operation"


# --- call sites -----------------------------------------------------------------------------
def _lib_dirs() -> tuple[str, ...]:
    dirs = {os.path.dirname(torch.__file__), os.path.dirname(contextlib.__file__)}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            dirs.add(p)
    try:
        import triton
        dirs.add(os.path.dirname(triton.__file__))
    except Exception:  # pragma: no cover
        pass
    return tuple(os.path.normpath(d) + os.sep for d in dirs)


_LIB_DIRS = _lib_dirs()
_THIS_FILE = os.path.normpath(__file__)
_RUNTIME_FILE = os.path.normpath(runtime.__file__)
_TOOL_FILES = {_THIS_FILE, _RUNTIME_FILE}  # the tooling's own frames: never a user's site


def tool_file(path: str) -> None:
    """Mark a module's file as tooling, so sites skip its frames (sync_check runs every torch call
    of its region from inside its own frame: without this, every site would point there)."""
    _TOOL_FILES.add(os.path.normpath(path))


def _is_user_file(filename: str) -> bool:
    if not filename or filename.startswith("<frozen") or filename == "<string>":
        return False
    f = os.path.normpath(filename)
    if f in _TOOL_FILES:
        return False
    # A project that lives in a venv's site-packages (editable installs don't) would be skipped:
    # acceptable, the site then falls back to the innermost frame.
    return not f.startswith(_LIB_DIRS)


def _fmt_site(filename: str, lineno: int) -> str:
    return f"{os.path.basename(filename)}:{lineno}"


def user_frame(frame=None):
    """The innermost frame outside torch, triton, the stdlib, site-packages and the tooling's own
    files, walking outwards from `frame` (default: the caller); the innermost frame when none is."""
    f = frame if frame is not None else sys._getframe(1)
    first = f
    while f is not None:
        if _is_user_file(f.f_code.co_filename):
            return f
        f = f.f_back
    return first


def user_site(frame=None) -> str:
    """file:line of the innermost frame outside torch, triton, the stdlib, site-packages and this
    module, walking outwards from `frame` (default: the caller)."""
    f = user_frame(frame if frame is not None else sys._getframe(1))
    return _fmt_site(f.f_code.co_filename, f.f_lineno) if f is not None else "?"


def frame_function(frame) -> str:
    """The qualified name of a frame's function (`Class.method`; `<module>` at top level)."""
    code = frame.f_code
    return getattr(code, "co_qualname", code.co_name)


def _user_frames(tb) -> list[str]:
    """file:line of the user frames of a traceback, outermost first."""
    out = []
    while tb is not None:
        code = tb.tb_frame.f_code
        if _is_user_file(code.co_filename) and code.co_filename != _THIS_FILE:
            out.append(_fmt_site(code.co_filename, tb.tb_lineno))
        tb = tb.tb_next
    return out


def _site_from_traceback(tb) -> str:
    """The innermost user frame of an exception's traceback (where the sync was requested)."""
    frames = _user_frames(tb)
    if frames:
        return frames[-1]
    last = None
    while tb is not None:
        last = _fmt_site(tb.tb_frame.f_code.co_filename, tb.tb_lineno)
        tb = tb.tb_next
    return last or "?"


# --- results --------------------------------------------------------------------------------
@dataclasses.dataclass
class SyncRecord:
    source: str  # "sync_debug_mode" | "profiler" | "guard"
    site: str  # file:line in the user's code ("?" when unknown)
    what: str = ""  # the warning text, runtime call name or guard name


@dataclasses.dataclass
class SyncReport:
    """What count_syncs saw. `count`/`sites` are the host-device syncs of the primary source:
    sync debug mode on CUDA, the library guard counter on a CPU-only machine. The profiler's
    runtime calls (when asked for) are listed apart in `profiler_count` / `profiler_sites`, because
    they see the same `.item()` a second time (and also explicit synchronize calls)."""

    device_observable: bool
    records: list[SyncRecord] = dataclasses.field(default_factory=list)
    profiler_records: list[SyncRecord] = dataclasses.field(default_factory=list)
    dtoh_records: list[SyncRecord] = dataclasses.field(default_factory=list)  # device->host copies
    guard_records: list[SyncRecord] = dataclasses.field(default_factory=list)
    allowed: int = 0  # syncs inside allow_sync() blocks (not in `count`), where known

    @property
    def count(self) -> int:
        return len(self.records)

    @property
    def sites(self) -> Counter:
        return Counter(r.site for r in self.records)

    @property
    def profiler_count(self) -> int:
        return len(self.profiler_records)

    @property
    def profiler_sites(self) -> Counter:
        return Counter(f"{r.what} @ {r.site}" for r in self.profiler_records)

    @property
    def guard_count(self) -> int:
        return len(self.guard_records)

    def summary(self, top: int = 8) -> str:
        lines = []
        if self.device_observable:
            lines.append(f"{self.count} host-device sync(s) seen by torch's sync debug mode")
        else:
            lines.append("CPU-only machine: device syncs cannot be observed here. "
                         f"{self.count} library guard sync(s) counted "
                         "(lora_moe_lab.model.guards: one per .item() the `sync` guard would do on a GPU)")
        for site, n in self.sites.most_common(top):
            lines.append(f"  {n:6d}  {site}")
        if len(self.sites) > top:
            lines.append(f"  ... {len(self.sites) - top} more site(s)")
        if self.profiler_records:
            lines.append(f"{self.profiler_count} blocking runtime call(s) in the profiler:")
            for site, n in self.profiler_sites.most_common(top):
                lines.append(f"  {n:6d}  {site}")
        if self.dtoh_records:
            lines.append(f"{len(self.dtoh_records)} device-to-host copies in the profiler "
                         "(each makes the host wait for the GPU before it can read the value)")
        if self.device_observable and self.guard_records:
            lines.append(f"(of which the library's `sync` guard: {self.guard_count})")
        if self.allowed:
            lines.append(f"{self.allowed} sync(s) inside allow_sync() not counted")
        return "\n".join(lines)

    def __repr__(self):
        return (f"SyncReport(count={self.count}, device_observable={self.device_observable}, "
                f"sites={dict(self.sites)})")


class HostSyncError(RuntimeError):
    """A host-device sync happened inside a checked region."""

    def __init__(self, site: str, detail: str = "", callers: list[str] | None = None):
        self.site = site
        self.callers = list(callers or [])  # user frames leading to the site, outermost first
        msg = (f"host-device sync at {site} inside a checked region: the host waits here for the "
               f"GPU queue to drain. Remove it, or wrap an intended sync in allow_sync().")
        if self.callers:
            msg += " Called from " + " <- ".join(reversed(self.callers[-3:])) + "."
        if detail:
            msg += f" [{detail}]"
        super().__init__(msg)


# --- sync debug mode stack ------------------------------------------------------------------
# torch's sync debug mode is one process-wide setting; nested regions push what they need and the
# effective mode is derived from the stack: "error" inside a checked region (unless an allow_sync()
# is nested deeper), else "warn" while a counter is open (also inside allow_sync(), so the
# counter can tally allowed syncs), else off.
_state = threading.local()


def _stack() -> list[str]:
    if not hasattr(_state, "stack"):
        _state.stack = []
    return _state.stack


def _effective_mode() -> str | int:
    st = _stack()
    if not st:
        return 0
    if st[-1] == "allow":
        return "warn" if "warn" in st else 0
    last_allow = max((i for i, m in enumerate(st) if m == "allow"), default=-1)
    return "error" if "error" in st[last_allow + 1:] else "warn"


def _apply_mode() -> None:
    if runtime.has_cuda():
        torch.cuda.set_sync_debug_mode(_effective_mode())


@contextlib.contextmanager
def _push(mode: str):
    st = _stack()
    prev = torch.cuda.get_sync_debug_mode() if (runtime.has_cuda() and not st) else None
    st.append(mode)
    _apply_mode()
    try:
        yield
    finally:
        st.pop()
        if runtime.has_cuda():
            torch.cuda.set_sync_debug_mode(prev if not st else _effective_mode())


def _allowed_now() -> bool:
    st = _stack()
    return bool(st) and st[-1] == "allow"


# --- count_syncs ----------------------------------------------------------------------------
@contextlib.contextmanager
def count_syncs(profiler: bool = False):
    """Count the host-device syncs in the block and name their call sites.

    Yields a SyncReport that is complete when the block exits. `profiler=True` (CUDA only) also
    runs torch.profiler over the block and lists blocking runtime calls (cudaStreamSynchronize,
    cudaDeviceSynchronize, synchronous cudaMemcpy), which include explicit
    torch.cuda.synchronize() calls that sync debug mode does not report."""
    cuda = runtime.has_cuda()
    with _region():
        with _count_syncs(cuda, profiler) as rep:
            yield rep


@contextlib.contextmanager
def _count_syncs(cuda: bool, profiler: bool):
    rep = SyncReport(device_observable=cuda)
    guard_cm = _guard_sync_events() if _guard_sync_events is not None else contextlib.nullcontext([])
    base = _guard_clock()

    def hook(message, category, filename, lineno, file=None, line=None):
        text = str(message)
        if _TORCH_SYNC_MSG in text:
            if _allowed_now():
                rep.allowed += 1
            else:
                rep.records.append(SyncRecord("sync_debug_mode", user_site(sys._getframe(1)), text))
            if orig_show is not getattr(warnings, "_showwarning_orig", None):
                orig_show(message, category, filename, lineno, file, line)  # an outer counter
        elif orig_show is not getattr(warnings, "_showwarning_orig", None):
            orig_show(message, category, filename, lineno, file, line)  # not ours: pass it on
        else:  # to whatever displayed or recorded warnings before (e.g. an outer pytest.warns)
            orig_impl(warnings.WarningMessage(message, category, filename, lineno, file, line))

    orig_show = warnings.showwarning
    orig_impl = getattr(warnings, "_showwarnmsg_impl", None) or (
        lambda m: warnings._showwarning_orig(m.message, m.category, m.filename, m.lineno))
    prof = None
    with contextlib.ExitStack() as stack:
        guard_events = stack.enter_context(guard_cm)
        if cuda:
            caught = stack.enter_context(warnings.catch_warnings(record=True))
            # every sync warning, each time (the user's filters stay for everything else)
            warnings.filterwarnings("always", message=".*" + _TORCH_SYNC_MSG)
            warnings.showwarning = hook  # restored by catch_warnings on exit
            if profiler:
                prof = stack.enter_context(torch.profiler.profile(
                    activities=[torch.profiler.ProfilerActivity.CPU,
                                torch.profiler.ProfilerActivity.CUDA],
                    with_stack=True))
            stack.enter_context(_push("warn"))
        try:
            yield rep
        finally:
            if prof is not None:
                stack.close()  # stop the profiler before reading its events
    if cuda:
        # Warnings that bypassed the showwarning hook (a Python whose warnings module ignores
        # it) still land in the catch_warnings list: count them with the site they report.
        for w in caught:
            if _TORCH_SYNC_MSG in str(w.message):
                rep.records.append(SyncRecord("sync_debug_mode", _fmt_site(w.filename, w.lineno),
                                              str(w.message)))
    if prof is not None:
        evs = prof.events()
        rep.profiler_records.extend(_profiler_syncs(evs))
        rep.dtoh_records.extend(_profiler_dtoh(evs))
    for i, ev in enumerate(guard_events):
        if _in_allowed_span(base + i):
            if not cuda:
                rep.allowed += 1
            continue
        r = SyncRecord("guard", getattr(ev, "site", "?"), getattr(ev, "guard", "guard"))
        rep.guard_records.append(r)
        if not cuda:
            rep.records.append(r)


# Guard syncs inside allow_sync(): the guard module numbers its events process-wide
# (total_guard_syncs), so allow_sync() notes [start, end) spans of that clock and a region skips
# the events of its list that fall in a span (event i of a list opened at clock c is number c+i).
def _guard_clock() -> int:
    try:
        from ...model.guards import total_guard_syncs
        return total_guard_syncs()
    except Exception:  # pragma: no cover - no guard module
        return 0


def _spans() -> list[list[int]]:
    if not hasattr(_state, "spans"):
        _state.spans = []
    return _state.spans


@contextlib.contextmanager
def _region():
    """Open regions (count_syncs / checked_region); allow spans are dropped when the last closes."""
    _state.regions = getattr(_state, "regions", 0) + 1
    try:
        yield
    finally:
        _state.regions -= 1
        if _state.regions == 0:
            _spans().clear()


def _in_allowed_span(n: int) -> bool:
    return any(a <= n < (b if b is not None else float("inf")) for a, b in _spans())


_STACK_LINE = re.compile(r"^(?P<file>.*)\((?P<line>\d+)\)")


def _event_site(e) -> str:
    """The user site of the nearest enclosing profiler op that carries a Python stack."""
    p = e
    while p is not None:
        for fr in getattr(p, "stack", None) or []:
            m = _STACK_LINE.match(fr)
            if m and _is_user_file(m["file"]):
                return _fmt_site(m["file"], int(m["line"]))
        p = getattr(p, "cpu_parent", None)
    return "?"


def _profiler_syncs(events) -> list[SyncRecord]:
    """Blocking runtime calls among torch.profiler FunctionEvents (with_stack=True gives sites)."""
    from ..analysers.trace.parse import PROFILER_SYNC_NAMES  # the trace parser's list (pandas: imported on use only)

    return [SyncRecord("profiler", _event_site(e), e.name) for e in events
            if e.name in PROFILER_SYNC_NAMES]


def _profiler_dtoh(events) -> list[SyncRecord]:
    """Device-to-host copies on the GPU (`Memcpy DtoH (...)`) among profiler events."""
    return [SyncRecord("profiler_dtoh", _event_site(e), e.name) for e in events
            if e.name.startswith("Memcpy DtoH")]


# --- checked regions ------------------------------------------------------------------------
@contextlib.contextmanager
def checked_region():
    """Fail on any host-device sync in the block (torch's sync debug mode "error" on CUDA).

    On CUDA the first sync raises HostSyncError naming the user's line. On a CPU-only machine no
    device sync can happen or be seen; the library's guard syncs are checked instead, when the
    block exits (the error names the guard's line: the sync a GPU run would do)."""
    cuda = runtime.has_cuda()
    guard_cm = _guard_sync_events() if _guard_sync_events is not None else contextlib.nullcontext([])
    base = _guard_clock()
    with _region(), guard_cm as guard_events:
        try:
            with _push("error"):
                yield
        except RuntimeError as e:
            if cuda and _TORCH_SYNC_MSG in str(e) and not isinstance(e, HostSyncError):
                frames = _user_frames(e.__traceback__)
                raise HostSyncError(_site_from_traceback(e.__traceback__),
                                    str(e).strip().splitlines()[0], callers=frames[:-1]) from e
            raise
        if not cuda:
            bad = [ev for i, ev in enumerate(guard_events) if not _in_allowed_span(base + i)]
            if bad:
                raise HostSyncError(getattr(bad[0], "site", "?"),
                                    f"CPU-only: library guard `{getattr(bad[0], 'guard', '?')}` "
                                    f"would sync on a GPU; {len(bad)} such sync(s) in the region")


no_syncs = checked_region


@contextlib.contextmanager
def allow_sync():
    """An intended sync inside a checked region (the escape hatch, like vLLM's). Syncs here are not
    errors and are not counted by an enclosing count_syncs (they are tallied in
    SyncReport.allowed). Outside any region it does nothing."""
    span = [_guard_clock(), None]
    if getattr(_state, "regions", 0):
        _spans().append(span)
    try:
        with _push("allow"):
            yield
    finally:
        span[1] = _guard_clock()
