"""A sync audit for any PyTorch forward: every host-device sync, its line, its kind, its cost.

    rep = audit(model, x, warmup=1, reps=2)       # a callable and its arguments
    rep.table()                                   # one row per (site, kind), sorted by cost
    print(rep.summary())
    with audit() as rep:                          # or a block (run once, no warm-up)
        model(x)

    python -m lora_moe_lab.audit mypkg.models:forward --inputs mypkg.models:make_inputs  # priced: lora_moe_lab/audit.py

How it sees a sync. A `TorchFunctionMode` sees every torch call the forward makes (not the calls
torch makes inside them) and classifies the ones that make the host wait for the GPU (KINDS):
reading a device value (`.item()`, `bool()`/`if tensor:`, `int()`, `.tolist()`), copying to the
host (`.cpu()`, `.numpy()`, print/format), an output shape that depends on device data
(`nonzero`, `torch.where(cond)`, boolean-mask indexing, `unique`, `bincount`, `masked_select`,
`repeat_interleave` without `output_size`), a `non_blocking` upload from pageable memory
(sync_check.pageable_upload), an explicit stream/event/device `synchronize`, and the caching
allocator (`empty_cache`, and on a GPU any call after which the reserved memory grew: cudaMalloc,
cudaFree syncs the device). The call site is the innermost frame outside torch and outside the
tooling (syncs.user_frame); the host time blocked is perf_counter around the call.

On a GPU (CUDA): only calls on CUDA tensors count; torch's sync debug mode (syncs.count_syncs)
counts what torch itself synchronised per site (`torch_count`: a site the mode did not classify
is listed as kind "other"); then ONE profiled forward (profiling.profile_forwards) gives, per site, the
GPU idle after each sync (next GPU op start minus the later of the sync's start and the last GPU
op that finished before it returned), and the estimator it is handed (`estimator=`; lora_moe_lab.audit
hands it the replay engine's, sim/sync_savings.py) the forward time saved if that site's syncs were removed.

On a CPU-only machine there is no device: the audit counts and locates the calls that WOULD sync
on a GPU (on the CPU tensors: host-side metadata kept in CPU tensors is counted too, a known
false positive), times are marked CPU and nothing is estimated. A non_blocking `copy_` from an
unpinned tensor counts there (the upload it would be); a `.to(device)` does not (a no-op there).

Limits: torch calls only (a C extension that syncs inside is seen on a GPU by the debug mode,
with the site of the torch call that led to it, or by the profiler, unattributed); one thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import math
import os
import sys
import time
import warnings
from collections import Counter, defaultdict
from typing import Callable

import pandas as pd
import torch

from . import syncs
from .audit_watch import DEBUG_MODE_KINDS, KINDS, FocusError, Sites, Watch, classify, debug_mode_hook

__all__ = [
    "audit",
    "AuditReport",
    "SyncEventRecord",
    "KINDS",
    "AuditError",
    "SpecError",
    "NoCudaWork",
    "FocusError",
    "classify",
]

NOT_ESTIMATED = "not estimated"


class AuditError(ValueError):
    """Bad input to audit(): not a callable, reps or warmup out of range, a focus not installed."""


class SpecError(AuditError):
    """A `module:callable` spec that does not name an importable callable."""


class NoCudaWork(UserWarning):
    """The audited forward launched no CUDA work on a GPU machine."""


# --- results ------------------------------------------------------------------------------------
@dataclasses.dataclass
class SyncEventRecord:
    kind: str
    op: str
    site: str  # package-relative file:line of the innermost frame outside torch and the tooling
    function: str
    rep: int  # which audited call (0-based)
    t_ns: int  # perf_counter ns from the call's start
    blocked_ns: int  # perf_counter around the op
    called_from: str = ""  # the innermost frame of the user's own code
    code: str = ""  # the source line at `site`


_COLS = ["site", "function", "code", "called_from", "kind", "ops", "count_per_call", "host_blocked_us",
         "host_blocked_us_per_call", "timed_on", "gpu_idle_after_us", "saving_us", "estimate", "torch_count"]


@dataclasses.dataclass
class AuditReport:
    """What audit() saw. `events`: every sync of the detection calls; `cpu_only`: checks that only a
    CPU makes (not counted); `table()`: per line and kind, counts per call, host time blocked, GPU
    idle after and saving (both per call)."""

    device: str  # "cuda" | "cpu"
    reps: int
    events: list = dataclasses.field(default_factory=list)
    cpu_only: list = dataclasses.field(default_factory=list)
    call_ms: list = dataclasses.field(default_factory=list)  # wall time of each detection call
    torch_total: int = 0  # syncs torch's debug mode reported over the detection calls (GPU)
    mismatch: list = dataclasses.field(default_factory=list)  # predicted more than the debug mode saw
    focus: str | None = None
    gpu_idle_ns: dict = dataclasses.field(default_factory=dict)  # (site, kind) -> ns, one profiled call
    saving_ns: dict = dataclasses.field(default_factory=dict)  # (site, kind) -> ns or None
    total_saving_ns: float = math.nan
    estimate_note: str = ""
    notes: list = dataclasses.field(default_factory=list)
    trace: object = None  # TraceTables of the profiled call (CUDA)
    ranges: dict = dataclasses.field(default_factory=dict)  # (site, kind) -> [(start_ns, end_ns)] in it
    overhead_s: float = math.nan  # audit time beyond the forward's own calls

    @property
    def timed_on(self) -> str:
        return "GPU" if self.device == "cuda" else "CPU"

    @property
    def count(self) -> float:
        """Syncs per call (every kind)."""
        return len(self.events) / self.reps

    @property
    def debug_mode_count(self) -> float:
        """Syncs per call of the kinds torch's sync debug mode counts: on a GPU it equals what the
        debug mode reported (`torch_count`); on a CPU it is what it would report on a GPU."""
        return sum(e.kind in DEBUG_MODE_KINDS for e in self.events) / self.reps

    @property
    def torch_count(self) -> float:
        """Syncs per call torch's own debug mode reported (GPU; NaN on a CPU)."""
        return self.torch_total / self.reps if self.device == "cuda" else math.nan

    @property
    def sites(self) -> Counter:
        """site -> syncs per call (a site that syncs in only some calls gets a fraction)."""
        c = Counter(e.site for e in self.events)
        return Counter({k: v / self.reps for k, v in c.items()})

    @property
    def kinds(self) -> Counter:
        c = Counter(e.kind for e in self.events)
        return Counter({k: v / self.reps for k, v in c.items()})

    def table(self, cpu_only: bool = False) -> pd.DataFrame:
        """One row per (site, function, kind): count per call, host time blocked (median per
        occurrence and total per call, µs), GPU idle after (per call, µs; NaN on a CPU), the saving
        if removed (per call, µs; NaN with `estimate` = "not estimated ..." where there is none),
        `called_from` (the user's lines that led there). Sorted by saving, then GPU idle, then count.
        `cpu_only=True`: the table of the CPU-only checks instead."""
        g = defaultdict(list)
        for e in self.cpu_only if cpu_only else self.events:
            g[(e.site, e.function, e.kind)].append(e)
        rows = []
        for (site, fn, kind), evs in g.items():
            b = pd.Series([e.blocked_ns for e in evs], dtype=float) / 1e3
            sv = self.saving_ns.get((site, kind))
            rows.append(
                dict(
                    site=site,
                    function=fn,
                    code=evs[0].code,
                    called_from=", ".join(sorted({e.called_from for e in evs})),
                    kind=kind,
                    ops=", ".join(sorted({e.op for e in evs})),
                    count_per_call=len(evs) / self.reps,
                    host_blocked_us=float(b.median()),
                    host_blocked_us_per_call=float(b.sum()) / self.reps,
                    timed_on=self.timed_on,
                    gpu_idle_after_us=self.gpu_idle_ns.get((site, kind), math.nan) / 1e3,
                    saving_us=math.nan if sv is None else sv / 1e3,
                    estimate="replay" if sv is not None else self._why_not(kind),
                    torch_count=(
                        (len(evs) if kind in DEBUG_MODE_KINDS else 0) / self.reps
                        if self.device == "cuda"
                        else math.nan
                    ),
                )
            )
        df = pd.DataFrame(rows, columns=_COLS)
        if len(df):
            df = df.sort_values(
                ["saving_us", "gpu_idle_after_us", "count_per_call", "site"],
                ascending=[False, False, False, True],
                na_position="last",
                kind="stable",
            ).reset_index(drop=True)
        return df

    def _why_not(self, kind: str) -> str:
        if self.device != "cuda":
            return f"{NOT_ESTIMATED} (CPU: no device)"
        return (
            f"{NOT_ESTIMATED} ({self.estimate_note or 'no blocking runtime call of this site in the trace'})"
        )

    def summary(self, top: int = 10) -> str:
        t = self.table()
        head = (
            f"{self.count:g} host-device sync(s) per call on the {self.timed_on} "
            f"({len(t)} line/kind row(s), {self.reps} call(s) audited)"
        )
        if self.device == "cuda":
            head += f"; torch's sync debug mode counted {self.torch_count:g}"
        else:
            head += "; CPU count: the calls that would sync on a GPU, times are CPU times, nothing estimated"
        lines = [head]
        for r in t.head(top).itertuples():
            cost = (
                f"; per call, all of them: GPU idle after {r.gpu_idle_after_us:.1f} us, saving {r.saving_us:.1f} us"
                if self.device == "cuda"
                else ""
            )
            where = "" if r.called_from == r.site else f" <- {r.called_from}"
            lines.append(
                f"  {r.count_per_call:7g} x {r.kind:<11} {r.site} ({r.function}: {r.ops}){where}"
                f" blocked {r.host_blocked_us:.1f} us each [{r.timed_on}]{cost}"
            )
        if len(t) > top:
            lines.append(f"  ... {len(t) - top} more row(s)")
        if self.cpu_only:
            c = Counter(e.site for e in self.cpu_only)
            lines.append(
                f"left out: {len(self.cpu_only) / self.reps:g} CPU-only check(s) per call that a GPU does not make "
                f"({', '.join(f'{s} x{n / self.reps:g}' for s, n in c.most_common(3))})"
            )
        if self.device == "cuda" and math.isfinite(self.total_saving_ns):
            lines.append(
                f"removing every attributed sync saves {self.total_saving_ns / 1e3:.1f} us per call "
                "(replay of the profiled forward)"
            )
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __repr__(self):
        return f"AuditReport(device={self.device!r}, syncs_per_call={self.count:g}, sites={dict(self.sites)})"


# --- explicit synchronize / empty_cache (not torch functions) ------------------------------------
@contextlib.contextmanager
def _patched_syncs(on_call):
    """Explicit synchronize / empty_cache calls are not torch functions: wrap them for the region."""
    targets = [
        (torch.cuda, "synchronize", "synchronize", "torch.cuda.synchronize"),
        (torch.cuda.Stream, "synchronize", "synchronize", "Stream.synchronize"),
        (torch.cuda.Event, "synchronize", "synchronize", "Event.synchronize"),
        (torch.cuda, "empty_cache", "allocator", "torch.cuda.empty_cache"),
    ]
    saved = []
    for obj, attr, kind, op in targets:
        orig = getattr(obj, attr, None)
        if orig is None:
            continue

        def wrapper(*a, _orig=orig, _kind=kind, _op=op, **k):
            t0 = time.perf_counter_ns()
            try:
                return _orig(*a, **k)
            finally:
                on_call(_kind, _op, sys._getframe(1), t0, time.perf_counter_ns())

        saved.append((obj, attr, orig))
        setattr(obj, attr, wrapper)
    try:
        yield
    finally:
        for obj, attr, orig in reversed(saved):
            setattr(obj, attr, orig)


syncs.tool_file(__file__)  # the interception's frames are never a user's site


def _check(fn, warmup, reps):
    if not callable(fn):
        raise AuditError(f"audit needs a callable (a forward), got {type(fn).__name__}: {fn!r:.80}")
    for n, v, lo in (("warmup", warmup, 0), ("reps", reps, 1)):
        if not isinstance(v, int) or isinstance(v, bool) or v < lo:
            raise AuditError(f"{n} must be an int >= {lo}, got {v!r}")


def _reraise_note(e: BaseException, what: str) -> None:
    if hasattr(e, "add_note"):
        e.add_note(f"(raised by the audited callable during {what}; the traceback above is its own)")


class _Session:
    """One audit: detection calls (both interceptions + torch's debug mode), then the profiled call."""

    def __init__(self, device: str | None, reps: int, focus: str | None = None, estimator: Callable | None = None):
        dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if dev not in ("cuda", "cpu"):
            raise AuditError(f"device must be 'cuda', 'cpu' or None (auto), got {device!r}")
        if focus is not None and not isinstance(focus, str):
            raise AuditError(f"focus must be a package name, 'user' or None, got {focus!r}")
        self.sites = Sites(focus)  # FocusError when that package is not installed
        self.rep = AuditReport(device=dev, reps=reps, focus=focus)
        self.estimator = estimator
        self.cur, self.t_call = 0, 0

    def _take(self, w: Watch):
        for src, dst in ((w.events, self.rep.events), (w.cpu_only, self.rep.cpu_only)):
            dst.extend(SyncEventRecord(e.kind, e.op, e.site, e.function, self.cur, e.t0 - self.t_call, e.t1 - e.t0,
                                       e.called_from, e.code) for e in src)
        self.rep.torch_total += w.warns
        self.rep.mismatch += w.mismatch

    @contextlib.contextmanager
    def detecting(self, i: int):
        self.cur, self.t_call = i, time.perf_counter_ns()
        cuda = self.rep.device == "cuda"
        w = Watch(self.rep.device, self.sites, watch_alloc=cuda)

        def on_call(kind, op, frame, t0, t1):
            w._emit(kind, op, self.sites.locate(frame), t0, t1)

        with contextlib.ExitStack() as st:
            if cuda:
                st.enter_context(debug_mode_hook(w))
            st.enter_context(_patched_syncs(on_call))
            st.enter_context(w)
            yield
        self._take(w)
        if w.mismatch:
            self.rep.notes.append(f"the audit predicted more syncs than torch's debug mode saw: {w.mismatch[:3]}")
        self.rep.call_ms.append((time.perf_counter_ns() - self.t_call) / 1e6)

    def _no_work(self, tables) -> bool:
        if len(tables.kernels):
            return False
        msg = (
            "the forward launched no CUDA work (no kernel, copy or memset in the profiled call): "
            "are its tensors on the CPU? There is nothing on the GPU to sync with"
        )
        self.rep.notes.append(msg)
        warnings.warn(msg, NoCudaWork, stacklevel=5)
        return True

    def profile(self, call: Callable[[], object]):
        """ONE profiled call (CUDA): GPU idle after each site's syncs and the replay's saving."""
        from .profiling import profile_forwards

        marks = []

        def run():
            w = Watch("cuda", self.sites, mark=True)
            with _patched_syncs(lambda *a: None), w:
                call()
            marks.extend(w.marks)

        self.analyse(profile_forwards(run, n_warmup=0, n_active=1), marks)

    def analyse(self, tables, marks: list) -> None:
        """Per (site, kind) of the profiled call's `audit_sync_<n>` ranges (marks[n]): the GPU idle
        after its syncs, and the estimator's saving."""
        self.rep.trace = tables
        if self._no_work(tables):
            return
        ann = tables.annotations
        ann = ann[ann["name"].str.startswith("audit_sync_")]
        ranges = defaultdict(list)
        for r in ann.itertuples():
            i = int(r.name.rsplit("_", 1)[1])
            if i < len(marks):
                ranges[marks[i]].append((int(r.start_ns), int(r.end_ns)))
        self.rep.ranges = dict(ranges)
        k = tables.kernels.sort_values("start_ns")
        ks, ke = k["start_ns"].to_numpy(), k["end_ns"].to_numpy()
        for key, rs in ranges.items():
            idle = 0
            for s, e in rs:
                prev = ke[ke <= e].max() if (ke <= e).any() else s
                nxt = ks[ks >= e]
                if len(nxt):
                    idle += max(0, int(nxt.min()) - max(int(prev), s))
            self.rep.gpu_idle_ns[key] = idle
        est = self.estimator
        if est is None:
            self.rep.estimate_note = ("no saving estimator: lora_moe_lab.audit.audit prices with the replay engine, "
                                      "or pass audit(estimator=...)")
            return
        try:
            self.rep.saving_ns, self.rep.total_saving_ns, note = est(tables, dict(ranges))
            self.rep.estimate_note = note
        except Exception as e:  # noqa: BLE001 - an estimate that fails is reported, the audit stands
            self.rep.estimate_note = f"the replay failed: {type(e).__name__}: {e}"


def audit(
    fn: Callable | None = None,
    *args,
    warmup: int = 1,
    reps: int = 1,
    device: str | None = None,
    profile: bool = True,
    focus: str | None = None,
    estimator: Callable | None = None,
    **kw,
):
    """Audit `fn(*args, **kw)`: `warmup` plain calls, `reps` detection calls, then (on CUDA, with
    `profile`) one profiled call. Returns an AuditReport. Without `fn`: a context manager that
    audits its block once (detection only) and yields the report.
    `focus`: None (each sync at the innermost frame outside torch, installed packages included), a
    package name ("transformers": its innermost frame there) or "user" (the user's own frame).
    `estimator`: the saving estimator of the profiled call (None: no price; lora_moe_lab.audit.audit passes the
    replay engine's, sim/sync_savings.estimate).
    An exception of `fn` propagates unchanged (its own traceback, a note added)."""
    if fn is None:
        if args or kw:
            raise AuditError(
                "audit() as a context manager takes no arguments for a forward: "
                "use `with audit() as rep:` or audit(fn, *args)"
            )
        return _block(device, warmup, focus)
    _check(fn, warmup, reps)
    s = _Session(device, reps, focus, estimator)
    t_start = time.perf_counter()
    plain = []  # the forward's own wall time, from the plain warm-up calls
    for i in range(warmup):
        t0 = time.perf_counter()
        try:
            fn(*args, **kw)
        except Exception as e:
            _reraise_note(e, f"warm-up call {i + 1}")
            raise
        plain.append(time.perf_counter() - t0)
    for i in range(reps):
        try:
            with s.detecting(i):
                fn(*args, **kw)
        except Exception as e:
            _reraise_note(e, f"audited call {i + 1}")
            raise
    n_calls = warmup + reps
    if s.rep.device == "cuda" and profile:
        s.profile(lambda: fn(*args, **kw))
        n_calls += 1
    # overhead: the audit's wall time beyond the forward's own calls. The warm-up calls are plain calls
    # and count as what they took (a cold process compiles its kernels in the first one: not the
    # audit's cost); each audited call is charged the fastest plain call.
    one = min(plain) if plain else min(s.rep.call_ms) / 1e3
    s.rep.overhead_s = time.perf_counter() - t_start - sum(plain) - (n_calls - warmup) * one
    return s.rep


@contextlib.contextmanager
def _block(device, warmup, focus=None):
    if warmup not in (0, 1):  # a block runs once: warmup has no meaning there
        raise AuditError("a `with audit()` block runs once: pass no warmup/reps")
    s = _Session(device, 1, focus)
    with s.detecting(0):
        yield s.rep


# --- CLI ------------------------------------------------------------------------------------------
def resolve(spec: str, what: str = "callable"):
    """'package.module:attr.path' (or 'path/to/file.py:attr') -> the object; SpecError otherwise."""
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise SpecError(f"{what} spec {spec!r} is not 'module:name' (e.g. mypkg.models:forward)")
    mod_name, attr = spec.split(":")
    try:
        if mod_name.endswith(".py"):
            if not os.path.isfile(mod_name):
                raise SpecError(f"{what} spec {spec!r}: no file {mod_name}")
            ms = importlib.util.spec_from_file_location(os.path.basename(mod_name)[:-3], mod_name)
            mod = importlib.util.module_from_spec(ms)
            ms.loader.exec_module(mod)
        else:
            mod = importlib.import_module(mod_name)
    except SpecError:
        raise
    except Exception as e:
        raise SpecError(f"{what} spec {spec!r}: cannot import {mod_name!r} ({type(e).__name__}: {e})") from e
    obj = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise SpecError(f"{what} spec {spec!r}: {mod_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise SpecError(f"{what} spec {spec!r} names a {type(obj).__name__}, not a callable")
    return obj


def call_args(factory) -> tuple[tuple, dict]:
    """A factory's result as call arguments: a tuple -> *args, a dict -> **kwargs, (tuple, dict) ->
    both, anything else -> one argument."""
    v = factory() if factory is not None else ()
    if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], tuple) and isinstance(v[1], dict):
        return v
    if isinstance(v, tuple):
        return v, {}
    if isinstance(v, dict):
        return (), v
    return (v,), {}
