"""The per-sync signature of a forward, from a profiler trace: what each host-device sync costs the
HOST and what it costs the GPU, which are different quantities.

    per_sync(tables)        one row per sync, in order within its forward:
        host_blocked_us     how long the host sat in the sync (cudaStreamSynchronize's duration)
        lead_us             GPU work queued when the sync started: the last queued op's end - the
                            sync's start. The host waits for exactly this (plus a round trip).
        idle_after_us       GPU idle from the moment the queue drained at this sync until it drained
                            at the next one (or the forward's end), split by cause (idle_<cause>_us):
                            `after_sync` while the host leaves the sync and launches again,
                            `host_launch_wait` while the host is still issuing the next ops
    per_forward(tables)     the signature's totals: syncs, host blocked in all / the first / the
                            rest, GPU idle after the syncs, NCCL kernel time (the all-reduce spin)

Why two quantities: a sync blocks the host for as long as the GPU has work queued (its lead). While
it waits, the GPU is BUSY with that work, so a long block costs the GPU nothing by itself. What it
costs the GPU is the bubble afterwards: the queue is empty when the host returns, and the GPU idles
until the host has issued enough again. Production's trace (sgl-project/sglang#25531) reported
~100 ms of cumulative cudaStreamSynchronize per forward, ~70 ms in the first sync: host time
blocked. Set it beside host_blocked_us, never beside idle_after_us.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from . import trace as T

NCCL_PATTERN = r"(?i)nccl"
SYNC_COLUMNS = ["forward", "device", "sync_index", "start_ns", "end_ns", "host_blocked_us", "lead_us",
                "idle_after_us", *[f"idle_{c}_us" for c in T.GAP_CATEGORIES]]


def per_sync(tables, sync_slack_ns: int = 2000) -> pd.DataFrame:
    """One row per host sync inside a forward (see the module docstring for the columns)."""
    t = T.as_tables(tables)
    gaps = T.idle_gaps(t, sync_slack_ns=sync_slack_ns)
    rows = []
    syncs = t.syncs[t.syncs["forward"] >= 0].sort_values("start_ns")
    for (fwd, dev), ops in t.kernels[t.kernels["forward"] >= 0].groupby(["forward", "device"], sort=True):
        s = syncs[syncs["forward"] == fwd]
        if not len(s):
            continue
        ls = T.i64(ops["launch_start_ns"])
        en = ops["end_ns"].to_numpy(np.int64)
        gpu_end = int(en.max())
        g = gaps[(gaps["forward"] == fwd) & (gaps["device"] == dev)]
        g_st, g_dur = g["start_ns"].to_numpy(np.int64), g["dur_ns"].to_numpy(np.int64)
        g_cat = g["category"].astype(str).to_numpy()
        s0, s1 = s["start_ns"].to_numpy(np.int64), s["end_ns"].to_numpy(np.int64)
        # the queue a sync waits for: every op launched before the sync started
        drain = np.array([int(en[(ls != T.NA) & (ls < a)].max(initial=a)) for a in s0], dtype=np.int64)
        nxt = np.r_[drain[1:], gpu_end]
        for i in range(len(s)):
            sel = (g_st >= drain[i]) & (g_st < max(nxt[i], drain[i]))  # a bubble opens where the queue drained
            row = {"forward": int(fwd), "device": dev, "sync_index": i, "start_ns": int(s0[i]), "end_ns": int(s1[i]),
                   "host_blocked_us": (s1[i] - s0[i]) / 1e3, "lead_us": max(0, drain[i] - s0[i]) / 1e3,
                   "idle_after_us": g_dur[sel].sum() / 1e3}
            for c in T.GAP_CATEGORIES:
                row[f"idle_{c}_us"] = g_dur[sel & (g_cat == c)].sum() / 1e3
            rows.append(row)
    return pd.DataFrame(rows, columns=SYNC_COLUMNS)


def nccl_us(tables) -> pd.Series:
    """NCCL kernel time per forward (µs). An all-reduce kernel spins on its GPU until every rank's
    contribution arrives, so a rank whose host is stalled shows up as NCCL time on the others."""
    t = T.as_tables(tables)
    k = t.kernels[(t.kernels["forward"] >= 0) & t.kernels["name"].str.contains(NCCL_PATTERN, regex=True)]
    return k.groupby("forward")["dur_ns"].sum().div(1e3)


def per_forward(tables, sync_slack_ns: int = 2000) -> pd.DataFrame:
    """The signature's totals per forward. `first_share` is the first sync's part of the host time
    blocked in all syncs (production: ~70 of ~100 ms)."""
    t = T.as_tables(tables)
    s = per_sync(t, sync_slack_ns)
    nc = nccl_us(t)
    rows = []
    for f in t.forwards["forward"]:
        x = s[s["forward"] == f]
        later = x[x["sync_index"] > 0]
        tot = float(x["host_blocked_us"].sum())
        first = float(x["host_blocked_us"].iloc[0]) if len(x) else np.nan
        rows.append(dict(
            forward=int(f), n_syncs=len(x), host_blocked_ms=tot / 1e3, first_blocked_ms=first / 1e3,
            first_share=first / tot if tot else np.nan,
            first_lead_ms=float(x["lead_us"].iloc[0]) / 1e3 if len(x) else np.nan,
            later_blocked_median_us=float(later["host_blocked_us"].median()) if len(later) else np.nan,
            later_blocked_mean_us=float(later["host_blocked_us"].mean()) if len(later) else np.nan,
            later_lead_median_us=float(later["lead_us"].median()) if len(later) else np.nan,
            idle_after_ms=float(x["idle_after_us"].sum()) / 1e3,
            idle_after_first_us=float(x["idle_after_us"].iloc[0]) if len(x) else np.nan,
            idle_after_later_median_us=float(later["idle_after_us"].median()) if len(later) else np.nan,
            nccl_ms=float(nc.get(f, 0.0)) / 1e3))
    return pd.DataFrame(rows)


def from_sync_events(events, forwards: int) -> dict:
    """The host side of the signature WITHOUT a profiler: guard SyncEvents (model.guards, each with
    the perf_counter time blocked in its `.item()`) of `forwards` forwards of equal sync counts.
    Returns per-forward medians over the forwards after the first (steady state)."""
    b = np.array([e.blocked_ns for e in events], dtype=float) / 1e3
    if not len(b) or forwards < 1 or len(b) % forwards or (b < 0).any():
        return dict(first_blocked_ms=np.nan, later_blocked_median_us=np.nan, later_blocked_mean_us=np.nan,
                    host_blocked_ms=np.nan, first_share=np.nan)
    per = b.reshape(forwards, -1)
    steady = per[1:] if forwards > 1 else per  # the first forward starts from an idle GPU
    tot = steady.sum(axis=1)
    return dict(first_blocked_ms=float(np.median(steady[:, 0])) / 1e3,
                later_blocked_median_us=float(np.median(steady[:, 1:])) if per.shape[1] > 1 else np.nan,
                later_blocked_mean_us=float(np.mean(steady[:, 1:])) if per.shape[1] > 1 else np.nan,
                host_blocked_ms=float(np.median(tot)) / 1e3,
                first_share=float(np.median(steady[:, 0] / np.where(tot > 0, tot, np.nan))))


def host_cost_for_lead(blocked_us, after_host_work, target_us: float) -> float:
    """The host work h (µs) to add at each call point so that the later syncs of a forward block
    the host `target_us` on average, predicted from one measured forward without it.

    blocked_us       the host time blocked in each sync of one forward, in order
    after_host_work  per sync: True when host work at a call point comes right before it (the
                     first sync at a point); False for a sync right after another (it waits only
                     for a round trip, and h does not change it)
    Model: after a sync the queue is empty; host work h before the next sync lets the GPU catch up
    by h, so that sync blocks max(floor, b - h), floor = the back-to-back syncs' median (a round
    trip). The first sync of the forward is left out (its wait is set by earlier work)."""
    b = np.asarray(blocked_us, dtype=float)
    w = np.asarray(after_host_work, dtype=bool)
    if b.shape != w.shape or len(b) < 2:
        raise ValueError(f"need one flag per sync and >= 2 syncs, got {len(b)} and {len(w)}")
    b, w = b[1:], w[1:]
    floor = float(np.median(b[~w])) if (~w).any() else float(b.min())

    def mean_at(h):
        return float(np.where(w, np.maximum(floor, b - h), b).mean())

    if mean_at(0.0) <= target_us:
        return 0.0
    lo, hi = 0.0, float(b.max())
    if mean_at(hi) > target_us:
        raise ValueError(f"a later-sync mean of {target_us:g} us is below this forward's floor "
                         f"({mean_at(hi):.0f} us: round trips of back-to-back syncs)")
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mean_at(mid) > target_us else (lo, mid)
    return hi
