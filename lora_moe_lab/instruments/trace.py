"""Record torch profiler traces of any code and read them back at nanosecond precision.

    tables = profile_forwards(lambda: model(x), n_warmup=2, n_active=3, path="t.json.gz")
    forward_metrics(tables)      # per forward: GPU busy / idle, idle split by cause, syncs
    idle_gaps(tables)            # every GPU idle gap with its category
    layer_breakdown(tables)      # the same per `moe_layer_{i}` annotation
    queue_depth(tables)          # kernels launched but not finished, over time
    export_perfetto(tables, "small.json.gz", forwards=2)   # opens in ui.perfetto.dev

Why nanoseconds: chrome traces store 'ts'/'dur' as floating-point microseconds with three
decimals. The timestamps are large (~5e12 us), so `float(ts) * 1000` is off by a nanosecond or
more, and rounding to whole microseconds (as some tools do) erases short kernels and the small
gaps between them. Here every number is parsed from its decimal text into an int of ns.

GPU idle gaps (inside one forward's GPU window: first op start .. last op end) get one cause:
  after_sync        a host sync (cudaStreamSynchronize, .item(), ...) returned inside the gap or
                    just before the next launch: the host was blocked, the queue drained, and
                    the GPU now waits for the host to issue again. The bubble of this lab.
  host_launch_wait  the next op's launch call began after the previous op ended: the GPU ran dry
                    because the host did not issue fast enough (launch-bound).
  kernel_to_kernel  the next op was already queued: the small device-side gap between ops.
  other             the next op has no launch record (cannot tell).
"""
from __future__ import annotations

import contextlib
import dataclasses
import gzip
import json
import os
import re
import tempfile
import warnings
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import pandas as pd
import torch

from .. import runtime
from .syncs import PROFILER_SYNC_NAMES

__all__ = ["TraceTables", "profile_forwards", "load_trace", "to_ns", "idle_gaps", "forward_metrics",
           "layer_breakdown", "queue_depth", "syncs_per_forward", "export_perfetto",
           "summarize", "GAP_CATEGORIES"]

GAP_CATEGORIES = ("after_sync", "host_launch_wait", "kernel_to_kernel", "other")
GPU_OP_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
# Kinds of cuda_sync events (CUPTI synchronization records) that block the host thread.
# "Stream Wait Event" is a device-side wait between streams: not a host sync.
HOST_SYNC_KINDS = {"Stream Sync", "Context Sync", "Event Sync", "stream_synchronize",
                   "context_synchronize", "event_synchronize"}
SYNC_RUNTIME_NAMES = PROFILER_SYNC_NAMES
FORWARD_WRAPPER = "profile_forward"  # the range profile_forwards puts around each call


# --- exact number parsing --------------------------------------------------------------------
class RawFloat(float):
    """A JSON float that remembers its text, so the text (not the rounded double) is parsed."""

    __slots__ = ("raw",)

    def __new__(cls, text: str):
        o = float.__new__(cls, text)
        o.raw = text
        return o


def _dec_us_to_ns(s: str) -> int:
    s = s.strip()
    if "e" in s or "E" in s or s.lower() in ("nan", "inf", "-inf", "infinity"):
        d = Decimal(s) * 1000
        if not d.is_finite():
            raise ValueError(f"not a finite timestamp: {s!r}")
        return int(d.to_integral_value(ROUND_HALF_EVEN))
    neg = s.startswith("-")
    if neg or s.startswith("+"):
        s = s[1:]
    ip, _, fp = s.partition(".")
    ns = int(ip or "0") * 1000 + int((fp + "000")[:3])
    rest = fp[3:]
    if rest and (rest[0] > "5" or (rest[0] == "5" and (rest[1:].strip("0") or ns % 2))):
        ns += 1  # round half to even beyond the nanosecond digit
    return -ns if neg else ns


def to_ns(v) -> int | None:
    """Chrome-trace microseconds (int, float, float with its JSON text, or str) -> int ns, exact.

    A Python float is read through its shortest repr (`1000.001` -> "1000.001" -> 1000001), so a
    hand-written trace dict gives exactly the numbers written in it."""
    if v is None:
        return None
    if isinstance(v, bool):
        raise TypeError("a timestamp cannot be a bool")
    if isinstance(v, RawFloat):
        return _dec_us_to_ns(v.raw)
    if isinstance(v, int):
        return v * 1000
    if isinstance(v, float):
        return _dec_us_to_ns(repr(v))
    if isinstance(v, (str, Decimal)):
        return _dec_us_to_ns(str(v))
    raise TypeError(f"cannot read a timestamp from {type(v).__name__}")


def _fmt_us(ns: int) -> str:
    """int ns -> exact decimal microseconds text (the inverse of to_ns)."""
    sign = "-" if ns < 0 else ""
    ns = abs(int(ns))
    return f"{sign}{ns // 1000}.{ns % 1000:03d}"


# --- tables ----------------------------------------------------------------------------------
@dataclasses.dataclass
class TraceTables:
    """Tidy tables of one chrome trace. Times are int64 ns on the trace's clock.

    kernels      GPU stream ops (kind: kernel / memcpy / memset) with their launching host call
                 (launch_*), the forward they were launched in (-1: none)
    runtime      CUDA runtime and driver API calls on the host (is_sync: blocks the host)
    syncs        host syncs: blocking runtime calls, merged with cuda_sync records
    memcpys      the memcpy rows of `kernels`, with direction and bytes
    annotations  record_function ranges on the host (`forward`, `moe_layer_3`, ...)
    gpu_annotations  the same ranges projected on GPU streams by the profiler (when present)
    cpu_ops      aten ops on the host
    forwards     one row per forward (host range), see load_trace(forward_name=...)
    """

    kernels: pd.DataFrame
    runtime: pd.DataFrame
    syncs: pd.DataFrame
    memcpys: pd.DataFrame
    annotations: pd.DataFrame
    gpu_annotations: pd.DataFrame
    cpu_ops: pd.DataFrame
    forwards: pd.DataFrame
    doc: dict = dataclasses.field(repr=False, default_factory=dict)
    path: str | None = None

    @property
    def labels(self) -> dict:
        return dict(self.doc.get("labels") or {})

    def __repr__(self):
        return (f"TraceTables({self.path or '<in memory>'}: {len(self.forwards)} forwards, "
                f"{len(self.kernels)} GPU ops, {len(self.runtime)} runtime calls, "
                f"{len(self.syncs)} syncs, {len(self.annotations)} annotations)")


KERNEL_COLUMNS = ["name", "kind", "device", "stream", "start_ns", "end_ns", "dur_ns", "correlation",
          "external_id", "launch_name", "launch_start_ns", "launch_end_ns", "launch_tid", "forward"]
RUNTIME_COLUMNS = ["name", "cat", "pid", "tid", "start_ns", "end_ns", "dur_ns", "correlation",
          "external_id", "is_sync", "forward"]
SYNC_COLUMNS = ["name", "source", "kind", "pid", "tid", "stream", "start_ns", "end_ns", "dur_ns",
          "correlation", "forward"]
ANNOTATION_COLUMNS = ["name", "pid", "tid", "start_ns", "end_ns", "dur_ns", "external_id", "forward"]


def frame(rows: list[dict], cols: list[str]) -> pd.DataFrame:
    """Rows as a DataFrame with these columns (an empty frame keeps them)."""
    df = pd.DataFrame(rows, columns=cols)
    for c in cols:
        if c.endswith("_ns") or c in ("forward",):
            df[c] = pd.array(df[c], dtype="Int64") if df[c].isna().any() else df[c].astype("int64")
    return df


def _read_doc(path) -> dict:
    p = str(path)
    with open(p, "rb") as f:
        head = f.read(2)
    opener = gzip.open if head == b"\x1f\x8b" else open
    with opener(p, "rt", encoding="utf-8") as f:
        doc = json.load(f, parse_float=RawFloat)
    if isinstance(doc, list):  # the JSON-array flavour of the format
        doc = {"traceEvents": doc}
    return doc


def load_trace(trace, forward_name: str = "forward") -> TraceTables:
    """Parse a chrome trace (path to .json / .json.gz, or an already-loaded dict) into tables.

    Forwards are the top-level `forward_name` annotations; without any, the ranges
    profile_forwards wraps around each call; then the profiler's `ProfilerStep#N` ranges; then
    the whole trace as one forward."""
    path = None
    if isinstance(trace, TraceTables):
        return trace
    if isinstance(trace, (str, os.PathLike)):
        path = str(trace)
        doc = _read_doc(path)
    elif isinstance(trace, dict):
        doc = trace
    elif isinstance(trace, list):
        doc = {"traceEvents": trace}
    else:
        raise TypeError(f"load_trace takes a path or a chrome-trace dict, not {type(trace).__name__}")

    gpu, rt, csync, ann, gann, cpu = [], [], [], [], [], []
    flows_s, flows_f = {}, {}
    for e in doc.get("traceEvents", ()):
        ph = e.get("ph")
        if ph in ("s", "f"):  # launch -> GPU op arrows ("ac2g"); other flows (fwdbwd) ignored
            if "id" in e and "ts" in e and e.get("cat", "ac2g") == "ac2g":
                (flows_s if ph == "s" else flows_f)[(e.get("pid"), e.get("tid"), to_ns(e["ts"]))] = e["id"]
            continue
        if ph != "X":
            continue
        cat = e.get("cat", "")
        args = e.get("args") or {}
        start = to_ns(e.get("ts", 0))
        dur = to_ns(e.get("dur", 0)) or 0
        base = {"name": e.get("name", ""), "start_ns": start, "end_ns": start + dur, "dur_ns": dur,
                "external_id": args.get("External id")}
        if cat in GPU_OP_CATS:
            gpu.append({**base, "kind": GPU_OP_CATS[cat], "device": args.get("device", e.get("pid")),
                        "stream": args.get("stream", e.get("tid")),
                        "correlation": args.get("correlation"), "bytes": args.get("bytes"),
                        "_key": (e.get("pid"), e.get("tid"), start)})
        elif cat in RUNTIME_CATS:
            rt.append({**base, "cat": cat, "pid": e.get("pid"), "tid": e.get("tid"),
                       "correlation": args.get("correlation"),
                       "_key": (e.get("pid"), e.get("tid"), start)})
        elif cat == "cuda_sync":
            csync.append({**base, "kind": args.get("cuda_sync_kind", e.get("name", "")),
                          "pid": e.get("pid"), "tid": e.get("tid"), "stream": args.get("stream"),
                          "correlation": args.get("correlation")})
        elif cat == "user_annotation":
            ann.append({**base, "pid": e.get("pid"), "tid": e.get("tid")})
        elif cat == "gpu_user_annotation":
            gann.append({**base, "pid": e.get("pid"), "tid": e.get("tid")})
        elif cat == "cpu_op":
            cpu.append({**base, "pid": e.get("pid"), "tid": e.get("tid")})

    # Link GPU ops to the host call that launched them: the 'correlation' arg, else flow events.
    by_corr = {r["correlation"]: r for r in rt if r["correlation"] is not None}
    by_key = {r["_key"]: r for r in rt}
    flow_host = {v: k for k, v in flows_s.items()}
    for g in gpu:
        r = by_corr.get(g["correlation"]) if g["correlation"] is not None else None
        if r is None:
            fid = flows_f.get(g["_key"])
            r = by_key.get(flow_host.get(fid)) if fid is not None else None
            if r is not None and g["correlation"] is None:
                g["correlation"] = r["correlation"] if r["correlation"] is not None else fid
        g["launch_name"] = r["name"] if r else None
        g["launch_start_ns"] = r["start_ns"] if r else None
        g["launch_end_ns"] = r["end_ns"] if r else None
        g["launch_tid"] = r["tid"] if r else None
    for r in rt:
        r["is_sync"] = r["name"] in SYNC_RUNTIME_NAMES

    every = rt + ann + cpu + gpu + csync
    bounds = (min(r["start_ns"] for r in every), max(r["end_ns"] for r in every)) if every else None
    forwards = _forwards(ann, forward_name, bounds)
    whole = len(forwards) == 1 and forwards[0]["name"] == "<trace>"
    f_starts = np.array([f["start_ns"] for f in forwards], dtype=np.int64)
    f_ends = np.array([f["end_ns"] for f in forwards], dtype=np.int64)

    def fwd_of(t):
        if t is None or not len(f_starts):
            return -1
        i = int(np.searchsorted(f_starts, t, side="right")) - 1
        return i if i >= 0 and t < f_ends[i] else -1

    for g in gpu:  # the forward an op belongs to: the one its launch call ran in
        g["forward"] = 0 if whole else fwd_of(g["launch_start_ns"])
    for lst in (rt, csync, ann, gann, cpu):
        for r in lst:
            r["forward"] = fwd_of(r["start_ns"])

    syncs = _merge_syncs(rt, csync)
    kernels = frame(sorted(gpu, key=lambda g: (g["start_ns"], g["end_ns"])), KERNEL_COLUMNS + ["bytes"])
    memcpys = kernels[kernels["kind"] == "memcpy"].copy()
    memcpys["direction"] = memcpys["name"].str.extract(r"(DtoH|HtoD|DtoD|HtoH|PtoP)", expand=False)
    kernels = kernels.drop(columns=["bytes"])
    return TraceTables(
        kernels=kernels.reset_index(drop=True),
        runtime=frame(sorted(rt, key=lambda r: r["start_ns"]), RUNTIME_COLUMNS),
        syncs=frame(sorted(syncs, key=lambda r: r["start_ns"]), SYNC_COLUMNS),
        memcpys=memcpys.reset_index(drop=True),
        annotations=frame(sorted(ann, key=lambda r: r["start_ns"]), ANNOTATION_COLUMNS),
        gpu_annotations=frame(sorted(gann, key=lambda r: r["start_ns"]), ANNOTATION_COLUMNS),
        cpu_ops=frame(sorted(cpu, key=lambda r: r["start_ns"]), ANNOTATION_COLUMNS),
        forwards=pd.DataFrame(forwards, columns=["forward", "name", "start_ns", "end_ns", "dur_ns"]),
        doc=doc, path=path)


def _top_level(ranges: list[dict]) -> list[dict]:
    out, end = [], None
    for r in sorted(ranges, key=lambda r: (r["start_ns"], -r["end_ns"])):
        if end is not None and r["start_ns"] < end:
            continue  # nested in (or overlapping) the previous top-level range
        out.append(r)
        end = r["end_ns"]
    return out


def _forwards(ann: list[dict], forward_name: str, bounds: tuple[int, int] | None) -> list[dict]:
    for pick in (lambda n: n == forward_name, lambda n: n == FORWARD_WRAPPER,
                 lambda n: n.startswith("ProfilerStep#")):
        rs = _top_level([a for a in ann if pick(a["name"])])
        if rs:
            break
    else:  # no ranges at all: the whole trace is one forward
        rs = [] if bounds is None else [{"name": "<trace>", "start_ns": bounds[0],
                                         "end_ns": bounds[1] + 1, "dur_ns": bounds[1] + 1 - bounds[0]}]
    return [{"forward": i, "name": r["name"], "start_ns": r["start_ns"], "end_ns": r["end_ns"],
             "dur_ns": r["dur_ns"]} for i, r in enumerate(rs)]


def _merge_syncs(rt: list[dict], csync: list[dict]) -> list[dict]:
    """Host syncs: blocking runtime calls, plus cuda_sync records that no runtime call explains.
    A cuda_sync record and its runtime call share a correlation id (or overlap in time): one sync."""
    out = []
    for r in rt:
        if r["is_sync"]:
            out.append({"name": r["name"], "source": "runtime", "kind": None, "pid": r["pid"],
                        "tid": r["tid"], "stream": None, "start_ns": r["start_ns"],
                        "end_ns": r["end_ns"], "dur_ns": r["dur_ns"],
                        "correlation": r["correlation"], "forward": r["forward"]})
    by_corr = {s["correlation"]: s for s in out if s["correlation"] is not None}
    starts = np.array([s["start_ns"] for s in out], dtype=np.int64)
    order = np.argsort(starts, kind="stable")
    for c in csync:
        if c["kind"] not in HOST_SYNC_KINDS and c["name"] not in HOST_SYNC_KINDS:
            continue
        s = by_corr.get(c["correlation"]) if c["correlation"] is not None else None
        if s is None and len(order):  # no correlation match: a runtime sync around the record?
            i = int(np.searchsorted(starts[order], c["start_ns"], side="right")) - 1
            if i >= 0:
                cand = out[order[i]]
                if cand["start_ns"] <= c["start_ns"] <= cand["end_ns"]:
                    s = cand
        if s is not None:
            s["kind"], s["stream"] = c["kind"], c["stream"]
            continue
        out.append({"name": c["name"], "source": "cuda_sync", "kind": c["kind"], "pid": c["pid"],
                    "tid": c["tid"], "stream": c["stream"], "start_ns": c["start_ns"],
                    "end_ns": c["end_ns"], "dur_ns": c["dur_ns"], "correlation": c["correlation"],
                    "forward": c["forward"]})
    return out


# --- metrics ---------------------------------------------------------------------------------
def _tables(t) -> TraceTables:
    return t if isinstance(t, TraceTables) else load_trace(t)


_NA = np.iinfo(np.int64).min  # "no value" in int64 ns arrays (never a float: ns need 64 bits)


def _i64(col) -> np.ndarray:
    return pd.Series(col).astype("Int64").to_numpy(dtype=np.int64, na_value=_NA)


def _ranges_index(times: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Index of the (sorted, non-overlapping) range containing each time, -1 when none."""
    if not len(starts):
        return np.full(len(times), -1, dtype=np.int64)
    i = np.searchsorted(starts, times, side="right") - 1
    ok = (i >= 0) & (times < ends[np.clip(i, 0, None)])
    return np.where(ok, i, -1)


def _layer_ranges(t: TraceTables, pattern: str) -> pd.DataFrame:
    a = t.annotations
    a = a[a["name"].str.match(pattern)] if len(a) else a
    return pd.DataFrame(_top_level(a.to_dict("records")), columns=a.columns)


def idle_gaps(tables, sync_slack_ns: int = 2000, layer_pattern: str = r"moe_layer_\d+$",
              include_unassigned: bool = False) -> pd.DataFrame:
    """Every GPU idle gap inside a forward's GPU window, one row each, with its cause.

    The window of a forward is its GPU ops (those launched during the forward) from the first
    start to the last end; ops on all streams of a device count as busy (union). A sync counts
    for a gap when it ended in [gap start - sync_slack_ns, next launch start] (the slack absorbs
    the small host/GPU clock offset of the profiler)."""
    t = _tables(tables)
    k = t.kernels
    if not include_unassigned:
        k = k[k["forward"] >= 0]
    s = t.syncs.sort_values("end_ns")
    s_end = s["end_ns"].to_numpy(dtype=np.int64)
    s_name = s["name"].to_numpy()
    layers = _layer_ranges(t, layer_pattern)
    rows = []
    for (fwd, dev), ops in k.groupby(["forward", "device"], sort=True, dropna=False):
        ops = ops.sort_values(["start_ns", "end_ns"])
        st = ops["start_ns"].to_numpy(dtype=np.int64)
        en = ops["end_ns"].to_numpy(dtype=np.int64)
        names = ops["name"].to_numpy()
        ls = _i64(ops["launch_start_ns"])
        # running max of ends: a gap opens where an op starts after everything before it ended;
        # run_idx: the op that set the running max (the op the GPU finished last before the gap)
        run_end = np.maximum.accumulate(en)
        run_idx = np.maximum.accumulate(np.where(en == run_end, np.arange(len(en)), 0))
        prev_end = np.concatenate([[st[0]], run_end[:-1]])
        idx = np.nonzero(st > prev_end)[0]
        for i in idx:
            g0, g1 = int(prev_end[i]), int(st[i])
            launch = int(ls[i])
            known = launch != _NA
            upper = max(launch, g0) if known else g1
            si = int(np.searchsorted(s_end, upper, side="right")) - 1
            sync_hit = si >= 0 and s_end[si] >= g0 - sync_slack_ns
            if sync_hit:
                cat = "after_sync"
            elif not known:
                cat = "other"
            elif launch >= g0:
                cat = "host_launch_wait"
            else:
                cat = "kernel_to_kernel"
            rows.append({"forward": int(fwd), "device": dev, "start_ns": g0, "end_ns": g1,
                         "dur_ns": g1 - g0, "category": cat, "prev_name": names[run_idx[i - 1]],
                         "next_name": names[i],
                         "next_launch_start_ns": launch if known else None,
                         "sync_name": s_name[si] if sync_hit else None,
                         "sync_end_ns": int(s_end[si]) if sync_hit else None})
    cols = ["forward", "device", "start_ns", "end_ns", "dur_ns", "category", "prev_name",
            "next_name", "next_launch_start_ns", "sync_name", "sync_end_ns", "layer"]
    df = pd.DataFrame(rows, columns=cols[:-1])
    # the layer a gap belongs to: the annotation in which the op after the gap was launched
    key = _i64(df["next_launch_start_ns"])
    key = np.where(key == _NA, _i64(df["end_ns"]), key)
    li = _ranges_index(key, layers["start_ns"].to_numpy(dtype=np.int64),
                       layers["end_ns"].to_numpy(dtype=np.int64))
    df["layer"] = np.where(li >= 0, layers["name"].to_numpy()[np.clip(li, 0, None)] if len(layers)
                           else None, None)
    for c in ("next_launch_start_ns", "sync_end_ns"):
        df[c] = pd.array(df[c], dtype="Int64")
    df["category"] = pd.Categorical(df["category"], categories=list(GAP_CATEGORIES))
    return df


def _busy(st: np.ndarray, en: np.ndarray) -> int:
    """Length of the union of intervals."""
    if not len(st):
        return 0
    o = np.argsort(st, kind="stable")
    st, en = st[o], en[o]
    run_end = np.maximum.accumulate(en)
    prev_end = np.concatenate([[st[0]], run_end[:-1]])
    gaps = np.clip(st - prev_end, 0, None).sum()
    return int(run_end[-1] - st[0] - gaps)


def syncs_per_forward(tables) -> pd.DataFrame:
    """Host syncs per forward: how many, host time blocked in them, which calls."""
    t = _tables(tables)
    rows = []
    for f in t.forwards["forward"]:
        s = t.syncs[t.syncs["forward"] == f]
        rows.append({"forward": int(f), "n_syncs": len(s), "sync_ns": int(s["dur_ns"].sum()),
                     "names": ",".join(f"{k}x{v}" for k, v in s["name"].value_counts().items())})
    return pd.DataFrame(rows, columns=["forward", "n_syncs", "sync_ns", "names"])


def forward_metrics(tables, **gap_kw) -> pd.DataFrame:
    """Per forward: host time, GPU window, busy and idle ns, idle split by cause, ops, syncs."""
    t = _tables(tables)
    gaps = idle_gaps(t, **gap_kw)
    sp = syncs_per_forward(t).set_index("forward")
    rows = []
    for f in t.forwards.itertuples():
        k = t.kernels[t.kernels["forward"] == f.forward]
        g = gaps[gaps["forward"] == f.forward]
        row = {"forward": f.forward, "host_start_ns": f.start_ns, "host_end_ns": f.end_ns,
               "host_ns": f.dur_ns, "n_gpu_ops": len(k),
               "n_kernels": int((k["kind"] == "kernel").sum())}
        if len(k):
            g0, g1 = int(k["start_ns"].min()), int(k["end_ns"].max())
            busy = sum(_busy(kk["start_ns"].to_numpy(np.int64), kk["end_ns"].to_numpy(np.int64))
                       for _, kk in k.groupby("device", dropna=False))
            row.update(gpu_start_ns=g0, gpu_end_ns=g1, gpu_span_ns=g1 - g0, busy_ns=busy)
        else:
            row.update(gpu_start_ns=None, gpu_end_ns=None, gpu_span_ns=0, busy_ns=0)
        row["idle_ns"] = int(g["dur_ns"].sum())
        for c in GAP_CATEGORIES:
            row[f"idle_{c}_ns"] = int(g.loc[g["category"] == c, "dur_ns"].sum())
        row["n_gaps"] = len(g)
        row["n_syncs"] = int(sp.loc[f.forward, "n_syncs"]) if f.forward in sp.index else 0
        row["sync_ns"] = int(sp.loc[f.forward, "sync_ns"]) if f.forward in sp.index else 0
        row["gpu_util"] = row["busy_ns"] / row["gpu_span_ns"] if row["gpu_span_ns"] else float("nan")
        rows.append(row)
    df = pd.DataFrame(rows)
    for c in ("gpu_start_ns", "gpu_end_ns"):
        if c in df:
            df[c] = pd.array(df[c], dtype="Int64")
    return df


def layer_breakdown(tables, layer_pattern: str = r"moe_layer_\d+$", **gap_kw) -> pd.DataFrame:
    """Per forward and layer annotation: host time, GPU ops launched there and their busy time,
    the idle gaps before them by cause, and the syncs inside the layer."""
    t = _tables(tables)
    gaps = idle_gaps(t, layer_pattern=layer_pattern, **gap_kw)
    layers = _layer_ranges(t, layer_pattern)
    ls, le = layers["start_ns"].to_numpy(np.int64), layers["end_ns"].to_numpy(np.int64)
    k = t.kernels
    kl = _ranges_index(_i64(k["launch_start_ns"]), ls, le)
    sl = _ranges_index(t.syncs["start_ns"].to_numpy(np.int64), ls, le)
    rows = []
    for i, L in enumerate(layers.itertuples()):
        kk = k[kl == i]
        gg = gaps[(gaps["layer"] == L.name) & (gaps["forward"] == L.forward)]
        row = {"forward": L.forward, "layer": L.name, "host_start_ns": L.start_ns,
               "host_ns": L.dur_ns, "n_gpu_ops": len(kk),
               "busy_ns": _busy(kk["start_ns"].to_numpy(np.int64), kk["end_ns"].to_numpy(np.int64)),
               "n_syncs": int((sl == i).sum()),
               "sync_ns": int(t.syncs["dur_ns"].to_numpy()[sl == i].sum()),
               "idle_ns": int(gg["dur_ns"].sum())}
        for c in GAP_CATEGORIES:
            row[f"idle_{c}_ns"] = int(gg.loc[gg["category"] == c, "dur_ns"].sum())
        m = re.search(r"(\d+)$", L.name)
        row["layer_index"] = int(m.group(1)) if m else i
        rows.append(row)
    return pd.DataFrame(rows)


def queue_depth(tables, device=None) -> pd.DataFrame:
    """Launch-queue depth over time: GPU ops whose launch call returned (enqueued: the launch call's
    end, or the op's start if that came first) and that have not finished yet. A step function:
    each row gives the depth from time_ns until the next row. Ops without a launch record are left
    out. Column `forward` is the forward of the op whose enqueue/finish made the step."""
    t = _tables(tables)
    k = t.kernels.dropna(subset=["launch_end_ns"])
    if device is not None:
        k = k[k["device"] == device]
    enq = np.minimum(_i64(k["launch_end_ns"]), _i64(k["start_ns"]))
    end = k["end_ns"].to_numpy(np.int64)
    fwd = k["forward"].to_numpy(np.int64)
    times = np.concatenate([enq, end])
    delta = np.concatenate([np.ones(len(enq), np.int64), -np.ones(len(end), np.int64)])
    fw = np.concatenate([fwd, fwd])
    o = np.lexsort((delta, times))  # at equal times, finishes (-1) before enqueues (+1)
    depth = np.cumsum(delta[o])
    df = pd.DataFrame({"time_ns": times[o], "depth": depth, "delta": delta[o], "forward": fw[o]})
    # keep one row per timestamp (the depth after all events at that time)
    return df.groupby("time_ns", sort=True).agg(depth=("depth", "last"), forward=("forward", "last")
                                                ).reset_index()


def summarize(tables, **gap_kw) -> dict:
    """One row of means over forwards (for a CSV of many traces)."""
    t = _tables(tables)
    m = forward_metrics(t, **gap_kw)
    qd = queue_depth(t)
    out = {"n_forwards": len(m)}
    for c in ["host_ns", "gpu_span_ns", "busy_ns", "idle_ns"] + [f"idle_{c}_ns" for c in GAP_CATEGORIES] \
            + ["n_gpu_ops", "n_kernels", "n_gaps", "n_syncs", "sync_ns", "gpu_util"]:
        out[c] = float(m[c].mean()) if len(m) else float("nan")
    out["max_queue_depth"] = int(qd["depth"].max()) if len(qd) else 0
    return out


# --- export ----------------------------------------------------------------------------------
def _json_event(e: dict) -> str:
    items = []
    for k, v in e.items():
        if k in ("ts", "dur") and v is not None and not isinstance(v, bool):
            items.append(f"{json.dumps(k)}:{_fmt_us(to_ns(v))}")
        else:
            items.append(f"{json.dumps(k)}:{json.dumps(v, separators=(',', ':'))}")
    return "{" + ",".join(items) + "}"


def dumps_trace(doc: dict) -> str:
    """Chrome-trace JSON text with every ts/dur written from exact ns (no float round trip)."""
    head = [f"{json.dumps(k)}:{json.dumps(v)}" for k, v in doc.items() if k != "traceEvents"]
    events = ",\n".join(_json_event(e) for e in doc.get("traceEvents", ()))
    return "{" + "".join(h + "," for h in head) + '"traceEvents":[\n' + events + "\n]}"


def write_doc(doc: dict, out_path) -> Path:
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = dumps_trace(doc)
    if out.name.endswith(".gz"):
        with open(out, "wb") as f:  # mtime=0: the same trace gives the same bytes
            with gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0) as gz:
                gz.write(text.encode())
    else:
        out.write_text(text)
    return out


def tables_to_doc(t: TraceTables, pid: int = 1, tid: int = 1) -> dict:
    """Chrome-trace events rebuilt from the tables (for TraceTables made without a trace, e.g. a
    simulated timeline): annotations, runtime calls, syncs (as cuda_sync records), GPU ops with
    their correlation and flow arrows. load_trace() of the result gives the same tables."""
    ev = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "host"}}]

    def x(cat, name, p, th, start, dur, args):
        return {"ph": "X", "cat": cat, "name": str(name), "pid": p, "tid": th,
                "ts": _fmt_us(int(start)), "dur": _fmt_us(int(dur)), "args": args}

    def val(v):
        return None if v is None or (not isinstance(v, str) and pd.isna(v)) else v

    for cat, df in (("user_annotation", t.annotations), ("cpu_op", t.cpu_ops)):
        for r in df.itertuples():
            ev.append(x(cat, r.name, val(r.pid) or pid, val(r.tid) or tid, r.start_ns, r.dur_ns, {}))
    for r in t.runtime.itertuples():
        a = {"correlation": val(r.correlation)} if val(r.correlation) is not None else {}
        ev.append(x(r.cat, r.name, val(r.pid) or pid, val(r.tid) or tid, r.start_ns, r.dur_ns, a))
    for r in t.syncs.itertuples():
        if r.source == "runtime" and val(r.kind) is None:
            continue  # already there as its runtime call (a record with a kind merges into it)
        ev.append(x("cuda_sync", r.kind or r.name, 0, val(r.stream) or 0, r.start_ns, r.dur_ns,
                    {"cuda_sync_kind": r.kind or r.name, "correlation": val(r.correlation)}))
    cat_of = {v: k for k, v in GPU_OP_CATS.items()}
    for r in t.kernels.itertuples():
        a = {"device": val(r.device), "stream": val(r.stream), "correlation": val(r.correlation)}
        ev.append(x(cat_of.get(r.kind, "kernel"), r.name, val(r.device) or 0, val(r.stream) or 0,
                    r.start_ns, r.dur_ns, a))
    return {"traceEvents": ev, "labels": dict(t.doc.get("labels") or {}) if t.doc else {}}


def _window_of_forwards(t: TraceTables, forwards) -> tuple[int, int]:
    if isinstance(forwards, int):
        sel = list(t.forwards["forward"])[:forwards]
    elif isinstance(forwards, slice):
        sel = list(t.forwards["forward"])[forwards]
    else:
        sel = list(forwards)
    f = t.forwards[t.forwards["forward"].isin(sel)]
    if not len(f):
        raise ValueError(f"no forwards selected by {forwards!r} (trace has {len(t.forwards)})")
    lo, hi = int(f["start_ns"].min()), int(f["end_ns"].max())
    k = t.kernels[t.kernels["forward"].isin(sel)]
    if len(k):
        lo, hi = min(lo, int(k["start_ns"].min())), max(hi, int(k["end_ns"].max()))
    return lo, hi


def trim_doc(t: TraceTables, window: tuple[int, int] | None = None, forwards=None,
             drop_cats: Iterable[str] = ()) -> dict:
    """A copy of the trace doc with only the events overlapping the window (ns), or the window of
    the selected forwards (an int N: the first N; a slice; or forward indices), without the
    categories in drop_cats (e.g. "cpu_op": the aten ops, most of a trace's bytes and unused by
    the metrics here). Metadata events stay; flow arrows stay when both their ends stay."""
    if forwards is not None:
        window = _window_of_forwards(t, forwards)
    src = t.doc if (t.doc and "traceEvents" in t.doc) else {**(t.doc or {}), **tables_to_doc(t)}
    drop = set(drop_cats)
    events = [e for e in src.get("traceEvents", ()) if e.get("cat") not in drop] if drop \
        else list(src.get("traceEvents", ()))
    doc = {k: v for k, v in src.items() if k != "traceEvents"}
    if window is None:
        doc["traceEvents"] = events
        return doc
    lo, hi = window
    kept, flows = [], []
    for e in events:
        ph = e.get("ph")
        if ph == "M":
            kept.append(e)
            continue
        if "ts" not in e:
            continue
        s = to_ns(e["ts"])
        if ph in ("s", "f", "t"):
            flows.append((e, s))
            continue
        end = s + (to_ns(e.get("dur", 0)) or 0)
        if end >= lo and s <= hi:
            kept.append(e)
    ids = {}
    for e, s in flows:
        if lo <= s <= hi:
            ids.setdefault(e.get("id"), []).append(e)
    for group in ids.values():
        if len(group) >= 2:
            kept.extend(group)
    doc["traceEvents"] = kept
    return doc


def export_perfetto(trace_or_path, out_path, forwards=None, window: tuple[int, int] | None = None,
                    max_bytes: int | None = None, labels: dict | None = None,
                    drop_cats: Iterable[str] = ()) -> Path:
    """Write a chrome-JSON trace (.json or .json.gz) that ui.perfetto.dev and chrome://tracing open,
    optionally trimmed to a window [lo, hi] ns or to some forwards, and without some event
    categories (see trim_doc). Timestamps are written exactly. With max_bytes, warns when the file
    is bigger."""
    t = _tables(trace_or_path)
    doc = trim_doc(t, window=window, forwards=forwards, drop_cats=drop_cats)
    if labels:
        doc["labels"] = {**(doc.get("labels") or {}), **labels}
    out = write_doc(doc, out_path)
    if max_bytes is not None and out.stat().st_size > max_bytes:
        warnings.warn(f"{out} is {out.stat().st_size} bytes (> {max_bytes}); trim to fewer forwards",
                      stacklevel=2)
    return out


# --- recording -------------------------------------------------------------------------------
def sync_events_config():
    """Ask for CUDA sync records (cudaStreamSynchronize etc. as `cuda_sync` events) where this
    torch offers them."""
    try:
        return torch.profiler._ExperimentalConfig(enable_cuda_sync_events=True)
    except Exception:  # older/newer torch without the option
        return None


def profile_forwards(fn: Callable[[], object], n_warmup: int = 2, n_active: int = 3, path=None,
                     labels: dict | None = None, keep_forwards: int | None = None,
                     forward_name: str = "forward", record_shapes: bool = False,
                     with_stack: bool = False, sync_between: bool = True,
                     sync_events: bool = True, activities: Iterable | None = None) -> TraceTables:
    """Run `fn()` n_warmup + n_active times under torch.profiler and return the parsed trace.

    Warm-up calls run with the profiler in its warm-up state (not recorded). Each call is wrapped
    in a `profile_forward` range (used as the forward when `fn` emits no `forward` range of its
    own). With sync_between, the device is synchronized after each call, outside that range, so
    forwards do not overlap on the GPU (that sync is not counted in any forward). The chrome trace
    is written to `path` (.json or .json.gz; a temporary file when None), optionally trimmed to the
    first `keep_forwards` forwards, with `labels` stored in the trace under "labels"."""
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    if activities is None:
        activities = [ProfilerActivity.CPU]
        if runtime.has_cuda():
            activities.append(ProfilerActivity.CUDA)
    kw = {}
    cfg = sync_events_config() if (sync_events and runtime.has_cuda()) else None
    if cfg is not None:
        kw["experimental_config"] = cfg
    exported = {}
    tmpdir = tempfile.mkdtemp(prefix="lora_moe_lab_trace_")
    raw = os.path.join(tmpdir, "raw.json")

    def ready(p):
        p.export_chrome_trace(raw)
        exported["raw"] = raw

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*warmup.*")  # n_warmup=0 is allowed
        with profile(activities=list(activities), schedule=schedule(
                wait=0, warmup=n_warmup, active=n_active, repeat=1), on_trace_ready=ready,
                record_shapes=record_shapes, with_stack=with_stack, **kw) as prof:
            for _ in range(n_warmup + n_active):
                with record_function(FORWARD_WRAPPER):
                    fn()
                if sync_between:
                    runtime.synchronize()
                prof.step()
    if "raw" not in exported:  # pragma: no cover - a torch whose schedule did not fire
        prof.export_chrome_trace(raw)
    t = load_trace(raw, forward_name=forward_name)
    if path is None:
        path = os.path.join(tmpdir, "trace.json.gz")
    out = export_perfetto(t, path, forwards=keep_forwards, labels=labels)
    with contextlib.suppress(OSError):
        os.remove(raw)
        os.rmdir(tmpdir)  # only when empty (the trace was written elsewhere)
    return load_trace(out, forward_name=forward_name)
