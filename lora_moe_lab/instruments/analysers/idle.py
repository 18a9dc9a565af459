"""GPU idle time the way Holistic Trace Analysis (HTA) breaks it down, and a per-layer diff of two
traces of the same forward (e.g. the `sync` guard against `cpu_flag`).

    b = hta_idle_breakdown(tables, kernel_wait_ns=2_000)   # or {stream: ns, ...}
    b.streams      # per forward and stream: idle ns by HTA category (+ after_sync)
    b.forwards     # per forward: the same summed over streams
    b.gaps         # every idle gap with both our category and the HTA one
    trace_diff(sync_tables, cpu_flag_tables, names=("sync", "cpu_flag"))   # one row per layer

HTA's idle time breakdown (`get_idle_time_breakdown`) works per CUDA stream: a stream is idle
between one op's end and the next op's start, and the gap is
  host wait    the next op's launch call began after the previous op ended: the GPU drained its
               queue and waited for the CPU to issue more work;
  kernel wait  the next op was already queued and the gap is shorter than a threshold
               (`consecutive_kernel_delay`, documented as 30 ns by default): the front end's
               fixed cost of starting the next kernel;
  other        anything else (a longer gap between queued ops: cross-stream event waits, ...).

This module does not classify gaps a second time. It runs trace.idle_gaps on each stream alone
(the stream stands in for the device, so the union of "busy" is that stream's ops only) and maps
its categories onto HTA's:

  ours (trace.idle_gaps)   HTA view here   what HTA itself would call it
  after_sync               after_sync      host wait (the host was blocked in the sync, so the
                                           next launch came after the queue drained); kept apart
                                           because it is the bubble this lab is about
  host_launch_wait         host_wait       host wait
  kernel_to_kernel         kernel_wait     kernel wait when the gap < threshold,
                           or other        other when it is not
  other (no launch record) other           HTA files a short gap without a launch record under
                                           kernel wait (its host test is false for a missing
                                           launch); here "kernel wait" needs an op known to be
                                           queued, so it stays other

So HTA's host wait is (nearly always) after_sync + host_wait here. One boundary differs by a
nanosecond: ours counts a launch starting exactly when the gap opens as host wait, HTA needs it
strictly later.

Precision: HTA's JSON reader (by default) rounds the profiler's float microseconds to whole
microseconds, each start up and each end down, so its gaps are whole microseconds and up to 2 us
wider than they were (two back-to-back kernels show a 1 us gap), and a kernel shorter than a
microsecond can shrink to nothing. Here every start, end and gap is an exact int of nanoseconds
(trace.to_ns), and the threshold is in nanoseconds too. On the H200 the shortest gap between two
already-queued kernels in the recorded eager traces is about 0.9-1 us (the GPU's front end
starting the next grid, with the profiler's per-kernel records adding to it), so HTA's 30 ns
default files every queued gap of those traces under "other"; a threshold near 2 us calls most
of them kernel wait.

Per-forward totals are sums over streams (stream-time, as HTA sums per rank); with one stream
they equal forward_metrics()'s idle_ns. Like trace/analysis.py, only gaps inside a forward's
window count (HTA also counts the gaps between profiler steps).
"""
from __future__ import annotations

import dataclasses
import math
from numbers import Real
from typing import Mapping, NamedTuple

import numpy as np
import pandas as pd

from . import trace as T

__all__ = ["HTA_CATEGORIES", "OURS_TO_HTA", "HTA_KERNEL_WAIT_NS", "IdleBreakdown",
           "ThresholdError", "LayerMismatchError", "stream_gaps", "hta_idle_breakdown",
           "sync_launch_gaps", "trace_diff"]

HTA_CATEGORIES = ("after_sync", "host_wait", "kernel_wait", "other")
# kernel_to_kernel is split by the threshold, so it maps to one of two names
OURS_TO_HTA = {"after_sync": "after_sync", "host_launch_wait": "host_wait",
               "kernel_to_kernel": ("kernel_wait", "other"), "other": "other"}
HTA_KERNEL_WAIT_NS = 30  # HTA's documented default for consecutive_kernel_delay
LAYER_PATTERN = r"moe_layer_\d+$"


class ThresholdError(ValueError):
    """A kernel-wait threshold that is not a finite number >= 0, or a dict missing a stream."""


class LayerMismatchError(ValueError):
    """The two traces of a diff do not hold the same forwards and layers."""


class IdleBreakdown(NamedTuple):
    streams: pd.DataFrame   # forward, device, stream, threshold_ns, n_gaps, idle_ns, <cat>_ns
    forwards: pd.DataFrame  # forward, n_streams, n_gaps, idle_ns, <cat>_ns
    gaps: pd.DataFrame      # idle_gaps' columns + stream, threshold_ns, hta_category


def _check_ns(v, what: str) -> int | float:
    if isinstance(v, bool) or not isinstance(v, Real) or not math.isfinite(v) or v < 0:
        raise ThresholdError(f"{what} must be a finite number of ns >= 0, not {v!r}")
    return v


def _thresholds(kernel_wait_ns, streams) -> dict:
    """One threshold per stream from a single value or a {stream: ns} dict."""
    if isinstance(kernel_wait_ns, Mapping):
        missing = [s for s in streams if s not in kernel_wait_ns]
        if missing:
            raise ThresholdError(f"kernel_wait_ns has no threshold for stream(s) {missing} "
                                 f"(it has {sorted(kernel_wait_ns, key=str)})")
        return {s: _check_ns(kernel_wait_ns[s], f"kernel_wait_ns[{s!r}]") for s in streams}
    v = _check_ns(kernel_wait_ns, "kernel_wait_ns")
    return {s: v for s in streams}


def stream_gaps(tables, kernel_wait_ns=HTA_KERNEL_WAIT_NS, sync_slack_ns: int = 2000,
                layer_pattern: str = LAYER_PATTERN) -> pd.DataFrame:
    """Every idle gap of every stream (per forward), with trace.idle_gaps' `category` and the
    HTA view `hta_category` (see the module docstring). kernel_wait_ns: one threshold, or a
    {stream: ns} dict covering every stream of the trace."""
    t = T.load_trace(tables)
    k = t.kernels
    pairs = list(dict.fromkeys(zip(k["device"], k["stream"])))
    thr = _thresholds(kernel_wait_ns, list(dict.fromkeys(s for _, s in pairs)))
    # idle_gaps treats all streams of a device as one (busy = union). Giving each (device,
    # stream) pair its own "device" id makes it measure each stream alone, HTA's view.
    key = {p: i for i, p in enumerate(pairs)}
    per_stream = dataclasses.replace(t, kernels=k.assign(device=[key[p] for p in
                                                                 zip(k["device"], k["stream"])]))
    g = T.idle_gaps(per_stream, sync_slack_ns=sync_slack_ns, layer_pattern=layer_pattern)
    pair = [pairs[i] for i in g["device"]]
    g["device"] = [d for d, _ in pair]
    g.insert(2, "stream", [s for _, s in pair])
    g["threshold_ns"] = [thr[s] for s in g["stream"]]
    ours = g["category"].astype(str)
    hta = ours.map({c: v for c, v in OURS_TO_HTA.items() if isinstance(v, str)})
    queued = ours == "kernel_to_kernel"
    hta[queued] = np.where(g.loc[queued, "dur_ns"] < g.loc[queued, "threshold_ns"],
                           "kernel_wait", "other")
    g["hta_category"] = pd.Categorical(hta, categories=list(HTA_CATEGORIES))
    return g


def _totals(g: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Idle ns per HTA category (ints) for each group of gaps."""
    if not len(g):
        return pd.DataFrame(columns=by + ["n_gaps", "idle_ns"]
                            + [f"{c}_ns" for c in HTA_CATEGORIES]).set_index(by)
    w = g.pivot_table(index=by, columns="hta_category", values="dur_ns", aggfunc="sum",
                      fill_value=0, observed=False)
    w = w.reindex(columns=list(HTA_CATEGORIES), fill_value=0).astype("int64")
    w.columns = [f"{c}_ns" for c in w.columns]
    w.insert(0, "idle_ns", w.sum(axis=1))
    w.insert(0, "n_gaps", g.groupby(by).size().reindex(w.index, fill_value=0))
    return w


def hta_idle_breakdown(tables, kernel_wait_ns=HTA_KERNEL_WAIT_NS, sync_slack_ns: int = 2000,
                       layer_pattern: str = LAYER_PATTERN) -> IdleBreakdown:
    """HTA's idle breakdown (plus after_sync) per forward and stream, and per forward.

    Every stream that ran an op in a forward gets a row, gaps or not. Columns of both tables:
    n_gaps, idle_ns, after_sync_ns, host_wait_ns, kernel_wait_ns, other_ns (int ns); the four
    categories sum to idle_ns."""
    t = T.load_trace(tables)
    g = stream_gaps(t, kernel_wait_ns, sync_slack_ns, layer_pattern)
    k = t.kernels[t.kernels["forward"] >= 0]
    rows = k[["forward", "device", "stream"]].drop_duplicates().sort_values(
        ["forward", "device", "stream"]).reset_index(drop=True)
    thr = _thresholds(kernel_wait_ns, list(dict.fromkeys(t.kernels["stream"])))
    rows["threshold_ns"] = [thr[s] for s in rows["stream"]]
    by = ["forward", "device", "stream"]
    cols = ["n_gaps", "idle_ns"] + [f"{c}_ns" for c in HTA_CATEGORIES]
    streams = rows.merge(_totals(g, by).reset_index(), on=by, how="left")
    streams[cols] = streams[cols].fillna(0).astype("int64")
    forwards = streams.groupby("forward", sort=True)[cols].sum().reset_index()
    forwards.insert(1, "n_streams", streams.groupby("forward", sort=True).size().to_numpy())
    return IdleBreakdown(streams=streams, forwards=forwards, gaps=g)


# --- the before/after diff -----------------------------------------------------------------
def sync_launch_gaps(tables, layer_pattern: str = LAYER_PATTERN) -> pd.DataFrame:
    """One row per host sync: its layer, and the host time from its end to the start of the next
    launch call (of a GPU op, same forward, same host thread when the sync has one). That is how
    long the host took, once released, to give the idle GPU work again (Python, the guard's
    decision, the next op's setup); the GPU idles for this plus the launch latency."""
    t = T.load_trace(tables)
    s = t.syncs.reset_index(drop=True)
    lay = T.layer_ranges(t, layer_pattern)
    li = T.ranges_index(s["start_ns"].to_numpy(np.int64), lay["start_ns"].to_numpy(np.int64),
                         lay["end_ns"].to_numpy(np.int64))
    launches = t.kernels.dropna(subset=["launch_start_ns"])
    rows = []
    for i, r in enumerate(s.itertuples()):
        cand = launches[(launches["forward"] == r.forward)
                        & (launches["launch_start_ns"] >= r.end_ns)]
        own = cand[cand["launch_tid"] == r.tid]  # a runtime sync's launches share its thread
        cand = own if len(own) else cand
        nxt = cand.loc[cand["launch_start_ns"].idxmin()] if len(cand) else None
        name = lay["name"].iloc[li[i]] if li[i] >= 0 else None
        rows.append({"forward": int(r.forward), "layer": name, "sync_name": r.name,
                     "sync_start_ns": int(r.start_ns), "sync_end_ns": int(r.end_ns),
                     "next_launch_name": None if nxt is None else nxt["launch_name"],
                     "next_launch_start_ns": None if nxt is None else int(nxt["launch_start_ns"]),
                     "host_ns": None if nxt is None else int(nxt["launch_start_ns"]) - int(r.end_ns)})
    df = pd.DataFrame(rows, columns=["forward", "layer", "sync_name", "sync_start_ns",
                                     "sync_end_ns", "next_launch_name", "next_launch_start_ns",
                                     "host_ns"])
    for c in ("next_launch_start_ns", "host_ns"):
        df[c] = pd.array(df[c], dtype="Int64")
    return df


def _side(t: T.TraceTables, layer_pattern: str, sync_slack_ns: int) -> pd.DataFrame:
    lb = T.layer_breakdown(t, layer_pattern=layer_pattern, sync_slack_ns=sync_slack_ns)
    if not len(lb):  # no layer annotation matched: an empty frame with the columns
        lb = pd.DataFrame(columns=["forward", "layer", "layer_index", "idle_ns",
                                   "idle_after_sync_ns", "n_syncs", "sync_ns"])
    lb = lb[["forward", "layer", "layer_index", "idle_ns", "idle_after_sync_ns", "n_syncs",
             "sync_ns"]].rename(columns={"idle_after_sync_ns": "after_sync_ns"})
    sg = sync_launch_gaps(t, layer_pattern).dropna(subset=["layer"])
    host = sg.groupby(["forward", "layer"])["host_ns"].sum(min_count=1).rename("sync_to_launch_ns")
    lb = lb.merge(host.reset_index(), on=["forward", "layer"], how="left")
    lb["sync_to_launch_ns"] = lb["sync_to_launch_ns"].fillna(0).astype("int64")
    # align forwards by their order in the trace (forward ids may start anywhere)
    order = {f: i for i, f in enumerate(sorted(lb["forward"].unique()))}
    return lb.assign(forward=lb["forward"].map(order))


def trace_diff(a, b, names: tuple[str, str] = ("a", "b"), layer_pattern: str = LAYER_PATTERN,
               forward: int | None = None, sync_slack_ns: int = 2000) -> pd.DataFrame:
    """Per forward and layer, trace `a` against trace `b` of the same forward: GPU idle (and its
    after_sync part), syncs, and the host time from each sync's end to the next launch.

    Layers are aligned by the index at the end of their annotation (`moe_layer_3` -> 3),
    forwards by their order. `forward`: compare only that forward (by order) of each trace.
    added_idle_ns = idle_ns_a - idle_ns_b: what `a` adds (e.g. a = sync, b = cpu_flag), int ns.
    Raises LayerMismatchError when the traces do not hold the same forwards and layers."""
    sides = []
    for n, t in zip(names, (a, b)):
        s = _side(T.load_trace(t), layer_pattern, sync_slack_ns)
        if forward is not None:
            s = s[s["forward"] == forward]
        if not len(s):
            raise LayerMismatchError(f"{n}: no layer annotation matches {layer_pattern!r}"
                                     + ("" if forward is None else f" in forward {forward}"))
        sides.append(s)
    fa, fb = (s.groupby("forward")["layer_index"].apply(sorted).to_dict() for s in sides)
    if len(fa) != len(fb):
        raise LayerMismatchError(f"{names[0]} has {len(fa)} forwards, {names[1]} has {len(fb)}; "
                                 "pick one with forward=")
    for f in fa:
        if fa[f] != fb.get(f):
            raise LayerMismatchError(f"forward {f}: {names[0]} has {len(fa[f])} layers "
                                     f"{fa[f]}, {names[1]} has {len(fb.get(f, []))} "
                                     f"{fb.get(f, [])}")
    d = sides[0].merge(sides[1], on=["forward", "layer_index"], suffixes=("_a", "_b"))
    d["added_idle_ns"] = d["idle_ns_a"] - d["idle_ns_b"]
    d["added_syncs"] = d["n_syncs_a"] - d["n_syncs_b"]
    d = d.sort_values(["forward", "layer_index"]).reset_index(drop=True)
    d.attrs["names"] = tuple(names)
    return d
