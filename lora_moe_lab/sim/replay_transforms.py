"""What-if transformations of a replay Graph (sim/replay.py): each a small pure function Graph -> Graph.

    remove_syncs(g)                  the fix: the guard's ranges (`lora_guard_sync`: its reduction, D2H copy,
                                     sync and host time) go; without guard ranges every sync and the D2H copy
                                     launched right before it
    add_syncs(g, template)           the guard: a guard's calls (from guard_template(a sync graph)) at every
                                     guard site (`lora_guard_*` ranges) or at given host calls
    scale_host(g, factor)            host work (and, calls=True, the runtime calls) x factor
    graph_launch(g, layers=None)     each layer's launches -> one cudaGraphLaunch, its kernels back to back
    add_early_exit(g, k, d_us)       K early-exit launches of d µs at the end of every layer (launch_always)
    scale_collectives(g, factor)     NCCL kernels' durations x factor (or set to ns=)
    tile_layers(g, times)            the layers' block repeated (an 8-layer trace as a 48-layer forward)
    unblock_launches(g)              launches that waited for a full launch queue get their usual duration
    drop_calls(g, calls)             a rewrite deletes ops: these host calls go with their kernels and gaps
    repeat_calls(g, calls)           a rewrite adds ops like existing ones: a copy of each call right after it
    shorten_gaps(g, calls, ns)       a rewrite deletes host-only ops: their time leaves the gap before each call
    apply(g, "name", **kw)           by name; an unknown name raises UnknownTransformationError
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from .replay import CALL, HOST_FIELDS, KERNEL_FIELDS, SYNC, Graph, GraphError, UnknownTransformationError

__all__ = ["GuardTemplate", "guard_template", "remove_syncs", "add_syncs", "scale_host", "graph_launch",
           "add_early_exit", "scale_collectives", "tile_layers", "unblock_launches", "drop_calls", "repeat_calls",
           "shorten_gaps", "apply", "TRANSFORMS", "GRAPH_LAUNCH_NS", "GRAPH_K2K_NS"]

# cudaGraphLaunch host cost, unprofiled (a profiler inflates it: 150-440 µs in data/traces/*_graph_*,
# where CUPTI records every node); the kernel-to-kernel gap inside a replayed graph (data/traces/*_graph_*: 416 ns).
GRAPH_LAUNCH_NS = 10_000
GRAPH_K2K_NS = 416


def _block(n: int, **cols) -> dict:
    """A host or kernel block of n rows; missing fields get neutral values."""
    out = {}
    for f in set(HOST_FIELDS) | set(KERNEL_FIELDS):
        if f in cols:
            v = cols[f]
            out[f] = np.asarray(v if np.ndim(v) else [v] * n)
    return out


def _edit(g: Graph, drop_host=None, drop_kern=None, inserts=(), carry=None, add_gap=None) -> Graph:
    """A new graph: host calls dropped (drop_host mask; carry[i]: gap of a dropped call handed to the next
    kept original call), kernels dropped (drop_kern; those of a dropped call always go), blocks inserted
    before original call `anchor` (n: after the last), add_gap: ns added to each original call's gap."""
    n, m = g.n_host, g.n_kernels
    h, k = g.host, g.kern
    keep = np.ones(n, bool) if drop_host is None else ~np.asarray(drop_host, bool)
    gap = h["gap"].copy() + (0 if add_gap is None else np.asarray(add_gap, np.int64))
    tail = g.tail
    if carry is not None:
        c = np.where(keep, 0, np.asarray(carry, np.int64))
        # each dropped call's carry goes to the next kept call
        nxt = np.searchsorted(np.nonzero(keep)[0], np.arange(n), side="left")
        kept_idx = np.nonzero(keep)[0]
        to_tail = nxt >= len(kept_idx)
        np.add.at(gap, kept_idx[nxt[~to_tail]], c[~to_tail])
        tail += int(c[to_tail].sum())
    # rows: (anchor, 0 = inserted / 1 = original, order)
    rows_a, rows_b, rows_c = [np.arange(n)[keep]], [np.ones(keep.sum(), np.int64)], [np.arange(n)[keep]]
    hcols = {f: [(gap if f == "gap" else h[f])[keep]] for f in HOST_FIELDS}
    kmask = keep[k["host"]] & (np.ones(m, bool) if drop_kern is None else ~np.asarray(drop_kern, bool))
    kcols = {f: [k[f][kmask]] for f in KERNEL_FIELDS}
    k_row = [k["host"][kmask]]  # the launching call's row id (original: its index)
    k_ord = [np.arange(m)[kmask]]
    next_id = n
    for anchor, hb, kb in inserts:
        p = len(hb["kind"])
        rows_a.append(np.full(p, anchor))
        rows_b.append(np.zeros(p, np.int64))
        rows_c.append(np.arange(next_id, next_id + p))
        for f in HOST_FIELDS:
            hcols[f].append(np.asarray(hb[f]))
        q = len(kb.get("host", ()))
        if q:
            for f in KERNEL_FIELDS:
                kcols[f].append(np.asarray(kb["host"]) + next_id if f == "host" else np.asarray(kb[f]))
            k_row.append(np.asarray(kb["host"]) + next_id)
            k_ord.append(m + next_id + np.arange(q))
        next_id += p
    ra, rb, rc = (np.concatenate(x) for x in (rows_a, rows_b, rows_c))
    order = np.lexsort((rc, rb, ra))
    host = {f: np.concatenate(hcols[f])[order] for f in HOST_FIELDS}
    new_of = np.empty(next_id, np.int64)
    new_of[rc[order]] = np.arange(len(order))
    kern = {f: np.concatenate(kcols[f]) for f in KERNEL_FIELDS}
    kern["host"] = new_of[np.concatenate(k_row)]
    ko = np.lexsort((np.concatenate(k_ord), kern["host"]))
    kern = {f: v[ko] for f, v in kern.items()}
    # sites: anchors follow their first row at or after the old anchor
    keys = ra[order] * 2 + rb[order]
    sites = g.sites.copy()
    if len(sites):
        sites["anchor"] = np.searchsorted(keys, sites["anchor"].to_numpy() * 2, side="left")
    for f in ("gap", "dur", "ret", "guard", "gap_guard", "layer"):
        host[f] = host[f].astype(np.int64)
    host["kind"] = host["kind"].astype(np.int8)
    return dataclasses.replace(g, host=host, kern=kern, tail=int(tail), sites=sites, traced_ns=None,
                               meta={**g.meta, "transforms": [*g.meta.get("transforms", [])]})


def _tag(g: Graph, what: str) -> Graph:
    g.meta["transforms"] = [*g.meta.get("transforms", []), what]
    return g


# --- the guard -----------------------------------------------------------------------------------
def _sync_sites(g: Graph) -> np.ndarray:
    """Indices of the guard ranges that hold a sync."""
    h = g.host
    s = np.unique(h["guard"][(h["kind"] == SYNC) & (h["guard"] >= 0)])
    return s


def remove_syncs(g: Graph, decision_ns: int = 0, which: str = "guard", calls=None) -> Graph:
    """The fix. With guard ranges (`lora_guard_*` annotations): every call in a range that holds a sync
    goes (the reduction launch, the D2H copy, the sync) with its kernels, and the host time inside every
    guard range is replaced by `decision_ns` (a host bool read); host work before a range stays.
    Without guard ranges (or which='all'): every sync goes, with the call right before it when that
    call launched a D2H copy, and their gaps (the guard's own host cost). `calls` (with which='all'):
    only these host-call indices, each a sync (the audit removes one call site's syncs at a time)."""
    h, k = g.host, g.kern
    if which not in ("guard", "all"):
        raise GraphError(f"which is 'guard' or 'all', not {which!r}")
    ss = _sync_sites(g)
    if which == "guard" and len(ss):
        drop = np.isin(h["guard"], ss)
        carry = h["gap"] - h["gap_guard"]  # the part of a dropped call's gap before its range began
        add = -h["gap_guard"] * (~drop)
        if decision_ns:
            anchors = g.sites["anchor"].to_numpy()
            add = add + np.bincount(np.minimum(anchors, g.n_host - 1), minlength=g.n_host) * int(decision_ns)
        out = _edit(g, drop_host=drop, carry=carry, add_gap=add)
        out.tail -= g.tail_guard
        out.tail_guard = 0
        return _tag(out, f"remove_syncs(guard ranges {len(ss)}, decision {decision_ns} ns)")
    sync = h["kind"] == SYNC
    if calls is not None:
        if which != "all":
            raise GraphError("calls= selects syncs by host-call index: use it with which='all'")
        sel = np.zeros(g.n_host, bool)
        idx = np.asarray(calls, np.int64)
        if len(idx) and (idx.min() < 0 or idx.max() >= g.n_host or not sync[idx].all()):
            raise GraphError(f"calls= must be indices of sync calls of the graph (0..{g.n_host - 1})")
        sel[idx] = True
        sync = sel
    if not sync.any():
        raise GraphError("the graph has no syncs to remove")
    d2h = np.zeros(g.n_host, bool)
    is_d2h = np.array(["DtoH" in str(n) for n in k["name"]], bool)
    d2h[k["host"][is_d2h]] = True
    prev = np.nonzero(sync)[0] - 1
    drop = sync.copy()
    drop[prev[(prev >= 0) & d2h[np.maximum(prev, 0)]]] = True
    return _tag(_edit(g, drop_host=drop), f"remove_syncs(all {int(sync.sum())})")


@dataclasses.dataclass(frozen=True)
class GuardTemplate:
    """The calls of one guard decision, position by position (medians over a sync graph's guard ranges):
    host: HOST_FIELDS arrays (gap of the first call: the part inside the range); kern: KERNEL_FIELDS with
    `host` = the call's position; after_ns: host time in the range after its last call."""

    host: dict
    kern: dict
    after_ns: int
    source: str = ""


def guard_template(sync_graph: Graph) -> GuardTemplate:
    """The typical guard of a graph traced with the `sync` guard (its most common call sequence)."""
    g = sync_graph
    h, k = g.host, g.kern
    ss = _sync_sites(g)
    if not len(ss):
        raise GraphError("guard_template needs a graph with guard ranges holding a sync (a `sync` trace)")
    seqs = {}
    for s in ss:
        idx = np.nonzero(h["guard"] == s)[0]
        seqs.setdefault(tuple(h["name"][idx]), []).append(idx)
    names, groups = max(seqs.items(), key=lambda kv: len(kv[1]))
    M = np.array(groups)  # sites x positions
    med = lambda a: np.median(a, axis=0).round().astype(np.int64)  # noqa: E731
    gaps = med(h["gap"][M])
    gaps[0] = int(np.median(h["gap_guard"][M[:, 0]]))
    host = dict(kind=h["kind"][M[0]], gap=gaps, dur=med(h["dur"][M]), ret=med(h["ret"][M]),
                guard=np.zeros(M.shape[1], np.int64), gap_guard=gaps.copy(), layer=np.zeros(M.shape[1], np.int64),
                name=np.array(names, object))
    host["gap_guard"][1:] = gaps[1:]
    kh = k["host"]
    rows = {f: [] for f in KERNEL_FIELDS}
    for pos in range(M.shape[1]):
        ks = [np.nonzero(kh == i)[0] for i in M[:, pos]]
        nk = min(len(x) for x in ks)
        for q in range(nk):
            sel = np.array([x[q] for x in ks])
            rows["host"].append(pos)
            for f in ("dur", "lat", "gap"):
                rows[f].append(int(np.median(k[f][sel])))
            rows["stream"].append(int(k["stream"][sel[0]]))
            rows["nccl"].append(False)
            rows["guard"].append(0)
            rows["name"].append(k["name"][sel[0]])
    kern = {f: np.array(v, object if f == "name" else None) for f, v in rows.items()}
    last = M[:, -1] + 1
    after = int(np.median(h["gap_guard"][np.minimum(last, g.n_host - 1)]))
    return GuardTemplate(host, kern, after, source=str(g.meta.get("source")))


def unblock_launches(g: Graph, factor: float = 10.0, min_ns: int = 50_000) -> Graph:
    """Launch calls that blocked because the device's launch queue was full (a host far ahead of its
    GPU: cudaLaunchKernel waits for a free slot) get their name's median duration: longer than
    `factor` x that median and than min_ns. A graph that gains syncs never fills the queue."""
    h = g.host
    dur = h["dur"].copy()
    calls = h["kind"] == CALL
    names = h["name"].astype(str)
    n_fixed = 0
    for nm in np.unique(names[calls]):
        m = calls & (names == nm)
        med = int(np.median(dur[m]))
        bad = m & (dur > factor * med) & (dur > min_ns)
        dur[bad] = med
        n_fixed += int(bad.sum())
    out = dataclasses.replace(g, host={**h, "dur": dur}, traced_ns=None, meta=dict(g.meta))
    return _tag(out, f"unblock_launches({n_fixed} calls)")


def add_syncs(g: Graph, template: GuardTemplate, sites=None, unblock: bool = True) -> Graph:
    """The guard: the template's calls at every guard site (sites None: the graph's `lora_guard_*`
    ranges, whose own host time the template's replaces), or before each host call index in `sites`.
    unblock: first give launches that waited for a full launch queue their usual duration
    (unblock_launches): with a sync in every layer the queue never fills."""
    if not isinstance(template, GuardTemplate):
        raise GraphError(f"add_syncs needs a GuardTemplate (guard_template(a sync graph)), "
                         f"got {type(template).__name__}")
    base = unblock_launches(g) if unblock else g
    if sites is None:
        if not len(g.sites):
            raise GraphError("the graph has no guard sites (`lora_guard_*` ranges): pass sites= (host call indices)")
        if len(_sync_sites(base)):
            base = remove_syncs(base)
        else:  # the decision's own host time goes; the template brings the guard's
            tg = base.tail_guard
            base = _edit(base, add_gap=-base.host["gap_guard"])
            base.tail -= tg
        anchors = base.sites["anchor"].to_numpy()
        pre = base.sites["pre_ns"].to_numpy(np.int64) if "pre_ns" in base.sites else np.zeros(len(anchors), np.int64)
        sidx = np.arange(len(anchors))
    else:
        anchors = np.asarray(sites, np.int64)
        if len(anchors) and (anchors.min() < 0 or anchors.max() > g.n_host):
            raise GraphError(f"sites must be host call indices in 0..{g.n_host}, got {anchors.min()}..{anchors.max()}")
        sidx = np.full(len(anchors), -1)
        pre = np.zeros(len(anchors), np.int64)
    th, tk = template.host, template.kern
    inserts = []
    after = np.zeros(base.n_host, np.int64)
    moved = np.zeros(base.n_host + 1, np.int64)
    for a, si, p in zip(anchors, sidx, pre):
        hb = {f: np.array(th[f], copy=True) for f in HOST_FIELDS}
        # the host work before the decision stays before it: it moves from the anchor's gap to the guard's
        p = int(min(p, base.host["gap"][a] - moved[a])) if a < base.n_host else int(min(p, base.tail))
        p = max(p, 0)
        hb["gap"][0] += p
        moved[a] += p
        hb["guard"] = np.full(len(hb["kind"]), si)
        lay = base.host["layer"][min(a, base.n_host - 1)]
        hb["layer"] = np.full(len(hb["kind"]), lay)
        kb = {f: np.array(tk[f], copy=True) for f in KERNEL_FIELDS}
        kb["guard"] = np.full(len(kb["host"]), si)
        inserts.append((int(a), hb, kb))
        if a < base.n_host:
            after[a] += template.after_ns
    out = _edit(base, inserts=inserts, add_gap=after - moved[:base.n_host])
    out.tail -= int(moved[base.n_host])
    return _tag(out, f"add_syncs({len(anchors)} sites)")


# --- host, launches, collectives ------------------------------------------------------------------
def scale_host(g: Graph, factor: float, calls: bool = False, below_ns: int | None = None, ret: bool = True) -> Graph:
    """Host work (the gaps between runtime calls and the tail) x factor; calls=True: the runtime
    calls' own durations too (not a sync's wait, which the device sets), and with `ret` a sync's return
    latency after the drain (ret=False keeps it as traced: the driver's wake-up, not host work). below_ns:
    only gaps shorter than this (a long busy-wait of the engine runs at its own speed, profiled or not)."""
    if not np.isfinite(factor) or factor < 0:
        raise GraphError(f"a host factor must be finite and >= 0, got {factor}")
    h = dict(g.host)
    f = np.where(g.host["gap"] < below_ns, factor, 1.0) if below_ns is not None else factor
    h["gap"] = np.round(g.host["gap"] * f).astype(np.int64)
    h["gap_guard"] = np.round(g.host["gap_guard"] * f).astype(np.int64)
    if calls:
        h["dur"] = np.where(h["kind"] == CALL, np.round(g.host["dur"] * factor), g.host["dur"]).astype(np.int64)
        if ret:
            h["ret"] = np.round(g.host["ret"] * np.where(h["kind"] == SYNC, factor, 1)).astype(np.int64)
    out = dataclasses.replace(g, host=h, tail=int(round(g.tail * factor)), tail_guard=int(round(g.tail_guard * factor)),
                              traced_ns=None, meta=dict(g.meta))
    return _tag(out, f"scale_host({factor:g}, calls={calls})")


def graph_launch(g: Graph, layers=None, launch_ns: int = GRAPH_LAUNCH_NS, k2k_ns: int = GRAPH_K2K_NS) -> Graph:
    """CUDA-graph replay of each layer in `layers` (None: all): the layer's calls and host work become one
    cudaGraphLaunch of `launch_ns`; its kernels run back to back (`k2k_ns` apart)."""
    h = g.host
    want = range(len(g.layers)) if layers is None else layers
    drop = np.zeros(g.n_host, bool)
    inserts = []
    kern = {f: v.copy() for f, v in g.kern.items()}
    moved = []
    for li in want:
        idx = np.nonzero(h["layer"] == li)[0]
        if not len(idx):
            raise GraphError(f"layer {li} has no host calls (the graph has {len(g.layers)} layers)")
        if (h["kind"][idx] == SYNC).any():
            raise GraphError(f"layer {li} ({g.layers[li]}) holds {(h['kind'][idx] == SYNC).sum()} syncs: a CUDA graph "
                             f"cannot contain a host sync; apply remove_syncs first (or use launch_always)")
        drop[idx] = True
        ks = np.nonzero(np.isin(kern["host"], idx))[0]
        moved.append((int(idx[0]), ks))
    # kernels of each layer are re-attached to the inserted launch: drop them and re-insert
    drop_k = np.zeros(g.n_kernels, bool)
    for a, ks in moved:
        drop_k[ks] = True
        hb = _block(1, kind=np.array([CALL], np.int8), gap=np.array([0]), dur=np.array([launch_ns]), ret=np.array([0]),
                    guard=np.array([-1]), gap_guard=np.array([0]), layer=np.array([h["layer"][a]]),
                    name=np.array(["cudaGraphLaunch"], object))
        kb = {f: g.kern[f][ks].copy() for f in KERNEL_FIELDS}
        kb["host"] = np.zeros(len(ks), np.int64)
        kb["lat"] = np.full(len(ks), g.lat_ns)
        kb["gap"] = np.full(len(ks), k2k_ns)
        inserts.append((a, hb, kb))
    out = _edit(g, drop_host=drop, drop_kern=drop_k, inserts=inserts)
    return _tag(out, f"graph_launch({len(moved)} layers, {launch_ns} ns)")


def add_early_exit(g: Graph, k: int, d_us: float, launch_ns: int | None = None, host_ns: int | None = None) -> Graph:
    """launch_always: K launches of an early-exit kernel of d µs at the end of every layer. launch_ns:
    the launch call (default: the graph's median cuLaunchKernelEx, else any launch); host_ns: host work
    before each (default: the median gap before those calls: a Triton launcher's Python)."""
    h = g.host
    if k < 0 or d_us < 0:
        raise GraphError(f"k and d_us must be >= 0, got {k}, {d_us}")
    if not len(g.layers):
        raise GraphError("the graph has no layer ranges (decoder_layer_N / moe_layer_N)")
    launches = np.isin(np.nonzero(h["kind"] == CALL)[0], np.unique(g.kern["host"]))
    lidx = np.nonzero(h["kind"] == CALL)[0][launches]
    tri = lidx[h["name"][lidx] == "cuLaunchKernelEx"]
    pick = tri if len(tri) else lidx
    launch_ns = int(np.median(h["dur"][pick])) if launch_ns is None else int(launch_ns)
    host_ns = int(np.median(h["gap"][pick])) if host_ns is None else int(host_ns)
    stream = int(np.bincount(g.kern["stream"] - g.kern["stream"].min()).argmax() + g.kern["stream"].min())
    inserts = []
    for li in range(len(g.layers)):
        idx = np.nonzero(h["layer"] == li)[0]
        if not len(idx):
            continue
        hb = _block(k, kind=np.full(k, CALL, np.int8), gap=np.full(k, host_ns), dur=np.full(k, launch_ns),
                    ret=np.zeros(k, np.int64), guard=np.full(k, -1), gap_guard=np.zeros(k, np.int64),
                    layer=np.full(k, li), name=np.array(["cuLaunchKernelEx"] * k, object))
        kb = _block(k, host=np.arange(k), stream=np.full(k, stream), dur=np.full(k, int(round(d_us * 1e3))),
                    lat=np.full(k, g.lat_ns), gap=np.full(k, g.k2k_ns), nccl=np.zeros(k, bool),
                    guard=np.full(k, -1), name=np.array(["early_exit"] * k, object))
        inserts.append((int(idx[-1]) + 1, hb, kb))
    return _tag(_edit(g, inserts=inserts), f"add_early_exit({k} x {d_us} us per layer)")


def scale_collectives(g: Graph, factor: float | None = None, ns: int | None = None) -> Graph:
    """The NCCL kernels' durations x factor, or each set to `ns`."""
    nc = g.kern["nccl"]
    if not nc.any():
        raise GraphError("the graph has no collectives (no kernel named like nccl*)")
    if (factor is None) == (ns is None):
        raise GraphError("give exactly one of factor= or ns=")
    kern = dict(g.kern)
    new = np.round(g.kern["dur"] * factor) if factor is not None else np.full(g.n_kernels, ns)
    kern["dur"] = np.where(nc, new, g.kern["dur"]).astype(np.int64)
    out = dataclasses.replace(g, kern=kern, traced_ns=None, meta=dict(g.meta))
    return _tag(out, f"scale_collectives({factor if factor is not None else str(ns) + ' ns'})")


def tile_layers(g: Graph, times: int) -> Graph:
    """The block of host calls from the first layer's first call to the last layer's last call (with
    their kernels and guard sites) repeated `times` times: an L-layer trace as a times*L-layer forward."""
    if times < 1:
        raise GraphError(f"times must be >= 1, got {times}")
    h = g.host
    inl = np.nonzero(h["layer"] >= 0)[0]
    if not len(inl):
        raise GraphError("the graph has no layer ranges to tile")
    if times == 1:
        return g
    a, b = int(inl[0]), int(inl[-1]) + 1
    body = np.arange(a, b)
    kb_mask = (g.kern["host"] >= a) & (g.kern["host"] < b)
    nl, ns_ = len(g.layers), len(g.sites)
    inserts = []
    for r in range(1, times):
        hb = {f: h[f][body].copy() for f in HOST_FIELDS}
        hb["layer"] = np.where(hb["layer"] >= 0, hb["layer"] + r * nl, -1)
        hb["guard"] = np.where(hb["guard"] >= 0, hb["guard"] + r * ns_, -1)
        kb = {f: g.kern[f][kb_mask].copy() for f in KERNEL_FIELDS}
        kb["host"] = kb["host"] - a
        kb["guard"] = np.where(kb["guard"] >= 0, kb["guard"] + r * ns_, -1)
        inserts.append((b, hb, kb))
    out = _edit(g, inserts=inserts)
    # sites of the copies: same shape, anchors shifted by whole bodies
    if ns_:
        s = out.sites
        reps = [s]
        for r in range(1, times):
            c = g.sites.copy()
            c["anchor"] = c["anchor"] + r * (b - a)
            c["layer"] = np.where(c["layer"] >= 0, c["layer"] + r * nl, -1)
            reps.append(c)
        out.sites = pd.concat(reps, ignore_index=True)
    out.layers = [f"{n}@{r}" if r else n for r in range(times) for n in g.layers]
    return _tag(out, f"tile_layers(x{times})")


# --- a rewrite of the host's ops ---------------------------------------------------------------------
def _calls(g: Graph, calls, what: str) -> np.ndarray:
    idx = np.unique(np.asarray(calls, np.int64))
    if len(idx) and (idx.min() < 0 or idx.max() >= g.n_host):
        raise GraphError(f"{what}: calls must be host-call indices of the graph (0..{g.n_host - 1})")
    return idx


def drop_calls(g: Graph, calls) -> Graph:
    """A rewrite that deletes ops: these host calls go, with the kernels they launched and the host time
    before each (its gap: the Python and dispatcher work that issued it). The host then reaches the next
    kept call sooner; a dropped sync no longer drains the queue."""
    idx = _calls(g, calls, "drop_calls")
    drop = np.zeros(g.n_host, bool)
    drop[idx] = True
    return _tag(_edit(g, drop_host=drop), f"drop_calls({len(idx)})")


def repeat_calls(g: Graph, calls) -> Graph:
    """A rewrite that adds ops resembling existing ones: a copy of each listed call (its gap, duration and
    the kernels it launched) right after it. A copied sync is issued as a plain call (it cannot wait)."""
    idx = _calls(g, calls, "repeat_calls")
    h, k = g.host, g.kern
    inserts = []
    for c in idx:
        hb = {f: np.asarray([h[f][c]]) for f in HOST_FIELDS}
        hb["kind"] = np.asarray([CALL], np.int8)
        mine = np.nonzero(k["host"] == c)[0]
        kb = {f: np.asarray(k[f][mine]) for f in KERNEL_FIELDS}
        kb["host"] = np.zeros(len(mine), np.int64)
        inserts.append((int(c) + 1 if c + 1 < g.n_host else g.n_host, hb, kb if len(mine) else {}))
    return _tag(_edit(g, inserts=inserts), f"repeat_calls({len(idx)})")


def shorten_gaps(g: Graph, calls, ns) -> Graph:
    """A rewrite that deletes host-only ops (ops that make no runtime call: a view, a select): their host
    time `ns` (one value per listed call, or one for all) leaves the gap before each listed call (the
    next call the host reaches after them). A gap never goes below 0."""
    idx = np.asarray(calls, np.int64).reshape(-1)
    _calls(g, idx, "shorten_gaps")  # the range check (a call listed twice loses both times)
    ns = np.broadcast_to(np.asarray(ns, np.int64), idx.shape)
    if (ns < 0).any():
        raise GraphError("shorten_gaps: the host time to remove must be >= 0")
    cut = np.zeros(g.n_host, np.int64)
    np.add.at(cut, idx, ns)
    cut = np.minimum(cut, g.host["gap"])
    return _tag(_edit(g, add_gap=-cut), f"shorten_gaps({len(idx)})")


TRANSFORMS = {"remove_syncs": remove_syncs, "add_syncs": add_syncs, "scale_host": scale_host,
              "graph_launch": graph_launch, "add_early_exit": add_early_exit,
              "scale_collectives": scale_collectives, "tile_layers": tile_layers,
              "unblock_launches": unblock_launches,
              "drop_calls": drop_calls, "repeat_calls": repeat_calls, "shorten_gaps": shorten_gaps}


def apply(g: Graph, name: str, **kw) -> Graph:
    """A transformation by name."""
    if name not in TRANSFORMS:
        raise UnknownTransformationError(f"unknown transformation {name!r}; known: {', '.join(sorted(TRANSFORMS))}")
    return TRANSFORMS[name](g, **kw)
