"""A sync audit for any PyTorch forward: every host-device sync, its line, its kind, its cost.

    rep = audit(model, x, warmup=1, reps=2)       # a callable and its arguments
    rep.table()                                   # one row per (site, kind), sorted by cost
    print(rep.summary())
    with audit() as rep:                          # or a block (run once, no warm-up)
        model(x)

    python -m lora_moe_lab.audit mypkg.models:forward --inputs mypkg.models:make_inputs  # priced: lora_moe_lab/audit.py
    python -m lora_moe_lab.instruments.recorders.audit mypkg.models:forward --timeout 60  # the same, not priced

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

On a CPU-only machine (or device="cpu") there is no device: the audit counts and locates the calls
that WOULD sync on a GPU. Tensors a factory makes without `device=` (and what is computed from them
only) are host metadata a GPU run keeps on the host: not counted (audit_watch.Watch keeps them by
identity). An empty copy counts 0 (no bytes, no sync). Times are marked CPU, nothing is estimated.

Failures: the audited code's exceptions pass unchanged (a note names the call); the audit's own are
AuditInternalError; `timeout_s=` stops a call that has not returned with AuditTimeout and the syncs
seen so far (audit_deadline.py); `graph_breaks=True` adds the graph-break view (audit_graph.py).

Limits: torch calls only (a C extension that syncs inside is seen on a GPU by the debug mode,
with the site of the torch call that led to it, or by the profiler, unattributed); one thread.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import os
import sys
import time
import warnings
from collections import defaultdict
from typing import Callable

import torch

from . import syncs
from .audit_deadline import Deadline, Expired, check_timeout
from .audit_report import NOT_ESTIMATED, AuditReport, SyncEventRecord  # noqa: F401  (re-exported)
from .audit_watch import KINDS, AuditInternalError, FocusError, Sites, Watch, classify, debug_mode_hook

__all__ = [
    "audit",
    "AuditReport",
    "SyncEventRecord",
    "KINDS",
    "AuditError",
    "NotCallableError",
    "SpecError",
    "AuditTimeout",
    "AuditInternalError",
    "NoCudaWork",
    "FocusError",
    "classify",
    "main",
]

class AuditError(ValueError):
    """Bad input to audit(): not a callable, reps or warmup out of range, a focus not installed."""


class NotCallableError(AuditError, TypeError):
    """What audit() was handed to call is not callable."""


class SpecError(AuditError):
    """A `module:callable` spec that does not name an importable callable."""


class AuditTimeout(TimeoutError):
    """An audited call that had not returned by its deadline (`timeout_s=`), stopped. `report`: the
    AuditReport of the syncs seen so far (the calls that finished, and the stopped call's so far)."""

    def __init__(self, msg: str, report: "AuditReport"):
        super().__init__(msg)
        self.report = report


class NoCudaWork(UserWarning):
    """The audited forward launched no CUDA work on a GPU machine."""


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


def _check(fn, warmup, reps, timeout_s=None):
    if not callable(fn):
        raise NotCallableError(f"audit needs a callable (a forward), got {type(fn).__name__}: {fn!r:.80}")
    for n, v, lo in (("warmup", warmup, 0), ("reps", reps, 1)):
        if not isinstance(v, int) or isinstance(v, bool) or v < lo:
            raise AuditError(f"{n} must be an int >= {lo}, got {v!r}")
    try:
        return check_timeout(timeout_s)
    except ValueError as e:
        raise AuditError(str(e)) from None


def _timed_out(rep: "AuditReport", seconds: float, what: str) -> AuditTimeout:
    kinds = ", ".join(f"{k} {int(v * rep.reps)}" for k, v in rep.kinds.most_common()) or "none"
    watched = "" if "audited" in what else " (a warm-up call is not watched: warmup=0 watches from the start)"
    return AuditTimeout(
        f"the {what} did not return within {seconds:g} s and was stopped; {len(rep.events)} sync(s) seen so far "
        f"({kinds}){watched}: the exception's .report holds them", rep)


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
        """Watch one call. The syncs seen are taken into the report however the call ends (a stopped
        call's so far); a failure of the audit's own code is raised as that, whatever the call did."""
        self.cur, self.t_call = i, time.perf_counter_ns()
        cuda = self.rep.device == "cuda"
        w = Watch(self.rep.device, self.sites, watch_alloc=cuda)

        def on_call(kind, op, frame, t0, t1):
            w._emit(kind, op, self.sites.locate(frame), t0, t1)

        try:
            with contextlib.ExitStack() as st:
                if cuda:
                    st.enter_context(debug_mode_hook(w))
                st.enter_context(_patched_syncs(on_call))
                st.enter_context(w)
                yield
        except BaseException as e:
            self._take(w)
            if w.internal is not None and e is not w.internal:
                raise w.internal  # the forward caught it and raised something else
            raise
        self._take(w)
        if w.internal is not None:  # the forward caught it and went on: still the audit's failure
            raise w.internal
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
    timeout_s: float | None = None,
    graph_breaks: bool = False,
    **kw,
):
    """Audit `fn(*args, **kw)`: `warmup` plain calls, `reps` detection calls, then (on CUDA, with
    `profile`) one profiled call. Returns an AuditReport. Without `fn`: a context manager that
    audits its block once (detection only) and yields the report.
    `focus`: None (each sync at the innermost frame outside torch, installed packages included), a
    package name ("transformers": its innermost frame there) or "user" (the user's own frame).
    `estimator`: the saving estimator of the profiled call (None: no price; lora_moe_lab.audit.audit passes the
    replay engine's, sim/sync_savings.estimate).
    `timeout_s`: each call of `fn` that has not returned after that many seconds is stopped, and
    AuditTimeout is raised with the syncs seen so far (`.report`); audit_deadline.py says what cannot be
    stopped (one C call that never returns).
    `graph_breaks`: also trace one call with torch._dynamo.explain and say, per sync site, whether it breaks
    a torch.compile(fullgraph=True) graph (`rep.graph_break_table()`; audit_graph.py; costly, off by default).
    An exception of `fn` propagates unchanged (its own traceback, a note added); a failure of the
    audit's own code is an AuditInternalError, never reported as `fn`'s."""
    if fn is None:
        if args or kw:
            raise AuditError(
                "audit() as a context manager takes no arguments for a forward: "
                "use `with audit() as rep:` or audit(fn, *args)"
            )
        if timeout_s is not None:
            raise AuditError("timeout_s needs a callable: audit(fn, *args, timeout_s=...), not a `with audit()` block")
        return _block(device, warmup, focus)
    timeout_s = _check(fn, warmup, reps, timeout_s)
    if not isinstance(graph_breaks, bool):
        raise AuditError(f"graph_breaks must be True or False, got {graph_breaks!r}")
    s = _Session(device, reps, focus, estimator)

    def call(what: str):
        try:
            with Deadline(timeout_s):
                return fn(*args, **kw)
        except Expired:
            raise _timed_out(s.rep, timeout_s, what) from None
        except (AuditInternalError, AuditTimeout):
            raise
        except Exception as e:
            _reraise_note(e, what)
            raise

    t_start = time.perf_counter()
    plain = []  # the forward's own wall time, from the plain warm-up calls
    for i in range(warmup):
        t0 = time.perf_counter()
        call(f"warm-up call {i + 1}")
        plain.append(time.perf_counter() - t0)
    for i in range(reps):
        try:
            with s.detecting(i):
                call(f"audited call {i + 1}")
        except AuditTimeout as e:
            raise _timed_out(s.rep, timeout_s, f"audited call {i + 1}") from e.__cause__
    n_calls = warmup + reps
    if graph_breaks:
        from .audit_graph import explain_breaks

        s.rep.graph_breaks = explain_breaks(fn, args, kw, s.sites.rel)
        n_calls += 1
    if s.rep.device == "cuda" and profile:
        s.profile(lambda: call("profiled call"))
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


# Exit status of the command line: 0 the report was printed; 2 bad input (a spec that names no callable, a focus
# package not installed, a count out of range), the named error on stderr; 3 the timeout (the syncs seen so far on
# stdout); 4 a failure of the audit's own code. An exception of the audited callable (or of its input factory) is
# its own: Python's traceback, exit status 1.
EXIT_BAD_INPUT, EXIT_TIMEOUT, EXIT_INTERNAL = 2, 3, 4


def parser(prog: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=prog,
        description=(
            "Audit the host-device syncs of a forward: each sync's line, kind, count per call, host time "
            "blocked, GPU idle after it and (on a GPU, python -m lora_moe_lab.audit) the replay's estimate "
            "of the saving."
        ),
    )
    ap.add_argument("callable", help="module:callable to audit, e.g. mypkg.models:forward (or path/to/file.py:fn)")
    ap.add_argument("--inputs", help="module:factory returning its arguments (tuple, dict or one value)")
    ap.add_argument("--warmup", type=int, default=1, help="plain calls first (default 1)")
    ap.add_argument("--reps", type=int, default=1, help="audited calls (default 1)")
    ap.add_argument("--csv", help="write the table here")
    ap.add_argument("--focus", help="site each sync at its innermost frame in this package (e.g. transformers), "
                    "or 'user' for the caller's own lines (default: the innermost frame outside torch)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default=None,
                    help="cuda: count on the GPU; cpu: the calls that would sync on one (default: cuda if available)")
    ap.add_argument("--timeout", type=float, default=None, metavar="S",
                    help="stop a call that has not returned after S seconds and print the syncs seen so far")
    return ap


def _fail(e: BaseException, code: int) -> int:
    print(f"audit: {type(e).__name__}: {e}", file=sys.stderr)
    return code


def main(argv=None, estimator=None, prog: str = "python -m lora_moe_lab.instruments.recorders.audit") -> int:
    a = parser(prog).parse_args(argv)
    try:
        fn = resolve(a.callable)
        factory = resolve(a.inputs, "inputs") if a.inputs else None
    except AuditError as e:
        return _fail(e, EXIT_BAD_INPUT)
    args, kw = call_args(factory)
    try:
        rep = audit(fn, *args, warmup=a.warmup, reps=a.reps, focus=a.focus, estimator=estimator,
                    timeout_s=a.timeout, device=a.device, **kw)
    except (FocusError, AuditError) as e:
        return _fail(e, EXIT_BAD_INPUT)
    except AuditTimeout as e:
        print(e.report.summary())
        return _fail(e, EXIT_TIMEOUT)
    except AuditInternalError as e:
        return _fail(e, EXIT_INTERNAL)
    print(rep.summary())
    if a.csv:
        rep.table().to_csv(a.csv, index=False)
        print(f"table: {a.csv}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
