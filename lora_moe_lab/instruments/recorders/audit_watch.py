"""What the sync audit watches, and how it names the line: the dispatcher's view of a forward.

Two interceptions run together over an audited call:

* a `TorchDispatchMode` sees every aten op torch runs, including the ones torch's own C++ calls
  from inside a Python-level op. That is where the hidden syncs live: indexing with a 0-d device
  tensor (`w[expert_idx]`) makes torch's C++ indexing call `.item()`, i.e. `aten._local_scalar_dense`,
  which no Python-level hook ever sees. `classify_aten` names the aten ops that make the host wait
  on a CUDA device (ATEN_SYNCS) and how many syncs CUDA makes in each.
* a `TorchFunctionMode` sees the Python-level torch call in flight (`Tensor.__getitem__`,
  `F.one_hot`, `Tensor.tolist`) and labels the aten syncs inside it, so a row reads
  "Tensor.__getitem__ with a 0-d tensor index -> .item()". It also classifies the calls whose sync
  is not an aten op on a CPU-only machine (`.cpu()`, `.tolist()`, an upload: `classify`).

On a GPU, torch's sync debug mode runs beside them and is the count: every sync it reports inside
a Python-level call is matched with the aten syncs predicted there; any it reports beyond them is
kind `other`. On a CPU the predictions are the count (what a GPU would do), except the checks that
only the CPU makes (`F.one_hot` reads its input's min and max on the CPU; CUDA relies on a device
assert): those are listed apart as CPU-only.

Sites: the innermost frame outside torch, triton, the standard library and the tooling, *including*
installed packages, shown relative to its import root (`transformers/models/qwen3_moe/
modeling_qwen3_moe.py:237`); `called_from` is the innermost frame of the user's own code (outside
site-packages too). `focus="transformers"` sites every sync at its innermost frame in that package;
`focus="user"` collapses to the user's frames.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import linecache
import os
import sys
import sysconfig
import time
import warnings

import torch
from torch.utils.weak import WeakIdKeyDictionary
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from . import sync_check, syncs

__all__ = ["KINDS", "DEBUG_MODE_KINDS", "ATEN_SYNCS", "classify", "classify_aten", "Sites", "Watch", "Event",
           "FocusError", "AuditInternalError"]

KINDS = {
    "item": ".item() / bool() / int() / float(): reads one device value",
    "index0d": "a 0-d device tensor used as an index (w[expert_idx]): torch's C++ indexing calls .item()",
    "tolist": ".tolist(): reads a device tensor into Python",
    "d2h": ".cpu() / .numpy() / print: a blocking device-to-host copy",
    "upload": "a blocking host-to-device copy: torch.tensor(data, device=...), .to(device), a list index",
    "shape": "data-dependent shape (nonzero, where(cond), mask indexing, unique, bincount, equal, "
    "repeat_interleave without output_size)",
    "pageable": "non_blocking copy from pageable host memory (runs synchronously; not in the debug mode)",
    "synchronize": "stream / event / device synchronize (not in the debug mode)",
    "allocator": "caching-allocator growth / empty_cache (cudaMalloc, cudaFree; not in the debug mode)",
    "other": "seen only by torch's sync debug mode (GPU): a sync no rule above explains",
}
# the kinds torch's sync debug mode counts on a GPU (the others it does not see)
DEBUG_MODE_KINDS = frozenset({"item", "index0d", "tolist", "d2h", "upload", "shape", "other"})


class FocusError(ValueError):
    """A `focus=` package that is not installed (or not importable as a package)."""


class AuditInternalError(RuntimeError):
    """The audit's own machinery failed while watching a call (a rule, a site lookup): never the
    audited code's error. `__cause__` is the original exception."""


# --- aten ops that make the host wait on CUDA --------------------------------------------------------
# overload packet -> syncs CUDA makes in one call (torch's CUDA kernels: a memcpy_and_sync or a stream
# sync to read a count or a value back). bincount reads its input's min and max back (two .cpu()s);
# unique and masked_select read their output size; equal reads one bool.
ATEN_SYNCS = {
    "_local_scalar_dense": ("item", 1),
    "nonzero": ("shape", 1),
    "masked_select": ("shape", 1),
    "_unique": ("shape", 1),
    "_unique2": ("shape", 1),
    "unique_dim": ("shape", 1),
    "unique_consecutive": ("shape", 1),
    "unique_dim_consecutive": ("shape", 1),
    "bincount": ("shape", 2),
    "equal": ("shape", 1),
}
_INDEX_OPS = {"index", "index_put", "index_put_", "_index_put_impl_"}
_COPY_OPS = {"_to_copy", "copy_", "_copy_from", "_copy_from_and_resize"}


def _is_mask(t) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8)


def classify_aten(func, args, kwargs, device_type: str) -> tuple[str, int, str] | None:
    """(kind, syncs on CUDA, aten op name) when this aten op would block the host on a CUDA device,
    else None. `device_type` is where the audited tensors live ("cuda", or "cpu" on a CPU-only
    machine: the op is then judged as the same op on CUDA would be)."""
    name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else getattr(func, "__name__", "")
    first = args[0] if args else None
    on_dev = isinstance(first, torch.Tensor) and first.device.type == device_type
    if name in ATEN_SYNCS:
        kind, n = ATEN_SYNCS[name]
        if name == "bincount" and on_dev and first.dtype == torch.uint8:
            n = 1  # no min check for unsigned input
        return (kind, n, name) if on_dev else None
    if name == "repeat_interleave":
        if kwargs.get("output_size") is None and (len(args) < 3 or args[2] is None):
            reps = first if len(args) == 1 or not isinstance(args[1], torch.Tensor) else args[1]
            if isinstance(reps, torch.Tensor) and reps.device.type == device_type and reps.numel() > 1:
                return "shape", 1, name
        return None
    if name == "histc" and on_dev:
        lo = args[2] if len(args) > 2 else kwargs.get("min", 0)
        hi = args[3] if len(args) > 3 else kwargs.get("max", 0)
        return ("shape", 2, name) if lo == hi and first.numel() else None  # reads min and max back
    if name == "_grouped_mm" and on_dev and first.dtype != torch.bfloat16:
        # CUDA's grouped GEMM runs bf16 natively (sm90); other dtypes take ATen's fallback, which reads
        # the group offsets back to the host to loop over the groups: one sync per call
        return "d2h", 1, "_grouped_mm (non-bf16 fallback reads its offsets)"
    if name in _INDEX_OPS and on_dev and len(args) > 1:
        idx = [t for t in (args[1] or ()) if t is not None]
        if any(_is_mask(t) for t in idx):
            return "shape", 1, f"{name} (bool mask)"
        if device_type == "cuda" and any(t.device.type == "cpu" and t.dim() > 0 for t in idx):
            return "upload", 1, f"{name} (host index tensor)"
        return None
    if name in _COPY_OPS and device_type == "cuda":
        return _classify_copy_aten(name, args, kwargs)
    return None


def _classify_copy_aten(name, args, kwargs):
    if name == "_to_copy":
        src = args[0]
        dev = kwargs.get("device")
        if dev is None or not isinstance(src, torch.Tensor):
            return None
        dst_type = torch.device(dev).type
        src_type = src.device.type
    else:  # copy_(self=dst, src, non_blocking); _copy_from(self=src, dst, non_blocking); ..._and_resize(src, dst)
        if len(args) < 2 or not all(isinstance(a, torch.Tensor) for a in args[:2]):
            return None
        src, dst = (args[1], args[0]) if name == "copy_" else (args[0], args[1])
        dst_type, src_type = dst.device.type, src.device.type
    nb = kwargs.get("non_blocking", False) or (name in ("copy_", "_copy_from") and len(args) > 2 and args[2] is True)
    if src.numel() == 0:
        return None  # ATen's copy_ returns before any CUDA call when there is nothing to copy: no sync
    if src_type == "cuda" and dst_type == "cpu" and not nb:
        return "d2h", 1, name
    if src_type == "cpu" and dst_type == "cuda" and not nb:
        return "upload", 1, name
    return None  # non_blocking: the pageable case is the Python-level rule's (not in the debug mode)


# --- Python-level rules: a CPU-only machine's view of the calls whose sync is no aten op there --------
_ITEM = {"item", "__bool__", "__int__", "__float__", "__index__", "__complex__"}
_D2H = {"cpu", "numpy", "__repr__", "__format__", "__str__"}
_SHAPE = {"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "bincount"}
_COPIES = {f: n for f, n in sync_check.COPY_FUNCS}
_NEW_FROM_DATA = {"tensor", "as_tensor", "asarray"}
_FACTORIES = _NEW_FROM_DATA | {"arange", "zeros", "ones", "empty", "full", "rand", "randn", "randint", "linspace",
                               "from_numpy"}
_FORMAT = ("__repr__", "__format__", "__str__")


def _tensors(a):
    if isinstance(a, torch.Tensor):
        yield a
    elif isinstance(a, (tuple, list)):
        for b in a:
            yield from _tensors(b)


def _bool_index(idx) -> bool:
    return any(t.dtype == torch.bool and t.dim() > 0 for t in _tensors(idx))


def _list_index(idx) -> bool:
    """A Python list (or a tuple holding one) as an index: torch builds a host tensor and uploads it."""
    items = idx if isinstance(idx, tuple) else (idx,)
    return any(isinstance(i, list) and len(i) and all(isinstance(v, (int, bool)) for v in i) for i in items)


def classify(func, args, kwargs, device_type: str) -> tuple[str, str] | None:
    """(kind, op) when this Python-level torch call would block the host on a device of `device_type`,
    else None. Decided from the call's arguments before it runs. (The aten view, `classify_aten`, sees
    the syncs torch makes inside a call; this one names the call.)"""
    name = getattr(func, "__name__", "")
    first = next(_tensors(args[:1]), None) if args else None
    on_dev = first is not None and first.device.type == device_type
    if name in _ITEM:
        return ("item", name) if on_dev else None
    if name == "tolist" or name in ("cpu", "numpy"):  # a copy to the host: none for 0 elements
        return ("tolist" if name == "tolist" else "d2h", name) if on_dev and first.numel() else None
    if name in _D2H:
        return ("d2h", name) if on_dev else None
    if name in _SHAPE:
        return ("shape", name) if on_dev else None
    if name == "where" and len(args) + len(kwargs) == 1:
        return ("shape", "where(cond)") if on_dev else None
    if name in ("__getitem__", "__setitem__", "index_put", "index_put_") and len(args) > 1:
        if on_dev and _bool_index(args[1]):
            return "shape", f"{name}[bool mask]"
        if on_dev and _list_index(args[1]):
            return "upload", f"{name}[python list]"
        return None
    if name == "repeat_interleave" and kwargs.get("output_size") is None:
        reps = args[0] if len(args) == 1 else (args[1] if len(args) > 1 else kwargs.get("repeats"))
        if isinstance(reps, torch.Tensor) and reps.device.type == device_type and reps.numel() > 1:
            return "shape", "repeat_interleave (no output_size)"
        return None
    if func in _COPIES:
        return _classify_copy(func, _COPIES[func], args, kwargs, device_type)
    return None


def _classify_copy(func, op, args, kwargs, device_type):
    if device_type == "cuda":  # blocking copies are aten ops there (classify_aten); this is the pageable one
        return ("pageable", op) if sync_check.pageable_upload(func, args, kwargs) is not None else None
    # CPU-only machine: a non_blocking copy_ from an unpinned tensor is the upload it would be
    if op == "Tensor.copy_" and len(args) > 1 and isinstance(args[1], torch.Tensor):
        nb = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
        return ("pageable", op) if nb and not args[1].is_pinned() else None
    return None


def _uploaded(args, out) -> bool:
    """A constructor from host data whose result landed on a CUDA device, with bytes to copy."""
    data = args[0] if args else None
    return (isinstance(out, torch.Tensor) and out.is_cuda and out.numel() > 0
            and not isinstance(data, torch.Tensor))


def _target_device(func, args, kwargs):
    """The device a `.to(...)` / `.cuda()` moves to, or None (a dtype-only `.to`)."""
    if _COPIES.get(func) == "Tensor.cuda":
        return torch.device("cuda")
    if _COPIES.get(func) != "Tensor.to":
        return None
    for a in list(args[1:]) + [kwargs.get("device")]:
        if isinstance(a, (str, torch.device)):
            return torch.device(a)
        if isinstance(a, torch.Tensor):
            return a.device
    return None


# --- sites ---------------------------------------------------------------------------------------------
def _roots() -> list[str]:
    """Import roots, longest first: a file under one is shown relative to it (its package path)."""
    rs = {os.path.normpath(p) for p in sys.path if p and os.path.isdir(p)}
    for key in ("purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            rs.add(os.path.normpath(p))
    return sorted(rs, key=len, reverse=True)


def _no_site_dirs() -> tuple[str, ...]:
    """torch, triton and the standard library: never a site (the tooling's files are syncs.tool_file)."""
    dirs = {os.path.dirname(torch.__file__), os.path.dirname(os.__file__)}
    try:
        import triton

        dirs.add(os.path.dirname(triton.__file__))
    except Exception:  # pragma: no cover
        pass
    return tuple(os.path.normpath(d) + os.sep for d in dirs)


_NO_SITE = _no_site_dirs()


def package_dir(name: str) -> str:
    """The directory of an installed package (for focus=); FocusError when there is none."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as e:
        raise FocusError(f"focus={name!r}: cannot find that package ({type(e).__name__}: {e})") from e
    if spec is None or not spec.submodule_search_locations:
        raise FocusError(f"focus={name!r}: no installed package of that name (python {sys.executable})")
    return os.path.normpath(list(spec.submodule_search_locations)[0]) + os.sep


class Sites:
    """Where a sync is shown: `site` (the innermost frame outside torch and the tooling, library code
    included, or the innermost in the `focus` package), `called_from` (the innermost user frame)."""

    def __init__(self, focus: str | None = None):
        self.focus = focus
        self.focus_dir = None if focus in (None, "user") else package_dir(focus)
        self.roots = _roots()
        self._rel: dict[str, str] = {}

    def rel(self, filename: str) -> str:
        """An installed package's file relative to its site directory (`transformers/...`); the user's
        own file relative to the working directory; else relative to the deepest import root."""
        r = self._rel.get(filename)
        if r is None:
            f = os.path.normpath(filename)
            cwd = os.getcwd()
            sites = [p for p in self.roots if os.path.basename(p) in ("site-packages", "dist-packages")]
            base = next((p for p in sites if f.startswith(p + os.sep)), None)
            if base is None and f.startswith(cwd + os.sep):
                base = cwd
            if base is None:
                base = next((p for p in self.roots if f.startswith(p + os.sep)), None)
            r = os.path.relpath(f, base).replace(os.sep, "/") if base else os.path.basename(f)
            self._rel[filename] = r
        return r

    @staticmethod
    def _skip(fn: str) -> bool:
        if not fn or fn.startswith("<frozen") or fn == "<string>":
            return True
        f = os.path.normpath(fn)
        return f in syncs._TOOL_FILES or f.startswith(_NO_SITE)

    def locate(self, frame) -> tuple[str, str, str, str]:
        """(site, function, called_from, code) of the frame that made the call, walking outwards."""
        lib = user = focus = None
        f = frame
        while f is not None and (lib is None or user is None or (self.focus_dir and focus is None)):
            fn = f.f_code.co_filename
            if not self._skip(fn):
                lib = lib or f
                if self.focus_dir and focus is None and os.path.normpath(fn).startswith(self.focus_dir):
                    focus = f
                if user is None and syncs._is_user_file(fn):
                    user = f
            f = f.f_back
        lib = lib or frame
        user = user or lib
        at = user if self.focus == "user" else (focus or lib)
        site = f"{self.rel(at.f_code.co_filename)}:{at.f_lineno}"
        called = f"{self.rel(user.f_code.co_filename)}:{user.f_lineno}"
        code = linecache.getline(at.f_code.co_filename, at.f_lineno).strip()
        return site, syncs.frame_function(at), called, code


# --- the watch: both modes and the debug mode's warnings over one audited call -------------------------
@dataclasses.dataclass
class Event:
    kind: str
    op: str
    site: str
    function: str
    called_from: str
    code: str
    t0: int
    t1: int
    cpu_only: bool = False
    aten: str = ""


def _label(py: str, aten: str, kind: str) -> str:
    if kind == "index0d":
        return f"Tensor.{py} with a 0-d tensor index -> .item()"
    if not py:
        return f"aten.{aten}"
    return py if aten in ("", py) else f"{py} -> aten.{aten}"


class _Call:
    __slots__ = ("name", "func", "args", "kwargs", "frame", "preds", "warn0", "t0")

    def __init__(self, name, func, args, kwargs, frame, warn0):
        self.name, self.func, self.args, self.kwargs, self.frame = name, func, args, kwargs, frame
        self.preds: list[tuple[str, int, str, tuple]] = []  # (kind, n, aten, located) of aten syncs inside
        self.warn0, self.t0 = warn0, time.perf_counter_ns()


class Watch:
    """Watches one audited call: events (syncs the audit counts) and cpu_only (checks only a CPU makes).
    `mark`: wrap each predicted aten sync in a profiler range `audit_sync_<n>` (marks[n] = (site, kind))."""

    def __init__(self, device_type: str, sites: Sites, mark: bool = False, watch_alloc: bool = False):
        self.dev, self.sites, self.mark, self.watch_alloc = device_type, sites, mark, watch_alloc
        self.events: list[Event] = []
        self.cpu_only: list[Event] = []
        self.marks: list[tuple[str, str]] = []
        self.stack: list[_Call] = []
        self.warns = 0  # sync debug mode warnings seen (GPU): torch's own count of the region
        self.mismatch: list[str] = []
        self.pending = 0  # top-level aten syncs whose debug-mode warnings have not arrived yet
        # CPU only: tensors a GPU run keeps on the host, keyed by identity. A WeakSet would compare a
        # tensor with `==` on a hash collision: an elementwise op, and `bool()` of its result is a
        # phantom .item() (0-d) or an error (more than one element) in the audited call.
        self.host_born = WeakIdKeyDictionary()
        self.busy = False  # inside the audit's own code: torch calls made there are not the forward's
        self.internal: AuditInternalError | None = None  # the first failure of the audit's own code
        self._own = _Own(self)
        self._fm, self._dm = _FunctionSide(self), _DispatchSide(self)

    # -- entering / leaving
    def __enter__(self):
        self._fm.__enter__()
        self._dm.__enter__()
        return self

    def __exit__(self, *exc):
        self._dm.__exit__(*exc)
        self._fm.__exit__(*exc)
        return False

    def on_warning(self, frame) -> None:
        """A sync debug mode warning (GPU): one sync torch made."""
        self.warns += 1
        if not self.stack:
            if self.pending:
                self.pending -= 1
            else:
                t = time.perf_counter_ns()
                self._emit("other", "sync debug mode", self.sites.locate(frame), t, t)

    def _emit(self, kind, op, located, t0, t1, cpu_only=False, aten=""):
        site, fn, called, code = located
        ev = Event(kind, op, site, fn, called, code, t0, t1, cpu_only, aten)
        (self.cpu_only if cpu_only else self.events).append(ev)
        return ev

    def is_host(self, t) -> bool:
        if not isinstance(t, torch.Tensor):
            return False
        return t in self.host_born or (t._base is not None and t._base in self.host_born)

    def own(self, what: str) -> "_Own":
        """`with w.own("..."):` the audit's own code: its torch calls pass unwatched, and an exception
        there becomes an AuditInternalError (recorded, so a forward that catches it cannot hide it)."""
        self._own.what = what
        return self._own


class _Own:
    __slots__ = ("w", "what", "prev")

    def __init__(self, w: Watch):
        self.w, self.what, self.prev = w, "", False

    def __enter__(self):
        self.prev, self.w.busy = self.w.busy, True

    def __exit__(self, et, e, tb):
        self.w.busy = self.prev
        if et is None or not issubclass(et, Exception) or isinstance(e, AuditInternalError):
            return False  # a BaseException (the audit's deadline, KeyboardInterrupt) passes as itself
        err = AuditInternalError(f"the sync audit's own {self.what} failed ({et.__name__}: {e}); this is a bug "
                                 "of the audit, not of the audited code")
        self.w.internal = self.w.internal or err
        raise err from e


class _DispatchSide(TorchDispatchMode):
    def __init__(self, w: Watch):
        super().__init__()
        self.w = w

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        w = self.w
        if w.busy:
            return func(*args, **kwargs)
        with w.own("aten rule"):
            hit = classify_aten(func, args, kwargs, w.dev)
            if hit is not None and w.dev == "cpu" and w.is_host(args[0]):
                hit = None  # a host-side metadata tensor: on a GPU it stays on the host, nothing to wait for
        if hit is None:
            return func(*args, **kwargs)
        with w.own("site lookup"):
            kind, n, aten = hit
            call = w.stack[-1] if w.stack else None
            if kind == "item" and call is not None and call.name in ("__getitem__", "__setitem__"):
                kind = "index0d"
            located = w.sites.locate(sys._getframe(1))
            rng = None
            if w.mark:
                rng = torch.profiler.record_function(f"audit_sync_{len(w.marks)}")
                w.marks.append((located[0], kind))
                rng.__enter__()
        warn0, t0 = w.warns, time.perf_counter_ns()
        try:
            out = func(*args, **kwargs)
        finally:
            if rng is not None:
                rng.__exit__(None, None, None)
        t1 = time.perf_counter_ns()
        if call is not None:
            call.preds.append((kind, n, aten, located, t0, t1))
        else:  # outside any Python-level torch call (e.g. torch.ops from a library)
            with w.own("event record"):
                for _ in range(n):
                    w._emit(kind, f"aten.{aten}", located, t0, t1, aten=aten)
                if w.dev == "cuda":
                    w.pending += max(0, n - (w.warns - warn0))
        return out


class _FunctionSide(TorchFunctionMode):
    def __init__(self, w: Watch):
        super().__init__()
        self.w = w

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        w = self.w
        if w.busy:
            return func(*args, **kwargs)
        with w.own("call record"):
            name = getattr(func, "__name__", "") or str(func)
            call = _Call(name, func, args, kwargs, sys._getframe(1), w.warns)
            before = torch.cuda.memory_reserved() if w.watch_alloc else 0
        w.stack.append(call)
        try:
            out = func(*args, **kwargs)
        finally:
            w.stack.pop()
        t1 = time.perf_counter_ns()
        with w.own(f"rules for {name}"):
            self._settle(call, out, t1)
            if w.watch_alloc and torch.cuda.memory_reserved() > before:  # cudaMalloc inside this call
                w._emit("allocator", f"{name} (reserved memory grew)", w.sites.locate(call.frame), call.t0, t1)
        return out

    def _settle(self, call: _Call, out, t1: int) -> None:
        """The syncs of one Python-level call: its aten predictions, matched on a GPU with what torch's
        debug mode saw inside it; on a CPU the Python-level rule where no aten op shows the sync."""
        w = self.w
        name, preds = call.name, call.preds
        py = classify(call.func, call.args, call.kwargs, w.dev)
        if w.dev == "cpu":
            py = self._cpu_rules(call, py, out)
        if py is not None and py[0] == "pageable":
            w._emit("pageable", py[1], w.sites.locate(call.frame), call.t0, t1)
            py = None
        if w.dev == "cpu" and name == "one_hot":  # CPU-only range checks (CUDA: a device assert)
            nc = call.args[1] if len(call.args) > 1 else call.kwargs.get("num_classes", -1)
            keep = 1 if nc == -1 else 0  # CUDA reads the max back to size the output only without num_classes
            for i, (kind, n, aten, loc, t0, t_1) in enumerate(preds):
                counted = i >= len(preds) - keep
                w._emit(kind, "one_hot -> .item()" + ("" if counted else " (CPU-only range check)"), loc, t0, t_1,
                        cpu_only=not counted, aten=aten)
            return
        if w.dev == "cpu" and name in _FORMAT and (preds or py):
            w._emit("d2h", name, w.sites.locate(call.frame), call.t0, t1)  # one copy, then host formatting
            return
        relabel = "tolist" if py and py[0] == "tolist" else ("d2h" if name in _FORMAT else None)
        expanded = [(relabel or k, a, loc, t0, t_1) for k, n, a, loc, t0, t_1 in preds for _ in range(n)]
        if not expanded and py is not None:
            expanded = [(py[0], "", w.sites.locate(call.frame), call.t0, t1)]
        if not expanded and w.dev == "cuda" and name in _NEW_FROM_DATA and _uploaded(call.args, out):
            # torch.tensor(data, device="cuda"): the host buffer is copied inside torch's constructor,
            # below the dispatcher's Python key: no aten op shows it
            expanded = [("upload", "", w.sites.locate(call.frame), call.t0, t1)]
        if w.dev == "cuda":
            seen = w.warns - call.warn0
            if seen < len(expanded):
                w.mismatch.append(f"{name} at {expanded[0][2][0]}: {len(expanded)} predicted, torch saw {seen}")
                expanded = expanded[:seen]
            extra = seen - len(expanded)
        else:
            extra = 0
        for kind, aten, loc, t0, t_1 in expanded:
            w._emit(kind, _label(name, aten, kind), loc, t0, t_1, aten=aten)
        if extra > 0:
            loc = w.sites.locate(call.frame)
            for _ in range(extra):
                w._emit("other", f"{name} (sync debug mode)", loc, call.t0, t1)

    def _cpu_rules(self, call: _Call, py, out):
        """CPU-only machine: which tensors a GPU run would keep on the host, and the uploads."""
        w, name, args, kwargs = self.w, call.name, call.args, call.kwargs
        ts = list(_tensors(list(args) + list(kwargs.values())))
        if py is not None and ts and w.is_host(ts[0]) and py[0] in ("item", "tolist", "d2h", "shape"):
            py = None  # host metadata: no device to wait for
        target = _target_device(call.func, args, kwargs)
        if name in _FACTORIES:
            dev = kwargs.get("device")
            if dev is None:
                self._mark_host(out)
            elif name in _NEW_FROM_DATA and not isinstance(args[0] if args else None, torch.Tensor):
                # 0 bytes (torch.tensor([], device=...)): no copy is issued, no sync
                return ("upload", f"torch.{name}(data, device=...)") if _numel(out) else None
        elif name == "new_tensor" and ts and not w.is_host(ts[0]):
            return ("upload", "Tensor.new_tensor(data)") if _numel(out) else None
        elif target is not None and ts and w.is_host(ts[0]):
            if not ts[0].numel():
                return None  # an empty upload copies nothing
            nb = kwargs.get("non_blocking", False) or any(a is True for a in args[1:])
            if nb and not ts[0].is_pinned():
                return "pageable", "Tensor.to(device, non_blocking=True) of pageable memory"
            return None if nb else ("upload", f"{name}(device) of a host tensor")
        elif ts and all(w.is_host(t) for t in ts) and target is None:
            self._mark_host(out)
        return py

    def _mark_host(self, out) -> None:
        for t in _tensors(out if isinstance(out, (tuple, list)) else [out]):
            self.w.host_born[t] = True


def _numel(t) -> int:
    return t.numel() if isinstance(t, torch.Tensor) else 1


class _WarningHook:
    """torch's sync debug mode ("warn") over the region, each warning handed to the watch with its frame."""

    def __init__(self, watch: Watch):
        self.watch = watch

    def __enter__(self):
        self._cw = warnings.catch_warnings()
        self._cw.__enter__()
        warnings.filterwarnings("always", message=".*" + syncs._TORCH_SYNC_MSG)
        prev = warnings.showwarning

        def hook(message, category, filename, lineno, file=None, line=None):
            if syncs._TORCH_SYNC_MSG in str(message):
                self.watch.on_warning(sys._getframe(1))
            else:
                prev(message, category, filename, lineno, file, line)

        warnings.showwarning = hook
        self._mode = syncs._push("warn")
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)
        self._cw.__exit__(*exc)
        return False


def debug_mode_hook(watch: Watch) -> _WarningHook:
    return _WarningHook(watch)


syncs.tool_file(__file__)
