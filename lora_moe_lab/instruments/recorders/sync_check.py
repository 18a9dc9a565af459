"""A sync check with an allowlist, like vLLM's GPU sync check: fail on every host-device sync in a
region except at named sites, and on the upload that CUDA silently makes synchronous.

    with sync_check(allow=["guards.py:active"]) as chk:   # the `sync` guard's .item() is intended
        model(x, batch, tensors, guard="sync")
    chk.allowed["guards.py:active"]                        # how many syncs that entry let through

An allow entry names a site as syncs.py reports it: "file.py:LINE", or "file.py:function" (also
"file.py:Class.method"), the function whose body holds that line. When the block exits:
  * syncs at sites that no entry names raise SyncCheckError, which lists every such site;
  * an entry that matched nothing raises UnusedAllowError: a stale allowlist is a bug (the sync it
    was written for moved or went away, and the entry would silently allow a new one there).
allow_sync() blocks still work inside the region (syncs there are neither errors nor matches).

What is seen (syncs.count_syncs does the counting): torch's sync debug mode on CUDA, the library's
guard counter on a CPU-only machine; on any machine, a non_blocking host-to-GPU copy from pageable
memory, checked before the copy runs. Inside an enclosing checked_region() every sync still fails:
the outer region's rule (no sync at all) wins over the allowlist.
"""
from __future__ import annotations

import ast
import contextlib
import dataclasses
import os
import re
import sys
from collections import Counter

import torch
from torch.overrides import TorchFunctionMode

from . import syncs
from .syncs import HostSyncError

__all__ = ["sync_check", "SyncCheck", "SyncCheckError", "PageableCopyError", "AllowlistError",
           "UnusedAllowError", "pageable_upload", "COPY_FUNCS"]

# "file.py:LINE" or "file.py:name[.name...]"; the file is a base name, as sites are reported
_ENTRY = re.compile(r"(?P<file>[^\s/\\:]+\.py):"
                    r"(?:(?P<line>[1-9][0-9]*)|(?P<func>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*))")


class AllowlistError(ValueError):
    """An allow entry that is not shaped "file.py:LINE" or "file.py:function"."""


class UnusedAllowError(RuntimeError):
    """Allowlist entries that matched no sync in the region."""

    def __init__(self, entries: list[str]):
        self.entries = list(entries)
        super().__init__("; ".join(f"allowlist entry {e!r} matched no sync in the region" for e in entries)
                         + ". A stale allowlist is a bug: remove the entry, or point it at the site the "
                           "sync moved to.")


class SyncCheckError(HostSyncError):
    """Host-device syncs at sites the allowlist does not name. `sites` counts them per site."""

    def __init__(self, sites: Counter, unused: list[str] = ()):
        self.sites, self.site, self.callers, self.unused = sites, next(iter(sites)), [], list(unused)
        listed = ", ".join(f"{s} (x{n})" for s, n in sites.items())
        msg = (f"host-device sync(s) outside the allowlist at {listed}: each makes the host wait for "
               "the GPU queue to drain. Remove it, or name its site in allow=[...].")
        if self.unused:
            msg += " Unused allowlist entries: " + ", ".join(map(repr, self.unused)) + "."
        RuntimeError.__init__(self, msg)


class PageableCopyError(HostSyncError):
    """A non_blocking host-to-GPU copy from pageable memory: synchronous in fact."""

    def __init__(self, site: str, what: str):
        self.site, self.callers, self.what = site, [], what
        # The GPU's copy engines read host memory by DMA, which needs pages the OS can neither move
        # nor swap out (page-locked, "pinned"). From ordinary pageable memory the CUDA driver first
        # copies the data, on the calling CPU thread, into a pinned staging buffer, and returns only
        # once it is staged: the host is held for the whole copy and non_blocking is silently ignored.
        RuntimeError.__init__(self, (
            f"non_blocking copy from pageable (unpinned) host memory to the GPU at {site} ({what}): "
            "CUDA runs it synchronously, the host thread stages the data through a pinned buffer and "
            "waits. Pin the source (tensor.pin_memory(), ideally once into a reused buffer), or name "
            "the site in allow=[...]."))


@dataclasses.dataclass(frozen=True)
class _Entry:
    text: str
    file: str
    line: int | None
    func: str | None


def _parse_allow(allow) -> list[_Entry]:
    if isinstance(allow, (str, bytes)):
        raise AllowlistError(f"allow must be a list of sites, got the single string {allow!r}: "
                             f"write allow=[{allow!r}]")
    out = {}
    for a in allow:
        m = _ENTRY.fullmatch(a) if isinstance(a, str) else None
        if m is None:
            raise AllowlistError(f"allowlist entry {a!r} is not a site: write 'file.py:LINE' or "
                                 "'file.py:function' (the file's base name, as sync sites are reported)")
        line = m["line"]
        out[a] = _Entry(a, m["file"], int(line) if line else None, m["func"])
    return list(out.values())


# --- the function that holds a site's line --------------------------------------------------
# Sites are "file.py:LINE" (base names); the function is found in the source of every loaded
# module of that base name: the innermost def whose lines hold LINE.
def _defs(path: str) -> list[tuple[int, int, str, str]]:
    """(first line, last line, name, qualified name) of every def in a source file."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return []
    out = []

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if not isinstance(child, ast.ClassDef):
                    out.append((child.lineno, child.end_lineno, child.name, prefix + child.name))
                walk(child, prefix + child.name + ".")
            else:
                walk(child, prefix)

    walk(tree, "")
    return out


def _functions_at(site: str) -> set[str]:
    file, _, line = site.rpartition(":")
    if not line.isdigit():
        return set()
    paths = {getattr(m, "__file__", None) for m in list(sys.modules.values())}
    names = set()
    for p in paths:
        if p and os.path.basename(p) == file:
            inside = [d for d in _defs(p) if d[0] <= int(line) <= d[1]]
            if inside:
                names |= set(max(inside)[2:])  # the innermost def starts last
    return names


syncs.tool_file(__file__)  # every torch call of a region runs inside _PageableCopyCheck's frame


# --- pageable non_blocking uploads ----------------------------------------------------------
_COPIES = ((torch.Tensor.to, "Tensor.to"), (torch.Tensor.cuda, "Tensor.cuda"), (torch.Tensor.copy_, "Tensor.copy_"))


def _pageable_upload(func, args, kwargs) -> torch.Tensor | None:
    """The source tensor when this call is a non_blocking copy from pageable host memory to a CUDA
    device, else None. Decided from the arguments alone, so it works on a machine without CUDA."""
    try:
        if func is torch.Tensor.copy_:
            dst, src = args[0], args[1] if len(args) > 1 else kwargs["src"]
            nb = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
            to_cuda = dst.device.type == "cuda"
        elif func is torch.Tensor.cuda:  # cuda(device=None, non_blocking=False)
            src, to_cuda = args[0], True
            nb = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
        else:  # Tensor.to, any overload: the parser nn.Module.to uses (it rejects `copy`: drop it)
            pos, kw = list(args[1:]), {k: v for k, v in kwargs.items() if k != "copy"}
            if sum(isinstance(a, bool) for a in pos) == 2:
                pos.pop()  # to(..., non_blocking, copy)
            device, _, nb, _ = torch._C._nn._parse_to(*pos, **kw)
            src, to_cuda = args[0], device is not None and device.type == "cuda"
    except (IndexError, KeyError, TypeError, RuntimeError, AttributeError):
        return None  # malformed call: let torch raise its own error
    pageable = isinstance(src, torch.Tensor) and src.device.type == "cpu" and not src.is_pinned()
    return src if (nb and to_cuda and pageable) else None


pageable_upload = _pageable_upload  # public: instruments/recorders/audit.py classifies the same copies
COPY_FUNCS = _COPIES


class _PageableCopyCheck(TorchFunctionMode):
    """Sees every torch call in the region; hands the pageable uploads to `on_copy` before they run."""

    def __init__(self, on_copy):
        super().__init__()
        self.on_copy = on_copy

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = next((n for f, n in _COPIES if f is func), None)
        if name is not None:
            src = _pageable_upload(func, args, kwargs)
            if src is not None:
                what = f"{name} of a {tuple(src.shape)} {src.dtype} tensor"
                self.on_copy(syncs.user_site(sys._getframe(1)), what)
        return func(*args, **kwargs)


# --- the region -----------------------------------------------------------------------------
@dataclasses.dataclass
class SyncCheck:
    """What sync_check saw (complete on exit): the SyncReport of the region, and how many syncs each
    allowlist entry let through."""

    report: syncs.SyncReport
    allowed: Counter = dataclasses.field(default_factory=Counter)


@contextlib.contextmanager
def sync_check(allow=(), *, strict: bool = True):
    """Fail on every host-device sync in the block outside the `allow` sites (see the module doc).

    `strict=False` does not raise for unused entries: for an allowlist written for a GPU run (a
    CPU-only machine sees only the library's guard syncs and pageable uploads)."""
    entries = _parse_allow(allow)
    funcs: dict[str, set[str]] = {}  # site -> names of the function holding it (looked up once)

    def match(site: str) -> bool:
        hits = [e for e in entries if e.line is not None and f"{e.file}:{e.line}" == site]
        if any(e.func for e in entries) and site not in funcs:
            funcs[site] = _functions_at(site)
        hits += [e for e in entries if e.func and site.rpartition(":")[0] == e.file
                 and e.func in funcs[site]]
        for e in hits:
            chk.allowed[e.text] += 1
        return bool(hits)

    def on_copy(site: str, what: str) -> None:
        if not syncs._allowed_now() and not match(site):
            raise PageableCopyError(site, what)

    with syncs.count_syncs() as rep, _PageableCopyCheck(on_copy):
        chk = SyncCheck(rep)
        yield chk
    bad = Counter(r.site for r in rep.records if not match(r.site))
    unused = [e.text for e in entries if not chk.allowed[e.text]] if strict else []
    if bad:
        raise SyncCheckError(bad, unused)
    if unused:
        raise UnusedAllowError(unused)
