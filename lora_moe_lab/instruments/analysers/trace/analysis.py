"""What the tidy tables of a trace say: every GPU idle gap inside a forward with its cause, per-forward
and per-layer figures, launch-queue depth, syncs per forward, one summary row.

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

import re

import numpy as np
import pandas as pd

from .parse import NA, TraceTables, as_tables, i64, top_level

__all__ = ["GAP_CATEGORIES", "idle_gaps", "forward_metrics", "layer_breakdown", "queue_depth", "syncs_per_forward",
           "summarize", "ranges_index", "layer_ranges"]

GAP_CATEGORIES = ("after_sync", "host_launch_wait", "kernel_to_kernel", "other")


def ranges_index(times: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Index of the (sorted, non-overlapping) range containing each time, -1 when none."""
    if not len(starts):
        return np.full(len(times), -1, dtype=np.int64)
    i = np.searchsorted(starts, times, side="right") - 1
    ok = (i >= 0) & (times < ends[np.clip(i, 0, None)])
    return np.where(ok, i, -1)


def layer_ranges(t: TraceTables, pattern: str) -> pd.DataFrame:
    a = t.annotations
    a = a[a["name"].str.match(pattern)] if len(a) else a
    return pd.DataFrame(top_level(a.to_dict("records")), columns=a.columns)


def idle_gaps(tables, sync_slack_ns: int = 2000, layer_pattern: str = r"moe_layer_\d+$",
              include_unassigned: bool = False) -> pd.DataFrame:
    """Every GPU idle gap inside a forward's GPU window, one row each, with its cause.

    The window of a forward is its GPU ops (those launched during the forward) from the first
    start to the last end; ops on all streams of a device count as busy (union). A sync counts
    for a gap when it ended in [gap start - sync_slack_ns, next launch start] (the slack absorbs
    the small host/GPU clock offset of the profiler)."""
    t = as_tables(tables)
    k = t.kernels
    if not include_unassigned:
        k = k[k["forward"] >= 0]
    s = t.syncs.sort_values("end_ns")
    s_end = s["end_ns"].to_numpy(dtype=np.int64)
    s_name = s["name"].to_numpy()
    layers = layer_ranges(t, layer_pattern)
    rows = []
    for (fwd, dev), ops in k.groupby(["forward", "device"], sort=True, dropna=False):
        ops = ops.sort_values(["start_ns", "end_ns"])
        st = ops["start_ns"].to_numpy(dtype=np.int64)
        en = ops["end_ns"].to_numpy(dtype=np.int64)
        names = ops["name"].to_numpy()
        ls = i64(ops["launch_start_ns"])
        # running max of ends: a gap opens where an op starts after everything before it ended;
        # run_idx: the op that set the running max (the op the GPU finished last before the gap)
        run_end = np.maximum.accumulate(en)
        run_idx = np.maximum.accumulate(np.where(en == run_end, np.arange(len(en)), 0))
        prev_end = np.concatenate([[st[0]], run_end[:-1]])
        idx = np.nonzero(st > prev_end)[0]
        for i in idx:
            g0, g1 = int(prev_end[i]), int(st[i])
            launch = int(ls[i])
            known = launch != NA
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
    key = i64(df["next_launch_start_ns"])
    key = np.where(key == NA, i64(df["end_ns"]), key)
    li = ranges_index(key, layers["start_ns"].to_numpy(dtype=np.int64),
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
    t = as_tables(tables)
    rows = []
    for f in t.forwards["forward"]:
        s = t.syncs[t.syncs["forward"] == f]
        rows.append({"forward": int(f), "n_syncs": len(s), "sync_ns": int(s["dur_ns"].sum()),
                     "names": ",".join(f"{k}x{v}" for k, v in s["name"].value_counts().items())})
    return pd.DataFrame(rows, columns=["forward", "n_syncs", "sync_ns", "names"])


def forward_metrics(tables, **gap_kw) -> pd.DataFrame:
    """Per forward: host time, GPU window, busy and idle ns, idle split by cause, ops, syncs."""
    t = as_tables(tables)
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
    t = as_tables(tables)
    gaps = idle_gaps(t, layer_pattern=layer_pattern, **gap_kw)
    layers = layer_ranges(t, layer_pattern)
    ls, le = layers["start_ns"].to_numpy(np.int64), layers["end_ns"].to_numpy(np.int64)
    k = t.kernels
    kl = ranges_index(i64(k["launch_start_ns"]), ls, le)
    sl = ranges_index(t.syncs["start_ns"].to_numpy(np.int64), ls, le)
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
    t = as_tables(tables)
    k = t.kernels.dropna(subset=["launch_end_ns"])
    if device is not None:
        k = k[k["device"] == device]
    enq = np.minimum(i64(k["launch_end_ns"]), i64(k["start_ns"]))
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
    t = as_tables(tables)
    m = forward_metrics(t, **gap_kw)
    qd = queue_depth(t)
    out = {"n_forwards": len(m)}
    for c in ["host_ns", "gpu_span_ns", "busy_ns", "idle_ns"] + [f"idle_{c}_ns" for c in GAP_CATEGORIES] \
            + ["n_gpu_ops", "n_kernels", "n_gaps", "n_syncs", "sync_ns", "gpu_util"]:
        out[c] = float(m[c].mean()) if len(m) else float("nan")
    out["max_queue_depth"] = int(qd["depth"].max()) if len(qd) else 0
    return out

