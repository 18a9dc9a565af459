"""The host/device queue engine: why a per-layer `.item()` drains the GPU pipeline.

The host issues ops one after another; each costs host time (PyTorch dispatch + the launch call).
An issued op waits in the stream's queue and the device runs the queue in order: an op starts when
it has been issued AND the previous op has ended. While the host stays ahead, the device never
waits for it and host launch costs are hidden. A sync op (`.item()` -> `cudaStreamSynchronize`)
blocks the host until the device has drained everything issued so far; then the queue is empty,
and the device idles until the host has issued the next op. That idle gap, once per guard site,
per layer, is the whole lesson.

Units: microseconds in parameters and results, integer nanoseconds in the timeline.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Sequence

import numpy as np
import pandas as pd

# One row per host segment or device op; `op` joins a launch (host) to its kernel (gpu); issue_ns is
# when a device op entered the queue (NaN on host rows).
TIMELINE_COLUMNS = ["lane", "start_ns", "end_ns", "name", "category", "layer", "op", "issue_ns"]

# --------------------------------------------------------------------------------------------
# Ops and the queue engine
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Op:
    """One step of the host program.

    kind: "kernel"     host spends host_us issuing it, then it runs device_us on the device;
          "sync"       host blocks until the device has drained, then spends host_us (wake-up,
                       copy-out); no device work;
          "collective" a device op every rank must reach: it starts wait_us after this rank could
                       start it (the slowest rank's skew), then runs device_us; the NCCL kernel
                       occupies the device while it waits, as it spins on the other ranks;
          "host"       host-only work (graph launch, Python bookkeeping): host_us, no device op.
    """

    name: str
    kind: str = "kernel"
    host_us: float = 0.0
    device_us: float = 0.0
    wait_us: float = 0.0
    layer: int = -1
    category: str = ""

    def __post_init__(self):
        if self.kind not in ("kernel", "sync", "collective", "host"):
            raise ValueError(f"op {self.name!r}: unknown kind {self.kind!r}")
        for f in ("host_us", "device_us", "wait_us"):
            v = getattr(self, f)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"op {self.name!r}: {f} must be finite and >= 0, got {v!r}")


@dataclass
class SimResult:
    forward_us: float  # end of the last device op or of the host program, whichever is later
    host_end_us: float
    device_end_us: float
    device_busy_us: float
    device_idle_us: float  # forward_us - busy: the device had nothing to run
    sync_stall_us: float  # the part of idle that directly follows a sync (queue drained)
    host_blocked_us: float  # host time spent waiting inside syncs
    syncs: int
    device_ops: int  # ops that ran on the device (an op may stand for several kernel launches)
    timeline: pd.DataFrame | None = None

    def as_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "timeline"}
        return d

    def tables(self, **labels):
        """The timeline as trace.TraceTables (see `to_trace_tables`): trace.forward_metrics,
        idle_gaps, layer_breakdown and plots.timeline read it like a recorded trace."""
        if self.timeline is None:
            raise ValueError("this SimResult has no timeline: simulate it with timeline=True")
        return to_trace_tables(self.timeline, labels=labels)


def simulate(ops: Sequence[Op], *, timeline: bool = False) -> SimResult:
    """Run the queue model over `ops` (host starts at t=0 with an idle device and an empty queue)."""
    h = 0.0  # host clock
    dfree = 0.0  # when the device finishes the last op issued so far
    busy = stall = blocked = 0.0
    syncs = device_ops = 0
    after_sync = False
    rows: list[tuple] = []
    ns = 1000.0
    for i, op in enumerate(ops):
        cat = op.category
        if op.kind == "sync":
            wait_from = h
            h = max(h, dfree)
            blocked += h - wait_from
            h_end = h + op.host_us
            syncs += 1
            after_sync = True
            if timeline:
                rows.append(("host", wait_from, h_end, op.name, cat or "sync", op.layer, i, np.nan))
            h = h_end
            continue
        h_end = h + op.host_us
        if timeline and op.host_us > 0:
            hc = (cat or "host") if op.kind == "host" else "launch"  # the host side of a kernel is its launch
            rows.append(("host", h, h_end, op.name, hc, op.layer, i, np.nan))
        h = h_end
        if op.kind == "host":
            continue
        device_ops += 1
        start = max(h, dfree)
        if after_sync:
            stall += start - dfree
            after_sync = False
        dur = op.device_us + (op.wait_us if op.kind == "collective" else 0.0)
        end = start + dur
        busy += dur
        if timeline:
            rows.append(("gpu", start, end, op.name, cat or op.kind, op.layer, i, h))
        dfree = end
    fwd = max(h, dfree)
    tl = None
    if timeline:
        tl = pd.DataFrame(rows, columns=TIMELINE_COLUMNS)
        for c in ("start_ns", "end_ns"):
            tl[c] = np.round(tl[c].to_numpy(dtype=float) * ns).astype("int64")
        tl["issue_ns"] = pd.array(np.round(tl["issue_ns"].to_numpy(dtype=float) * ns), dtype="Int64")
    return SimResult(fwd, h, dfree, busy, fwd - busy, stall, blocked, syncs, device_ops, tl)


_RUNTIME_NAME = {"launch": "cudaLaunchKernel", "sync": "cudaStreamSynchronize", "graph_launch": "cudaGraphLaunch"}


def to_trace_tables(timeline: pd.DataFrame, forward_name: str = "forward", launch_call_ns: int = 2000,
                    labels: dict | None = None):
    """A simulated timeline as `trace.TraceTables` (one forward), so the trace analyses
    (`trace.forward_metrics`, `idle_gaps`, `layer_breakdown`, `queue_depth`) and the plots built
    on them read a simulated forward exactly as a recorded one. Host launch segments become
    `cudaLaunchKernel` runtime calls (correlated with their kernel), syncs `cudaStreamSynchronize`,
    the graph launch `cudaGraphLaunch`; each layer's host span becomes a `moe_layer_{i}` range.
    A launch segment of the model is PyTorch dispatch followed by the CUDA call: only its last
    `launch_call_ns` become the `cudaLaunchKernel` call, as in a profiler trace (the trace's gap
    categories look at when that call began)."""
    from ..instruments.analysers import trace

    tl = timeline
    host = tl[tl["lane"] == "host"]
    gpu = tl[tl["lane"] == "gpu"]
    end = int(tl["end_ns"].max()) if len(tl) else 0
    rt_rows, launch_of = [], {}
    graph = host[host["category"] == "graph_launch"]
    for r in host.itertuples():
        name = _RUNTIME_NAME.get(r.category)
        if name is None:
            continue  # host work that calls no CUDA API
        s, e = int(r.start_ns), int(r.end_ns)
        if r.category == "launch":
            s = max(s, e - int(launch_call_ns))
        rt_rows.append(dict(name=name, cat="cuda_runtime", pid=1, tid=1, start_ns=s, end_ns=e, dur_ns=e - s,
                            correlation=int(r.op), external_id=None, is_sync=name == "cudaStreamSynchronize",
                            forward=0))
        launch_of[int(r.op)] = (name, s, e)
    g0 = ("cudaGraphLaunch", int(graph.iloc[0]["start_ns"]), int(graph.iloc[0]["end_ns"])) if len(graph) else None
    k_rows = []
    for r in gpu.itertuples():
        ln = launch_of.get(int(r.op)) or g0
        if ln is None:  # issued with no host cost: a zero-length launch at its issue time
            t = int(r.issue_ns) if not pd.isna(r.issue_ns) else int(r.start_ns)
            ln = ("cudaLaunchKernel", t, t)
        k_rows.append(dict(name=r.name, kind="memcpy" if r.category == "memcpy" else "kernel", device=0, stream=7,
                           start_ns=int(r.start_ns), end_ns=int(r.end_ns), dur_ns=int(r.end_ns - r.start_ns),
                           correlation=int(r.op), external_id=None, launch_name=ln[0], launch_start_ns=ln[1],
                           launch_end_ns=ln[2], launch_tid=1, forward=0))
    ann = [dict(name=forward_name, pid=1, tid=1, start_ns=0, end_ns=end, dur_ns=end, external_id=None, forward=0)]
    hl = host[host["layer"] >= 0]
    if len(hl):
        spans = hl.groupby("layer")["start_ns"].min().sort_index()
        starts = spans.to_numpy(dtype=np.int64)
        ends = np.append(starts[1:], int(host["end_ns"].max()))
        for layer, s, e in zip(spans.index, starts, ends):
            ann.append(dict(name=f"moe_layer_{int(layer)}", pid=1, tid=1, start_ns=int(s), end_ns=int(e),
                            dur_ns=int(e - s), external_id=None, forward=0))
    kernels = trace.frame(k_rows, trace.KERNEL_COLUMNS)
    runtime = trace.frame(rt_rows, trace.RUNTIME_COLUMNS)
    sync_rows = [dict(name=r["name"], source="runtime", kind=None, pid=1, tid=1, stream=None, start_ns=r["start_ns"],
                      end_ns=r["end_ns"], dur_ns=r["dur_ns"], correlation=r["correlation"], forward=0)
                 for r in rt_rows if r["is_sync"]]
    memcpys = kernels[kernels["kind"] == "memcpy"].copy()
    memcpys["direction"] = None
    return trace.TraceTables(
        kernels=kernels, runtime=runtime, syncs=trace.frame(sync_rows, trace.SYNC_COLUMNS), memcpys=memcpys,
        annotations=trace.frame(ann, trace.ANNOTATION_COLUMNS),
        gpu_annotations=trace.frame([], trace.ANNOTATION_COLUMNS),
        cpu_ops=trace.frame([], trace.ANNOTATION_COLUMNS),
        forwards=pd.DataFrame([dict(forward=0, name=forward_name, start_ns=0, end_ns=end, dur_ns=end)],
                              columns=["forward", "name", "start_ns", "end_ns", "dur_ns"]),
        doc={"labels": {"source": "simulate", **(labels or {})}}, path=None)


