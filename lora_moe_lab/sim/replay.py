"""A trace-driven what-if replay: one profiled forward as a dependency graph, replayed host and device.

    g = build_graph("trace.json.gz", forward=1)      # one forward (a "step") of a torch.profiler trace
    r = replay(g)                                     # reproduces the traced forward (r.step_ms[0] ~ g.traced_ms)
    fix = T.remove_syncs(g)                           # transformations: replay_transforms.py
    replay(fix, steps=8, init="idle").forward_ms      # a chunked prefill of 8 forwards, median per forward

The idea is Daydream's (Zhu et al., USENIX ATC 2020): a graph of host work, launches, kernels and
syncs from a profile, transformed to model a change, replayed to predict the new time. Written
for this lab, on the tables of instruments/analysers/trace/ (parse).

The graph of one step (the host window from the previous forward's end to this forward's end, so
that the engine's work between forwards, a `_sleep` kernel of an earlier batch or the batch
upload, belongs to the forward it precedes):

  host      one thread (the forward annotation's), its runtime calls in order. Each call j has
            `gap` (host work since the previous call ended: Python, the framework, a spin),
            `dur` (the call itself), and, for a sync, `ret` (the return latency after the queue
            drained). A launch call launches kernels.
  device    per stream, kernels in launch order, each with `dur`, `lat` (launch call end ->
            kernel start when the launch binds) and `gap` (previous kernel's end -> start when
            the queue binds). NCCL kernels keep their (spinning) durations.
  edges     kernel start = max(its launch's end + lat, previous kernel on its stream's end + gap);
            a sync ends at max(its start, the end of every kernel launched before it) + ret.

Which constraint bound a kernel in the trace is read from the trace (the nearer one); the other
gets the trace's typical value (median launch latency / kernel-to-kernel gap), so an unchanged
graph replays to the traced times exactly, and a changed one moves each kernel by the rule.

Replay is a pass over the host calls in sync-delimited segments: inside a segment the host times
are prefix sums and each stream's kernel ends a max-plus prefix scan (numpy, no per-event Python).

Named errors say what is missing: TraceFormatError (not a kineto chrome trace, an older torch's
format), EmptyTraceError, TruncatedTraceError, NoKernelsError, NoLaunchLinksError, NoForwardError.
"""
from __future__ import annotations

import dataclasses
import gzip
import json
import os
import re
import zlib
from pathlib import Path

import numpy as np
import pandas as pd

from ..instruments.analysers import trace as T
from ..instruments.analysers.schemas import RecordingError

__all__ = ["Graph", "ReplayResult", "build_graph", "replay", "read_trace", "ReplayError", "TraceFormatError",
           "EmptyTraceError", "TruncatedTraceError", "NoKernelsError", "NoLaunchLinksError", "NoForwardError",
           "UnknownTransformationError", "GraphError", "NCCL_PATTERN", "GUARD_PREFIX", "LAYER_PATTERN"]

NCCL_PATTERN = re.compile(r"(?i)nccl")
GUARD_PREFIX = "lora_guard_"  # record_function ranges around each guard decision (model/guards.py)
LAYER_PATTERN = re.compile(r"^(decoder_layer|moe_layer)_(\d+)$")
WRAPPERS = (T.FORWARD_WRAPPER,)
NEG = -(1 << 62)  # "idle since forever" on a device clock
CALL, SYNC = 0, 1
HOST_FIELDS = ("kind", "gap", "dur", "ret", "guard", "gap_guard", "layer", "name")
KERNEL_FIELDS = ("host", "stream", "dur", "lat", "gap", "nccl", "guard", "name")


# --- errors ------------------------------------------------------------------------------------
class ReplayError(Exception):
    """Base of the replay engine's named errors."""


class TraceFormatError(ReplayError):
    pass


class EmptyTraceError(ReplayError):
    pass


class TruncatedTraceError(ReplayError):
    pass


class NoKernelsError(ReplayError):
    pass


class NoLaunchLinksError(ReplayError):
    pass


class NoForwardError(ReplayError):
    pass


class UnknownTransformationError(ReplayError, KeyError):
    def __str__(self):  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class GraphError(ReplayError, ValueError):
    """A transformation's input does not fit the graph (no such site, a sync inside a graph launch)."""


# --- reading -----------------------------------------------------------------------------------
OLD_CATS = {"Kernel", "Runtime", "Memcpy", "Memset", "Operator"}  # the pre-kineto (autograd profiler) names


def read_trace(path) -> dict:
    """A chrome-trace dict from a .json / .json.gz path, with named errors for what is wrong."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no trace file at {p}")
    if p.stat().st_size == 0:
        raise EmptyTraceError(f"{p} is empty (0 bytes): no trace events")
    try:
        doc = T.read_doc(p)  # the checked reader: its seal where it has one, gzip or not, a traceEvents list
    except RecordingError as e:
        if "not a chrome trace" in e.what or "partly sealed" in e.what or "sealed for another" in e.what:
            raise TraceFormatError(str(e)) from e
        raise TruncatedTraceError(f"{e}: a truncated, damaged or edited trace; re-export it") from e
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise TruncatedTraceError(f"{p}: the gzip stream ends early or is damaged ({e}); re-export the trace") from e
    except json.JSONDecodeError as e:
        raise TruncatedTraceError(f"{p}: the JSON stops or breaks at char {e.pos} ({e.msg}): a truncated or "
                                  f"partly written trace") from e
    except UnicodeDecodeError as e:
        raise TraceFormatError(f"{p}: not a text chrome trace ({e})") from e
    return doc


def _check_doc(doc) -> None:
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        keys = sorted(doc)[:8] if isinstance(doc, dict) else type(doc).__name__
        raise TraceFormatError(f"not a chrome trace: no 'traceEvents' list (found {keys}); expected "
                               f"torch.profiler's export_chrome_trace output")
    ev = doc["traceEvents"]
    if not ev:
        raise EmptyTraceError("the trace has no events ('traceEvents' is empty)")
    cats = {e.get("cat") for e in ev if isinstance(e, dict)}
    if cats & OLD_CATS and not cats & {"kernel", "cuda_runtime", "cuda_driver"}:
        raise TraceFormatError(f"a trace in an older torch profiler format "
                               f"(categories {sorted(c for c in cats & OLD_CATS)}); "
                               f"this engine reads kineto's 'kernel' / 'cuda_runtime' / 'user_annotation' events "
                               f"(torch >= 1.8.1 with ProfilerActivity.CUDA)")
    if not cats & {"kernel", "gpu_memcpy", "gpu_memset"}:
        raise NoKernelsError(f"the trace has no GPU ops (no 'kernel' / 'gpu_memcpy' / 'gpu_memset' events; categories: "
                             f"{sorted(str(c) for c in cats)[:10]}): was ProfilerActivity.CUDA on, on a GPU?")
    if not cats & {"cuda_runtime", "cuda_driver"}:
        raise NoLaunchLinksError("the trace has GPU ops but no host runtime calls ('cuda_runtime' / 'cuda_driver'): "
                                 "cannot tell when the host launched them")


def _tables(trace) -> tuple[T.TraceTables, str | None]:
    if isinstance(trace, T.TraceTables):
        return trace, trace.path
    if isinstance(trace, (str, os.PathLike)):
        doc = read_trace(trace)
        _check_doc(doc)
        t = T.load_trace(doc)
        t.path = str(trace)
        return t, str(trace)
    if isinstance(trace, dict):
        _check_doc(trace)
        return T.load_trace(trace), None
    raise TraceFormatError(f"build_graph takes a trace path, a chrome-trace dict or TraceTables, "
                           f"not {type(trace).__name__}")


# --- the graph ---------------------------------------------------------------------------------
@dataclasses.dataclass
class Graph:
    """One step of a forward as arrays (ns). host: HOST_FIELDS, in host order; kern: KERNEL_FIELDS,
    sorted by launching host call (stream order = launch order). guard: the index of the
    `lora_guard_*` range a call (or kernel's launch) lies in, -1 none; gap_guard: the part of a
    call's gap inside such a range; layer: index into `layers`, -1 none. sites: one row per guard
    range (name, layer, anchor = the first host call at or after its start, own = its calls)."""

    host: dict
    kern: dict
    tail: int  # host work after the last call until the step ends
    tail_guard: int
    layers: list
    sites: pd.DataFrame
    init_free: dict  # stream -> ns the stream is busy until at the step's start (traced); NEG: idle
    ref_ns: int  # the step time is measured from here (the previous forward's GPU end, or the step's start)
    traced_ns: int | None
    lat_ns: int  # the typical launch latency (launch end -> start) of launch-bound kernels
    k2k_ns: int  # the typical gap between queued kernels
    meta: dict = dataclasses.field(default_factory=dict)

    @property
    def n_host(self) -> int:
        return len(self.host["kind"])

    @property
    def n_kernels(self) -> int:
        return len(self.kern["host"])

    @property
    def n_syncs(self) -> int:
        return int((self.host["kind"] == SYNC).sum())

    @property
    def traced_ms(self) -> float:
        return self.traced_ns / 1e6 if self.traced_ns is not None else float("nan")

    @property
    def host_work_ns(self) -> int:
        """Host time outside runtime calls (gaps + tail)."""
        return int(self.host["gap"].sum() + self.tail)

    def replace(self, **kw) -> "Graph":
        return dataclasses.replace(self, **kw)

    def __repr__(self):
        return (f"Graph({self.meta.get('source') or '<in memory>'} forward {self.meta.get('forward')}: "
                f"{self.n_host} host calls, {self.n_syncs} syncs, {self.n_kernels} kernels on "
                f"{len(set(self.kern['stream'].tolist()))} stream(s), {len(self.layers)} layers, "
                f"traced {self.traced_ms:.3f} ms)")


def _coverage(starts: np.ndarray, ends: np.ndarray):
    """cov(t): total length of the (sorted, disjoint) ranges before t."""
    cum = np.concatenate([[0], np.cumsum(ends - starts)])

    def cov(t):
        t = np.asarray(t, dtype=np.int64)
        if not len(starts):
            return np.zeros(t.shape, np.int64)
        i = np.searchsorted(starts, t, side="right")  # ranges starting at or before t
        full = cum[np.maximum(i - 1, 0)]
        part = np.where(i > 0, np.minimum(t, ends[np.maximum(i - 1, 0)]) - starts[np.maximum(i - 1, 0)], 0)
        return np.where(i > 0, full + np.maximum(part, 0), 0)
    return cov


def _window(t: T.TraceTables, f: int) -> tuple[int, int, bool]:
    fw = t.forwards.sort_values("start_ns").reset_index(drop=True)
    s0, s1 = int(fw.start_ns[f]), int(fw.end_ns[f])
    a = t.annotations
    wrap = a[a["name"].isin(WRAPPERS) & (a["start_ns"] <= s0) & (a["end_ns"] >= s1)]
    w0 = int(wrap["start_ns"].max()) if len(wrap) else s0
    prev_end = int(fw.end_ns[f - 1]) if f > 0 else None
    back_to_back = prev_end is not None and prev_end > w0
    if back_to_back:
        w0 = prev_end
    return w0, s1, back_to_back


def build_graph(trace, forward: int = 1, host_tid=None) -> Graph:
    """The graph of one forward of a trace (path, dict or TraceTables). forward: its index
    (negative counts from the end; a trace with one forward has only 0)."""
    t, path = _tables(trace)
    if not len(t.kernels):
        raise NoKernelsError(f"{path or 'the trace'} has no GPU ops")
    n_fw = len(t.forwards)
    if n_fw == 0:
        raise NoForwardError(f"{path or 'the trace'} has no forward range "
                             f"('forward', 'profile_forward' or ProfilerStep#)")
    f = forward + n_fw if forward < 0 else forward
    if not 0 <= f < n_fw:
        raise NoForwardError(f"forward {forward} asked, {path or 'the trace'} has {n_fw} (0..{n_fw - 1})")
    w0, w1, b2b = _window(t, f)
    ann = t.annotations
    if host_tid is None:
        fa = ann[(ann["start_ns"] == t.forwards.sort_values("start_ns").start_ns.iloc[f])]
        host_tid = fa["tid"].iloc[0] if len(fa) else t.runtime["tid"].mode().iloc[0] if len(t.runtime) else None
    rt = t.runtime[(t.runtime["tid"] == host_tid) & (t.runtime["start_ns"] >= w0) & (t.runtime["start_ns"] < w1)]
    rt = rt.sort_values("start_ns", kind="stable")
    if not len(rt):
        raise NoLaunchLinksError(f"no runtime calls of host thread {host_tid} in forward {f}")
    hs, he = rt["start_ns"].to_numpy(np.int64), rt["end_ns"].to_numpy(np.int64)
    kind = np.where(rt["is_sync"].to_numpy(bool), SYNC, CALL).astype(np.int8)
    # kernels launched by these calls (by correlation id)
    corr = pd.Series(np.arange(len(rt)), index=rt["correlation"].to_numpy())
    corr = corr[~corr.index.duplicated()]
    k = t.kernels
    kk = k[k["correlation"].isin(corr.index)].copy()
    n_unlinked = int(((k["launch_start_ns"].isna()) & (k["start_ns"] >= w0) & (k["start_ns"] < w1)).sum())
    if not len(kk):
        raise NoLaunchLinksError(f"forward {f}: none of the GPU ops links to a runtime call of thread {host_tid} "
                                 f"(no 'correlation' args or ac2g flows)")
    kk["host"] = corr.loc[kk["correlation"].to_numpy()].to_numpy()
    kk = kk.sort_values(["host", "start_ns"], kind="stable")
    kh = kk["host"].to_numpy(np.int64)
    ks, ke = kk["start_ns"].to_numpy(np.int64), kk["end_ns"].to_numpy(np.int64)
    stream = kk["stream"].fillna(-1).astype(np.int64).to_numpy()
    # each stream's state at the step's start: the end of the kernels launched before it
    before = k[k["launch_start_ns"].notna() & (k["launch_start_ns"] < w0)]
    init_free = {int(s): int(before.loc[before["stream"] == s, "end_ns"].max()) - w0 if (before["stream"] == s).any()
                 else NEG for s in np.unique(stream)}
    # launch latency and kernel-to-kernel gap, and which one bound each kernel
    a = ks - he[kh]
    prev_end = np.empty(len(kk), np.int64)
    for s in np.unique(stream):
        m = np.nonzero(stream == s)[0]
        init = init_free[int(s)] + w0 if init_free[int(s)] != NEG else NEG
        prev_end[m] = np.concatenate([[init], ke[m[:-1]]])
    b = np.where(prev_end == NEG, np.iinfo(np.int64).max // 4, ks - prev_end)
    queued = b <= a
    lat0 = int(np.median(a[~queued])) if (~queued).any() else 2000
    k2k0 = int(np.median(b[queued])) if queued.any() else 1000
    lat = np.where(queued, np.minimum(a, lat0), a)
    gap = np.where(queued, b, np.minimum(b, k2k0))
    # the sync's return latency: its end after the queue (every kernel launched before it) drained
    ke_pref = np.maximum.accumulate(ke) if len(ke) else ke
    n_before = np.searchsorted(kh, np.arange(len(rt)), side="left")
    free0 = max([v + w0 for v in init_free.values() if v != NEG], default=NEG)
    drain = np.maximum(np.where(n_before > 0, ke_pref[np.maximum(n_before - 1, 0)], NEG), free0)
    ret = np.where(kind == SYNC, he - np.maximum(hs, drain), 0)
    prev_host_end = np.concatenate([[w0], he[:-1]])
    gaps = hs - prev_host_end
    # guard ranges and layers on the host thread
    a_h = ann[(ann["tid"] == host_tid) & (ann["start_ns"] >= w0) & (ann["start_ns"] < w1)]
    ga = a_h[a_h["name"].str.startswith(GUARD_PREFIX)].sort_values("start_ns")
    g_s, g_e = ga["start_ns"].to_numpy(np.int64), ga["end_ns"].to_numpy(np.int64)
    g_idx = T.ranges_index(hs, g_s, g_e)
    cov = _coverage(g_s, g_e)
    gap_guard = cov(hs) - cov(prev_host_end)
    tail_guard = int(cov(np.array([w1]))[0] - cov(np.array([he[-1]]))[0])
    la = a_h[a_h["name"].str.match(LAYER_PATTERN)]
    la = pd.DataFrame(T.top_level(la.to_dict("records")), columns=la.columns)
    layers = list(la["name"])
    l_idx = T.ranges_index(hs, la["start_ns"].to_numpy(np.int64), la["end_ns"].to_numpy(np.int64))
    anchor = np.searchsorted(hs, g_s, side="left")
    site_layer = T.ranges_index(g_s, la["start_ns"].to_numpy(np.int64), la["end_ns"].to_numpy(np.int64))
    own = [np.nonzero(g_idx == i)[0] for i in range(len(ga))]
    # host work before the range, after the last call
    pre = g_s - np.where(anchor > 0, he[np.maximum(anchor - 1, 0)], w0)
    sites = pd.DataFrame({"name": ga["name"].to_numpy(), "layer": site_layer, "anchor": anchor,
                          "n_calls": [len(o) for o in own], "dur_ns": g_e - g_s, "pre_ns": np.maximum(pre, 0)})
    names = kk["name"].to_numpy(object)
    nccl = np.array([bool(NCCL_PATTERN.search(str(n))) for n in names], bool)
    host = dict(kind=kind, gap=gaps.astype(np.int64), dur=(he - hs).astype(np.int64), ret=ret.astype(np.int64),
                guard=g_idx.astype(np.int64), gap_guard=gap_guard.astype(np.int64), layer=l_idx.astype(np.int64),
                name=rt["name"].to_numpy(object))
    kern = dict(host=kh, stream=stream, dur=(ke - ks).astype(np.int64), lat=lat.astype(np.int64),
                gap=gap.astype(np.int64), nccl=nccl, guard=host["guard"][kh].copy(), name=names)
    ref = (int(t.kernels.loc[t.kernels["launch_start_ns"].notna() & (t.kernels["launch_start_ns"] < w0),
                             "end_ns"].max()) if b2b else w0)
    traced = int(ke.max()) - ref
    meta = dict(source=path, forward=f, n_forwards=n_fw, host_tid=host_tid, window_ns=(w0, w1),
                back_to_back=b2b, unlinked_kernels=n_unlinked, labels=t.labels)
    return Graph(host=host, kern=kern, tail=int(w1 - he[-1]), tail_guard=tail_guard, layers=layers, sites=sites,
                 init_free=init_free, ref_ns=int(ref - w0), traced_ns=traced, lat_ns=lat0, k2k_ns=k2k0, meta=meta)


# --- replay ------------------------------------------------------------------------------------
@dataclasses.dataclass
class ReplayResult:
    """Replayed times (ns from the first step's start). step_ns: each step's time, measured as a
    chunked prefill measures it: the step's last kernel end minus the previous step's (the first
    from the graph's reference: the traced previous GPU end with init='traced', else 0)."""

    h_start: np.ndarray
    h_end: np.ndarray
    k_start: np.ndarray
    k_end: np.ndarray
    step_gpu_end: np.ndarray
    step_host_end: np.ndarray
    step_ns: np.ndarray
    n_host: int
    n_kernels: int

    @property
    def step_ms(self) -> np.ndarray:
        return self.step_ns / 1e6

    @property
    def forward_ms(self) -> float:
        """The median step (a chunked prefill's forward_median_ms)."""
        return float(np.median(self.step_ns)) / 1e6


def _tile(g: Graph, steps: int):
    h, k = g.host, g.kern
    n, m = g.n_host, g.n_kernels
    if steps == 1:
        return h["kind"], h["gap"], h["dur"], h["ret"], k["host"], k["stream"], k["dur"], k["lat"], k["gap"]
    gap = np.tile(h["gap"], steps)
    gap[n::n] += g.tail  # the next step's first gap starts where this one's tail ends
    kh = (np.tile(k["host"], steps) + np.repeat(np.arange(steps, dtype=np.int64) * n, m))
    return (np.tile(h["kind"], steps), gap, np.tile(h["dur"], steps), np.tile(h["ret"], steps), kh,
            np.tile(k["stream"], steps), np.tile(k["dur"], steps), np.tile(k["lat"], steps), np.tile(k["gap"], steps))


def replay(g: Graph, steps: int = 1, init: str = "traced") -> ReplayResult:
    """Replay `steps` copies of the graph's step back to back on one host thread (the next starts
    where the previous one's host work ends). init='traced': the device starts as it was at the
    traced step's start (queued work of the previous forward); 'idle': an idle device."""
    if init not in ("traced", "idle"):
        raise ValueError(f"init is 'traced' or 'idle', not {init!r}")
    if g.n_kernels == 0:
        raise NoKernelsError("the graph has no kernels to replay")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    kind, gap, dur, ret, kh, stream, kdur, lat, kgap = _tile(g, steps)
    n, m = len(kind), len(kh)
    streams = np.unique(stream)
    carry = {int(s): (g.init_free.get(int(s), NEG) if init == "traced" else NEG) for s in streams}
    h_start = np.empty(n, np.int64)
    h_end = np.empty(n, np.int64)
    k_start = np.empty(m, np.int64)
    k_end = np.empty(m, np.int64)
    Gc = np.concatenate([[0], np.cumsum(gap)])  # Gc[j+1] = sum gap[0..j]
    Dc = np.concatenate([[0], np.cumsum(np.where(kind == SYNC, 0, dur))])
    k_lo = np.searchsorted(kh, np.arange(n + 1), side="left")  # kernels of calls < j: [0, k_lo[j])
    one_stream = len(streams) == 1
    sel = None if one_stream else {int(s): stream == s for s in streams}
    syncs = np.nonzero(kind == SYNC)[0]
    bounds = np.concatenate([syncs, [n - 1]]) if (not len(syncs) or syncs[-1] != n - 1) else syncs
    t0, e0 = 0, 0
    for e1 in bounds:
        e1 = int(e1)
        j = np.arange(e0, e1 + 1)
        st = t0 + (Gc[j + 1] - Gc[e0]) + (Dc[j] - Dc[e0])
        h_start[e0:e1 + 1] = st
        h_end[e0:e1 + 1] = st + dur[e0:e1 + 1]
        a, b = k_lo[e0], k_lo[e1 + 1]
        if b > a:
            ready = h_end[kh[a:b]] + lat[a:b]
            for s in ([int(streams[0])] if one_stream else carry):
                if one_stream:
                    idx = slice(a, b)
                    r_, d_, g_ = ready, kdur[a:b], kgap[a:b]
                else:
                    idx = a + np.nonzero(sel[s][a:b])[0]
                    if not len(idx):
                        continue
                    r_, d_, g_ = ready[idx - a], kdur[idx], kgap[idx]
                C = np.cumsum(g_ + d_)
                e = C + np.maximum(carry[s], np.maximum.accumulate(r_ + d_ - C))
                k_end[idx] = e
                k_start[idx] = e - d_
                carry[s] = int(e[-1])
        if kind[e1] == SYNC:
            drain = max(carry.values())
            h_end[e1] = max(int(h_start[e1]), drain) + int(ret[e1])
        t0 = int(h_end[e1])
        e0 = e1 + 1
    nh, nk = g.n_host, g.n_kernels
    host_end = h_end[nh - 1::nh] + g.tail
    gpu_end = k_end.reshape(steps, nk).max(axis=1)
    ref0 = g.ref_ns if init == "traced" else 0
    step = np.diff(np.concatenate([[ref0], gpu_end]))
    return ReplayResult(h_start, h_end, k_start, k_end, gpu_end, host_end, step, nh, nk)
