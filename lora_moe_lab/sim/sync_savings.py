"""The audit's saving estimate: what removing one call site's syncs would save, from the replay
engine (sim/replay.py) on the audit's one profiled forward.

instruments/recorders/audit.py sits below sim/ and never imports it: lora_moe_lab/audit.py (above both)
hands `estimate` to audit(estimator=...). For each site, the sync calls of the graph
that lie in the site's `audit_sync_<n>` ranges are removed with the D2H copy right before each
(replay_transforms.remove_syncs(which="all", calls=...)), and the forward is replayed: the saving
is the traced forward's replayed time minus the changed one. A site without a blocking runtime
call in its ranges (a pageable copy, an allocation) is not estimated (None).
"""

from __future__ import annotations

import numpy as np

from . import replay_transforms as RT
from .replay import SYNC, build_graph, replay

__all__ = ["estimate", "host_call_starts"]


def host_call_starts(g) -> np.ndarray:
    """Absolute start (trace ns) of every host call of a graph: its window start plus the gaps and
    durations before it (build_graph stores them relative)."""
    w0 = int(g.meta["window_ns"][0])
    h = g.host
    ends = w0 + np.cumsum(h["gap"] + h["dur"])
    return ends - h["dur"]


def estimate(tables, ranges: dict, forward: int = 0):
    """({key: saving ns or None}, total ns of removing every attributed sync, note). `ranges`:
    {key: [(start_ns, end_ns), ...]} on the trace's clock."""
    g = build_graph(tables, forward=forward)
    starts = host_call_starts(g)
    sync_idx = np.nonzero(g.host["kind"] == SYNC)[0]
    base = float(replay(g).step_ns[0])
    out, every = {}, []
    for key, rs in ranges.items():
        s = starts[sync_idx]
        inside = np.zeros(len(sync_idx), bool)
        for a, b in rs:
            inside |= (s >= a) & (s < b)
        calls = sync_idx[inside]
        if not len(calls):
            out[key] = None
            continue
        every.append(calls)
        out[key] = base - float(replay(RT.remove_syncs(g, which="all", calls=calls)).step_ns[0])
    total = float("nan")
    if every:
        total = base - float(
            replay(RT.remove_syncs(g, which="all", calls=np.unique(np.concatenate(every)))).step_ns[0]
        )
    note = (
        f"replay of the profiled forward ({g.n_syncs} blocking runtime calls, {g.n_kernels} GPU ops); "
        "Daydream-style: host/device dependency graph"
    )
    return out, total, note

