"""Reading chrome / kineto traces into tidy tables at nanosecond precision: load_trace -> TraceTables.

Why nanoseconds: chrome traces store 'ts'/'dur' as floating-point microseconds with three
decimals. The timestamps are large (~5e12 us), so `float(ts) * 1000` is off by a nanosecond or
more, and rounding to whole microseconds (as some tools do) erases short kernels and the small
gaps between them. Here every number is parsed from its decimal text into an int of ns.

The tables: GPU ops linked to the host call that launched them (the 'correlation' arg, else the
flow arrows), CUDA runtime/driver calls, host syncs (blocking runtime calls merged with the
profiler's cuda_sync records), annotations, aten ops, and the forwards the events belong to.
"""
from __future__ import annotations

import dataclasses
import os
from decimal import ROUND_HALF_EVEN, Decimal

import numpy as np
import pandas as pd

__all__ = ["TraceTables", "load_trace", "as_tables", "read_doc", "to_ns", "fmt_us", "RawFloat", "frame",
           "top_level", "i64", "NA", "KERNEL_COLUMNS", "RUNTIME_COLUMNS", "SYNC_COLUMNS", "ANNOTATION_COLUMNS",
           "GPU_OP_CATS", "RUNTIME_CATS", "HOST_SYNC_KINDS", "PROFILER_SYNC_NAMES", "SYNC_RUNTIME_NAMES",
           "FORWARD_WRAPPER"]

GPU_OP_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
# Kinds of cuda_sync events (CUPTI synchronization records) that block the host thread.
# "Stream Wait Event" is a device-side wait between streams: not a host sync.
HOST_SYNC_KINDS = {"Stream Sync", "Context Sync", "Event Sync", "stream_synchronize",
                   "context_synchronize", "event_synchronize"}
# Runtime / driver API calls that block the calling host thread until the device has caught up.
# cudaMemcpyAsync is not here: torch follows a device-to-host cudaMemcpyAsync with a
# cudaStreamSynchronize, which is counted instead (so one `.item()` counts once).
PROFILER_SYNC_NAMES = frozenset({
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
    "cudaMemcpy2D", "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize",
    "cuMemcpyDtoH", "cuMemcpyDtoH_v2",
})
SYNC_RUNTIME_NAMES = PROFILER_SYNC_NAMES
FORWARD_WRAPPER = "profile_forward"  # the range profiling.profile_forwards puts around each call

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


def fmt_us(ns: int) -> str:
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


def read_doc(path, *, sealed: bool | None = None) -> dict:
    """A trace file's document through the checked reader (schemas.read_trace: its seal, gzip or not, a
    `traceEvents` list): a cut, invalid or foreign file is a RecordingError naming it."""
    from ..schemas import read_trace

    return read_trace(path, sealed=sealed, parse_float=RawFloat)


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
        doc = read_doc(path)
    elif isinstance(trace, dict):
        doc = trace
        if not isinstance(doc.get("traceEvents"), list):
            raise ValueError(f"not a chrome trace: the dict has no traceEvents list (it has {sorted(doc)[:6]})")
    elif isinstance(trace, list):
        doc = {"traceEvents": trace}
    else:
        raise TypeError(f"load_trace takes a path or a chrome-trace dict, not {type(trace).__name__}")
    where = path or "<in-memory trace>"
    try:
        return _tables(doc, forward_name, path)
    except _BadEvent as b:
        from ..schemas import RecordingError

        raise RecordingError(where, "trace", f"traceEvents[{b.index}]: {b.what}") from None


class _BadEvent(Exception):
    def __init__(self, index: int, what: str):
        self.index, self.what = index, what


def _events(doc, at: list):
    """The trace's events, `at[0]` the index of the one handed out; one that is not an object -> _BadEvent."""
    for i, e in enumerate(doc.get("traceEvents", ())):
        at[0] = i
        if not isinstance(e, dict):
            raise _BadEvent(i, f"an event that is not an object: {e!r:.60}")
        yield e


def _is_time(v) -> bool:
    try:
        to_ns(v)
        return True
    except (ValueError, TypeError, ArithmeticError):
        return False


def _tables(doc: dict, forward_name: str, path) -> TraceTables:
    gpu, rt, csync, ann, gann, cpu = [], [], [], [], [], []
    flows_s, flows_f = {}, {}
    at = [0]
    try:
        for e in _events(doc, at):
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
    except (ValueError, TypeError, ArithmeticError) as err:  # a ts / dur that is not a time
        e = doc["traceEvents"][at[0]]
        bad = next((f"{k} {e[k]!r:.40}" for k in ("ts", "dur") if k in e and not _is_time(e[k])), f"{err}")
        raise _BadEvent(at[0], f"{bad} is not a time in microseconds") from None

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


def top_level(ranges: list[dict]) -> list[dict]:
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
        rs = top_level([a for a in ann if pick(a["name"])])
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


def as_tables(t) -> TraceTables:
    """Tables as they are, or a trace (path, dict) parsed with load_trace."""
    return t if isinstance(t, TraceTables) else load_trace(t)


NA = np.iinfo(np.int64).min  # "no value" in int64 ns arrays (never a float: ns need 64 bits)


def i64(col) -> np.ndarray:
    """An ns column as int64, NA where it has no value."""
    return pd.Series(col).astype("Int64").to_numpy(dtype=np.int64, na_value=NA)

