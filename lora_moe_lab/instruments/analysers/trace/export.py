"""Writing traces back: chrome-trace JSON with every ts/dur written from exact ns, traces rebuilt from
tables (a simulated timeline), trimmed to a window or some forwards, for ui.perfetto.dev.

    export_perfetto(tables, "small.json.gz", forwards=2)   # opens in ui.perfetto.dev
"""
from __future__ import annotations

import gzip
import json
import warnings
from pathlib import Path
from typing import Iterable

import pandas as pd

from .parse import GPU_OP_CATS, TraceTables, as_tables, fmt_us, to_ns

__all__ = ["dumps_trace", "write_doc", "tables_to_doc", "window_of_forwards", "trim_doc", "export_perfetto"]


def _json_event(e: dict) -> str:
    items = []
    for k, v in e.items():
        if k in ("ts", "dur") and v is not None and not isinstance(v, bool):
            items.append(f"{json.dumps(k)}:{fmt_us(to_ns(v))}")
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
                "ts": fmt_us(int(start)), "dur": fmt_us(int(dur)), "args": args}

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


def window_of_forwards(t: TraceTables, forwards) -> tuple[int, int]:
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
        window = window_of_forwards(t, forwards)
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
    t = as_tables(trace_or_path)
    doc = trim_doc(t, window=window, forwards=forwards, drop_cats=drop_cats)
    if labels:
        doc["labels"] = {**(doc.get("labels") or {}), **labels}
    out = write_doc(doc, out_path)
    if max_bytes is not None and out.stat().st_size > max_bytes:
        warnings.warn(f"{out} is {out.stat().st_size} bytes (> {max_bytes}); trim to fewer forwards",
                      stacklevel=2)
    return out

